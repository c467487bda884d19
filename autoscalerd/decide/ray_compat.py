"""Ray Serve 2.60's default autoscaling decision, rewritten as pure functions.

A Ray user who switches to autoscalerd should be able to ask for "what Ray would have
done" and get exactly that, tick for tick, without Ray installed and without a wall
clock. This module re-derives the rules of `ray.serve.autoscaling_policy` (the queue
length policy wrapped by its scaling factors and delays) and of the controller's
`apply_bounds`; tests/test_ray_compat.py holds it to Ray's own functions.

The decision runs in four stages, in Ray's order:

    raw desired count -> scaling factors -> delay timer -> bounds

with one short-cut ahead of them: with no replica running and traffic waiting, Ray
skips all four stages (bounds excepted) and starts replicas at once.

Everything that survives between ticks lives in `RayPolicyState`, so a caller can
persist it as JSON and resume.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autoscalerd.config import AutoscalingConfig

# The keys under which Ray keeps the delay timer in `policy_state`. Spelled out here
# rather than imported so that this module never needs Ray; the test checks they match.
RAY_DECISION_COUNTER_KEY = "__decision_counters"
RAY_DECISION_TIMESTAMP_KEY = "__decision_timestamp"

# Ray adds this slack before comparing elapsed time with a delay: differences of two
# large epoch timestamps can land a hair under the configured delay.
_DELAY_ELAPSED_EPS_S = 1e-6

# Reason words. Where autoscalerd's `Reason` enum has the same idea the same spelling is
# used, so `Reason(word)` works for those.
SCALE_FROM_ZERO = "scale_from_zero"
HOLD_STARTING = "hold_starting"
STEP_LIMITED = "step_limited"
DOWNSCALE_STUCK_STEP = "downscale_stuck_step"
FLOORED_AT_ONE = "floored_at_one"
UPSCALE_DELAYED = "upscale_delayed"
DOWNSCALE_DELAYED = "downscale_delayed"
SCALE_UP = "scale_up"
SCALE_DOWN = "scale_down"
SCALE_TO_ZERO = "scale_to_zero"
STEADY = "steady"
BOUNDED_MIN = "bounded_min"
BOUNDED_MAX = "bounded_max"


@dataclass(frozen=True, slots=True)
class RayKnobs:
    """Ray's `AutoscalingConfig` fields that shape a decision, with Ray 2.60's defaults.

    Optional fields keep Ray's `None`; the `effective_*` properties apply Ray's fallback
    rules at the point of use, as Ray does, so a knob set round-trips to Ray unchanged.
    """

    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    # Deprecated in Ray, still honoured as the last fallback of both factors.
    smoothing_factor: float = 1.0
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None

    def __post_init__(self) -> None:
        # Ray's pydantic validators, so a knob set valid here is valid for Ray too.
        problems: list[str] = []
        if self.min_replicas < 0:
            problems.append("min_replicas must be >= 0")
        if self.max_replicas < 1:
            problems.append("max_replicas must be >= 1")
        if self.max_replicas < self.min_replicas:
            problems.append("max_replicas must be >= min_replicas")
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            problems.append("initial_replicas must lie within [min_replicas, max_replicas]")
        if not self.target_ongoing_requests > 0:
            problems.append("target_ongoing_requests must be > 0")
        for name in ("upscale_delay_s", "downscale_delay_s", "downscale_to_zero_delay_s"):
            delay_s: float | None = getattr(self, name)
            if delay_s is not None and not delay_s >= 0:
                problems.append(f"{name} must be >= 0")
        for name in (
            "upscaling_factor",
            "downscaling_factor",
            "smoothing_factor",
            "upscale_smoothing_factor",
            "downscale_smoothing_factor",
        ):
            factor: float | None = getattr(self, name)
            if factor is not None and not factor > 0:
                problems.append(f"{name} must be > 0")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_autoscaling(cls, cfg: AutoscalingConfig) -> RayKnobs:
        """Ray's knobs from autoscalerd's `autoscaling_config` block, as a paste means them.

        A field the YAML set carries over; a field it left out takes Ray 2.60's default
        (max_replicas 1, target_ongoing_requests 2, delays 30 s and 600 s), not
        autoscalerd's, so that a pasted block behaves as it did in Ray.
        """
        given = cfg.model_fields_set
        ray = cls()
        knobs = {
            name: getattr(cfg, name) if name in given else getattr(ray, name)
            for name in (
                "min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests",
                "upscale_delay_s", "downscale_delay_s", "downscale_to_zero_delay_s",
                "upscaling_factor", "downscaling_factor", "smoothing_factor",
                "upscale_smoothing_factor", "downscale_smoothing_factor",
            )
        }  # fmt: skip
        if knobs["max_replicas"] < knobs["min_replicas"]:
            # min_replicas set above Ray's default max of 1: Ray would reject this paste.
            # `check-config` warns about bounds left to Ray's defaults; here min wins.
            knobs["max_replicas"] = knobs["min_replicas"]
        return cls(**knobs)

    @property
    def effective_upscaling_factor(self) -> float:
        """The new field wins; otherwise the deprecated per-direction one, then the shared one."""
        if self.upscaling_factor is not None:
            return self.upscaling_factor
        if self.upscale_smoothing_factor is not None:
            return self.upscale_smoothing_factor
        return self.smoothing_factor

    @property
    def effective_downscaling_factor(self) -> float:
        """Same precedence as the upscaling factor, with the downscale fields."""
        if self.downscaling_factor is not None:
            return self.downscaling_factor
        if self.downscale_smoothing_factor is not None:
            return self.downscale_smoothing_factor
        return self.smoothing_factor

    @property
    def effective_downscale_to_zero_delay_s(self) -> float:
        """The last replica waits as long as any other unless told otherwise."""
        if self.downscale_to_zero_delay_s is not None:
            return self.downscale_to_zero_delay_s
        return self.downscale_delay_s

    @property
    def effective_initial_replicas(self) -> int:
        """A fresh deployment starts at min_replicas unless initial_replicas is set."""
        if self.initial_replicas is not None:
            return self.initial_replicas
        return self.min_replicas


@dataclass(frozen=True, slots=True)
class RayPolicyState:
    """The delay timer Ray carries between ticks in `policy_state`.

    `decision_counter` counts consecutive ticks that wanted a change, positive for up and
    negative for down; only its sign matters to the decision, the count is kept because
    Ray keeps it. `decision_started_s` is when the current run of same-direction wishes
    began, `None` while no change is wanted.
    """

    decision_counter: int = 0
    decision_started_s: float | None = None

    def to_policy_state(self) -> dict[str, int | float | None]:
        """The dict Ray itself would hold, under Ray's keys."""
        return {
            RAY_DECISION_COUNTER_KEY: self.decision_counter,
            RAY_DECISION_TIMESTAMP_KEY: self.decision_started_s,
        }

    @classmethod
    def from_policy_state(cls, policy_state: Mapping[str, object]) -> RayPolicyState:
        """Read Ray's keys, with Ray's defaults for missing ones; other keys are ignored."""
        counter = policy_state.get(RAY_DECISION_COUNTER_KEY, 0)
        started_s = policy_state.get(RAY_DECISION_TIMESTAMP_KEY)
        if not isinstance(counter, int) or isinstance(counter, bool):
            raise ValueError(f"{RAY_DECISION_COUNTER_KEY} must be an int, got {counter!r}")
        if started_s is not None and not isinstance(started_s, (int, float)):
            raise ValueError(f"{RAY_DECISION_TIMESTAMP_KEY} must be a number, got {started_s!r}")
        return cls(counter, None if started_s is None else float(started_s))


def ray_decide(
    total_num_requests: float,
    total_queued_requests: float,
    current_num_replicas: int,
    target_num_replicas: int,
    knobs: RayKnobs,
    state: RayPolicyState,
    now_s: float,
    capacity_adjusted_min_replicas: int | None = None,
    capacity_adjusted_max_replicas: int | None = None,
) -> tuple[int, RayPolicyState, tuple[str, ...]]:
    """One tick of Ray Serve's default autoscaler: the new target, state and reasons.

    `total_num_requests` is ongoing plus queued requests, already aggregated over the
    look-back window as Ray's controller would; `total_queued_requests` is accepted
    because Ray's context carries it, but Ray 2.60's default policy never reads it.
    `current_num_replicas` counts running replicas, `target_num_replicas` is the target
    the previous tick settled on. The capacity-adjusted bounds default to the knobs'
    min/max (what Ray uses at target capacity 100%).
    """
    del total_queued_requests  # part of the signature for parity with Ray's context
    lower = capacity_adjusted_min_replicas
    if lower is None:
        lower = knobs.min_replicas
    upper = capacity_adjusted_max_replicas
    if upper is None:
        upper = knobs.max_replicas

    cold_start = cold_start_replicas(
        total_num_requests, current_num_replicas, target_num_replicas, knobs
    )
    if cold_start is not None:
        bounded, bound_reasons = apply_bounds(cold_start, lower, upper)
        return bounded, state, (SCALE_FROM_ZERO, *bound_reasons)

    desired = raw_desired_replicas(
        total_num_requests, current_num_replicas, target_num_replicas, knobs
    )
    scaled, factor_reasons = apply_scaling_factors(desired, current_num_replicas, knobs)
    if current_num_replicas == 0 and scaled > 0:
        # Replicas are on their way and no request waits: keep the target, no timer.
        bounded, bound_reasons = apply_bounds(scaled, lower, upper)
        return bounded, state, (*factor_reasons, HOLD_STARTING, *bound_reasons)

    delayed, new_state, delay_reasons = apply_delay(
        max(0, scaled), target_num_replicas, knobs, state, now_s
    )
    bounded, bound_reasons = apply_bounds(delayed, lower, upper)
    return bounded, new_state, (*factor_reasons, *delay_reasons, *bound_reasons)


def cold_start_replicas(
    total_num_requests: float,
    current_num_replicas: int,
    target_num_replicas: int,
    knobs: RayKnobs,
) -> int | None:
    """With nothing running there is no per-replica load to size from, so start a fixed step.

    The step is ⌈upscaling factor⌉ replicas (never below a target already set), whatever
    the load, and it skips the factors and the delay timer: a cold deployment should not
    wait `upscale_delay_s` with requests queued. `None` when the short-cut does not apply.
    """
    if current_num_replicas != 0 or not total_num_requests > 0:
        return None
    return max(math.ceil(1 * knobs.effective_upscaling_factor), target_num_replicas)


def raw_desired_replicas(
    total_num_requests: float,
    current_num_replicas: int,
    target_num_replicas: int,
    knobs: RayKnobs,
) -> float:
    """Replicas that would bring ongoing requests per replica to the target, unrounded.

    Ray computes it as running · (total / (target · running)); that order is kept, since
    the quotient can differ from total / target in the last bit and a ceiling follows.
    With nothing running (and nothing queued) there is no ratio: the target stands.
    """
    if current_num_replicas == 0:
        return float(target_num_replicas)
    wanted_load = knobs.target_ongoing_requests * current_num_replicas
    load_ratio = total_num_requests / wanted_load
    return current_num_replicas * load_ratio


def apply_scaling_factors(
    desired_replicas: float, current_num_replicas: int, knobs: RayKnobs
) -> tuple[int, tuple[str, ...]]:
    """Move only a factor's share of the way from running to desired, rounding up.

    Rounding up makes any wanted increase at least one replica, but can freeze a small
    decrease at the current count; Ray then steps down by one so downscaling still ends.
    From zero running the gap is the whole desired count, which a factor above one would
    amplify every tick, so Ray leaves it unscaled.
    """
    if current_num_replicas == 0:
        return math.ceil(desired_replicas), ()
    gap = desired_replicas - current_num_replicas
    factor = knobs.effective_upscaling_factor if gap > 0 else knobs.effective_downscaling_factor
    scaled = math.ceil(current_num_replicas + factor * gap)
    if math.ceil(float(desired_replicas)) < current_num_replicas and scaled == current_num_replicas:
        return scaled - 1, (DOWNSCALE_STUCK_STEP,)
    if scaled != math.ceil(desired_replicas):
        return scaled, (STEP_LIMITED,)
    return scaled, ()


def _delay_elapsed(now_s: float, started_s: float, delay_s: float) -> bool:
    """Whether a wish that began at `started_s` has lasted `delay_s`, within Ray's slack."""
    return now_s - started_s + _DELAY_ELAPSED_EPS_S >= delay_s


def apply_delay(
    desired_replicas: int,
    target_num_replicas: int,
    knobs: RayKnobs,
    state: RayPolicyState,
    now_s: float,
) -> tuple[int, RayPolicyState, tuple[str, ...]]:
    """Change the target only once the same direction has been wanted for the delay.

    The timer is wall-clock (not a tick count), starts at the first tick that wants the
    direction, restarts when the wish flips direction, and is cleared by any tick that
    wants no change. Scaling down goes no lower than one replica unless the target is
    already one; that last step uses its own delay, `downscale_to_zero_delay_s`.
    """
    counter = state.decision_counter
    started_s = state.decision_started_s

    if desired_replicas > target_num_replicas:
        if counter < 0:
            counter, started_s = 0, None
        counter += 1
        if started_s is None:
            started_s = now_s
        if _delay_elapsed(now_s, started_s, knobs.upscale_delay_s):
            return desired_replicas, RayPolicyState(), (SCALE_UP,)
        return target_num_replicas, RayPolicyState(counter, started_s), (UPSCALE_DELAYED,)

    if desired_replicas < target_num_replicas:
        if counter > 0:
            counter, started_s = 0, None
        counter -= 1
        reasons: tuple[str, ...] = ()
        to_zero = target_num_replicas == 1
        if to_zero:
            delay_s = knobs.effective_downscale_to_zero_delay_s
        else:
            delay_s = knobs.downscale_delay_s
            if desired_replicas < 1:
                desired_replicas, reasons = 1, (FLOORED_AT_ONE,)
        if started_s is None:
            started_s = now_s
        if _delay_elapsed(now_s, started_s, delay_s):
            done = SCALE_TO_ZERO if to_zero else SCALE_DOWN
            return desired_replicas, RayPolicyState(), (*reasons, done)
        return (
            target_num_replicas,
            RayPolicyState(counter, started_s),
            (*reasons, DOWNSCALE_DELAYED),
        )

    return target_num_replicas, RayPolicyState(), (STEADY,)


def apply_bounds(replicas: int, lower: int, upper: int) -> tuple[int, tuple[str, ...]]:
    """Clip to the capacity-adjusted bounds, as Ray's controller does after the policy.

    The floor is applied last, so it wins if capacity adjustment ever crosses the two.
    """
    bounded = max(lower, min(upper, replicas))
    reasons: list[str] = []
    if replicas > upper:
        reasons.append(BOUNDED_MAX)
    if bounded > min(upper, replicas):
        reasons.append(BOUNDED_MIN)
    return bounded, tuple(reasons)
