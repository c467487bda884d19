"""The decision: (Observation, DeploymentState, config, now) -> (Decision, DeploymentState).

Pure. The daemon, the backtest and the tests all call `decide`. It is a pipeline of named
stages, each a module with one job, in the order of ARCHITECTURE.md §Decide v2:

    rates -> replica model -> forecast -> size -> SLO guard -> knobs -> bounds -> fail-static

    rates.py         fresh inputs; the short and look-back arrival rate; burstiness.py
    replica_model.py slots, prefill tokens/s, tpot(batch), the token mix: learned online
    forecasting.py   Holt-Winters upper bound over the lead time
    sizing.py        the smallest count whose predicted wait tail meets the SLO
    slo_guard.py     error-budget burn rates on the controllable wait -> headroom
                     (both hold waits against prompt_budgets.py's per-request budgets)
    stabilize.py     the knobs: smoothing, upscale/downscale delay windows, Ray's factors, step caps
    bounds.py        min/max replicas, scale to zero and activation
    fail_static.py   stale data, warm-up, SLO burn and cooldown stop a change

`mode: ray-compatible` replaces the whole pipeline with Ray Serve's default policy
(ray_mode.py over ray_compat.py), implemented here and held to Ray's own functions.

Each stage records what it saw in the Decision, so any target can be explained from the
log alone. The scale-down delay lives in one place: `stabilize.apply_delays`.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide import (
    bounds,
    burstiness,
    capacity,
    fail_static,
    forecasting,
    outcome,
    rates,
    ray_mode,
    replica_model,
    sizing,
    slo_guard,
    stabilize,
)
from autoscalerd.forecast import holt_winters
from autoscalerd.model import Decision, DeploymentState, Histogram, Observation, Reason

_Number = TypeVar("_Number", int, float)


def initial_state(
    cfg: DeploymentConfig, now_s: float, current_replicas: int | None
) -> DeploymentState:
    """State for a deployment seen for the first time: start from what the platform runs."""
    a = cfg.autoscaling
    if current_replicas is None:
        current_replicas = a.initial_replicas if a.initial_replicas is not None else a.min_replicas
    return DeploymentState(target_replicas=current_replicas, started_at_s=now_s)


def refit_forecaster(
    state: DeploymentState, cfg: DeploymentConfig, now_s: float
) -> DeploymentState:
    """Refit the forecaster inline when due. The daemon runs the fit off the loop."""
    if not cfg.forecast.enabled or not holt_winters.refit_due(
        state.forecaster, now_s, cfg.forecast
    ):
        return state
    model = holt_winters.fit_state(state.forecaster, cfg.forecast)
    return state.with_(forecaster=holt_winters.install_fit(state.forecaster, model, now_s))


# The calibration is reported in a decision's reasons beyond this factor either way.
_CALIBRATION_REPORTED = 1.5

# The forecast is reported as leading the short-window rate when its upper bound asks
# for at least this many more requests over the lead time.
_LEADS_BY_REQUESTS = 1.0

# Without any latency SLO configured, requests may wait this long: the common TTFT SLO of
# interactive LLM serving.
DEFAULT_WAIT_BUDGET_S = 1.0


def decide(
    obs: Observation, state: DeploymentState, cfg: DeploymentConfig, now_s: float
) -> tuple[Decision, DeploymentState]:
    if cfg.mode == "ray-compatible":
        return ray_mode.decide_ray_compatible(obs, state, cfg, now_s)
    a = cfg.autoscaling
    max_age_s = cfg.max_metric_age_s
    current = state.target_replicas
    interval_s = now_s - state.last_decided_at_s if state.last_decided_at_s is not None else None
    tick_s = interval_s if interval_s is not None and interval_s > 0 else 1.0
    reasons: list[Reason] = []

    # 1. Rates, and the burstiness of arrivals at the tick scale.
    r = rates.observe(obs, state, cfg, now_s)
    burst_state = state.burst
    lead_s = forecasting.lead_time_s(cfg)
    if r.arrival_rate_per_s is not None:
        burst_state = burstiness.observe(
            burst_state,
            r.arrival_rate_per_s * tick_s,
            tick_s,
            now_s,
            cfg.forecast.bucket_s,
            lead_s,
        )

    # 2. The replica model, learned online; derated under KV-cache pressure or GPU trouble.
    model_state = replica_model.learn(
        state.replica_model, obs, cfg.replica_model, now_s, tick_s, max_age_s
    )
    model = replica_model.view(
        model_state, cfg.replica_model, now_s, cfg.capacity.service_rate_per_replica
    )
    # Little's law against the engine's own timing: how much longer the serving path
    # holds a slot than the token model predicts at this load.
    engine = dataclasses.replace(model, path_stretch=1.0)
    model_state = replica_model.learn_stretch(
        model_state,
        obs,
        lambda lam, replicas: sizing.slot_time_under_load_s(engine, lam, replicas),
        cfg.replica_model,
        now_s,
        tick_s,
        max_age_s,
    )
    model = replica_model.restretched(model, model_state, cfg.replica_model, now_s)
    capacity_factor = capacity.derate(
        obs.fresh("kv_cache_usage_ratio", now_s, max_age_s), cfg.capacity.kv_cache_derate_above
    )

    # 3. Forecast over the lead time.
    forecaster, prediction = forecasting.step(
        state.forecaster, r.arrival_rate_per_s, tick_s, cfg, now_s
    )
    upper_per_s = prediction.upper_per_s if prediction is not None else None
    rate_target = _max_known(upper_per_s, r.rate_short_per_s)
    rate_sustained = _max_known(upper_per_s, r.rate_down_per_s)
    if _forecast_leads(upper_per_s, r.rate_short_per_s, max(lead_s, tick_s)):
        reasons.append(Reason.FORECAST_LEADS)

    # 5 (before 4: its headroom is an input of the sizing). The SLO guard on the wait.
    slo = cfg.slo
    budget_s = slo_guard.wait_budget_s(slo.queue_wait_s, slo.ttft_s, model.prefill_s)
    if budget_s is None:
        budget_s = DEFAULT_WAIT_BUDGET_S
    share = 1.0 - slo.attainment_target

    def fresh_histogram(histogram: Histogram | None) -> Histogram | None:
        return histogram if histogram is not None and histogram.age_s(now_s) <= max_age_s else None

    # The misses replicas could have avoided: the engine's queue waits, each against its
    # request's own budget (TTFT less its prefill) with the replica model's prompt mix
    # (pooled: slo_guard.late_waits says why), else against the wait budget; where only
    # TTFT is known, TTFT misses less the prompts too long for it.
    waits = fresh_histogram(obs.queue_wait_histogram)
    prompts = fresh_histogram(obs.prompt_tokens_histogram)
    counts = slo_guard.late_waits(waits, model.prompt_mix, slo.ttft_s, model.prefill_tokens_per_s)
    if counts is None:
        counts = slo_guard.waits_over_budget(waits, budget_s)
    if counts is None:
        counts = slo_guard.controllable_misses(
            fresh_histogram(obs.ttft_histogram), prompts, slo.ttft_s, model.prefill_tokens_per_s
        )
    # An engine's TTFT does not include the wait at Serve's router before it: the misses
    # are at least the router waits over budget.
    counts = slo_guard.at_least(
        counts, slo_guard.waits_over_budget(fresh_histogram(obs.router_wait_histogram), budget_s)
    )
    # What the model predicts for the replicas running now: the guard compares it with
    # what the waits say, and calibrates the sizing's tail share.
    running = obs.fresh("running_replicas", now_s, max_age_s)
    # Only at a settled count: while replicas start, the backlog that asked for them is
    # still draining, which no steady-state formula describes.
    predicted_share: float | None = None
    starting = obs.fresh("starting_replicas", now_s, max_age_s)
    settled = starting is not None and starting == 0
    # The local arrival rate as requests arrived, over the last hour: the sizing averages
    # its late share over it (sizing._mixture_late). Not carried to the forecast's level:
    # the clumps of on-off traffic do not shrink in a lull, and a rising tide is the
    # steady formulas' at the forecast's rate.
    clump_windows = burstiness.read_clumps(burst_state, now_s, lead_s)
    rate_mix = burstiness.rate_mix(clump_windows, tick_s)

    if settled and running and r.rate_obs_per_s is not None and cfg.capacity.sizing == "model":
        now_inputs = sizing.SizingInputs(
            r.rate_obs_per_s,
            burstiness.peak_to_mean(burst_state, share, r.rate_obs_per_s, tick_s, now_s),
            tick_s,
            budget_s,
            share,
            capacity_factor,
            level_per_s=burst_state.level_per_s,
            ttft_s=slo.ttft_s,
            clumps=burstiness.clumps(clump_windows, share, tick_s),
            rate_mix=rate_mix,
        )
        late, _, _, burst_fits = sizing.predicted_tail(model, now_inputs, int(running))
        # Where the bursts measured do not fit the count running, the misses are the
        # bursts' (the sizing's burst condition answers those), not evidence about the
        # steady tail the calibration scales: like an overload, they say nothing of it.
        predicted_share = late if burst_fits else None
    guard_state, verdict = slo_guard.update(
        state.guard,
        counts,
        predicted_share,
        share,
        slo.burn_fast_window_s,
        slo.burn_slow_window_s,
        now_s,
        running,
    )
    if verdict.calibration > _CALIBRATION_REPORTED:
        reasons.append(Reason.HEADROOM_TIGHTENED)
    elif verdict.calibration < 1.0 / _CALIBRATION_REPORTED:
        reasons.append(Reason.HEADROOM_RELAXED)
    if verdict.mismatch:
        reasons.append(Reason.MODEL_MISMATCH)
    tail_share = share / verdict.calibration
    breached = _slo_breaches(obs, budget_s, cfg, now_s)

    # 4. Size: the smallest count whose predicted wait tail meets the target.
    peak_to_mean = burstiness.peak_to_mean(
        burst_state, tail_share, rate_target or 0.0, tick_s, now_s
    )
    clumps = burstiness.clumps(clump_windows, tail_share, tick_s)
    # The backlog the replicas asked for now must drain: the queue as it will be when they
    # can serve, a lead time from now, while arrivals outrun what runs.
    backlog_replicas = 0
    backlog: float | None = None
    if r.queued:
        served_per_s = running * model.service_rate_per_s() * capacity_factor if running else None
        backlog = capacity.backlog_at_landing_requests(
            r.queued, r.rate_short_per_s, served_per_s, lead_s
        )
        backlog_replicas = capacity.replicas_for_backlog(
            backlog, model.service_rate_per_s() * capacity_factor, cfg.capacity.drain_s
        )
        if backlog_replicas:
            reasons.append(Reason.BACKLOG)

    # Bursts are a ratio over the level: the forecast's upper bound, or the smoothed rate
    # the ratio was measured against when the forecast is lower or absent.
    burst_level_per_s = _max_known(upper_per_s, burst_state.level_per_s)

    def size_for(rate_per_s: float | None, near: int | None) -> sizing.Sizing | None:
        if rate_per_s is None:
            return None
        if cfg.capacity.sizing == "utilization":
            return sizing.by_utilization(
                rate_per_s,
                model.service_rate_per_s() * capacity_factor,
                cfg.capacity.target_utilization,
            )
        inputs = sizing.SizingInputs(
            arrival_rate_per_s=rate_per_s,
            peak_to_mean=peak_to_mean,
            tick_s=tick_s,
            wait_budget_s=budget_s,
            tail_share=tail_share,
            capacity_factor=capacity_factor,
            level_per_s=burst_level_per_s,
            ttft_s=slo.ttft_s,
            clumps=clumps,
            rate_mix=rate_mix,
        )
        return sizing.size(model, inputs, a.max_replicas, near)

    # The search starts from the count running now, and the sustained rate's from the
    # count the short rate sized (where the answer usually is: it only saves evaluations).
    sized_up = size_for(rate_target, current)
    # The same rate sizes the same: the forecast's upper bound often sets both.
    sized_down = (
        sized_up
        if rate_sustained == rate_target
        else size_for(rate_sustained, sized_up.replicas if sized_up else current)
    )
    replicas_capacity = sized_up.replicas + backlog_replicas if sized_up else None
    replicas_raw = replicas_capacity
    replicas_sustained = sized_down.replicas + backlog_replicas if sized_down else None
    # Capacity lost to GPU faults is not a load fluctuation: that many replicas' worth on
    # top of the sizing, added at once below. A stale reading holds what was added.
    gpu_extra = _gpu_extra(obs, state, now_s, max_age_s)
    if gpu_extra:
        failed = any(state_ == "failed" for *_, state_, _ in _gpu_rows(obs))
        reasons.append(Reason.GPU_FAILED if failed else Reason.GPU_DEGRADED)
        if replicas_capacity is not None:
            replicas_capacity += gpu_extra
            replicas_raw = replicas_capacity
        if replicas_sustained is not None:
            replicas_sustained += gpu_extra
    # Ray's concurrency reading: evidence for the record (observed queueing enters as the
    # backlog above), never a floor.
    replicas_concurrency: int | None = None
    if r.ongoing is not None or r.queued is not None:
        replicas_concurrency = capacity.replicas_for_concurrency(
            (r.ongoing or 0.0) + (r.queued or 0.0), a.target_ongoing_requests
        )
    if sized_up is not None:
        reasons.append(Reason.BURST if sized_up.binding == "burst" else Reason.CAPACITY)
        if burstiness.released(clump_windows, tail_share):
            reasons.append(Reason.SURGE_RELEASED)

    # A model that reality says is too optimistic by more than the calibration's bound is
    # not trusted to scale down.
    optimistic = verdict.mismatch and verdict.calibration >= slo_guard.CALIBRATION_MAX
    # The lowest count the guard lets a scale-down reach: none while the model is not
    # trusted; while the budget burns, one more than the most replicas that were running
    # when it burnt (those were shown too few; more than that is still more than they
    # were), or none where that count is unknown. These hold over the scale-down window.
    # A wait over budget now holds this tick only (none at all on it).
    window_floor: int | None = None
    if optimistic or (verdict.blocks_scale_down and verdict.burnt_replicas is None):
        window_floor = current
    elif verdict.blocks_scale_down and verdict.burnt_replicas is not None:
        window_floor = min(current, capacity.ceil_replicas(verdict.burnt_replicas) + 1)
    guard_floor = current if breached else window_floor
    # The guard's immediate rule, for what the model does not explain: the wait is over
    # its budget, the budget burns fast, and yet the model finds the current count enough.
    # Where the model already asks for more, the sizing is on its way and a step on top
    # would only chase a transient. One step per landing: while replicas asked for earlier
    # are still starting, the wait cannot have improved yet.
    # Nor while the wait quantile still holds waits from before the count running now: it
    # is read over the look-back window, so for that long after a landing it measures the
    # fewer replicas that ran before (a step then pays for a cold start the landing fixed).
    unexplained = replicas_capacity is not None and replicas_capacity <= current
    running_seen = _running_seen(state.running_seen, running, now_s)
    if breached and unexplained and (verdict.burn_fast or 0.0) > 2.0:
        reasons.append(Reason.SLO_BREACH)
        landing = running is not None and running < current
        measured = _ran_for(running_seen, now_s) >= a.look_back_period_s
        step_floor = current if landing or not measured else current + 1
        replicas_raw = max(replicas_raw if replicas_raw is not None else 0, step_floor)
    # A breach enters after the delays, not the window's evidence: whether such ticks
    # come often enough to matter is what the burn rate measures.
    if window_floor is not None and replicas_sustained is not None:
        replicas_sustained = max(replicas_sustained, window_floor)

    base = Decision(
        deployment=obs.deployment,
        target_replicas=current,
        reasons=(),
        decided_at_s=now_s,
        previous_replicas=current,
        load_unit="requests",
        arrival_rate_obs_per_s=r.rate_obs_per_s,
        arrival_rate_short_per_s=r.rate_short_per_s,
        arrival_rate_down_per_s=r.rate_down_per_s,
        arrival_rate_forecast_per_s=prediction.point_per_s if prediction else None,
        arrival_rate_upper_per_s=upper_per_s,
        arrival_rate_target_per_s=rate_target,
        forecast_method=prediction.method if prediction else None,
        service_rate_per_replica_per_s=model.service_rate_per_s() * capacity_factor,
        ongoing_requests=r.ongoing,
        queued_requests=r.queued,
        backlog_at_landing_requests=backlog,
        replicas_capacity=replicas_capacity,
        replicas_concurrency=replicas_concurrency,
        replicas_raw=replicas_raw,
        replicas_sustained=replicas_sustained,
        slo_breached=breached,
        sizing_binding=sized_up.binding if sized_up else None,
        predicted_wait_tail=sized_up.predicted_wait_tail if sized_up else None,
        peak_to_mean=peak_to_mean,
        clumps=clumps,
        wait_budget_s=budget_s,
        tail_share=tail_share,
        burn_rate_fast=verdict.burn_fast,
        burn_rate_slow=verdict.burn_slow,
        slo_floor_replicas=guard_floor,
        model_calibration=verdict.calibration,
        replica_model=tuple((e.name, e.value, e.samples, e.age_s) for e in model.estimates),
        gpu_lost_replicas=obs.fresh("gpu_lost_replicas", now_s, max_age_s),
        gpu_replicas=_gpu_rows(obs),
    )
    next_state = state.with_(
        rate_samples=r.rate_samples,
        last_arrival_at_s=r.last_arrival_at_s,
        fresh_since_s=r.fresh_since_s,
        tick_interval_s=r.tick_interval_s,
        forecaster=forecaster,
        replica_model=model_state,
        burst=burst_state,
        guard=guard_state,
        last_decided_at_s=now_s,
        gpu_extra_replicas=gpu_extra,
        running_seen=running_seen,
    )

    # 8 (first, because it short-circuits). Fail static: nothing fresh to act on -> hold,
    # except that the configured bounds always hold (an operator lowering max_replicas).
    if replicas_raw is None:
        target, bound_reasons = bounds.apply_bounds(current, a)
        return outcome.finish(
            target, [Reason.STALE_DATA, *bound_reasons], base, next_state, now_s, current
        )

    # 7b. Activation from zero: the first request gets a replica at once, bypassing delays.
    if current == 0 and replicas_raw > 0:
        target, _ = bounds.apply_bounds(max(1, replicas_raw), a)
        target = max(1, target)
        reasons.append(Reason.ACTIVATE_FROM_ZERO)
        return outcome.finish(target, reasons, base, next_state, now_s, float(replicas_raw))

    # 6. The knobs: EMA, then the windowed delays, Ray's factors, then the step caps.
    smoothed = stabilize.smooth(replicas_raw, state.smoothed_replicas, cfg.stabilize.ema_weight)
    quiet_since_s = r.last_arrival_at_s if r.last_arrival_at_s is not None else state.started_at_s
    lowest = bounds.floor(a, quiet_since_s, now_s)
    recommendation = max(capacity.ceil_replicas(smoothed), lowest)
    # Scale-down evidence: the sustained view, but never below what the scale-up evidence
    # held over upscale_delay_s (a burst that earned replicas keeps them for the window).
    held_up = min(
        [up for _, up, _ in capacity.tail(state.recommendations, now_s - a.upscale_delay_s)]
        + [recommendation]
    )
    sustained = max(
        replicas_sustained if replicas_sustained is not None else recommendation, lowest, held_up
    )
    horizon_s = max(a.upscale_delay_s, a.downscale_delay_s) + 2 * tick_s
    recommendations = capacity.window(
        (*state.recommendations, (now_s, recommendation, sustained)), now_s, horizon_s
    )
    next_state = next_state.with_(smoothed_replicas=smoothed, recommendations=recommendations)

    if Reason.SLO_BREACH in reasons and recommendation > current:
        # The SLO is already broken: waiting out upscale_delay_s would only prolong it.
        wanted, delay_reasons = recommendation, tuple[Reason, ...]()
    else:
        wanted, delay_reasons = stabilize.apply_delays(current, recommendations, now_s, a, tick_s)
    reasons.extend(delay_reasons)
    # Ray's scaling factors: how far toward what the delays let through (identity at
    # their default of 1).
    wanted, factor_reasons = stabilize.scale_by_factors(current, wanted, a)
    reasons.extend(factor_reasons)

    # 8. Fail static: what may stop the change.
    if guard_floor is not None and wanted < guard_floor:
        reasons.append(Reason.SLO_BREACH)
        wanted = guard_floor
    if wanted < current:
        blocker = fail_static.downscale_blocker(
            r.fresh, r.fresh_since_s, False, cfg, now_s, partial=r.partial
        )
        if blocker is not None:
            reasons.append(blocker)
            wanted = current
    if wanted != current and fail_static.cooling_down(
        state.last_action_at_s, cfg, now_s, bool(breached)
    ):
        reasons.append(Reason.COOLDOWN)
        wanted = current

    # Replacing capacity a GPU fault took bypasses the upscale delay and the cooldown.
    replacing = gpu_extra - state.gpu_extra_replicas
    if replacing > 0 and wanted < min(recommendation, current + replacing):
        wanted = min(recommendation, current + replacing)

    wanted, step_reasons = stabilize.limit_step(current, wanted, cfg.stabilize)
    reasons.extend(step_reasons)

    # 7. Bounds.
    if wanted == 0 and current > 0:
        reasons.append(Reason.SCALE_TO_ZERO)
    target, bound_reasons = bounds.apply_bounds(wanted, a)
    reasons.extend(bound_reasons)
    return outcome.finish(target, reasons, base, next_state, now_s, smoothed)


def _gpu_rows(obs: Observation) -> tuple[tuple[str, str, str, str], ...]:
    """(replica, GPU, state, reason) of every replica GPU that is not healthy."""
    return tuple(
        (g.replica_id, g.gpu_uuid, g.state, g.reason)
        for g in obs.gpu_replicas
        if g.state != "healthy"
    )


def _gpu_extra(obs: Observation, state: DeploymentState, now_s: float, max_age_s: float) -> int:
    if obs.gpu_lost_replicas is None:
        return 0  # no GPU health reported at all
    lost = obs.fresh("gpu_lost_replicas", now_s, max_age_s)
    if lost is None:
        return state.gpu_extra_replicas  # stale: never less on data not seen
    return capacity.ceil_replicas(lost)


def _running_seen(
    seen: tuple[float, float | None] | None, running: float | None, now_s: float
) -> tuple[float, float | None] | None:
    """The running count and since when: a change restarts the clock; the first sighting
    has run since before it (None); an unknown count keeps what was seen."""
    if running is None:
        return seen
    if seen is None:
        return (running, None)
    if seen[0] != running:
        return (running, now_s)
    return seen


def _ran_for(seen: tuple[float, float | None] | None, now_s: float) -> float:
    """Seconds the running count has been what it is (infinite where not known to change)."""
    if seen is None or seen[1] is None:
        return float("inf")
    return now_s - seen[1]


def _forecast_leads(upper_per_s: float | None, short_per_s: float | None, lead_s: float) -> bool:
    """Whether the forecast's upper bound, not the short-window rate, set the target rate
    by a margin that matters: at least one more request over the lead time. A bound a
    hair above an idle short window (0.001/s over 0/s) sizes nothing the window would not."""
    if upper_per_s is None:
        return False
    return (upper_per_s - (short_per_s or 0.0)) * lead_s >= _LEADS_BY_REQUESTS


def _max_known(*values: _Number | None) -> _Number | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _slo_breaches(
    obs: Observation, budget_s: float, cfg: DeploymentConfig, now_s: float
) -> tuple[str, ...]:
    """The controllable latency over its budget: the wait p99, never raw TTFT."""
    observed_s = obs.fresh("queue_wait_p99_s", now_s, cfg.max_metric_age_s)
    if observed_s is not None and observed_s > budget_s:
        return ("queue_wait_p99_s",)
    return ()
