"""Stage 2: the model of one replica, learned online from what the sensors see.

A replica of an LLM server has two resources a request needs in turn (ARCHITECTURE.md
§Decide v2): the prefill engine, which turns prompt tokens into a first token at
`prefill_tokens_per_s`, and a slot (`max_ongoing_requests` of them), held from admission
to the last output token, each token taking `tpot(b)` with b requests decoding. What
traffic costs is the token mix: E[prompt], E[prompt²] and E[output].

Every estimate is a ratio of exponentially forgotten sums, seeded with the configured
prior as a pseudo-observation of small weight, so that a prior that is wrong by 2x is
outvoted within seconds of traffic and the estimate follows slow drift:

- prefill_tokens_per_s = Σ prompt tokens / Σ prefill seconds (vLLM's prompt-token counter
  and the sum of its prefill-time histogram);
- tpot(b) = a + s·(b − 1): weighted least squares of the mean time per output token
  against the mean decode batch per replica, with the prior's two ends (b = 1 and b =
  slots) as pseudo-points, so a load that never varies moves the level, not the slope;
- the token mix from the prompt/output counters per request and the prompt-length
  histogram's second moment;
- the slot time by Little's law (ongoing / completions), which needs no vLLM metrics: the
  model of a plain Serve deployment;
- the path's stretch: Little's law's slot time over the one the token model predicts at
  the load seen (its batch and its prefill queue). The engine's counters time the engine
  alone; what holds a slot is the whole path (the replica's own process, streaming each
  token back through Serve's proxy), and on a busy host that takes several times as long.
  A stretch above one lengthens every slot time the sizing uses; below one is ignored (a
  faster path than the engine's own timing is no reason to trust the model more).

Pure: `learn(model, inputs, cfg, now_s) -> model`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autoscalerd.config import ReplicaModelConfig
from autoscalerd.decide.forgetting import Sums

if TYPE_CHECKING:
    from autoscalerd.model import Observation

# Weight of a prior, in the unit of its sums: one second of prefill, two ticks of decode
# timing, one request of token mix. Small on purpose: the prior only has to carry the
# model until traffic is seen.
_PRIOR_PREFILL_S = 1.0
_PRIOR_TPOT_WEIGHT = 2.0
_PRIOR_REQUESTS = 1.0


@dataclass(frozen=True, slots=True)
class ReplicaModelState:
    """The learned sums, carried in DeploymentState. Empty until the first learn()."""

    prefill: Sums | None = None  # (prompt tokens, prefill seconds)
    tpot: Sums | None = None  # (w, w·b, w·y, w·b², w·b·y) with b = batch − 1
    prompt: Sums | None = None  # (requests, prompt tokens)
    prompt_sq: Sums | None = None  # (weight, weight·E[prompt²])
    output: Sums | None = None  # (requests, output tokens)
    little: Sums | None = None  # (completions, ongoing·seconds) per replica
    # (requests·predicted slot seconds, ongoing·seconds): Little's law over the model.
    stretch: Sums | None = None
    slots: float | None = None
    slots_at_s: float | None = None
    # The prompt-length distribution: requests per bucket of `prompt_bounds` (tokens, +Inf
    # last), from the prompt-token histogram; what the sizing needs to know how much wait
    # each request can afford before its own prefill misses the TTFT SLO.
    prompt_mix: Sums | None = None
    prompt_bounds: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    """One parameter of the model with its evidence: how many samples, how old."""

    name: str
    value: float
    samples: int
    age_s: float | None  # None: still the prior


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """The model as the sizing stage uses it."""

    slots: int
    prefill_tokens_per_s: float | None  # None: no token metrics (plain Serve)
    tpot_batch1_s: float
    tpot_slope_s: float  # added per extra request decoding
    prompt_tokens_mean: float
    prompt_tokens_sq_mean: float
    output_tokens_mean: float
    slot_time_observed_s: float | None  # Little's law, at the load seen
    estimates: tuple[Estimate, ...]
    # (lower, upper) prompt tokens and the share of requests in that bucket; empty when no
    # prompt histogram was seen. The last bucket's upper bound is infinite.
    prompt_mix: tuple[tuple[float, float, float], ...] = ()
    # How much longer the serving path holds a slot than the token model says (≥ 1).
    path_stretch: float = 1.0

    def tpot_s(self, batch: float) -> float:
        return self.tpot_batch1_s + self.tpot_slope_s * max(0.0, batch - 1.0)

    @property
    def prefill_s(self) -> float | None:
        """Mean prefill time of one request."""
        if self.prefill_tokens_per_s is None:
            return None
        return self.prompt_tokens_mean / self.prefill_tokens_per_s

    def slot_time_at_batch_s(self, batch: float) -> float:
        """How long a request holds a slot with `batch` requests decoding, stretched."""
        engine_s = (self.prefill_s or 0.0) + self.output_tokens_mean * self.tpot_s(batch)
        return engine_s * self.path_stretch

    @property
    def slot_time_s(self) -> float:
        """How long a request holds a slot with a full batch decoding."""
        if self.prefill_tokens_per_s is None and self.slot_time_observed_s is not None:
            return self.slot_time_observed_s
        return self.slot_time_at_batch_s(self.slots)

    def service_rate_per_s(self) -> float:
        """μ: requests/s one replica sustains at full load, the tighter of its two limits."""
        by_slots = self.slots / self.slot_time_s if self.slot_time_s > 0 else math.inf
        prefill_s = self.prefill_s
        by_prefill = 1.0 / prefill_s if prefill_s else math.inf
        return min(by_slots, by_prefill)


def learn(
    state: ReplicaModelState,
    obs: Observation,
    cfg: ReplicaModelConfig,
    now_s: float,
    tick_s: float,
    max_age_s: float,
) -> ReplicaModelState:
    """Fold this tick's readings into the sums. Missing readings change nothing, and
    neither do partial ones: with a metrics endpoint missing, counters and gauges come from
    different subsets of the replicas, and their ratios are no measure of a replica."""
    if not cfg.learn:
        return state
    coverage = obs.metrics_coverage_ratio
    if coverage is not None and not (coverage.value >= 1.0):
        return state

    def fresh(name: str) -> float | None:
        return obs.fresh(name, now_s, max_age_s)

    hw_s, mix_s = cfg.hardware_memory_s, cfg.mix_memory_s
    changes: dict[str, object] = {}
    slots = fresh("max_ongoing_requests")
    if slots is not None and slots >= 1:
        changes["slots"] = float(slots)
        changes["slots_at_s"] = now_s
    prompt_rate = fresh("prompt_token_rate_per_s")
    prefill_rate = fresh("prefill_seconds_per_s")
    prefilled_rate = fresh("prefilled_request_rate_per_s")
    if prompt_rate is not None and prefill_rate is not None and prefill_rate > 0:
        prior = Sums((cfg.prefill_tokens_per_s * _PRIOR_PREFILL_S, _PRIOR_PREFILL_S))
        changes["prefill"] = (state.prefill or prior).add(
            now_s, hw_s, prompt_rate * tick_s, prefill_rate * tick_s
        )
    if prompt_rate is not None and prefilled_rate is not None and prefilled_rate > 0:
        changes["prompt"] = _seed(state.prompt, _PRIOR_REQUESTS, cfg.prompt_tokens).add(
            now_s, mix_s, prefilled_rate * tick_s, prompt_rate * tick_s
        )
        square = fresh("prompt_tokens_sq_mean")
        if square is not None:
            weight = prefilled_rate * tick_s
            changes["prompt_sq"] = _seed(
                state.prompt_sq, _PRIOR_REQUESTS, 2.0 * cfg.prompt_tokens**2
            ).add(now_s, mix_s, weight, weight * square)
    completions = fresh("completion_rate_per_s")
    output_rate = fresh("output_token_rate_per_s")
    if completions is not None and completions > 0 and output_rate is not None:
        changes["output"] = _seed(state.output, _PRIOR_REQUESTS, cfg.output_tokens).add(
            now_s, mix_s, completions * tick_s, output_rate * tick_s
        )
    tpot = fresh("tpot_mean_s")
    batch = fresh("decode_batch_mean")
    if tpot is not None and batch is not None and tpot > 0 and batch > 0:
        x = max(0.0, batch - 1.0)
        changes["tpot"] = (state.tpot or Sums((0.0,) * 5)).add(
            now_s, hw_s, 1.0, x, tpot, x * x, x * tpot
        )
    prompts = obs.prompt_tokens_histogram
    if (
        prompts is not None
        and prompts.sane
        and prompts.age_s(now_s) <= max_age_s
        and prompts.total > 0
    ):
        mix = state.prompt_mix if state.prompt_bounds == prompts.bounds_s else None
        changes["prompt_mix"] = (mix or Sums((0.0,) * len(prompts.counts))).add(
            now_s, mix_s, *prompts.counts
        )
        changes["prompt_bounds"] = prompts.bounds_s
    ongoing = fresh("ongoing_requests")
    running = fresh("running_replicas")
    if completions is not None and ongoing is not None and running:
        # Little's law: L = λ·W, summed so that quiet ticks weigh nothing.
        changes["little"] = _seed(state.little, 0.0, 0.0).add(
            now_s, mix_s, completions * tick_s, ongoing * tick_s
        )
    return replace(state, **changes) if changes else state  # type: ignore[arg-type]


def learn_stretch(
    state: ReplicaModelState,
    obs: Observation,
    predict_slot_s: Callable[[float, float], float | None],
    cfg: ReplicaModelConfig,
    now_s: float,
    tick_s: float,
    max_age_s: float,
) -> ReplicaModelState:
    """Fold one tick of Little's law (ongoing at the replicas over their completions)
    against `predict_slot_s(completions_per_s, running_replicas)`, the model's slot time
    at this tick's load (None where the model has no token timing or predicts overload).
    Weighted by completions, as the slot time itself is: busy ticks say the most. Partial
    or missing readings change nothing, as in `learn`."""
    coverage = obs.metrics_coverage_ratio
    if not cfg.learn or (coverage is not None and not (coverage.value >= 1.0)):
        return state
    ongoing = obs.fresh("ongoing_requests", now_s, max_age_s)
    completions = obs.fresh("completion_rate_per_s", now_s, max_age_s)
    running = obs.fresh("running_replicas", now_s, max_age_s)
    if ongoing is None or completions is None or not running or not completions > 0:
        return state
    predicted_s = predict_slot_s(completions, running)
    if predicted_s is None or not math.isfinite(predicted_s) or not predicted_s > 0:
        return state
    sums = state.stretch or Sums((0.0, 0.0))
    expected = completions * tick_s * predicted_s
    return replace(state, stretch=sums.add(now_s, cfg.mix_memory_s, expected, ongoing * tick_s))


# Requests of evidence the stretch needs before it is applied: fewer ticks of Little's law
# are a gauge's noise (a request in flight counted at one tick's edge).
STRETCH_MIN_REQUESTS = 50.0
# A stretch is bounded: beyond this the serving path is broken, which the SLO guard sees.
STRETCH_MAX = 10.0


# Prefill speeds outside these are no engine's (tokens per second).
_MIN_PREFILL_PER_S = 1.0
_MAX_PREFILL_PER_S = 1e9
# Tokens per request beyond any model's context window.
_MAX_TOKENS = 1e7


def view(
    state: ReplicaModelState,
    cfg: ReplicaModelConfig,
    now_s: float,
    fallback_service_rate_per_s: float,
) -> ReplicaView:
    """The model's current parameters, from the sums (or the priors where there are none).

    A deployment with neither token metrics nor completions seen yet gets its slot time
    from `fallback_service_rate_per_s` (slots / μ), so its first sizing is not a guess of
    zero.
    """
    slots = _slots(state, cfg)
    hw_s, mix_s = cfg.hardware_memory_s, cfg.mix_memory_s
    estimates: list[Estimate] = [
        Estimate("slots", float(slots), 1 if state.slots else 0, _age(state.slots_at_s, now_s))
    ]

    prefill_per_s: float | None = None
    if state.prefill is not None:
        tokens, seconds = state.prefill.decayed(now_s, hw_s)
        prefill_per_s = cfg.prefill_tokens_per_s
        if seconds > 0 and tokens > 0:
            # Bounded: prefill seen with no prompt tokens counted (or damage) must not
            # read as an engine of zero or infinite speed.
            prefill_per_s = min(_MAX_PREFILL_PER_S, max(_MIN_PREFILL_PER_S, tokens / seconds))
    estimates.append(
        _estimate(
            "prefill_tokens_per_s", prefill_per_s or cfg.prefill_tokens_per_s, state.prefill, now_s
        )
    )

    tpot_sums = state.tpot.decayed(now_s, hw_s) if state.tpot is not None else (0.0,) * 5
    batch1_s, slope_s = _fit_tpot(tpot_sums, cfg, slots)
    estimates.append(_estimate("tpot_batch1_s", batch1_s, state.tpot, now_s))
    estimates.append(_estimate("tpot_slope_s", slope_s, state.tpot, now_s))

    prompt_mean = _ratio(state.prompt, now_s, mix_s, cfg.prompt_tokens)
    # A prompt mix of constant length has E[p²] = E[p]²: never below that.
    prompt_sq = max(
        prompt_mean**2,
        _ratio(state.prompt_sq, now_s, mix_s, 2.0 * cfg.prompt_tokens**2, _MAX_TOKENS**2),
    )
    output_mean = _ratio(state.output, now_s, mix_s, cfg.output_tokens)
    estimates.append(_estimate("prompt_tokens_mean", prompt_mean, state.prompt, now_s))
    estimates.append(_estimate("prompt_tokens_sq_mean", prompt_sq, state.prompt_sq, now_s))
    estimates.append(_estimate("output_tokens_mean", output_mean, state.output, now_s))

    slot_time_s: float | None = None
    if state.little is not None:
        done, ongoing_s = state.little.decayed(now_s, mix_s)
        if done >= 1.0:
            slot_time_s = ongoing_s / done
            estimates.append(_estimate("slot_time_observed_s", slot_time_s, state.little, now_s))
    if prefill_per_s is None and slot_time_s is None:
        slot_time_s = slots / fallback_service_rate_per_s
    stretch = _stretch(state, cfg, now_s) if prefill_per_s is not None else None
    if stretch is not None:
        estimates.append(stretch)
    prompt_mix: tuple[tuple[float, float, float], ...] = ()
    if state.prompt_mix is not None and state.prompt_bounds is not None:
        counts = state.prompt_mix.decayed(now_s, mix_s)
        total = sum(counts)
        if total > 0:
            lowers = (0.0, *state.prompt_bounds)
            uppers = (*state.prompt_bounds, math.inf)
            prompt_mix = tuple(
                (low, high, count / total)
                for low, high, count in zip(lowers, uppers, counts, strict=True)
                if count > 0
            )
    return ReplicaView(
        slots=slots,
        prefill_tokens_per_s=prefill_per_s,
        tpot_batch1_s=batch1_s,
        tpot_slope_s=slope_s,
        prompt_tokens_mean=prompt_mean,
        prompt_tokens_sq_mean=prompt_sq,
        output_tokens_mean=output_mean,
        slot_time_observed_s=slot_time_s,
        estimates=tuple(estimates),
        prompt_mix=prompt_mix,
        path_stretch=stretch.value if stretch is not None else 1.0,
    )


def restretched(
    model: ReplicaView, state: ReplicaModelState, cfg: ReplicaModelConfig, now_s: float
) -> ReplicaView:
    """`model` (a view of an earlier `state`) with the path stretch `state` now holds:
    what `view(state, ...)` would give after `learn_stretch` alone, without redoing the
    rest of the view."""
    if model.prefill_tokens_per_s is None:
        return model
    stretch = _stretch(state, cfg, now_s)
    if stretch is None:
        return model
    others = tuple(e for e in model.estimates if e.name != "path_stretch")
    return replace(model, path_stretch=stretch.value, estimates=(*others, stretch))


def _stretch(state: ReplicaModelState, cfg: ReplicaModelConfig, now_s: float) -> Estimate | None:
    """The path stretch (≥ 1, at most STRETCH_MAX; 1 on thin evidence), or None unlearned."""
    if state.stretch is None:
        return None
    mix_s = cfg.mix_memory_s
    expected_s, observed_s = state.stretch.decayed(now_s, mix_s)
    done = state.little.decayed(now_s, mix_s)[0] if state.little is not None else 0.0
    value = 1.0
    if expected_s > 0 and done >= STRETCH_MIN_REQUESTS:
        value = min(STRETCH_MAX, max(1.0, observed_s / expected_s))
    return _estimate("path_stretch", value, state.stretch, now_s)


def _slots(state: ReplicaModelState, cfg: ReplicaModelConfig) -> int:
    return int(state.slots) if state.slots else cfg.max_ongoing_requests


def _seed(sums: Sums | None, weight: float, value: float) -> Sums:
    """The sums, or a prior pseudo-observation of `weight` at `value` (per unit weight)."""
    if sums is not None:
        return sums
    return Sums((weight, weight * value) if weight else (0.0, 0.0))


def _fit_tpot(sums: tuple[float, ...], cfg: ReplicaModelConfig, slots: int) -> tuple[float, float]:
    """Weighted least squares of tpot = a + s·(b − 1) over the data and a prior; s ≥ 0, a > 0.

    The prior is its shape, not its level: two pseudo-points (b = 1 and b = slots, of
    `_PRIOR_TPOT_WEIGHT` together) on the line with the prior's relative slope
    (tpot_full_batch_s / tpot_batch1_s) through the data's centroid. The data's level
    wins at once; a load whose batch never varies keeps the prior's relative slope, so
    a replica measured at 10 ms per token is not assumed to reach the prior's 60 ms at a
    full batch.
    """
    dw, dx, dy, dxx, dxy = sums
    relative = _prior_slope(cfg, slots) / cfg.tpot_batch1_s
    x_full = float(max(0, slots - 1))
    if dw > 0:
        centre_x, centre_y = dx / dw, dy / dw
        level = centre_y / (1.0 + relative * centre_x)
    else:
        level = cfg.tpot_batch1_s
    half = _PRIOR_TPOT_WEIGHT / 2.0
    y_full = level * (1.0 + relative * x_full)
    w = dw + 2 * half
    sx = dx + half * x_full
    sy = dy + half * (level + y_full)
    sxx = dxx + half * x_full * x_full
    sxy = dxy + half * x_full * y_full
    mean_x, mean_y = sx / w, sy / w
    var_x = sxx / w - mean_x * mean_x
    slope = (sxy / w - mean_x * mean_y) / var_x if var_x > 1e-12 else level * relative
    slope = max(0.0, slope)
    intercept = mean_y - slope * mean_x
    if intercept <= 0:
        # The data say tpot barely depends on the batch near where it was seen: keep the
        # level there and let the line be flat rather than cross zero.
        intercept, slope = max(mean_y, 1e-6), 0.0
    return intercept, slope


def _prior_slope(cfg: ReplicaModelConfig, slots: int) -> float:
    if slots <= 1:
        return 0.0
    return (cfg.tpot_full_batch_s - cfg.tpot_batch1_s) / (slots - 1)


def _ratio(
    sums: Sums | None, now_s: float, memory_s: float, prior: float, most: float = _MAX_TOKENS
) -> float:
    """A mean per request from (requests, total), bounded to [0, most]: a total over a
    vanishing weight (damage, or a counter seen without its count) must not read as an
    infinite prompt or output, which would make a replica serve nothing."""
    if sums is None:
        return prior
    weight, total = sums.decayed(now_s, memory_s)
    return min(most, max(0.0, total / weight)) if weight > 0 else prior


def _age(at_s: float | None, now_s: float) -> float | None:
    return None if at_s is None else max(0.0, now_s - at_s)


def _estimate(name: str, value: float, sums: Sums | None, now_s: float) -> Estimate:
    if sums is None:
        return Estimate(name, value, 0, None)
    return Estimate(name, value, sums.samples, _age(sums.updated_at_s, now_s))
