"""The stages of decide v2 one by one: hand-computed cases and online learning."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest

from autoscalerd.config import DeploymentConfig, ReplicaModelConfig
from autoscalerd.decide import burstiness, prompt_budgets, rates, replica_model, sizing, slo_guard
from autoscalerd.decide.forgetting import Sums
from autoscalerd.decide.policy import decide, initial_state
from autoscalerd.model import DeploymentState, Histogram, Observation, Reading
from autoscalerd.sim.cluster import Cluster, ReplicaModel
from autoscalerd.sim.sensor import SimSensor
from autoscalerd.sim.traces import RequestBatch

# The lead time the burst stages hold a clump for at least (a small model's cold start).
LEAD_S = 30.0


def view(**changes: object) -> replica_model.ReplicaView:
    base = {
        "slots": 10,
        "prefill_tokens_per_s": 1000.0,
        "tpot_batch1_s": 0.01,
        "tpot_slope_s": 0.0,
        "prompt_tokens_mean": 100.0,
        "prompt_tokens_sq_mean": 20_000.0,  # E[p²] = 2·E[p]²: exponential-like lengths
        "output_tokens_mean": 0.0,
        "slot_time_observed_s": None,
        "estimates": (),
    }
    base.update(changes)
    return replica_model.ReplicaView(**base)  # type: ignore[arg-type]


def test_prefill_queue_tail_is_pollaczek_khinchine_by_hand() -> None:
    # λ = 5/s on one replica, S = 0.1 s, E[S²] = 0.02 s²: ρ = 0.5, E[W] = 5·0.02/(2·0.5)
    # = 0.1 s, P(W > 0.5 s | busy engine) = 0.5·exp(−0.5·0.5/0.1) = 0.0410. The router
    # finds the engine busy only when the replica holds a request: N ~ Poisson(a), a =
    # 5·(0.1 + 0.1) = 1, P(N ≥ 1) = 1 − e⁻¹. The slots (a = 1 of 10, β = 9) add nothing.
    inputs = sizing.SizingInputs(5.0, 1.0, 1.0, 0.5, 0.05)
    tail, rho, _, fits = sizing.predicted_tail(view(), inputs, 1)
    assert rho == pytest.approx(0.5)
    assert tail == pytest.approx((1 - math.exp(-1.0)) * 0.5 * math.exp(-2.5), rel=1e-9)
    assert fits
    # Two replicas: ρ = 0.25, E[W] = 2.5·0.02/1.5 = 1/30 s; a = 5·(0.1 + 1/30) = 2/3 and
    # both replicas hold a request with P(N ≥ 2) = 1 − e^(−a)(1 + a); then 0.25·exp(−3.75).
    tail2, _, _, _ = sizing.predicted_tail(view(), inputs, 2)
    a = 5.0 * (0.1 + 1.0 / 30.0)
    both_busy = 1.0 - math.exp(-a) * (1.0 + a)
    assert tail2 == pytest.approx(both_busy * 0.25 * math.exp(-3.75), rel=1e-9)
    assert sizing.size(view(), inputs, 10).replicas == 1
    strict = sizing.SizingInputs(5.0, 1.0, 1.0, 0.5, 0.01)
    sized = sizing.size(view(), strict, 10)
    assert sized.replicas == 2 and sized.binding == "prefill"


def test_steady_queue_is_the_tail_the_prediction_reads_and_none_when_overloaded() -> None:
    # The case above by hand: at 1 replica the prefill term is (1 − e⁻¹)·0.5 at rate
    # ρ/E[W] = 5/s. A slot is held for the prefill and the mean prefill wait the engine
    # adds, 0.1 + (1 − e⁻¹)·0.1 s (no output tokens here), so a = 5 of those, of 10
    # slots: the slots' term decays at (10 − a)/slot time. P(wait > 0.5 s) is the
    # prediction's tail.
    steady = sizing.steady_queue(view(), 5.0, 1, 1.0, 0.5)
    slot_s = 0.1 + (1 - math.exp(-1.0)) * 0.1
    assert steady.tail is not None and steady.rho == pytest.approx(0.5)
    assert steady.servers == 10 and steady.slot_s == pytest.approx(slot_s, rel=1e-9)
    assert steady.offered == pytest.approx(5.0 * slot_s, rel=1e-9)
    assert steady.utilization == pytest.approx(5.0 * slot_s / 10, rel=1e-9)
    prefill_weight, prefill_rate = steady.tail.terms[0]
    assert prefill_weight == pytest.approx((1 - math.exp(-1.0)) * 0.5, rel=1e-9)
    assert prefill_rate == pytest.approx(5.0, rel=1e-9)
    assert steady.tail.terms[1][1] == pytest.approx((10 - 5.0 * slot_s) / slot_s, rel=1e-9)
    late, _, _, _ = sizing.predicted_tail(view(), sizing.SizingInputs(5.0, 1.0, 1.0, 0.5, 0.05), 1)
    assert steady.tail.above(0.5) == pytest.approx(late, rel=1e-6)
    # Short waits are likelier than long ones, and every wait is a share.
    assert 1.0 >= steady.tail.above(0.0) > steady.tail.above(0.1) > steady.tail.above(0.5)
    # Prefill work beyond what the engines do (ρ = 12·0.1 = 1.2): no tail, the
    # prediction's overload.
    over = sizing.steady_queue(view(), 12.0, 1, 1.0, 0.5)
    assert over.tail is None and over.rho == pytest.approx(1.2) and over.utilization == 1.0
    assert (
        sizing.predicted_tail(view(), sizing.SizingInputs(12.0, 1.0, 1.0, 0.5, 0.05), 1)[0] == 1.0
    )
    # Slots short (instant prefill, 100 tokens at 50 ms: 20 requests/s offer 100 slots of 10).
    slotted = view(prefill_tokens_per_s=1e9, output_tokens_mean=100.0, tpot_batch1_s=0.05)
    full = sizing.steady_queue(slotted, 20.0, 1, 1.0, 0.5)
    assert full.tail is None and full.utilization == pytest.approx(10.0, rel=1e-6)


def test_least_loaded_router_holds_requests_behind_a_long_prefill_for_the_decode_time() -> None:
    # Prompts of 1,000-3,000 tokens at 1,000 tokens/s: S uniform in [1, 3] s, read at the
    # bucket's midpoints 1.25, 1.75, 2.25, 2.75 s. Against a 0.5 s wait they run over by
    # 0.75, 1.25, 1.75, 2.25 s. Requests decode 100 tokens at 10 ms: T_d = 1 s. The stuck
    # replica draws requests only while its decodes finish: T_d·(1 − e^(−over/T_d)) of
    # each overrun holds up arrivals, so the share is Σ(1 − e^(−o)) / Σ o.
    model = view(
        prompt_tokens_mean=2000.0, prompt_tokens_sq_mean=4.33e6, output_tokens_mean=100.0,
        prompt_mix=((1000.0, 3000.0, 1.0),),
    )  # fmt: skip
    overruns = (0.75, 1.25, 1.75, 2.25)
    expected = sum(-math.expm1(-o) for o in overruns) / sum(overruns)
    share = sizing._captured_share(model, 0.5, 2, 1.0, 0.5)
    assert share == pytest.approx(expected, rel=1e-12)
    # One replica: every request goes behind it, whatever the router.
    assert sizing._captured_share(model, 0.5, 1, 1.0, 0.5) == 1.0
    # Longer decodes hide the queue longer: the share tends to 1 (random routing).
    slow = dataclasses.replace(model, output_tokens_mean=10_000.0)
    assert expected < sizing._captured_share(slow, 0.5, 2, 1.0, 0.5) <= 1.0
    assert sizing._captured_share(slow, 0.5, 2, 1.0, 0.5) > 0.98
    # No prompt outlasts the wait: nothing to cap.
    assert sizing._captured_share(model, 0.5, 2, 1.0, 5.0) == 1.0
    # It scales the prefill queue's term of the tail, and only that one.
    inputs = sizing.SizingInputs(0.5, 1.0, 1.0, 0.5, 0.01)
    capped, rho, _, _ = sizing.predicted_tail(model, inputs, 2)
    uncapped, _, _, _ = sizing.predicted_tail(dataclasses.replace(model, prompt_mix=()), inputs, 2)
    assert rho == pytest.approx(0.5)
    assert capped < uncapped


def test_slot_time_at_load_solves_littles_law_for_the_batch() -> None:
    # Prefill 0.1 s, 100 output tokens at 10 ms + 1 ms per extra request in the batch.
    # At 1 request/s per replica, b = 1·T(b) with T(b) = 0.1 + 100·(0.01 + 0.001·(b − 1))
    # gives b = 1/0.9 and T = 1/0.9 s (one fixed-point step from b = 1 would say 1.11 s
    # at b = 1.1, not b = 1.111).
    model = view(output_tokens_mean=100.0, tpot_slope_s=0.001)
    assert sizing._slot_time_at_load_s(model, 2.0, 2) == pytest.approx(1.0 / 0.9, rel=1e-12)
    # 20/s per replica asks for more than the 10 slots: a full batch, T = 0.1 + 100·0.019.
    assert sizing._slot_time_at_load_s(model, 40.0, 2) == pytest.approx(2.0, rel=1e-12)


def test_decode_bound_traffic_fills_every_slot_not_target_ongoing_requests() -> None:
    """Long outputs: 32 slots, each request holds one for 300 x 60 ms = 18 s. 10 req/s
    offer a = 180 slots; square-root staffing asks a + O(√a), about 7 replicas; Ray's rule
    at target_ongoing_requests = 12 would ask 15."""
    model = view(
        slots=32, prefill_tokens_per_s=16_000.0, prompt_tokens_mean=1000.0,
        prompt_tokens_sq_mean=2e6, output_tokens_mean=300.0, tpot_batch1_s=0.06,
    )  # fmt: skip
    sized = sizing.size(model, sizing.SizingInputs(10.0, 1.2, 1.0, 0.9, 0.01), 64)
    assert sized.binding == "slots"
    assert 6 <= sized.replicas <= 8
    assert sized.replicas < math.ceil(10.0 * 18.06 / 12)


def test_burst_term_sizes_for_the_measured_peak() -> None:
    # 40x the mean in one tick: 200 requests of 0.1 s prefill = 20 s of prefill work
    # to finish within 1 + 0.5 s: 14 replicas.
    sized = sizing.size(view(), sizing.SizingInputs(5.0, 40.0, 1.0, 0.5, 0.05), 64)
    assert sized.replicas == math.ceil(200 * 0.1 / 1.5)
    assert sized.binding == "burst"


def test_a_clump_of_several_ticks_is_sized_by_its_window() -> None:
    # 10 requests per tick fit one replica (1 s of prefill within 1 + 0.5 s), but a clump
    # of 120 in 8 ticks is 12 s of prefill that must be done within 8 + 0.5 s: 2 replicas.
    inputs = sizing.SizingInputs(5.0, 2.0, 1.0, 0.5, 0.05)
    assert sizing.size(view(), inputs, 64).replicas == 1
    clumped = dataclasses.replace(inputs, clumps=((8.0, 120.0),))
    sized = sizing.size(view(), clumped, 64)
    assert sized.replicas == math.ceil(120 * 0.1 / 8.5)
    assert sized.binding == "burst"
    # The same clump over a shorter window needs more: 12 s within 2 + 0.5 s.
    shorter = dataclasses.replace(inputs, clumps=((8.0, 120.0), (2.0, 120.0)))
    assert sizing.size(view(), shorter, 64).replicas == math.ceil(120 * 0.1 / 2.5)


def test_a_clump_finds_slots_by_the_renewal_count() -> None:
    # Prefill is instant and a request holds its slot 5 s (100 tokens at 50 ms). 1
    # request/s keeps 5 slots busy; a clump of 50 within 4 s must find slots within
    # 4 + 1 s, one slot time: each free slot takes one at once and every slot, free or
    # busy, frees once more in expectation, so R replicas of 10 slots offer
    # (10R − 5) + 10R: 3 replicas (55), where 2 offer 35.
    model = view(prefill_tokens_per_s=1e6, output_tokens_mean=100.0, tpot_batch1_s=0.05)
    inputs = sizing.SizingInputs(1.0, 0.0, 1.0, 1.0, 0.05, clumps=((4.0, 50.0),))
    sized = sizing.size(model, inputs, 64)
    assert sized.replicas == 3
    assert sized.binding == "burst"
    assert sizing.size(model, dataclasses.replace(inputs, clumps=((4.0, 56.0),)), 64).replicas == 4


def test_clumps_are_counted_per_window_and_outlast_a_lull() -> None:
    """On-off traffic: 100 requests in each of 4 consecutive ticks every 300 s, nothing
    between. By request weight every request arrives in a 1-tick window of 100 and a 4-tick
    window of 100 to 400 (its quantile at 1 % is 400), and after 280 s of quiet the clumps are still what the sizing holds for."""
    state = burstiness.BurstState()
    now = 0.0
    for tick in range(1, 1201):
        now = float(tick)
        arrivals = 100.0 if tick % 300 in (1, 2, 3, 4) else 0.0
        state = burstiness.observe(state, arrivals, 1.0, now, 300.0, LEAD_S)
    assert now % 300 == 0  # 296 quiet ticks since the last clump
    found = dict(burstiness.clumps(burstiness.read_clumps(state, now, LEAD_S), 0.01, 1.0))
    # Never below the clumps seen (counts are binned 1.1x apart; the tail extrapolates,
    # and four clumps know its scale only to a factor: up to 2.5x what was seen).
    assert found[1.0] >= 100.0 and found[2.0] >= 200.0 and found[4.0] >= 400.0
    assert found[4.0] <= 2.5 * 400.0
    assert 400.0 <= found[64.0] <= 2.5 * 400.0  # no window holds more than one clump
    # The ratio over the decayed level says far less is coming by now.
    level = state.level_per_s or 0.0
    assert burstiness.peak_to_mean(state, 0.01, level, 1.0, now) * level < 50
    # The sizing holds the replicas a clump needs through the lull.
    inputs = sizing.SizingInputs(
        max(level, 0.01),
        1.0,
        1.0,
        0.5,
        0.01,
        clumps=burstiness.clumps(burstiness.read_clumps(state, now, LEAD_S), 0.01, 1.0),
    )
    assert sizing.size(view(), inputs, 64).replicas >= math.ceil(400 * 0.1 / 4.5)


def test_a_surge_is_held_twice_its_episodes_span_and_a_clump_as_long_as_remembered() -> None:
    # A run of 300 s (longer than a lead time) in an episode from 0 to 300 s: held until
    # 900 s. A run shorter than a lead time is a clump: held whenever it was seen.
    assert burstiness._live((0.0, 300.0, 0.0, 0.0), 900.0, LEAD_S)
    assert not burstiness._live((0.0, 300.0, 0.0, 0.0), 901.0, LEAD_S)
    assert burstiness._live((100.0, 100.0, 100.0, 0.0), 5000.0, LEAD_S)
    assert burstiness._live((0.0, 300.0, 300.0 - LEAD_S + 1.0, 0.0), 5000.0, LEAD_S)
    # A surge of one lead time is held two after it; the span counts up to the
    # histograms' memory.
    assert burstiness._live((100.0, 100.0 + LEAD_S, 100.0, 0.0), 100.0 + 3 * LEAD_S, LEAD_S)
    assert not burstiness._live((100.0, 100.0 + LEAD_S, 100.0, 0.0), 101.0 + 3 * LEAD_S, LEAD_S)
    assert burstiness._live((0.0, 7200.0, 7000.0, 0.0), 7200.0 + 7200.0, LEAD_S)
    assert not burstiness._live((0.0, 7200.0, 7000.0, 0.0), 7201.0 + 7200.0, LEAD_S)
    # A record saved before gaps were kept reads as one without a second run.
    assert not burstiness._live((0.0, 300.0, 0.0), 901.0, LEAD_S)
    # A count of 40 is a sighting of every group up to 32-63. A group seen again within a
    # lead time continues its run, within the hour its episode, after it starts anew.
    record = burstiness._seen((), burstiness._episode_group(40.0), 10.0, LEAD_S)
    assert record == ((10.0, 10.0, 10.0, 0.0),) * 7
    record = burstiness._seen(record, burstiness._episode_group(3.0), 30.0, LEAD_S)
    assert record[:3] == ((10.0, 30.0, 10.0, 0.0),) * 3
    assert record[3:] == ((10.0, 10.0, 10.0, 0.0),) * 4
    # A new run 2,970 s after the last sighting: the episode's longest gap so far.
    record = burstiness._seen(record, burstiness._episode_group(3.0), 3000.0, LEAD_S)
    assert record[:3] == ((10.0, 3000.0, 3000.0, 2970.0),) * 3
    record = burstiness._seen(record, burstiness._episode_group(40.0), 3700.0, LEAD_S)
    assert record[:3] == ((10.0, 3700.0, 3700.0, 2970.0),) * 3  # a gap of 700 s: shorter
    assert record[3:] == ((3700.0, 3700.0, 3700.0, 0.0),) * 4  # 3,690 s: a new episode


def test_a_recurring_surge_is_held_as_long_as_its_longest_pause() -> None:
    """Runs of 600 s with pauses of up to 900 s between them, in an episode of two hours
    that the span rule would hold for two (the histograms' memory at most): held 900 s
    after its last sighting, and no longer; at least a lead time however short the
    pauses."""
    episode = (0.0, 7200.0, 6600.0, 900.0)
    assert burstiness._live(episode, 7200.0 + 900.0, LEAD_S)
    assert not burstiness._live(episode, 7201.0 + 900.0, LEAD_S)
    # Without a second run it would be held twice its span (the memory's hour, twice).
    assert burstiness._live((0.0, 7200.0, 6600.0, 0.0), 7200.0 + 7200.0, LEAD_S)
    assert burstiness._live((0.0, 7200.0, 6600.0, 1.0), 7200.0 + LEAD_S, LEAD_S)
    assert not burstiness._live((0.0, 7200.0, 6600.0, 1.0), 7201.0 + LEAD_S, LEAD_S)
    # Crowds of 300 s every 1,200 s (20 → 250 requests/s), seen through observe(): held
    # 600 s after the last one; 1,900 s after it, once the lull has outlasted the pauses
    # of about 900 s between them, the crowds' counts lapse (the span rule would hold
    # the episode of 2,700 s for an hour and a half). What stays are the steady traffic's
    # 64 s windows (about 1,363) and those of the crowds' edges in the same count group.
    state = _crowds(burstiness.BurstState(), range(1, 4501), lambda t: t % 1200 < 300 and t > 600)
    assert (
        dict(burstiness.clumps(burstiness.read_clumps(state, 4500.0, 180.0), 0.01, 1.0))[64.0]
        > 10_000
    )
    state = _crowds(state, range(4501, 5801), lambda t: False)
    assert (
        dict(burstiness.clumps(burstiness.read_clumps(state, 5800.0, 180.0), 0.01, 1.0))[64.0]
        < 2_500
    )


def test_a_count_group_counts_only_while_every_smaller_one_does() -> None:
    """A window of 32 requests is also one of 16: a larger group held while a smaller
    lapsed (a clump seen inside a surge that has ended) would leave the large counts alone
    in the histogram and raise its quantile. It lapses with the smaller group."""
    weights = (1.0,) * burstiness.COUNT_BINS
    lapsed = (0.0, 300.0, 0.0, 0.0)  # a surge held until 900 s
    clump = (100.0, 100.0, 100.0, 0.0)  # held as long as remembered
    first_groups = [stop for group, _, stop in burstiness._GROUP_BINS if group <= 1]
    kept = burstiness._live_weights(weights, (clump, clump, lapsed, clump), 5000.0, LEAD_S)
    assert (
        sum(kept) == max(first_groups) and kept[: max(first_groups)] == weights[: max(first_groups)]
    )
    assert sum(burstiness._live_weights(weights, (lapsed, clump), 5000.0, LEAD_S)) == 0.0
    assert burstiness._live_weights(weights, (clump,) * 21, 5000.0, LEAD_S) == weights


def _crowds(
    state: burstiness.BurstState, ticks: range, crowd: Callable[[int], bool]
) -> burstiness.BurstState:
    rng = np.random.default_rng(5)
    for tick in ticks:
        rate = 250.0 if crowd(tick) else 20.0
        state = burstiness.observe(state, float(rng.poisson(rate)), 1.0, float(tick), 300.0, 180.0)
    return state


def test_a_one_off_crowd_is_let_go_and_a_recurring_one_held() -> None:
    """20 requests/s, Poisson, with a crowd of 250/s for 300 s after half an hour: 16 %
    of the hour's requests, longer than the lead time (180 s). Two spans (600 s) after it
    ends the 64 s windows of 16,000 are still held; half an hour after, they are not, and
    the clumps and the rate mix are the steady traffic's (64 s: 1,280 + 2.33·√1,280 ≈
    1,363). A crowd of 60 s every 600 s is held through the lull after its fourth, and a
    crowd of 60 s (shorter than the lead time) seen once is held as long as remembered."""
    once = _crowds(burstiness.BurstState(), range(1, 2701), lambda t: 1800 < t <= 2100)
    assert (
        dict(burstiness.clumps(burstiness.read_clumps(once, 2700.0, 180.0), 0.01, 1.0))[64.0]
        > 10_000
    )
    once = _crowds(once, range(2701, 3901), lambda t: False)
    found = dict(burstiness.clumps(burstiness.read_clumps(once, 3900.0, 180.0), 0.01, 1.0))
    assert 1363 <= found[64.0] <= 1.25 * 1363
    assert (
        max(
            rate
            for rate, _ in burstiness.rate_mix(burstiness.read_clumps(once, 3900.0, 180.0), 1.0)
        )
        < 30.0
    )
    # The decision says so (`surge_released`): the crowd's 16 % of the hour is let go.
    assert burstiness.released(burstiness.read_clumps(once, 3900.0, 180.0), 0.01)
    # A state saved before the episodes were recorded holds its histograms as before,
    # and from its next tick as one episode over the last hour.
    old = dataclasses.replace(once, episodes=())
    assert (
        dict(burstiness.clumps(burstiness.read_clumps(old, 3900.0, 180.0), 0.01, 1.0))[64.0]
        > 10_000
    )
    old = _crowds(old, range(3901, 3902), lambda t: False)
    assert (
        dict(burstiness.clumps(burstiness.read_clumps(old, 3901.0, 180.0), 0.01, 1.0))[64.0]
        > 10_000
    )
    recurring = _crowds(burstiness.BurstState(), range(1, 3001), lambda t: t % 600 < 60 and t > 600)
    assert (
        dict(burstiness.clumps(burstiness.read_clumps(recurring, 3000.0, 180.0), 0.01, 1.0))[64.0]
        > 10_000
    )
    assert not burstiness.released(burstiness.read_clumps(recurring, 3000.0, 180.0), 0.01)
    short = _crowds(burstiness.BurstState(), range(1, 3901), lambda t: 1800 < t <= 1860)
    assert (
        dict(burstiness.clumps(burstiness.read_clumps(short, 3900.0, 180.0), 0.01, 1.0))[64.0]
        > 10_000
    )
    assert not burstiness.released(burstiness.read_clumps(short, 3900.0, 180.0), 0.01)


def test_the_rate_mix_reads_each_requests_local_rate_over_eight_seconds() -> None:
    """Steady 2 requests a tick, with 40 more in one tick every 100 s. An 8 s window that
    holds that tick holds 42 + 7·2 = 56 requests (7/s): the tick's 42 arrive as one ends,
    and so do the 7·2 of the seven ticks after it; the other 92·2 of each 240 arrive as a
    window of 16 (2/s) ends."""
    state = burstiness.BurstState()
    now = 0.0
    for tick in range(1, 1001):
        now = float(tick)
        arrivals = 42.0 if tick % 100 == 50 else 2.0
        state = burstiness.observe(state, arrivals, 1.0, now, 300.0, LEAD_S)
    mix = burstiness.rate_mix(burstiness.read_clumps(state, now, LEAD_S), 1.0)
    assert [rate for rate, _ in mix] == sorted((rate for rate, _ in mix), reverse=True)
    assert sum(share for _, share in mix) == pytest.approx(1.0)
    # (The forgetting weighs recent ticks a little more; count bins are 1.1x wide.)
    high = sum(share for rate, share in mix if rate > 4.0)
    assert high == pytest.approx((42 + 7 * 2) / (42 + 99 * 2), rel=0.05)
    assert max(rate for rate, _ in mix) == pytest.approx(56 / 8, rel=0.1)
    low = [rate for rate, share in mix if rate < 4.0 and share > 0.5]
    assert len(low) == 1 and low[0] == pytest.approx(2.0, rel=0.1)
    assert (
        burstiness.rate_mix(burstiness.read_clumps(burstiness.BurstState(), now, LEAD_S), 1.0) == ()
    )


def test_the_late_share_is_averaged_over_the_local_rate() -> None:
    # A quarter of the requests arrive at 20/s, the rest at 4/s (8/s on average): the
    # mixture is 0.25·late(20) + 0.75·late(4) with the steady formulas at each rate, and
    # the prediction is the larger of it and the formulas at the mean rate.
    inputs = sizing.SizingInputs(8.0, 0.0, 1.0, 0.5, 0.01)
    mixed = dataclasses.replace(inputs, rate_mix=((20.0, 0.25), (4.0, 0.75)))

    def steady(rate_per_s: float, replicas: int) -> float:
        return sizing.predicted_tail(
            view(), dataclasses.replace(inputs, arrival_rate_per_s=rate_per_s), replicas
        )[0]

    for replicas in (3, 4, 6):
        expected = 0.25 * steady(20.0, replicas) + 0.75 * steady(4.0, replicas)
        assert expected > steady(8.0, replicas)  # the waits are convex in the rate
        assert sizing.predicted_tail(view(), mixed, replicas)[0] == pytest.approx(expected)
    # The count is the smallest meeting the target with the mixture: more than at the mean.
    count = sizing.size(view(), mixed, 64).replicas
    assert count > sizing.size(view(), inputs, 64).replicas
    assert 0.25 * steady(20.0, count) + 0.75 * steady(4.0, count) <= 0.01
    assert 0.25 * steady(20.0, count - 1) + 0.75 * steady(4.0, count - 1) > 0.01
    assert sizing.size(view(), mixed, 64).binding == "burst"


def test_clump_quantile_interpolates_within_its_bin() -> None:
    # All weight in one bin (b^10 to b^11], b = 1.1: the quantile with 1 % allowed above
    # sits 1 % of the way down from the top edge, in log terms.
    base = burstiness._COUNT_BASE
    weights = [0.0] * burstiness.COUNT_BINS
    weights[11] = 100.0
    got = burstiness._count_quantile(tuple(weights), 1.0)
    assert got == pytest.approx(base ** (11 - 0.01), rel=1e-9)
    assert burstiness._count_quantile(tuple(weights), 0.0) == pytest.approx(base**11)
    assert burstiness._count_quantile((0.0,) * burstiness.COUNT_BINS, 1.0) == 1.0


def test_the_clump_quantile_extrapolates_a_thin_tail_exponentially() -> None:
    # 90 % of the weight in bin 5, 10 % in bin 30 (b = 1.1): the median's bin ends at
    # u = b^5; above it only bin 30, of middle m = b^29.5, whose 160 requests came in
    # n = 160 / m ≈ 9.5 windows. With 1 % allowed above:
    # u + (m − u)·(1 + 1/√n)·ln(10 % / 1 %), beyond the plain quantile b^29.9 of what
    # was seen.
    base = burstiness._COUNT_BASE
    weights = [0.0] * burstiness.COUNT_BINS
    weights[5], weights[30] = 1440.0, 160.0
    u, m = base**5, base**29.5
    got = burstiness._clump_quantile(tuple(weights), 0.01)
    expected = u + (m - u) * (1.0 + 1.0 / math.sqrt(160.0 / m)) * math.log(10.0)
    assert got == pytest.approx(expected, rel=1e-9)
    assert got > burstiness._count_quantile(tuple(weights), 16.0) == pytest.approx(base**29.9)
    # The same shape seen in four times the clumps: the excess nearer its estimate.
    more = burstiness._clump_quantile(tuple(4.0 * w for w in weights), 0.01)
    assert more == pytest.approx(
        u + (m - u) * (1.0 + 0.5 / math.sqrt(160.0 / m)) * math.log(10.0), rel=1e-9
    )
    assert u + (m - u) * math.log(10.0) < more < got
    # Allowed above more than lies above the median: the plain quantile.
    assert burstiness._clump_quantile(tuple(weights), 0.2) == pytest.approx(
        burstiness._count_quantile(tuple(weights), 320.0)
    )


def test_poisson_clumps_read_close_to_their_quantile() -> None:
    # 30 requests per tick, Poisson: the 1 % quantile of a tick's count is about 43, of
    # 64 ticks' about 64·30 + 2.33·√1920 ≈ 2,022: bins 10 % apart read them within 25 %
    # and 10 %.
    rng = np.random.default_rng(3)
    state = burstiness.BurstState()
    for tick in range(1, 1801):
        state = burstiness.observe(state, float(rng.poisson(30)), 1.0, float(tick), 300.0, LEAD_S)
    found = dict(burstiness.clumps(burstiness.read_clumps(state, 1800.0, LEAD_S), 0.01, 1.0))
    assert 43 <= found[1.0] <= 1.25 * 43
    assert 2022 <= found[64.0] <= 1.1 * 2022


def test_halfin_whitt_limits() -> None:
    assert sizing._halfin_whitt(0.0) == 1.0
    assert sizing._halfin_whitt(1.0) == pytest.approx(0.2234, abs=1e-3)
    assert sizing._halfin_whitt(9.0) == 0.0


def test_burstiness_reads_poisson_near_one_and_clumps_high() -> None:
    rng = np.random.default_rng(1)
    smooth = burstiness.BurstState()
    clumped = burstiness.BurstState()
    for tick in range(1, 1801):
        smooth = burstiness.observe(smooth, float(rng.poisson(30)), 1.0, float(tick), 300.0, LEAD_S)
        # The same mean, all of it in one second of every 30.
        clumped = burstiness.observe(
            clumped, 900.0 if tick % 30 == 0 else 0.0, 1.0, float(tick), 300.0, LEAD_S
        )
    assert burstiness.peak_to_mean(smooth, 0.01, 30.0, 1.0, 1800.0) < 1.6
    assert burstiness.peak_to_mean(clumped, 0.01, 30.0, 1.0, 1800.0) > 15


def test_burstiness_reads_a_step_up_in_level_as_a_step_not_a_burst() -> None:
    """A flash crowd: 0.3 requests/s for ten minutes, then 20/s, Poisson at both levels.
    The onset is a change of level, which the forecast follows; counted against the
    smoothed level alone, which lags the step, the onset's ticks read up to 60x the mean,
    the quantile 6x, and that ratio times the new level sized for 6x the crowd's ticks.
    Read against a window centred on the tick as well, the step is about 2 at its onset
    and the crowd itself Poisson."""
    rng = np.random.default_rng(3)
    state = burstiness.BurstState()
    for tick in range(1, 1801):
        rate = 0.3 if tick <= 600 else 20.0
        state = burstiness.observe(state, float(rng.poisson(rate)), 1.0, float(tick), 60.0, LEAD_S)
    ratio = burstiness.peak_to_mean(state, 0.01, 20.0, 1.0, 1800.0)
    assert ratio < 3.0  # the bins are 1.25x apart: 2.44 here, 5.96 counted against the old level
    # Clumps in a near-empty window still read high: the on-off case is not smoothed away.
    quiet = burstiness.BurstState()
    for tick in range(1, 1801):
        arrivals = 40.0 if tick % 120 == 0 else float(rng.poisson(0.2))
        quiet = burstiness.observe(quiet, arrivals, 1.0, float(tick), 60.0, LEAD_S)
    assert burstiness.peak_to_mean(quiet, 0.01, 0.5, 1.0, 1800.0) > 20


def poisson_on_cluster(
    truth: ReplicaModel, replicas: int, rate_per_s: float, requests: int, seed: int
) -> tuple[Cluster, SimSensor, RequestBatch]:
    """Poisson arrivals (prompts 200-1800 tokens, outputs 10-90) for a simulated cluster of
    `replicas`, and the sensor that watches it."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate_per_s, requests))
    batch = RequestBatch(
        arrivals, rng.integers(200, 1800, arrivals.size), rng.integers(10, 90, arrivals.size)
    )
    cluster = Cluster(truth, initial_replicas=replicas)
    return cluster, SimSensor(cluster, "llm", 30.0, 1.0), batch


@pytest.mark.parametrize("prior_factor", [0.5, 2.0])
def test_a_wrong_prior_is_corrected_online(prior_factor: float) -> None:
    truth = ReplicaModel(max_ongoing_requests=32, prefill_tokens_per_s=16_000.0)
    cfg = ReplicaModelConfig(
        prefill_tokens_per_s=16_000.0 * prior_factor,
        tpot_batch1_s=0.030 * prior_factor,
        tpot_full_batch_s=0.060 * prior_factor,
        prompt_tokens=2000 * prior_factor,
        output_tokens=100 * prior_factor,
    )
    cluster, sensor, batch = poisson_on_cluster(truth, 3, 20.0, 6000, seed=0)
    arrivals = batch.arrival_s
    state = replica_model.ReplicaModelState()

    def on_tick(now_s: float) -> None:
        nonlocal state
        state = replica_model.learn(state, sensor.observe(now_s), cfg, now_s, 1.0, 5.0)

    cluster.run([batch], 1.0, float(arrivals[-1]), on_tick)
    learned = replica_model.view(state, cfg, float(arrivals[-1]), 1.0)
    assert learned.slots == 32
    assert learned.prefill_tokens_per_s == pytest.approx(16_000.0, rel=0.01)
    assert learned.prompt_tokens_mean == pytest.approx(1000.0, rel=0.05)
    assert learned.output_tokens_mean == pytest.approx(50.0, rel=0.1)
    # Where the load put the batch, the line is right; elsewhere the prior's slope fades.
    batch = 6.0
    assert learned.tpot_s(batch) == pytest.approx(truth.tpot_s(int(batch)), rel=0.2)
    # The prompt mix from the histogram: 200-1800 tokens, in the 100-200 ... 1000-2000 buckets.
    assert sum(share for _, _, share in learned.prompt_mix) == pytest.approx(1.0)
    assert all(high >= 200 and low <= 2000 for low, high, _ in learned.prompt_mix)
    prefill = next(e for e in learned.estimates if e.name == "prefill_tokens_per_s")
    assert prefill.samples > 100 and prefill.age_s is not None and prefill.age_s < 5


def waits_over(bad: float, total: float = 100.0) -> Histogram:
    """`total` waits, `bad` of them 1-5 s (over a 0.5 s budget), the rest under 0.1 s."""
    return Histogram((0.1, 0.5, 1.0, 5.0), (total - bad, 0.0, 0.0, bad, 0.0), 0.0)


def run_guard(bad: float, predicted_share: float, ticks: int) -> slo_guard.GuardVerdict:
    state = slo_guard.GuardState()
    for tick in range(1, ticks + 1):
        counts = slo_guard.waits_over_budget(waits_over(bad), 0.5)
        state, verdict = slo_guard.update(
            state, counts, predicted_share, 0.01, 300.0, 3600.0, float(tick)
        )
    return verdict


def test_calibration_ignores_overloads_where_the_model_predicts_no_tail() -> None:
    # A cold start: every request late and the model saying 100 %; then the model's 1 %
    # tail is right. The overload says nothing about the tail: the calibration stays 1.
    state = slo_guard.GuardState()
    for tick in range(1, 301):
        counts = slo_guard.waits_over_budget(waits_over(100.0 if tick <= 100 else 1.0), 0.5)
        predicted = 1.0 if tick <= 100 else 0.01
        state, verdict = slo_guard.update(state, counts, predicted, 0.01, 300.0, 3600.0, tick)
    # Only the 200 right ticks calibrate: seen = predicted in both windows, so each ratio
    # is 1 plus the one-sigma margin on what was seen, and the nearer 1 (the slow window,
    # more evidence) is used; the overload's 10,000 misses would have made it 16.
    seen, predicted = state.calibrating.decayed(300.0, 3600.0)
    assert seen == pytest.approx(predicted)
    slow = _ratio_of((seen, predicted), state.clumped.decayed(300.0, 3600.0))
    assert verdict.calibration == pytest.approx(slow) and 1.0 < slow < 1.1


def test_calibration_moves_on_what_both_windows_agree_on() -> None:
    # The model right (1 %) but for one minute of every wait over budget: the slow window
    # still remembers that minute 30 minutes on, the fast one has forgotten it, so
    # the headroom is back where the model puts it.
    state = slo_guard.GuardState()
    verdicts = []
    for tick in range(1, 2161):
        bad = 100.0 if 300 < tick <= 360 else 1.0
        counts = slo_guard.waits_over_budget(waits_over(bad), 0.5)
        state, verdict = slo_guard.update(state, counts, 0.01, 0.01, 300.0, 3600.0, tick)
        verdicts.append(verdict)
    assert verdicts[359].calibration > 4.0  # during it, both windows see it
    slow = _ratio_of(
        state.calibrating.decayed(2160.0, 3600.0), state.clumped.decayed(2160.0, 3600.0)
    )
    fast = _ratio_of(
        state.calibrating_fast.decayed(2160.0, 300.0), state.clumped_fast.decayed(2160.0, 300.0)
    )
    assert slow > 2.0 and fast < 1.5
    assert verdicts[-1].calibration == pytest.approx(fast) and not verdicts[-1].mismatch


def test_a_fast_window_that_tests_nothing_leaves_the_slow_calibration_standing() -> None:
    # The model pessimistic for 1000 ticks (4 % predicted, 0.5 % seen), then 2400 ticks at
    # an ample count: nothing predicted, nothing seen. The fast window has forgotten the
    # evidence (e^(−2400/300) of it: 0.05 misses seen and 0.39 predicted, against its 3
    # pseudo-events), so it has little say (twice its share of evidence, 2 · 0.44 / 3.44),
    # and the slow window's relaxation stands rather than the pseudo-events' 1.
    state = slo_guard.GuardState()
    for tick in range(1, 3401):
        bad, predicted = (0.5, 0.04) if tick <= 1000 else (0.0, 0.0)
        counts = slo_guard.waits_over_budget(waits_over(bad), 0.5)
        state, verdict = slo_guard.update(state, counts, predicted, 0.01, 300.0, 3600.0, tick)

    def remembered(window_s: float) -> float:
        return math.exp(-2400.0 / window_s) * sum(math.exp(-k / window_s) for k in range(1000))

    fast_seen, fast_predicted = 0.5 * remembered(300.0), 0.04 * 100.0 * remembered(300.0)
    assert fast_seen + fast_predicted < 3.0
    # The misses came one a tick (0.5 each, a clump size under 1 reads 1).
    slow_sum = remembered(3600.0)
    slow = (0.5 * slow_sum + math.sqrt(0.5 * slow_sum) + 3.0) / (4.0 * slow_sum + 3.0)
    assert slow < 0.25
    # What the fast window alone reads is its pseudo-events' ratio, near 1: as the nearer 1
    # of two leaning the same way it would have sized for the full tail again.
    fast = _ratio_of(
        state.calibrating_fast.decayed(3400.0, 300.0), state.clumped_fast.decayed(3400.0, 300.0)
    )
    assert fast == pytest.approx((fast_seen + math.sqrt(fast_seen) + 3.0) / (fast_predicted + 3.0))
    assert fast > 0.95
    # It has its say by its evidence only: slow^(1 − s) · fast^s, s = 2w.
    say = 2.0 * (fast_seen + fast_predicted) / (fast_seen + fast_predicted + 3.0)
    assert say < 0.3
    assert verdict.calibration == pytest.approx(slow ** (1 - say) * fast**say, rel=1e-6)
    assert verdict.calibration < 0.25  # the sizing still aims at ε / 0.25 or more, not at ε
    # A relaxation the slow window's own evidence does not carry is not kept: 100 ticks at
    # 0.02 misses predicted and none seen, then 600 quiet ones, leave the slow window
    # under its pseudo-events too (0.02·Σ e^(−k/3600) ≈ 1.67), so both windows are drawn
    # to 1 and the nearer 1 is used, as before.
    thin = slo_guard.GuardState()
    for tick in range(1, 701):
        counts = slo_guard.waits_over_budget(waits_over(0.0), 0.5)
        share = 0.0002 if tick <= 100 else 0.0
        thin, verdict = slo_guard.update(thin, counts, share, 0.01, 300.0, 3600.0, tick)
    # Nothing seen: a window's ratio is 3 / (predicted + 3).
    thin_slow = 3.0 / (thin.calibrating.decayed(700.0, 3600.0)[1] + 3.0)
    thin_fast = 3.0 / (thin.calibrating_fast.decayed(700.0, 300.0)[1] + 3.0)
    assert thin_slow < 0.7 < thin_fast < 1.0
    assert verdict.calibration == pytest.approx(thin_fast)


def test_a_relaxation_gives_way_to_the_fast_window_by_its_evidence() -> None:
    # slow^(1 − w) · fast^w, the fast reading held within [slow, 1] (hand-computed).
    assert slo_guard._relaxed(0.2, 0.8, 0.5) == pytest.approx(0.4)
    assert slo_guard._relaxed(0.2, 0.8, 0.0) == pytest.approx(0.2)
    assert slo_guard._relaxed(0.2, 0.8, 1.0) == pytest.approx(0.8)
    # A fast window reading a tightening pulls toward 1, not past it.
    assert slo_guard._relaxed(0.2, 3.0, 0.5) == pytest.approx(math.sqrt(0.2))
    # One more relaxed than the slow window adds nothing.
    assert slo_guard._relaxed(0.2, 0.1, 0.9) == pytest.approx(0.2)
    # The weight: evidence (seen + predicted) over evidence plus 3 pseudo-events of the
    # misses' clump size (here 1: 4 misses, one a tick, Σ bad² = 4); the say, twice that,
    # at most 1 (full from the test threshold, evidence = pseudo-events).
    assert slo_guard._weight((4.0, 8.0), (4.0,)) == pytest.approx(12.0 / 15.0)
    assert slo_guard._say((4.0, 8.0), (4.0,)) == 1.0
    assert slo_guard._say((0.5, 0.5), (0.5,)) == pytest.approx(2.0 * 1.0 / 4.0)
    assert slo_guard._weight((0.0, 0.0), (0.0,)) == 0.0


def test_the_calibration_does_not_jump_as_the_fast_window_becomes_tested() -> None:
    # The fast window's evidence depends on the count: at an ample one it predicts and
    # sees few misses; at a tight one, many. A relaxation held in full below the test
    # threshold and swapped for the fast window's pseudo-event-laden reading above it made
    # the count a limit cycle. Across the threshold (3 pseudo-events) it now moves by
    # little: the slow window at 0.2, the fast window's misses at a quarter of prediction.
    def calibration(fast_predicted: float) -> float:
        fast_seen = 0.25 * fast_predicted
        fast = (fast_seen + math.sqrt(fast_seen) + 3.0) / (fast_predicted + 3.0)
        say = slo_guard._say((fast_seen, fast_predicted), (fast_seen,))
        return slo_guard._relaxed(0.2, fast, say)

    below, above = calibration(2.39), calibration(2.41)  # evidence 2.99 and 3.01
    assert abs(above - below) < 0.01
    assert 0.2 < below < 0.9
    # With little evidence the relaxation stands nearly whole.
    assert calibration(0.2) < 0.3


def test_a_tightening_ends_when_its_misses_leave_the_fast_window() -> None:
    # The model optimistic: one miss a tick where it predicts none, for 300 ticks; then
    # 2400 quiet ticks. The slow window still reads well over 1; the fast window, with
    # nothing seen or predicted, reads its pseudo-events' value near 1, and as both lean
    # the same way the nearer 1 is used: the tightening ends, as a clump's misses leave.
    state = slo_guard.GuardState()
    for tick in range(1, 2701):
        counts = slo_guard.waits_over_budget(waits_over(1.0 if tick <= 300 else 0.0), 0.5)
        state, verdict = slo_guard.update(state, counts, 0.0, 0.01, 300.0, 3600.0, tick)
    slow = _ratio_of(
        state.calibrating.decayed(2700.0, 3600.0), state.clumped.decayed(2700.0, 3600.0)
    )
    fast = _ratio_of(
        state.calibrating_fast.decayed(2700.0, 300.0), state.clumped_fast.decayed(2700.0, 300.0)
    )
    assert slow > 10.0 and 1.0 < fast < 1.15
    assert verdict.calibration == pytest.approx(fast)


def _ratio_of(window: tuple[float, ...], squares: tuple[float, ...]) -> float:
    seen, predicted = window
    clump = max(1.0, squares[0] / seen)
    pseudo = 3.0 * clump  # 3 pseudo-events of the misses' clump size
    # The misses seen at one standard deviation over their number.
    return (seen + math.sqrt(clump * seen) + pseudo) / (predicted + pseudo)


def test_one_clump_of_misses_weighs_as_one_piece_of_evidence() -> None:
    # The model predicts no misses; twelve are seen. One a tick for twelve ticks: twelve
    # pieces of evidence, (12 + √12 + 3) / (0 + 3). All twelve in one tick (a burst): the
    # clump size is 144 / 12 = 12, so the 3 pseudo-events weigh 36 and the one-sigma margin
    # is √(12·12): (12 + 12 + 36) / 36.
    def calibration(bad_per_tick: list[float]) -> float:
        state = slo_guard.GuardState()
        for tick, bad in enumerate(bad_per_tick, start=1):
            counts = slo_guard.waits_over_budget(waits_over(bad), 0.5)
            state, verdict = slo_guard.update(state, counts, 0.0, 0.01, 1e9, 1e9, float(tick))
        return verdict.calibration

    assert calibration([1.0] * 12) == pytest.approx((15.0 + math.sqrt(12.0)) / 3.0, rel=1e-6)
    assert calibration([12.0] + [0.0] * 11) == pytest.approx(60.0 / 36.0, rel=1e-6)


def _bursts(clumped: bool) -> burstiness.BurstState:
    """Half an hour of 0.5 requests/s: evenly, or all of each minute's in one second."""
    burst = burstiness.BurstState()
    for tick in range(1, 1801):
        arrivals = (30.0 if tick % 60 == 0 else 0.0) if clumped else 0.5
        burst = burstiness.observe(burst, arrivals, 1.0, float(tick), 300.0, LEAD_S)
    return burst


@pytest.mark.parametrize("clumped", [False, True])
def test_misses_in_bursts_that_do_not_fit_the_running_count_do_not_calibrate(
    clumped: bool,
) -> None:
    """The calibration scales the steady tail. Waits over budget while the bursts measured
    do not fit the count running are the bursts' (the sizing's burst term answers them):
    like an overload, they are no evidence that the tail is heavier than modelled."""
    from autoscalerd.model import Observation, Reading

    cfg = DeploymentConfig(name="llm", slo={"ttft_s": 1.0, "queue_wait_s": 0.5})  # type: ignore[arg-type]
    state = initial_state(cfg, 1800.0, 1).with_(burst=_bursts(clumped))
    for now_s in (1801.0, 1802.0, 1803.0):
        obs = Observation(
            "llm",
            now_s,
            arrival_rate_per_s=Reading(0.5, now_s),
            running_replicas=Reading(1.0, now_s),
            starting_replicas=Reading(0.0, now_s),
            queue_wait_histogram=Histogram(
                (0.1, 0.5, 1.0, 5.0), (50.0, 0.0, 0.0, 50.0, 0.0), now_s
            ),
        )
        _, state = decide(obs, state, cfg, now_s)
    seen, predicted = state.guard.calibrating.values
    if clumped:
        # 30 requests in a second onto one replica of the prior's 5 slots: they do not fit.
        assert (seen, predicted) == (0.0, 0.0)
    else:
        assert seen > 0 and predicted > 0
    assert state.guard.fast.values[1] > 0  # the misses count against the budget either way


def test_a_window_without_requests_burns_nothing_now() -> None:
    """After a burst of misses the traffic stops: the fast window blocks scale-down while
    it still holds recent requests, and stops once a whole window passed without one (the
    forgotten sums keep their ratio when nothing comes; a sliding window reads 0/0)."""
    state = slo_guard.GuardState()
    for tick in range(1, 101):
        counts = slo_guard.waits_over_budget(waits_over(50.0), 0.5)
        state, verdict = slo_guard.update(state, counts, None, 0.01, 300.0, 3600.0, tick)
    assert verdict.blocks_scale_down
    # No request for 299 s: the window still holds the burst.
    state, verdict = slo_guard.update(state, None, None, 0.01, 300.0, 3600.0, 399.0)
    assert verdict.blocks_scale_down and verdict.burn_fast == pytest.approx(50.0)
    # 301 s: nothing counted for a whole fast window; the slow one still remembers.
    state, verdict = slo_guard.update(state, None, None, 0.01, 300.0, 3600.0, 401.0)
    assert verdict.burn_fast is None and not verdict.blocks_scale_down
    assert verdict.burn_slow == pytest.approx(50.0)


def test_controllable_misses_are_ttft_misses_less_prompts_too_long_for_the_slo() -> None:
    # 100 first tokens, 30 over a 1 s TTFT; 20 prompts over 16,000 tokens (1 s of prefill
    # at 16,000 tokens/s): 10 misses were the wait's, out of the 80 requests that could
    # meet the SLO at all.
    ttfts = Histogram((0.5, 1.0, 5.0), (50.0, 20.0, 30.0, 0.0), 0.0)
    prompts = Histogram((1000.0, 16_000.0, 100_000.0), (40.0, 40.0, 20.0, 0.0), 0.0)
    assert slo_guard.controllable_misses(ttfts, prompts, 1.0, 16_000.0) == (80.0, 10.0)
    # A counter reset (a negative count) is no data, not a negative miss.
    broken = Histogram((0.5, 1.0, 5.0), (50.0, -20.0, 30.0, 0.0), 0.0)
    assert slo_guard.controllable_misses(broken, prompts, 1.0, 16_000.0) is None
    assert slo_guard.controllable_misses(ttfts, prompts, None, 16_000.0) is None


def test_late_share_gives_each_prompt_its_own_wait_budget() -> None:
    # A wait tail of 0.5·exp(−2t). Half the prompts take 0-0.5 s to prefill (uniform),
    # half 1-2 s (hopeless at a 1 s SLO, and not counted): the late share of the
    # attainable half is the mean of 0.5·exp(−2t) for budgets t uniform in [0.5, 1],
    # i.e. 0.5·(e⁻¹ − e⁻²)/(2·0.5).
    tail = sizing.WaitTail(((0.5, 2.0),))
    model = view(prefill_tokens_per_s=1000.0, prompt_mix=((0.0, 500.0, 0.5), (1000.0, 2000.0, 0.5)))
    inputs = sizing.SizingInputs(1.0, 1.0, 1.0, 0.5, 0.01, ttft_s=1.0)
    expected = 0.5 * (math.exp(-1.0) - math.exp(-2.0)) / (2.0 * 0.5)
    assert sizing._late_share(tail, model, inputs, 1.0) == pytest.approx(expected, rel=1e-12)
    # Without a mix, everyone gets the wait budget: 0.5·exp(−1).
    plain = view(prefill_tokens_per_s=1000.0)
    assert sizing._late_share(tail, plain, inputs, 1.0) == pytest.approx(0.5 * math.exp(-1.0))


def test_guard_calibrates_the_model_by_observed_over_predicted_bad_requests() -> None:
    # The model right: 1 % predicted, 1 % seen; the budget burns at exactly 1.
    # The misses seen count at one sigma over their number: a window's ratio is
    # (S + √S + 3) / (S + 3) with S = Σ e^(−k/window); both above 1, the nearer 1 (the
    # slow window, more evidence) is used.
    right = run_guard(bad=1.0, predicted_share=0.01, ticks=1000)
    slow_sum = sum(math.exp(-k / 3600.0) for k in range(1000))
    assert right.calibration == pytest.approx(
        (slow_sum + math.sqrt(slow_sum) + 3.0) / (slow_sum + 3.0), rel=1e-6
    )
    assert right.burn_fast == pytest.approx(1.0) and not right.mismatch

    # The model pessimistic (4 % predicted, 0.5 % seen): both sums forget alike, so after
    # 1000 ticks a window's ratio is (0.5·S + √(0.5·S) + 3) / (4·S + 3) with
    # S = Σ e^(−k/window).
    # Both windows below 1: the one nearer 1, the fast one (fewer events, the pseudo-events
    # weigh more; its evidence, 4.5·S, is far over its 3 pseudo-events: its full say).
    def ratio(window_s: float) -> float:
        decayed = sum(math.exp(-k / window_s) for k in range(1000))
        return (0.5 * decayed + math.sqrt(0.5 * decayed) + 3.0) / (4.0 * decayed + 3.0)

    pessimistic = run_guard(bad=0.5, predicted_share=0.04, ticks=1000)
    assert ratio(3600.0) < ratio(300.0) < 1.0
    assert pessimistic.calibration == pytest.approx(ratio(300.0), rel=1e-6)
    assert not pessimistic.blocks_scale_down
    # Every wait over budget where the model saw 1 %: bounded, a mismatch, no scale-down.
    fire = run_guard(bad=100.0, predicted_share=0.01, ticks=200)
    assert fire.calibration == slo_guard.CALIBRATION_MAX and fire.mismatch
    assert fire.burn_fast == pytest.approx(100.0, rel=1e-6) and fire.blocks_scale_down
    # A default budget of TTFT less the mean prefill, never under half the TTFT.
    assert slo_guard.wait_budget_s(None, 1.0, 0.128) == pytest.approx(0.872)
    assert slo_guard.wait_budget_s(None, 1.0, 0.9) == 0.5


def test_every_decision_carries_the_models_estimates_with_samples_and_age() -> None:
    cfg = DeploymentConfig(name="llm", slo={"ttft_s": 1.0})  # type: ignore[arg-type]
    from autoscalerd.model import Observation, Reading

    obs = Observation(
        "llm", 1.0, arrival_rate_per_s=Reading(2.0, 1.0), ongoing_requests=Reading(1.0, 1.0)
    )
    decision, _ = decide(obs, initial_state(cfg, 0.0, 1), cfg, 1.0)
    names = {name for name, *_ in decision.replica_model}
    assert {"slots", "prefill_tokens_per_s", "tpot_batch1_s", "prompt_tokens_mean"} <= names
    assert decision.as_dict()["replica_model"]["slots"]["samples"] == 0  # still the prior
    assert decision.wait_budget_s is not None and decision.tail_share == pytest.approx(0.01)


def test_tpot_prior_lends_its_shape_not_its_level() -> None:
    # Measured 10 ms per token at a batch of 5, always; the prior (30 ms at 1, 60 ms at a
    # full batch of 32) says a full batch is twice batch 1. The fit keeps the data's level
    # and the prior's shape: every point lies on tpot = c·(1 + (b − 1)/31) with
    # c = 0.01 / (1 + 4/31), so tpot(32) = 2c, not the prior's 60 ms.
    cfg = ReplicaModelConfig(tpot_batch1_s=0.03, tpot_full_batch_s=0.06)
    x = 4.0
    sums = (100.0, 100.0 * x, 100.0 * 0.01, 100.0 * x * x, 100.0 * x * 0.01)
    batch1_s, slope_s = replica_model._fit_tpot(sums, cfg, 32)
    c = 0.01 / (1.0 + x / 31.0)
    assert batch1_s == pytest.approx(c, rel=1e-9)
    assert batch1_s + slope_s * 31 == pytest.approx(2 * c, rel=1e-9)
    # No data: the prior itself.
    assert replica_model._fit_tpot((0.0,) * 5, cfg, 32) == pytest.approx((0.03, 0.03 / 31))


def test_late_waits_hold_each_wait_against_its_own_requests_budget() -> None:
    # Waits: 50 under 0.1 s, 50 in 0.1-0.5 s. Prompts: half short ones (0-1,000 tokens,
    # prefill 0-0.1 s at 10,000 tokens/s, budgets 0.9-1 s: no wait reaches them) and half
    # of 5,000-20,000 tokens. Of those, the 5,000-10,000 part (prefill 0.5-1 s, budgets
    # 0.5-0 s) is attainable and the rest is not. For a budget b in [0, 0.5], the share of
    # waits over b is 1 - 0.5·b/0.1 for b < 0.1, else 0.5·(0.5 - b)/0.4.
    waits = Histogram((0.1, 0.5), (50.0, 50.0, 0.0), 0.0)
    prompts = ((0.0, 1000.0, 0.5), (5000.0, 20_000.0, 0.5))  # the replica model's mix
    requests, late = slo_guard.late_waits(waits, prompts, 1.0, 10_000.0) or (0.0, 0.0)
    # Attainable: 1/2 + 1/2·(10,000 - 5,000)/15,000 = 2/3 of the prompts, i.e. 2/3 of the
    # 100 waits counted.
    assert requests == pytest.approx(100.0 * (100.0 + 100.0 / 3.0) / 200.0)

    def over(budget_s: float) -> float:
        return 1.0 - 5.0 * budget_s if budget_s < 0.1 else 0.5 * (0.5 - budget_s) / 0.4

    # Uniform buckets (no touching neighbour) cut in 3 equal pieces of 3 midpoints each:
    # 9 midpoints over the bucket.
    points = [(k + 0.5) / 9 for k in range(9)]
    mean_over = sum(over(0.5 * (1.0 - x)) for x in points) / 9
    expected = (100.0 / 3.0) * mean_over * 100.0 / 200.0
    assert late == pytest.approx(expected, rel=1e-9)
    # Prompts all beyond the SLO: nothing attainable, nothing late.
    hopeless = ((10_000.0, 50_000.0, 1.0),)
    assert slo_guard.late_waits(waits, hopeless, 1.0, 10_000.0) == (0.0, 0.0)
    assert slo_guard.late_waits(waits, (), 1.0, 10_000.0) is None
    assert slo_guard.late_waits(None, prompts, 1.0, 10_000.0) is None
    assert slo_guard.late_waits(waits, prompts, None, 10_000.0) is None


def test_the_guards_bisected_count_above_reads_what_the_histogram_does() -> None:
    # slo_guard reads a hundred budgets a tick from one wait histogram, skipping the
    # buckets below each by bisection: the same counts as Histogram.count_above to the
    # last bit, at every kind of limit (0, negative, on a bound, inside a bucket, past the
    # last bound) and for whole or fractional counts, and the histogram's own reading
    # where the bounds do not ascend.
    rng = np.random.default_rng(7)
    for case in range(200):
        bounds = tuple(float(b) for b in np.cumsum(rng.uniform(0.01, 2.0, rng.integers(0, 9))))
        size = len(bounds) + 1
        raw = rng.integers(0, 50, size) if case % 2 == 0 else rng.uniform(0, 50, size)
        waits = Histogram(bounds, tuple(float(c) for c in raw), 0.0)
        reader = slo_guard._count_above(waits)
        limits = [-1.0, 0.0, *bounds, *(rng.uniform(0.0, 1.2 * (bounds[-1] if bounds else 1.0), 8))]
        for limit in limits:
            assert reader(float(limit)) == waits.count_above(float(limit))
    unsorted = Histogram((0.5, 0.1, 1.0), (1.0, 2.0, 3.0, 4.0), 0.0)
    assert slo_guard._count_above(unsorted) == unsorted.count_above


def test_the_two_term_late_share_is_the_tails_own_arithmetic() -> None:
    # sizing._late_two_terms writes WaitTail.above_uniform out over the budget pieces and
    # reuses each shared edge's exponentials: the same floats, to the last bit, including
    # rates so small that a piece is read at its lower edge and tails that pass 1.
    rng = np.random.default_rng(11)
    for _ in range(200):
        lows = np.sort(rng.uniform(0.0, 20_000.0, 4))
        shares = rng.dirichlet(np.ones(3))
        mix = (
            *((float(lows[k]), float(lows[k + 1]), float(shares[k])) for k in range(3)),
            (float(lows[-1]), math.inf, 0.05),
        )
        budgets = prompt_budgets.attainable_budgets(mix, 1.0, float(rng.uniform(5_000, 50_000)))
        terms = tuple(
            (float(rng.uniform(0.0, 1.5)), float(10.0 ** rng.uniform(-12.0, 2.0))) for _ in range(2)
        )
        tail = sizing.WaitTail(terms)
        attainable = late = 0.0
        for part, low_s, high_s in budgets:
            attainable += part
            late += part * tail.above_uniform(low_s, high_s)
        assert sizing._late_two_terms(terms, budgets) == (attainable, late)


def test_the_guard_counts_waits_before_ttft_less_prefill() -> None:
    # A long-prompt tick: every TTFT is over 1 s, and the prompt histogram puts 40 % of
    # its 10,000-20,000 bucket below 16,000 tokens (1 s at 16,000 tokens/s). From TTFT,
    # those read as misses replicas could fix; the waits say no request waited at all.
    cfg = DeploymentConfig.model_validate(
        {"name": "llm/a", "slo": {"ttft_s": 1.0}, "replica_model": {"prefill_tokens_per_s": 16_000}}
    )
    from autoscalerd.model import Observation, Reading

    def obs(now_s: float, waits: bool) -> Observation:
        return Observation(
            "llm/a",
            now_s,
            arrival_rate_per_s=Reading(10.0, now_s),
            # 160,000 prompt tokens/s over 10 s of prefill per second: 16,000 tokens/s.
            prompt_token_rate_per_s=Reading(160_000.0, now_s),
            prefill_seconds_per_s=Reading(10.0, now_s),
            running_replicas=Reading(4.0, now_s),
            starting_replicas=Reading(0.0, now_s),
            ttft_histogram=Histogram((1.0, 2.0), (0.0, 10.0, 0.0), now_s),
            prompt_tokens_histogram=Histogram((10_000.0, 20_000.0), (0.0, 10.0, 0.0), now_s),
            queue_wait_histogram=Histogram((0.001, 1.0), (10.0, 0.0, 0.0), now_s)
            if waits
            else None,
        )

    for waits, burning in ((True, False), (False, True)):
        state = initial_state(cfg, 0.0, 4)
        decision = None
        for tick in range(1, 40):
            decision, state = decide(obs(float(tick), waits), state, cfg, float(tick))
        assert decision is not None
        assert ((decision.burn_rate_fast or 0.0) > 1.0) is burning


@pytest.mark.parametrize("slowness", [1.0, 3.0])
def test_the_path_stretch_is_littles_law_over_the_engines_timing(slowness: float) -> None:
    """A serving path that holds each request `slowness` times as long as the engine's
    own timing says (a busy host's proxy and replica process) reads as that stretch, and
    every slot time the sizing uses grows by it; the engine's own truth reads one."""
    truth = ReplicaModel(max_ongoing_requests=16, prefill_tokens_per_s=20_000.0)
    cfg = ReplicaModelConfig(prefill_tokens_per_s=20_000.0, prompt_tokens=1000, output_tokens=50)
    cluster, sensor, batch = poisson_on_cluster(truth, 2, 12.0, 4000, seed=1)
    arrivals = batch.arrival_s
    state = replica_model.ReplicaModelState()

    def on_tick(now_s: float) -> None:
        nonlocal state
        obs = sensor.observe(now_s)
        ongoing = obs.ongoing_requests
        assert ongoing is not None
        obs = dataclasses.replace(
            obs, ongoing_requests=dataclasses.replace(ongoing, value=ongoing.value * slowness)
        )
        state = replica_model.learn(state, obs, cfg, now_s, 1.0, 5.0)
        engine = dataclasses.replace(replica_model.view(state, cfg, now_s, 1.0), path_stretch=1.0)
        state = replica_model.learn_stretch(
            state,
            obs,
            lambda lam, replicas: sizing.slot_time_under_load_s(engine, lam, replicas),
            cfg,
            now_s,
            1.0,
            5.0,
        )

    cluster.run([batch], 1.0, float(arrivals[-1]), on_tick)
    learned = replica_model.view(state, cfg, float(arrivals[-1]), 1.0)
    assert learned.path_stretch == pytest.approx(slowness, rel=0.15)
    engine = dataclasses.replace(learned, path_stretch=1.0)
    assert learned.slot_time_s == pytest.approx(engine.slot_time_s * learned.path_stretch)
    assert "path_stretch" in {e.name for e in learned.estimates}


def test_a_path_faster_than_the_engine_or_thin_evidence_stretches_nothing() -> None:
    cfg = ReplicaModelConfig()
    from autoscalerd.model import Observation, Reading

    def obs_at(now_s: float, ongoing: float) -> Observation:
        return Observation(
            "llm",
            now_s,
            ongoing_requests=Reading(ongoing, now_s),
            completion_rate_per_s=Reading(10.0, now_s),
            running_replicas=Reading(2.0, now_s),
        )

    state = replica_model.ReplicaModelState(
        prefill=Sums((16_000.0, 1.0)), little=Sums((1000.0, 1000.0))
    )
    # The model predicts 2 s per request; the path holds them 1 s.
    for tick in range(100):
        state = replica_model.learn_stretch(
            state, obs_at(float(tick), 10.0), lambda lam, r: 2.0, cfg, float(tick), 1.0, 5.0
        )
    assert replica_model.view(state, cfg, 100.0, 1.0).path_stretch == 1.0
    # Slower by 4x, but with fewer than STRETCH_MIN_REQUESTS completions seen: not yet.
    thin = replica_model.ReplicaModelState(prefill=Sums((16_000.0, 1.0)), little=Sums((5.0, 5.0)))
    thin = replica_model.learn_stretch(
        thin, obs_at(1.0, 80.0), lambda lam, r: 2.0, cfg, 1.0, 1.0, 5.0
    )
    assert replica_model.view(thin, cfg, 1.0, 1.0).path_stretch == 1.0
    # A model that cannot predict (overload) adds no evidence.
    assert (
        replica_model.learn_stretch(
            thin, obs_at(2.0, 80.0), lambda lam, r: None, cfg, 2.0, 1.0, 5.0
        ).stretch
        == thin.stretch
    )


def _down_rate(per_tick: list[float]) -> float | None:
    """The scale-down rate after these per-tick rates, one a second (30 s look-back,
    300 s downscale window)."""
    cfg = DeploymentConfig(  # type: ignore[arg-type]
        name="llm", autoscaling={"look_back_period_s": 30, "downscale_delay_s": 300}
    )
    now_s = float(len(per_tick))
    state = DeploymentState(
        target_replicas=1,
        started_at_s=0.0,
        rate_samples=tuple((float(t), r) for t, r in enumerate(per_tick[:-1], start=1)),
    )
    obs = Observation(
        deployment="llm", sensed_at_s=now_s, arrival_rate_per_s=Reading(per_tick[-1], now_s)
    )
    return rates.observe(obs, state, cfg, now_s).rate_down_per_s


def test_scale_down_rate_trims_noise_from_the_look_back_mean_not_a_fall_or_a_rise() -> None:
    # The look-back holds the 31 samples at or after now − 30 s; the window all 300.
    z = math.sqrt(2 * math.log(300 / 31))  # about 2.13
    # A fall is taken as it is: the look-back mean, 2 (the window's 9.2 would hold it).
    assert _down_rate([10.0] * 269 + [2.0] * 31) == pytest.approx(2.0)
    # Steady 0/6 a second (level 3, spread 3): the last 31 s happen to hold 18 6s, not
    # 15 or 16, a mean of 3.48. Noise explains up to z · 3 / √31 = 1.15 of it: the
    # window's mean, 3.04, is the rate.
    steady = [0.0, 6.0] * 134 + [0.0] + [6.0] * 5 + [0.0, 6.0] * 13
    assert len(steady) == 300 and sum(steady[-31:]) / 31 == pytest.approx(108 / 31)
    assert _down_rate(steady) == pytest.approx(sum(steady) / 300)
    # A step from 3 to 30/s: spread √(mean of squares − level²) over the window; the
    # excess beyond z standard errors stays.
    rise = [3.0] * 269 + [30.0] * 31
    spread = math.sqrt(sum(r * r for r in rise) / 300 - (sum(rise) / 300) ** 2)
    assert _down_rate(rise) == pytest.approx(30.0 - z * spread / math.sqrt(31))
    assert 26.0 < 30.0 - z * spread / math.sqrt(31) < 28.0


def test_prompt_budgets_read_a_heavy_tail_inside_a_bucket_from_its_neighbours() -> None:
    # Prompt lengths of density ∝ x^−2 over 1,000-10,000 tokens: a bucket [a, b] holds
    # K·(1/a − 1/b), i.e. 5/9, 3/9 and 1/9 of the requests in 1-2k, 2-5k and 5-10k. Its mean
    # density K/(ab) is the density at its geometric centre, so the neighbours' log-log
    # slope is exactly −2. At 3,000 tokens/s and a 1 s SLO the limit is 3,000 tokens: the
    # attainable share of 2-5k is (1/2000 − 1/3000)/(1/2000 − 1/5000) of it, 15/81, where
    # a uniform reading says 1/9.
    mix = ((1000.0, 2000.0, 5 / 9), (2000.0, 5000.0, 3 / 9), (5000.0, 10_000.0, 1 / 9))
    budgets = prompt_budgets.attainable_budgets(mix, 1.0, 3000.0)
    assert len(budgets) == 2 * prompt_budgets.PIECES  # 5-10k is past the limit
    first, middle = budgets[: prompt_budgets.PIECES], budgets[prompt_budgets.PIECES :]
    assert sum(part for part, _, _ in first) == pytest.approx(5 / 9)
    assert sum(part for part, _, _ in middle) == pytest.approx(15 / 81)
    # Equal-mass pieces: a third of 1-2k lies under 1,200 tokens (1/x from 1/1000 to
    # 1/1000 − 1/6000), so its first piece's budgets are 1 − 1.2/3 to 1 − 1/3 s.
    assert first[0] == pytest.approx((5 / 27, 0.6, 2 / 3))
    # The last piece of the attainable part ends at the limit: a budget of 0.
    assert middle[-1][1] == pytest.approx(0.0, abs=1e-12)
    # A lone bucket has no neighbour to read a slope from: uniform.
    alone = prompt_budgets.attainable_budgets(((2000.0, 5000.0, 1.0),), 1.0, 3000.0)
    assert sum(part for part, _, _ in alone) == pytest.approx(1 / 3)


def test_backlog_at_landing_grows_only_while_arrivals_outrun_what_runs() -> None:
    from autoscalerd.decide import capacity

    # 40 queued, 30/s arriving, 20/s served, 65 s lead: 40 + 10 · 65.
    assert capacity.backlog_at_landing_requests(40.0, 30.0, 20.0, 65.0) == 690.0
    assert capacity.backlog_at_landing_requests(40.0, 10.0, 20.0, 65.0) == 40.0
    # Unknown arrivals or unknown serving: the queue as it is, never less.
    assert capacity.backlog_at_landing_requests(40.0, None, 20.0, 65.0) == 40.0
    assert capacity.backlog_at_landing_requests(40.0, 30.0, None, 65.0) == 40.0
    # ⌈690 / (12 · 30)⌉
    assert capacity.replicas_for_backlog(690.0, 12.0, 30.0) == 2


def test_the_utilization_rule_counts_by_hand_and_bounds_what_overflows() -> None:
    # ⌈λ/(ρμ)⌉: 20/(0.8·9.5) = 2.63 -> 3; 7.6/(0.8·9.5) = 1 (+ float noise) -> 1; no load, 0.
    assert sizing.by_utilization(20.0, 9.5, 0.8).replicas == 3
    assert sizing.by_utilization(7.6, 9.5, 0.8).replicas == 1
    assert sizing.by_utilization(0.0, 9.5, 0.8).replicas == 0
    assert sizing.by_utilization(20.0, 9.5, 0.8).slot_utilization == pytest.approx(20 / 28.5)
    # A ρ·μ whose quotient overflows (ρ = 5e-324, as a config may say) or whose product
    # underflows to zero: the largest count, for the bounds to clip, never an error.
    for rho, mu in ((5e-324, 9.5), (1e-30, 1e-300)):
        assert sizing.by_utilization(20.0, mu, rho).replicas == 10**9
