"""The decision core: properties that must hold for any load, and the rules one by one."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide.policy import decide, initial_state
from autoscalerd.model import DeploymentState, Histogram, Observation, Reading, Reason


def make_cfg(forecast: bool = False, **sections: Any) -> DeploymentConfig:
    raw: dict[str, Any] = {
        "name": "app/llm",
        "autoscaling": {
            "min_replicas": 1,
            "max_replicas": 20,
            "target_ongoing_requests": 8,
            "upscale_delay_s": 5,
            "downscale_delay_s": 60,
            "look_back_period_s": 10,
        },
        # The classic rule ⌈λ/(ρ·μ)⌉ with a fixed μ: the knob, bound and fail-static
        # stages get hand-computable inputs. The model sizing has tests of its own.
        "capacity": {
            "sizing": "utilization",
            "service_rate_per_replica": 10.0,
            "target_utilization": 0.8,
        },
        "replica_model": {"learn": False, "max_ongoing_requests": 8},
        "forecast": {"enabled": forecast},
        "max_metric_age_s": 5,
    }
    for section, values in sections.items():
        if isinstance(values, dict):
            raw[section] = {**raw.get(section, {}), **values}
        else:
            raw[section] = values
    return DeploymentConfig.model_validate(raw)


def observe(
    now_s: float,
    rate_per_s: float | None,
    ongoing: float | None = None,
    queued: float | None = None,
    age_s: float = 0.0,
    **extra: float,
) -> Observation:
    at_s = now_s - age_s

    def reading(value: float | None) -> Reading | None:
        return None if value is None else Reading(value, at_s)

    return Observation(
        deployment="app/llm",
        sensed_at_s=now_s,
        arrival_rate_per_s=reading(rate_per_s),
        ongoing_requests=reading(ongoing),
        queued_requests=reading(queued),
        **{name: Reading(value, at_s) for name, value in extra.items()},
    )


def run(
    cfg: DeploymentConfig,
    rates: list[float | None],
    start_replicas: int = 1,
    state: DeploymentState | None = None,
    start_s: float = 0.0,
) -> tuple[list[int], DeploymentState]:
    state = state or initial_state(cfg, start_s, start_replicas)
    targets = []
    for tick, rate in enumerate(rates):
        now_s = start_s + tick + 1
        decision, state = decide(observe(now_s, rate), state, cfg, now_s)
        targets.append(decision.target_replicas)
    return targets, state


# ------------------------------------------------------------------- properties

rates = st.lists(
    st.one_of(st.none(), st.floats(min_value=0, max_value=500, allow_nan=False)),
    min_size=1,
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(
    rates=rates, min_replicas=st.integers(0, 5), span=st.integers(0, 10), start=st.integers(0, 20)
)
def test_target_always_within_bounds(
    rates: list[float | None], min_replicas: int, span: int, start: int
) -> None:
    cfg = make_cfg(
        autoscaling={"min_replicas": min_replicas, "max_replicas": max(1, min_replicas + span)}
    )
    targets, _ = run(cfg, rates, start_replicas=start)
    bounds = (cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas)
    # The very first decision may start outside (the platform's count); all are clipped.
    assert all(bounds[0] <= t <= bounds[1] for t in targets), (bounds, targets)


@settings(max_examples=60, deadline=None)
@given(history=rates, stale_ticks=st.integers(1, 400), age_s=st.floats(5.01, 1000))
def test_stale_or_missing_data_never_lowers_the_target(
    history: list[float | None], stale_ticks: int, age_s: float
) -> None:
    cfg = make_cfg()
    _, state = run(cfg, history, start_replicas=5)
    before = state.target_replicas
    now_s = float(len(history))
    for tick in range(stale_ticks):
        now_s += 1
        obs = observe(now_s, 0.0, ongoing=0.0, age_s=age_s) if tick % 2 else observe(now_s, None)
        decision, state = decide(obs, state, cfg, now_s)
        assert decision.target_replicas >= before
        assert Reason.STALE_DATA in decision.reasons or decision.target_replicas == before


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(0.5, 150), noise=st.floats(0, 0.05))
def test_constant_load_settles_without_oscillation(rate: float, noise: float) -> None:
    cfg = make_cfg()
    wobble = [rate * (1 + (noise if i % 2 else -noise)) for i in range(400)]
    targets, _ = run(cfg, list(wobble))
    settled = targets[200:]
    assert len(set(settled)) == 1, settled
    expected = -(-rate * (1 + noise) // (0.8 * 10.0))
    assert settled[0] <= max(1, expected) + 1


@settings(max_examples=60, deadline=None)
@given(history=rates, low=st.floats(0, 300), extra=st.floats(0, 300), ongoing=st.floats(0, 200))
def test_more_load_never_gives_fewer_replicas(
    history: list[float | None], low: float, extra: float, ongoing: float
) -> None:
    cfg = make_cfg()
    _, state = run(cfg, history, start_replicas=3)
    now_s = float(len(history) + 1)
    low_decision, _ = decide(observe(now_s, low, ongoing=ongoing), state, cfg, now_s)
    high_decision, _ = decide(
        observe(now_s, low + extra, ongoing=ongoing + extra), state, cfg, now_s
    )
    assert high_decision.target_replicas >= low_decision.target_replicas


@settings(max_examples=40, deadline=None)
@given(
    base=st.floats(1, 20),
    burst=st.floats(60, 400),
    upscale_delay_s=st.integers(0, 20),
    at_tick=st.integers(0, 50),
)
def test_burst_beyond_capacity_scales_up_within_upscale_delay_plus_a_tick(
    base: float, burst: float, upscale_delay_s: int, at_tick: int
) -> None:
    cfg = make_cfg(autoscaling={"upscale_delay_s": upscale_delay_s, "max_replicas": 100})
    _, state = run(cfg, [base] * (60 + at_tick))
    capacity_per_s = state.target_replicas * 10.0 * 0.8
    assert burst > capacity_per_s
    start_s = float(60 + at_tick)
    before = state.target_replicas
    for tick in range(1, upscale_delay_s + 2):
        now_s = start_s + tick
        decision, state = decide(observe(now_s, burst), state, cfg, now_s)
        if decision.target_replicas > before:
            return
    raise AssertionError(f"no scale-up within {upscale_delay_s} s + one tick")


# ------------------------------------------------------------------- rules


def test_capacity_rule_sizes_to_rate_over_utilised_service_rate() -> None:
    cfg = make_cfg(autoscaling={"upscale_delay_s": 0})
    decision, _ = decide(observe(1, 100.0), initial_state(cfg, 0, 1), cfg, 1)
    # ⌈100 / (0.8 · 10)⌉ = 13
    assert decision.replicas_capacity == 13
    assert decision.target_replicas == 13
    assert Reason.CAPACITY in decision.reasons and Reason.SCALE_UP in decision.reasons


def test_concurrency_is_evidence_and_backlog_adds_replicas_but_is_no_floor() -> None:
    cfg = make_cfg(autoscaling={"upscale_delay_s": 0})
    decision, _ = decide(observe(1, 1.0, ongoing=40, queued=24), initial_state(cfg, 0, 1), cfg, 1)
    assert decision.replicas_concurrency == 8  # ⌈(40 + 24) / 8⌉, recorded
    # ⌈1 / 8⌉ + ⌈24 / (10 · 30)⌉ = 1 + 1: Ray's rule would say 8
    assert decision.replicas_capacity == 2
    assert decision.target_replicas == 2
    assert Reason.BACKLOG in decision.reasons and Reason.CONCURRENCY not in decision.reasons


def test_backlog_is_the_queue_when_new_replicas_can_serve() -> None:
    # Lead time 10 s; 2 replicas run (20/s) while 100/s arrive: the queue of 50 grows by
    # 80/s until replicas asked for now can serve.
    cfg = make_cfg(
        autoscaling={"upscale_delay_s": 0},
        capacity={"cold_start_s": 10, "actuation_delay_s": 0},
    )
    state = initial_state(cfg, 0, 2)
    decision, _ = decide(observe(1, 100.0, queued=50, running_replicas=2), state, cfg, 1)
    assert decision.backlog_at_landing_requests == 50 + 80 * 10
    # ⌈100 / (0.8 · 10)⌉ + ⌈850 / (10 · 30)⌉ = 13 + 3
    assert decision.replicas_capacity == 16
    assert Reason.BACKLOG in decision.reasons
    # What runs outpaces the arrivals: the queue only drains, and is sized as it is.
    state = initial_state(cfg, 0, 13)
    decision, _ = decide(observe(1, 100.0, queued=50, running_replicas=13), state, cfg, 1)
    assert decision.backlog_at_landing_requests == 50
    assert decision.replicas_capacity == 13 + 1


def test_scale_down_waits_for_the_window_and_takes_its_maximum() -> None:
    cfg = make_cfg()
    targets, state = run(cfg, [80.0] * 100)  # 10 replicas, fresh for 100 s
    assert targets[-1] == 10
    # The sustained rate (10 s look-back mean) falls from 80/s to 8/s over t=101..110, so the
    # scale-down recommendations fall from 10 (t=101) and 9 (t=102) to 1; the 60 s window
    # releases them one by one from t=162, each step to the maximum left in the window.
    targets, state = run(cfg, [8.0] * 61, state=state, start_s=100)
    assert set(targets) == {10}
    targets, _ = run(cfg, [8.0] * 12, state=state, start_s=161)
    assert targets[0] == 9
    assert targets == sorted(targets, reverse=True)
    assert targets[-1] == 1


def test_no_scale_down_before_a_full_window_of_fresh_data_after_start() -> None:
    cfg = make_cfg()
    state = initial_state(cfg, 0, 10)  # a restart: the platform runs 10
    targets, state = run(cfg, [0.0] * 59, state=state)
    assert set(targets) == {10}
    decision, _ = decide(observe(60, 0.0), state, cfg, 60)
    assert Reason.WARMUP in decision.reasons or decision.target_replicas == 10
    targets, _ = run(cfg, [0.0] * 5, state=state, start_s=60)
    assert targets[-1] == 1


def test_step_caps_bound_each_step() -> None:
    # 400/s at 10/s and ρ 0.8 wants 50; each step at most doubles the count.
    cfg = make_cfg(
        autoscaling={"upscale_delay_s": 0, "max_replicas": 100},
        stabilize={"max_step_up_ratio": 2.0},
    )
    targets, state = run(cfg, [400.0] * 4, start_replicas=2)
    assert targets == [4, 8, 16, 32]
    decision, _ = decide(observe(5.0, 400.0), state, cfg, 5.0)
    assert decision.target_replicas == 50 and Reason.STEP_CAPPED not in decision.reasons
    # Down from 50 at 8/s (wants 1; the first tick's 1 s look-back still holds a 400/s
    # tick: 204/s wants 26): at least ⌊current/2⌋ stays, so 26, 13, 6, 3, then 1.
    cfg = make_cfg(
        autoscaling={"downscale_delay_s": 0, "look_back_period_s": 1, "max_replicas": 100},
        stabilize={"min_step_down_ratio": 0.5},
    )
    _, state = run(cfg, [400.0] * 20, start_replicas=50)
    targets, _ = run(cfg, [8.0] * 6, state=state, start_s=20)
    assert targets == [26, 13, 6, 3, 1, 1]


def test_ray_factors_are_a_gain_on_the_delta_in_autoscalerds_mode() -> None:
    # Wants 50 from 2 with upscaling_factor 0.5: ceil(2 + 0.5·48) = 26, ceil(26 + 12) = 38,
    # ceil(38 + 6) = 44, ceil(44 + 3) = 47, ceil(47 + 1.5) = 49, ceil(49 + 0.5) = 50.
    up = make_cfg(autoscaling={"upscale_delay_s": 0, "max_replicas": 100, "upscaling_factor": 0.5})
    targets, state = run(up, [400.0] * 6, start_replicas=2)
    assert targets == [26, 38, 44, 47, 49, 50]
    decision, _ = decide(observe(7.0, 400.0), state, up, 7.0)
    assert decision.target_replicas == 50 and Reason.STEP_LIMITED not in decision.reasons
    # Ray's deprecated fallbacks: upscale_smoothing_factor, then smoothing_factor.
    for knobs in ({"upscale_smoothing_factor": 0.5}, {"smoothing_factor": 0.5}):
        cfg = make_cfg(autoscaling={"upscale_delay_s": 0, "max_replicas": 100, **knobs})
        assert run(cfg, [400.0] * 6, start_replicas=2)[0] == targets
    # Down from 50 with downscaling_factor 0.5 (wants 26, then 1, as in the test above):
    # ceil(50 − 12) = 38, ceil(38 − 18.5) = 20, 11, 6, 4, 3, 2, then ceil(2 − 0.5) = 2,
    # stuck, where Ray steps down by one.
    down = make_cfg(
        autoscaling={
            "downscale_delay_s": 0,
            "look_back_period_s": 1,
            "max_replicas": 100,
            "downscaling_factor": 0.5,
        }
    )
    _, state = run(down, [400.0] * 20, start_replicas=50)
    targets, _ = run(down, [8.0] * 9, state=state, start_s=20)
    assert targets == [38, 20, 11, 6, 4, 3, 2, 1, 1]
    # A factor of 2 goes twice as far as the sizing asks: Ray's meaning, as pasted.
    # Ray takes any positive smoothing_factor as the fallback gain, 2 included.
    for knobs in ({"upscaling_factor": 2}, {"smoothing_factor": 2.0}):
        fast = make_cfg(autoscaling={"upscale_delay_s": 0, "max_replicas": 100, **knobs})
        _, state = run(fast, [80.0] * 3, start_replicas=10)
        assert run(fast, [120.0], state=state, start_s=3)[0] == [20]  # wants 15: 10 + 2·5


def test_the_ema_weight_smooths_the_sized_count() -> None:
    # 80/s wants 10, then 400/s wants 50: 0.5·50 + 0.5·10 = 30, then 40, 45, 47.5 -> 48.
    cfg = make_cfg(
        autoscaling={"upscale_delay_s": 0, "max_replicas": 100}, stabilize={"ema_weight": 0.5}
    )
    _, state = run(cfg, [80.0] * 3, start_replicas=10)
    targets, state = run(cfg, [400.0] * 4, state=state, start_s=3)
    assert targets == [30, 40, 45, 48]
    assert state.smoothed_replicas == pytest.approx(47.5)


def waits(now_s: float, wait_s: float, requests: float = 100.0) -> Histogram:
    """`requests` waits of about `wait_s` in the last tick."""
    bounds = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0)
    counts = [0.0] * (len(bounds) + 1)
    counts[next(i for i, b in enumerate(bounds) if wait_s <= b)] = requests
    return Histogram(bounds, tuple(counts), now_s)


def test_slo_guard_scales_up_at_once_on_the_wait_and_blocks_scale_down() -> None:
    cfg = make_cfg(slo={"ttft_s": 1.0, "queue_wait_s": 0.5})
    _, state = run(cfg, [8.0] * 100, start_replicas=6)
    assert state.target_replicas == 1
    state = state.with_(target_replicas=4)
    obs = replace(observe(101, 0.0, queue_wait_p99_s=3.0), queue_wait_histogram=waits(101, 3.0))
    decision, _ = decide(obs, state, cfg, 101)
    assert decision.target_replicas == 5
    assert Reason.SLO_BREACH in decision.reasons
    assert decision.slo_breached == ("queue_wait_p99_s",)
    assert decision.burn_rate_fast is not None and decision.burn_rate_fast > 2


def test_a_burning_budget_holds_scale_down_at_one_more_than_the_count_that_burnt_it() -> None:
    """Misses at one replica burn the budget; four run now and the waits are fine. The
    burn blocks scale-down to the count that was too few, not to every count below four."""
    cfg = make_cfg(slo={"ttft_s": 1.0, "queue_wait_s": 0.5})
    _, state = run(cfg, [8.0] * 100, start_replicas=6)
    state = state.with_(target_replicas=4)
    for now_s in range(101, 111):  # one replica serves, every wait over budget
        obs = replace(
            observe(now_s, 0.0, queue_wait_p99_s=3.0, running_replicas=1, starting_replicas=0),
            queue_wait_histogram=waits(now_s, 3.0),
        )
        decision, state = decide(obs, state, cfg, now_s)
        assert decision.target_replicas >= 4
    targets = []
    for now_s in range(111, 300):  # four serve, no wait over budget: 10 % of the window bad
        obs = replace(
            observe(now_s, 0.0, queue_wait_p99_s=0.05, running_replicas=4, starting_replicas=0),
            queue_wait_histogram=waits(now_s, 0.05),
        )
        decision, state = decide(obs, state, cfg, now_s)
        targets.append(decision.target_replicas)
    assert decision.burn_rate_fast is not None and decision.burn_rate_fast > 1
    assert min(targets) == 2 and targets[-1] == 2
    # The floor holds it, and the decision says by how much.
    assert decision.slo_floor_replicas == 2


def test_a_breach_blocks_the_scale_down_of_its_own_tick_not_the_window_after_it() -> None:
    """One tick's wait p99 over budget while the error budget is not burning: that tick
    does not scale down, but it does not hold the next `downscale_delay_s` either (how
    often such ticks come is what the burn rate measures)."""
    cfg = make_cfg(slo={"ttft_s": 1.0, "queue_wait_s": 0.5})
    bounds = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0)

    def tick(now_s: float, rate_per_s: float, late: float) -> Observation:
        counts = (rate_per_s - late, 0.0, 0.0, late, 0.0, 0.0, 0.0)
        obs = observe(now_s, rate_per_s, queue_wait_p99_s=3.0 if late else 0.05)
        return replace(obs, queue_wait_histogram=Histogram(bounds, counts, now_s))

    state = initial_state(cfg, 0.0, 1)
    targets: dict[int, int] = {}
    for now_s in range(1, 175):
        rate_per_s = 80.0 if now_s <= 100 else 8.0
        late = 1.0 if now_s in (150, 163) else 0.0  # one late request of eight
        decision, state = decide(tick(now_s, rate_per_s, late), state, cfg, now_s)
        targets[now_s] = decision.target_replicas
        if now_s == 163:
            assert Reason.SLO_BREACH in decision.reasons  # the hold says why
        if now_s in (150, 163):
            assert decision.slo_breached == ("queue_wait_p99_s",)
            assert decision.burn_rate_fast is not None and decision.burn_rate_fast < 1
    assert targets[100] == 10 and targets[161] == 10
    # As without the breach at t=150: the window releases the fall from t=162 ...
    assert targets[162] == 9
    # ... except on the tick the wait is over budget, which holds what runs.
    assert targets[163] == 9
    assert targets[164] < 9 and targets[174] < targets[164]


def test_slo_guard_ignores_ttft_that_is_prefill_time() -> None:
    """A 60,000-token prompt misses a 1 s TTFT on an idle cluster: no replica fixes that."""
    cfg = make_cfg(slo={"ttft_s": 1.0})
    _, state = run(cfg, [8.0] * 100, start_replicas=6)
    state = state.with_(target_replicas=4)
    obs = replace(
        observe(101, 0.0, ttft_p99_s=4.0, queue_wait_p99_s=0.01),
        queue_wait_histogram=waits(101, 0.01),
    )
    decision, _ = decide(obs, state, cfg, 101)
    assert decision.target_replicas < 4
    assert Reason.SLO_BREACH not in decision.reasons and decision.slo_breached == ()


def test_scale_to_zero_after_quiet_period_and_activation_at_once() -> None:
    cfg = make_cfg(
        autoscaling={"min_replicas": 0, "downscale_to_zero_delay_s": 30, "downscale_delay_s": 20}
    )
    targets, state = run(cfg, [5.0] * 30 + [0.0] * 60, start_replicas=1)
    assert targets[-1] == 0
    assert 0 not in targets[:59]  # not before 30 s without a request
    decision, _ = decide(observe(91, 0.5), state, cfg, 91)
    assert decision.target_replicas == 1
    assert Reason.ACTIVATE_FROM_ZERO in decision.reasons


def test_kv_cache_pressure_derates_capacity() -> None:
    cfg = make_cfg(autoscaling={"upscale_delay_s": 0})
    calm, _ = decide(observe(1, 80.0, kv_cache_usage_ratio=0.5), initial_state(cfg, 0, 1), cfg, 1)
    full, _ = decide(observe(1, 80.0, kv_cache_usage_ratio=1.0), initial_state(cfg, 0, 1), cfg, 1)
    assert calm.target_replicas == 10
    assert full.target_replicas == 20


def test_decision_carries_every_intermediate_value() -> None:
    cfg = make_cfg(autoscaling={"upscale_delay_s": 0})
    decision, _ = decide(observe(1, 50.0, ongoing=10, queued=0), initial_state(cfg, 0, 1), cfg, 1)
    record = decision.as_dict()
    for key in (
        "arrival_rate_obs_per_s",
        "arrival_rate_target_per_s",
        "service_rate_per_replica_per_s",
        "replicas_capacity",
        "replicas_concurrency",
        "replicas_raw",
        "replicas_smoothed",
        "reasons",
    ):
        assert record[key] is not None, key


def test_replicas_earned_by_a_burst_are_kept_for_the_downscale_window() -> None:
    cfg = make_cfg(autoscaling={"upscale_delay_s": 3, "downscale_delay_s": 60})
    targets, state = run(cfg, [8.0] * 100)
    assert targets[-1] == 1
    # A burst held past upscale_delay_s earns replicas; a 1-tick spike does not.
    targets, state = run(cfg, [8.0, 200.0, 8.0] + [80.0] * 6 + [8.0] * 50, state=state, start_s=100)
    assert targets[2] == 1  # the spike
    assert max(targets) == 10
    assert targets[-1] == 10  # still kept 50 s after the burst
    targets, _ = run(cfg, [8.0] * 30, state=state, start_s=159)
    assert targets[-1] == 1


def test_a_stale_replica_count_blocks_scale_down_even_with_fresh_load() -> None:
    cfg = make_cfg()
    _, state = run(cfg, [80.0] * 100)
    assert state.target_replicas == 10
    now_s = 100.0
    for _ in range(120):
        now_s += 1
        stale = Observation(
            deployment="app/llm",
            sensed_at_s=now_s,
            arrival_rate_per_s=Reading(1.0, now_s),
            running_replicas=Reading(10, now_s - 60),
        )
        decision, state = decide(stale, state, cfg, now_s)
        assert decision.target_replicas == 10
    assert Reason.STALE_DATA in decision.reasons


def test_slo_guard_adds_one_step_per_landing_not_one_per_tick() -> None:
    cfg = make_cfg(slo={"ttft_s": 1.0, "queue_wait_s": 0.5}, autoscaling={"upscale_delay_s": 0})
    state = initial_state(cfg, 0, 4)
    targets = []

    def over(tick: float, running: float) -> Observation:
        obs = observe(tick, 8.0, queue_wait_p99_s=3.0, running_replicas=running)
        return replace(obs, queue_wait_histogram=waits(tick, 3.0))

    for tick in range(1, 31):
        # The wait stays over budget; the platform still runs 4 while the 5th starts.
        decision, state = decide(over(tick, 4), state, cfg, tick)
        targets.append(decision.target_replicas)
    assert targets[0] == 5
    assert set(targets) == {5}
    # The step has landed. The wait p99 is read over the look-back window (10 s), so for
    # that long it still holds the waits of the four that ran before: no step on them.
    for tick in range(31, 41):
        decision, state = decide(over(tick, 5), state, cfg, tick)
        assert decision.target_replicas == 5
        assert Reason.SLO_BREACH in decision.reasons  # held, and the decision says why
    # A full window of waits at five, still over budget: one more.
    decision, _ = decide(over(41, 5), state, cfg, 41)
    assert decision.target_replicas == 6


def test_the_running_count_is_timed_from_its_last_change() -> None:
    from autoscalerd.decide.policy import _ran_for, _running_seen

    seen = _running_seen(None, 4.0, 10.0)
    assert seen == (4.0, None) and _ran_for(seen, 10.0) == math.inf  # running before it was seen
    assert _running_seen(seen, None, 11.0) == seen  # unknown: what was seen stands
    assert _running_seen(seen, 4.0, 12.0) == seen
    seen = _running_seen(seen, 5.0, 13.0)
    assert seen == (5.0, 13.0) and _ran_for(seen, 20.5) == 7.5
    assert _running_seen(seen, 5.0, 30.0) == (5.0, 13.0)


def test_forecast_leads_only_by_at_least_one_request_over_the_lead_time() -> None:
    # Lead time 65 s (cold start 60 + actuation 5). After 30 s at the level and 10 idle
    # seconds, the upper bound is about 3/4 of the level over a short rate of 0.
    cfg = make_cfg(forecast=True)
    for level_per_s, leads in ((4.0, True), (0.004, False)):
        state = initial_state(cfg, 0.0, 1)
        for tick in range(1, 41):
            rate = level_per_s if tick <= 30 else 0.0
            decision, state = decide(observe(float(tick), rate), state, cfg, float(tick))
        upper = decision.arrival_rate_upper_per_s
        assert upper is not None and upper > (decision.arrival_rate_short_per_s or 0.0)
        # 3/s over 65 s is about 195 requests; 0.003/s about 0.2 of one.
        assert (Reason.FORECAST_LEADS in decision.reasons) is leads
