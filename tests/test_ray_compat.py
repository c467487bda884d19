"""autoscalerd.decide.ray_compat against hand-computed cases and against Ray's own code.

The conformance tests drive Ray 2.60's `_apply_autoscaling_config(
replica_queue_length_autoscaling_policy)` the way the backtest baseline does (an
`AutoscalingContext` per tick, Ray's module `time` swapped for the simulated clock, the
returned `policy_state` fed back, the controller's bounds applied after) next to
`ray_decide`, and require the same target and the same timer state at every tick.
No Ray cluster is started: only the pure policy functions are called.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscalerd.config import AutoscalingConfig as AutoscalerdAutoscalingConfig
from autoscalerd.decide.baselines.base import Bounds
from autoscalerd.decide.baselines.ray_serve import simulated_time
from autoscalerd.decide.ray_compat import (
    BOUNDED_MAX,
    BOUNDED_MIN,
    DOWNSCALE_DELAYED,
    DOWNSCALE_STUCK_STEP,
    FLOORED_AT_ONE,
    HOLD_STARTING,
    RAY_DECISION_COUNTER_KEY,
    RAY_DECISION_TIMESTAMP_KEY,
    SCALE_DOWN,
    SCALE_FROM_ZERO,
    SCALE_TO_ZERO,
    SCALE_UP,
    STEADY,
    STEP_LIMITED,
    UPSCALE_DELAYED,
    RayKnobs,
    RayPolicyState,
    apply_bounds,
    apply_delay,
    apply_scaling_factors,
    cold_start_replicas,
    raw_desired_replicas,
    ray_decide,
)

# ---------------------------------------------------------------- knobs


def test_knob_defaults_are_rays() -> None:
    from ray.serve.config import AutoscalingConfig

    ray_cfg = AutoscalingConfig()
    knobs = RayKnobs()
    for field in dataclasses.fields(RayKnobs):
        assert getattr(knobs, field.name) == getattr(ray_cfg, field.name), field.name
    assert knobs.effective_upscaling_factor == ray_cfg.get_upscaling_factor() == 1.0
    assert knobs.effective_downscaling_factor == ray_cfg.get_downscaling_factor() == 1.0
    assert knobs.effective_downscale_to_zero_delay_s == 600.0
    assert knobs.effective_initial_replicas == 1


@pytest.mark.parametrize(
    ("fields", "up", "down"),
    [
        ({"smoothing_factor": 0.5}, 0.5, 0.5),
        ({"smoothing_factor": 0.5, "upscale_smoothing_factor": 3.0}, 3.0, 0.5),
        ({"smoothing_factor": 0.5, "downscale_smoothing_factor": 0.2}, 0.5, 0.2),
        ({"upscale_smoothing_factor": 3.0, "upscaling_factor": 2.0}, 2.0, 1.0),
        ({"downscale_smoothing_factor": 0.2, "downscaling_factor": 0.7}, 1.0, 0.7),
    ],
)
def test_factor_fallbacks_match_rays_getters(
    fields: dict[str, float], up: float, down: float
) -> None:
    from ray.serve.config import AutoscalingConfig

    knobs = RayKnobs(**fields)  # type: ignore[arg-type]
    ray_cfg = AutoscalingConfig(**fields)
    assert knobs.effective_upscaling_factor == ray_cfg.get_upscaling_factor() == up
    assert knobs.effective_downscaling_factor == ray_cfg.get_downscaling_factor() == down


@pytest.mark.parametrize(
    "fields",
    [
        {"min_replicas": -1},
        {"max_replicas": 0},
        {"min_replicas": 3, "max_replicas": 2},
        {"min_replicas": 2, "max_replicas": 4, "initial_replicas": 1},
        {"target_ongoing_requests": 0.0},
        {"upscale_delay_s": -1.0},
        {"downscale_to_zero_delay_s": -0.5},
        {"downscaling_factor": 0.0},
        {"smoothing_factor": -1.0},
    ],
)
def test_knobs_reject_what_ray_rejects(fields: dict[str, float]) -> None:
    from ray.serve.config import AutoscalingConfig

    with pytest.raises(ValueError):
        RayKnobs(**fields)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        AutoscalingConfig(**fields)


def test_from_autoscaling_maps_field_for_field() -> None:
    cfg = AutoscalerdAutoscalingConfig(
        min_replicas=0,
        max_replicas=8,
        target_ongoing_requests=12.0,
        upscale_delay_s=3.0,
        downscale_delay_s=120.0,
        downscale_to_zero_delay_s=900.0,
        downscaling_factor=0.5,
        smoothing_factor=0.8,
        upscale_smoothing_factor=1.5,
    )
    knobs = RayKnobs.from_autoscaling(cfg)
    assert knobs == RayKnobs(
        min_replicas=0,
        max_replicas=8,
        initial_replicas=None,
        target_ongoing_requests=12.0,
        upscale_delay_s=3.0,
        downscale_delay_s=120.0,
        downscale_to_zero_delay_s=900.0,
        upscaling_factor=None,
        downscaling_factor=0.5,
        smoothing_factor=0.8,
        upscale_smoothing_factor=1.5,
        downscale_smoothing_factor=None,
    )
    # Fields left None fall back as Ray's do.
    assert knobs.effective_upscaling_factor == 1.5
    assert knobs.effective_downscaling_factor == 0.5
    assert knobs.effective_initial_replicas == 0
    defaults = RayKnobs.from_autoscaling(AutoscalerdAutoscalingConfig())
    assert defaults.effective_downscale_to_zero_delay_s == defaults.downscale_delay_s


def test_state_round_trips_through_json_and_rays_keys() -> None:
    from ray.serve._private.constants import (
        SERVE_AUTOSCALING_DECISION_COUNTERS_KEY,
        SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY,
    )

    assert RAY_DECISION_COUNTER_KEY == SERVE_AUTOSCALING_DECISION_COUNTERS_KEY
    assert RAY_DECISION_TIMESTAMP_KEY == SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY
    state = RayPolicyState(-3, 1_700_000_000.25)
    assert (
        RayPolicyState.from_policy_state(json.loads(json.dumps(state.to_policy_state()))) == state
    )
    assert RayPolicyState.from_policy_state({}) == RayPolicyState()
    with pytest.raises(ValueError):
        RayPolicyState.from_policy_state({RAY_DECISION_COUNTER_KEY: "1"})


# ---------------------------------------------------------------- stages, by hand


def test_cold_start_starts_ceil_of_the_upscaling_factor_whatever_the_load() -> None:
    assert cold_start_replicas(500.0, 0, 0, RayKnobs(upscaling_factor=2.5)) == 3
    assert cold_start_replicas(500.0, 0, 0, RayKnobs(upscaling_factor=0.3)) == 1
    # A target already above the step stands.
    assert cold_start_replicas(1.0, 0, 4, RayKnobs(upscaling_factor=2.0)) == 4
    assert cold_start_replicas(0.0, 0, 0, RayKnobs()) is None
    assert cold_start_replicas(5.0, 1, 1, RayKnobs()) is None


def test_raw_desired_is_total_over_target() -> None:
    knobs = RayKnobs(target_ongoing_requests=4.0)
    assert raw_desired_replicas(30.0, 3, 3, knobs) == 7.5
    assert raw_desired_replicas(0.0, 3, 3, knobs) == 0.0
    # Nothing running: the target stands.
    assert raw_desired_replicas(0.0, 0, 2, knobs) == 2.0


def test_raw_desired_keeps_rays_order_of_operations() -> None:
    # 33 requests at 3.3 per replica is 10 replicas on paper; Ray's 3·(33 / (3.3·3)) is
    # 10.000000000000002, and its ceiling asks for an 11th. 33 / 3.3 would give 10.0.
    knobs = RayKnobs(max_replicas=20, target_ongoing_requests=3.3, upscale_delay_s=0.0)
    assert raw_desired_replicas(33.0, 3, 3, knobs) == 10.000000000000002
    assert ray_decide(33.0, 0.0, 3, 3, knobs, RayPolicyState(), 0.0)[0] == 11


@pytest.mark.parametrize(
    ("desired", "current", "up", "down", "expected", "reasons"),
    [
        (10.0, 4, 1.0, 1.0, 10, ()),
        (10.0, 4, 0.5, 1.0, 7, (STEP_LIMITED,)),  # ⌈4 + 0.5·6⌉
        (4.2, 4, 0.1, 1.0, 5, ()),  # ⌈4.02⌉: any wanted increase is at least one
        (10.0, 4, 2.0, 1.0, 16, (STEP_LIMITED,)),  # ⌈4 + 2·6⌉
        (1.0, 8, 1.0, 0.5, 5, (STEP_LIMITED,)),  # ⌈8 − 0.5·7⌉ = ⌈4.5⌉
        (2.5, 4, 1.0, 0.3, 3, (DOWNSCALE_STUCK_STEP,)),  # ⌈3.55⌉ = 4 is stuck: step by one
        (3.5, 4, 1.0, 0.5, 4, ()),  # ⌈3.5⌉ = 4: rounding wants no change, so none
        (0.0, 4, 1.0, 3.0, -8, (STEP_LIMITED,)),  # ⌈4 − 3·4⌉: overshoot, floored later
        (4.0, 4, 2.0, 2.0, 4, ()),
        (3.2, 0, 2.0, 2.0, 4, ()),  # from zero: unscaled, just rounded up
    ],
)
def test_scaling_factors(
    desired: float, current: int, up: float, down: float, expected: int, reasons: tuple[str, ...]
) -> None:
    knobs = RayKnobs(upscaling_factor=up, downscaling_factor=down)
    assert apply_scaling_factors(desired, current, knobs) == (expected, reasons)


def test_upscale_waits_out_its_delay_then_clears_the_timer() -> None:
    knobs = RayKnobs(upscale_delay_s=10.0)
    state = RayPolicyState()
    target, state, reasons = apply_delay(6, 3, knobs, state, 100.0)
    assert (target, state, reasons) == (3, RayPolicyState(1, 100.0), (UPSCALE_DELAYED,))
    target, state, reasons = apply_delay(5, 3, knobs, state, 105.0)
    assert (target, state, reasons) == (3, RayPolicyState(2, 100.0), (UPSCALE_DELAYED,))
    # 9.9999995 s elapsed passes thanks to Ray's 1 µs slack.
    target, state, reasons = apply_delay(5, 3, knobs, state, 109.9999995)
    assert (target, state, reasons) == (5, RayPolicyState(), (SCALE_UP,))


def test_a_direction_flip_or_a_steady_tick_restarts_the_timer() -> None:
    knobs = RayKnobs(upscale_delay_s=10.0, downscale_delay_s=10.0)
    _, state, _ = apply_delay(6, 3, knobs, RayPolicyState(), 100.0)
    _, state, reasons = apply_delay(2, 3, knobs, state, 108.0)
    assert (state, reasons) == (RayPolicyState(-1, 108.0), (DOWNSCALE_DELAYED,))
    _, state, reasons = apply_delay(3, 3, knobs, state, 109.0)
    assert (state, reasons) == (RayPolicyState(), (STEADY,))
    target, state, _ = apply_delay(6, 3, knobs, state, 118.0)
    assert (target, state) == (3, RayPolicyState(1, 118.0))


def test_downscale_stops_at_one_and_the_last_step_has_its_own_delay() -> None:
    knobs = RayKnobs(
        min_replicas=0, max_replicas=8, downscale_delay_s=60.0, downscale_to_zero_delay_s=5.0
    )
    target, state, reasons = apply_delay(0, 4, knobs, RayPolicyState(), 0.0)
    assert (target, state, reasons) == (
        4,
        RayPolicyState(-1, 0.0),
        (FLOORED_AT_ONE, DOWNSCALE_DELAYED),
    )
    target, state, reasons = apply_delay(0, 4, knobs, state, 60.0)
    assert (target, state, reasons) == (1, RayPolicyState(), (FLOORED_AT_ONE, SCALE_DOWN))
    target, state, _ = apply_delay(0, 1, knobs, state, 61.0)
    assert (target, state) == (1, RayPolicyState(-1, 61.0))
    target, state, reasons = apply_delay(0, 1, knobs, state, 66.0)
    assert (target, state, reasons) == (0, RayPolicyState(), (SCALE_TO_ZERO,))


def test_bounds() -> None:
    assert apply_bounds(12, 1, 8) == (8, (BOUNDED_MAX,))
    assert apply_bounds(0, 1, 8) == (1, (BOUNDED_MIN,))
    assert apply_bounds(5, 1, 8) == (5, ())
    # Crossed bounds: the floor wins.
    assert apply_bounds(5, 4, 3) == (4, (BOUNDED_MAX, BOUNDED_MIN))


def test_ray_decide_end_to_end_by_hand() -> None:
    knobs = RayKnobs(
        min_replicas=0,
        max_replicas=6,
        target_ongoing_requests=2.0,
        upscaling_factor=2.0,
        upscale_delay_s=0.0,
    )
    # From zero with traffic: ⌈2⌉ replicas at once, state untouched.
    start = RayPolicyState(-2, 5.0)
    assert ray_decide(40.0, 40.0, 0, 0, knobs, start, 10.0) == (2, start, (SCALE_FROM_ZERO,))
    # Still starting, traffic gone: the target holds.
    assert ray_decide(0.0, 0.0, 0, 2, knobs, start, 11.0) == (2, start, (HOLD_STARTING,))
    # 40 requests on 2 replicas wants 20; ⌈2 + 2·18⌉ = 38, clipped to 6.
    target, state, reasons = ray_decide(40.0, 0.0, 2, 2, knobs, RayPolicyState(), 12.0)
    assert (target, state, reasons) == (6, RayPolicyState(), (STEP_LIMITED, SCALE_UP, BOUNDED_MAX))
    # The capacity-adjusted bounds replace min/max.
    target, _, reasons = ray_decide(40.0, 0.0, 2, 2, knobs, RayPolicyState(), 12.0, 0, 3)
    assert (target, reasons[-1]) == (3, BOUNDED_MAX)


# ---------------------------------------------------------------- conformance with Ray's code


@dataclass(frozen=True)
class Tick:
    dt_s: float
    total_requests: float
    queued_requests: float
    # None: the running count has caught up with the previous target.
    running: int | None


@dataclass(frozen=True)
class Scenario:
    knobs: RayKnobs
    target_capacity: float | None
    start_s: float
    start_target: int
    start_running: int
    ticks: tuple[Tick, ...]


_OPTIONAL_FACTOR = st.none() | st.floats(0.05, 3.0) | st.sampled_from([0.5, 1.0, 2.0])
# Round delays and round steps land elapsed time exactly on the delay, where the slack
# and the `>=` decide.
_DELAY_S = st.sampled_from([0.0, 1.0, 2.0, 5.0, 10.0, 30.0]) | st.floats(0.0, 90.0)
# Targets with no exact binary value: a load that is a whole multiple of one makes Ray's
# order of operations show in the last bit, and the ceiling then adds a replica.
_DECIMAL_TARGETS = [0.3, 0.7, 1.0, 1.4, 2.0, 3.3, 5.1, 6.6, 16.0]
_DT_S = st.sampled_from([0.5, 1.0, 2.0, 5.0, 10.0]) | st.floats(0.5, 20.0)


@st.composite
def knob_sets(draw: st.DrawFn, min_replicas: int | None = None, max_cap: int = 12) -> RayKnobs:
    lo = draw(st.integers(0, 4)) if min_replicas is None else min_replicas
    hi = draw(st.integers(max(lo, 1), max(lo, 1) + max_cap))
    return RayKnobs(
        min_replicas=lo,
        max_replicas=hi,
        initial_replicas=draw(st.none() | st.integers(lo, hi)),
        target_ongoing_requests=draw(st.floats(0.25, 20.0) | st.sampled_from(_DECIMAL_TARGETS)),
        upscale_delay_s=draw(_DELAY_S),
        downscale_delay_s=draw(_DELAY_S),
        downscale_to_zero_delay_s=draw(st.none() | _DELAY_S),
        upscaling_factor=draw(_OPTIONAL_FACTOR),
        downscaling_factor=draw(_OPTIONAL_FACTOR),
        smoothing_factor=draw(st.floats(0.05, 2.0) | st.just(1.0)),
        upscale_smoothing_factor=draw(_OPTIONAL_FACTOR),
        downscale_smoothing_factor=draw(_OPTIONAL_FACTOR),
    )


@st.composite
def ticks(draw: st.DrawFn, max_requests: float, max_running: int, target: float) -> Tick:
    total = draw(
        st.just(0.0)
        | st.floats(0.0, max_requests)
        | st.integers(0, int(max_requests)).map(float)
        | st.integers(0, int(max_requests / target)).map(lambda k: k * target)
    )
    return Tick(
        dt_s=draw(_DT_S),
        total_requests=total,
        queued_requests=draw(st.floats(0.0, total)),
        running=draw(st.none() | st.none() | st.integers(0, max_running)),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    kind = draw(st.sampled_from(["random", "from_zero", "bounds"]))
    if kind == "from_zero":
        # Scale from zero: nothing running, min 0, traffic that comes and goes.
        knobs = draw(knob_sets(min_replicas=0))
        start_target = start_running = 0
        max_requests = 60.0
    elif kind == "bounds":
        # Loads far above max·target and idle stretches pin both bounds.
        knobs = draw(knob_sets(max_cap=3))
        start_target = knobs.effective_initial_replicas
        start_running = start_target
        max_requests = 400.0
    else:
        knobs = draw(knob_sets())
        start_target = knobs.effective_initial_replicas
        start_running = draw(st.integers(0, knobs.max_replicas))
        max_requests = 120.0
    return Scenario(
        knobs=knobs,
        target_capacity=draw(st.none() | st.sampled_from([50.0, 100.0]) | st.floats(1.0, 100.0)),
        start_s=draw(st.floats(0.0, 2e9) | st.just(1_700_000_000.0)),
        start_target=start_target,
        start_running=start_running,
        ticks=tuple(
            draw(
                st.lists(
                    ticks(max_requests, knobs.max_replicas + 3, knobs.target_ongoing_requests),
                    min_size=10,
                    max_size=60,
                )
            )
        ),
    )


class RaysOwnPolicy:
    """Ray 2.60's default policy, called as autoscalerd/decide/baselines/ray_serve.py calls it."""

    def __init__(self, knobs: RayKnobs, bounds: Bounds) -> None:
        from ray.serve import autoscaling_policy
        from ray.serve._private.common import DeploymentID
        from ray.serve.config import AutoscalingConfig, AutoscalingContext

        self._module = autoscaling_policy
        self._context_type = AutoscalingContext
        self._bounds = bounds
        self._deployment_id = DeploymentID(name="llm", app_name="conformance")
        self._config = AutoscalingConfig(
            min_replicas=knobs.min_replicas,
            max_replicas=knobs.max_replicas,
            initial_replicas=knobs.initial_replicas,
            target_ongoing_requests=knobs.target_ongoing_requests,
            upscale_delay_s=knobs.upscale_delay_s,
            downscale_delay_s=knobs.downscale_delay_s,
            downscale_to_zero_delay_s=knobs.downscale_to_zero_delay_s,
            upscaling_factor=knobs.upscaling_factor,
            downscaling_factor=knobs.downscaling_factor,
            smoothing_factor=knobs.smoothing_factor,
            upscale_smoothing_factor=knobs.upscale_smoothing_factor,
            downscale_smoothing_factor=knobs.downscale_smoothing_factor,
        )
        self._policy = autoscaling_policy._apply_autoscaling_config(
            autoscaling_policy.replica_queue_length_autoscaling_policy
        )
        self.policy_state: dict[str, Any] = {}

    def step(self, total: float, queued: float, running: int, target: int, now_s: float) -> int:
        context = self._context_type(
            deployment_id=self._deployment_id,
            deployment_name=self._deployment_id.name,
            app_name=self._deployment_id.app_name,
            current_num_replicas=running,
            target_num_replicas=target,
            running_replicas=[],
            total_num_requests=total,
            total_queued_requests=queued,
            aggregated_metrics={},
            raw_metrics={},
            capacity_adjusted_min_replicas=self._bounds.min_replicas,
            capacity_adjusted_max_replicas=self._bounds.max_replicas,
            policy_state=dict(self.policy_state),
            last_scale_up_time=None,
            last_scale_down_time=None,
            current_time=now_s,
            config=self._config,
        )
        with simulated_time(self._module, now_s):
            decision, self.policy_state = self._policy(context)
        # What the controller does with the policy's answer.
        if isinstance(decision, float):
            decision = math.ceil(decision)
        return self._bounds.clip(int(decision))


def _run_both(scenario: Scenario) -> list[tuple[str, ...]]:
    from ray.serve._private.utils import get_capacity_adjusted_num_replicas

    knobs = scenario.knobs
    lower = get_capacity_adjusted_num_replicas(knobs.min_replicas, scenario.target_capacity)
    upper = get_capacity_adjusted_num_replicas(knobs.max_replicas, scenario.target_capacity)
    ray = RaysOwnPolicy(knobs, Bounds(lower, upper))
    ray_target = ours_target = max(lower, min(upper, scenario.start_target))
    state = RayPolicyState()
    running = scenario.start_running
    now_s = scenario.start_s
    reasons_seen = []
    for index, tick in enumerate(scenario.ticks):
        now_s += tick.dt_s
        if tick.running is not None:
            running = tick.running
        elif index:
            running = ray_target
        ray_target = ray.step(tick.total_requests, tick.queued_requests, running, ray_target, now_s)
        ours_target, state, reasons = ray_decide(
            tick.total_requests,
            tick.queued_requests,
            running,
            ours_target,
            knobs,
            state,
            now_s,
            capacity_adjusted_min_replicas=lower,
            capacity_adjusted_max_replicas=upper,
        )
        assert ours_target == ray_target, (index, reasons)
        assert state == RayPolicyState.from_policy_state(ray.policy_state), (index, reasons)
        reasons_seen.append(reasons)
    return reasons_seen


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_ray_decide_matches_rays_own_policy(scenario: Scenario) -> None:
    _run_both(scenario)


def test_conformance_scenarios_reach_every_rule() -> None:
    """The generated scenarios do reach zero, both bounds and every delay outcome."""
    seen: set[str] = set()

    @settings(
        max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(scenarios())
    def collect(scenario: Scenario) -> None:
        for reasons in _run_both(scenario):
            seen.update(reasons)

    collect()
    assert {
        SCALE_FROM_ZERO,
        HOLD_STARTING,
        SCALE_TO_ZERO,
        SCALE_UP,
        SCALE_DOWN,
        UPSCALE_DELAYED,
        DOWNSCALE_DELAYED,
        DOWNSCALE_STUCK_STEP,
        FLOORED_AT_ONE,
        STEADY,
        BOUNDED_MIN,
        BOUNDED_MAX,
    } <= seen


def test_the_real_clock_is_back_after_the_conformance_run() -> None:
    from ray.serve import autoscaling_policy

    scenario = Scenario(
        knobs=RayKnobs(max_replicas=4, upscale_delay_s=2.0),
        target_capacity=None,
        start_s=1000.0,
        start_target=1,
        start_running=1,
        ticks=tuple(Tick(1.0, 20.0, 0.0, None) for _ in range(10)),
    )
    reasons = _run_both(scenario)
    assert reasons[0] == (UPSCALE_DELAYED,)
    assert reasons[2] == (SCALE_UP, BOUNDED_MAX)
    assert autoscaling_policy.time is time
