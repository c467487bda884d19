"""The simulated cluster against hand-worked cases: exact TTFT, e2e and replica-seconds."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from autoscalerd.sim.cluster import (
    TTFT_BUCKETS_S,
    Cluster,
    ReplicaModel,
    RequestRecords,
)
from autoscalerd.sim.sensor import SimSensor, histogram_quantile, quantile_between
from autoscalerd.sim.traces import RequestBatch

# 1,600 prompt tokens prefill in 0.1 s; one output token takes 30 ms alone in the batch.
MODEL = ReplicaModel(cold_start_s=10.0)
TPOT_1 = 0.03
TPOT_2 = 0.03 * (1 + 1 / 31)  # 30 ms rising linearly to 60 ms at batch 32


def batch(*requests: tuple[float, int, int]) -> RequestBatch:
    arrival, prompt, output = zip(*requests, strict=True)
    return RequestBatch(
        np.array(arrival, dtype=np.float64),
        np.array(prompt, dtype=np.int64),
        np.array(output, dtype=np.int64),
    )


def simulate(
    requests: RequestBatch,
    *,
    replicas: int = 1,
    model: ReplicaModel = MODEL,
    end_s: float = 5.0,
    tick_s: float = 1.0,
    on_tick: Callable[[Cluster, float], None] | None = None,
) -> tuple[Cluster, RequestRecords]:
    cluster = Cluster(model, replicas, record_dtype=np.float64)
    cluster.run([requests], tick_s, end_s, lambda now: on_tick(cluster, now) if on_tick else None)
    return cluster, cluster.records()


def by_arrival(records: RequestRecords) -> dict[float, tuple[float, float]]:
    return {
        float(a): (float(t), float(e))
        for a, t, e in zip(records.arrival_s, records.ttft_s, records.e2e_s, strict=True)
    }


def test_one_request_alone() -> None:
    cluster, records = simulate(batch((0.5, 1600, 10)))
    assert len(records) == 1
    assert records.ttft_s[0] == pytest.approx(0.1, abs=1e-12)  # prefill only
    assert records.e2e_s[0] == pytest.approx(0.1 + 10 * TPOT_1, abs=1e-12)
    assert records.tpot_s[0] == pytest.approx(TPOT_1, abs=1e-12)
    assert cluster.replica_seconds == pytest.approx(5.0)


def test_two_requests_share_prefill_then_the_batch() -> None:
    # r1: prefill 0 -> 0.1, decodes alone until r2's prefill ends at 0.3 (6 2/3 tokens),
    # then both decode at tpot(2); r1's last 3 1/3 tokens end at 0.3 + 10/3 · tpot(2);
    # r2 has 5 - 10/3 tokens left, alone again at 30 ms.
    _, records = simulate(batch((0.0, 1600, 10), (0.0, 3200, 5)))
    r1_done = 0.3 + (10 / 3) * TPOT_2
    assert sorted(records.ttft_s.tolist()) == pytest.approx([0.1, 0.3], abs=1e-12)
    e2e = sorted(records.e2e_s.tolist())
    assert e2e[0] == pytest.approx(r1_done, abs=1e-12)
    assert e2e[1] == pytest.approx(r1_done + (5 / 3) * TPOT_1, abs=1e-12)


def test_router_queue_is_fifo_when_replicas_are_full() -> None:
    model = ReplicaModel(max_ongoing_requests=1, tpot_full_batch_s=0.03, cold_start_s=10.0)
    cluster, records = simulate(
        batch((0.0, 1600, 10), (0.0, 1600, 10), (0.05, 1600, 10)), model=model
    )
    ttft = records.ttft_s.tolist()
    e2e = records.e2e_s.tolist()
    # r1 ends at 0.4; r2 waits for it (TTFT 0.5, e2e 0.8); r3, from 0.05, waits for r2:
    # prefill 0.8 -> 0.9, decode to 1.2.
    assert ttft == pytest.approx([0.1, 0.5, 0.9 - 0.05], abs=1e-12)
    assert e2e == pytest.approx([0.4, 0.8, 1.2 - 0.05], abs=1e-12)
    assert cluster.max_queue == 2


def test_cold_start_from_zero_replicas() -> None:
    def scale(cluster: Cluster, now_s: float) -> None:
        cluster.set_target(1, now_s)

    cluster, records = simulate(batch((0.5, 1600, 10)), replicas=0, end_s=20.0, on_tick=scale)
    # Asked for at the first tick (1.0 s), ready 10 s later.
    assert records.ttft_s[0] == pytest.approx(11.1 - 0.5, abs=1e-12)
    assert records.e2e_s[0] == pytest.approx(11.4 - 0.5, abs=1e-12)
    # It costs from the moment it is asked for.
    assert cluster.replica_seconds == pytest.approx(19.0)
    assert cluster.scale_actions == 1


def test_removed_replica_drains_then_stops_costing() -> None:
    def shrink(cluster: Cluster, now_s: float) -> None:
        if now_s == 0.25:
            cluster.set_target(1, now_s)

    requests = batch((0.0, 1600, 10), (0.0, 1600, 20), (0.5, 1600, 10))
    cluster, records = simulate(requests, replicas=2, end_s=2.0, tick_s=0.25, on_tick=shrink)
    results = by_arrival(records)
    # Both replicas had one request at 0.25; the higher slot (the second request's) drains
    # and stops when its request ends at 0.1 + 20 · 30 ms = 0.7.
    assert results[0.0] in (
        pytest.approx((0.1, 0.4), abs=1e-12),
        pytest.approx((0.1, 0.7), abs=1e-12),
    )
    # The request at 0.5 goes to the remaining replica, whose batch is empty by then.
    assert results[0.5] == pytest.approx((0.1, 0.4), abs=1e-12)
    assert cluster.replica_seconds == pytest.approx(2.0 + 0.7, abs=1e-12)


def test_starting_replicas_are_removed_first_and_stop_costing_at_once() -> None:
    targets = {1.0: 3, 2.0: 1}

    def follow(cluster: Cluster, now_s: float) -> None:
        if now_s in targets:
            cluster.set_target(targets[now_s], now_s)

    cluster, _ = simulate(batch((0.1, 100, 1)), replicas=1, end_s=4.0, on_tick=follow)
    # The warm replica runs 0..4; two asked for at 1 s are cancelled at 2 s.
    assert cluster.replica_seconds == pytest.approx(4.0 + 2 * 1.0)
    assert cluster.scale_actions == 2


def test_least_loaded_routing() -> None:
    cluster = Cluster(MODEL, 3, record_dtype=np.float64)
    seen: list[list[int]] = []
    # Four long requests at once: the fourth goes to the first of the three tied replicas.
    cluster.run(
        [batch(*[(0.0, 16000, 100)] * 4)],
        0.5,
        0.5,
        lambda now: seen.append(cluster.ongoing_per_replica()),
        drain_limit_s=0.0,
    )
    assert seen[0] == [2, 1, 1]


def test_request_without_output_tokens_ends_at_its_first_token() -> None:
    _, records = simulate(batch((0.0, 1600, 0)))
    assert records.e2e_s[0] == pytest.approx(records.ttft_s[0]) == pytest.approx(0.1)
    assert np.isnan(records.tpot_s[0])


def test_every_request_completes_and_cost_matches_a_static_fleet() -> None:
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.random(2000) * 600)
    requests = RequestBatch(arrival, rng.integers(10, 4000, 2000), rng.integers(0, 200, 2000))
    cluster, records = simulate(requests, replicas=4, end_s=600.0)
    assert len(records) == 2000
    assert np.all(records.ttft_s > 0)
    assert np.all(records.e2e_s >= records.ttft_s)
    # Requests still in flight at 600 s keep the fleet (and the clock) running.
    assert cluster.now_s > 600.0
    assert cluster.replica_seconds == pytest.approx(4 * cluster.now_s)


# ---------------------------------------------------------------- the sensor


def test_sensor_reports_what_a_real_one_would() -> None:
    model = ReplicaModel(max_ongoing_requests=1, tpot_full_batch_s=0.03, cold_start_s=10.0)
    cluster = Cluster(model, 1, record_dtype=np.float64)
    sensor = SimSensor(cluster, "app/llm", look_back_s=30.0, tick_s=0.25)
    seen = []
    cluster.run(
        [batch((0.0, 1600, 10), (0.0, 1600, 10), (0.05, 1600, 10))],
        0.25,
        1.0,
        lambda now: seen.append(sensor.observe(now)),
    )
    first = seen[0]  # at 0.25 s
    assert first.deployment == "app/llm"
    assert first.arrival_rate_per_s is not None and first.arrival_rate_per_s.value == 12.0
    assert first.ongoing_requests is not None and first.ongoing_requests.value == 1
    assert first.queued_requests is not None and first.queued_requests.value == 2
    assert first.running_replicas is not None and first.running_replicas.value == 1
    assert first.starting_replicas is not None and first.starting_replicas.value == 0
    assert first.ttft_p99_s is not None  # r1's first token came at 0.1 s
    assert 0.08 < first.ttft_p99_s.value <= 0.1
    assert first.ttft_p99_s.at_s == 0.25
    assert first.completion_rate_per_s is not None and first.completion_rate_per_s.value == 0
    second = seen[1]  # at 0.5 s: r1 done at 0.4, 10 + 1600 tokens
    assert second.completion_rate_per_s is not None and second.completion_rate_per_s.value == 4.0
    assert second.token_rate_per_s is not None
    assert second.token_rate_per_s.value == pytest.approx((1600 + 10) / 0.25)


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    bounds = (0.1, 0.5, 1.0)
    # 100 observations: 50 in (0, 0.1], 40 in (0.1, 0.5], 10 in (0.5, 1.0].
    assert histogram_quantile(0.5, bounds, [50, 40, 10, 0]) == pytest.approx(0.1)
    assert histogram_quantile(0.9, bounds, [50, 40, 10, 0]) == pytest.approx(0.5)
    assert histogram_quantile(0.99, bounds, [50, 40, 10, 0]) == pytest.approx(0.95)
    # A rank in +Inf reads as the highest finite bound.
    assert histogram_quantile(0.99, bounds, [0, 0, 0, 5]) == 1.0
    assert histogram_quantile(0.99, bounds, [0, 0, 0, 0]) is None


def test_quantile_between_matches_histogram_quantile() -> None:
    rng = np.random.default_rng(1)
    for _ in range(500):
        then = rng.integers(0, 5, len(TTFT_BUCKETS_S) + 1)
        increase = rng.choice([0, 0, 1, 3, 10], len(TTFT_BUCKETS_S) + 1)
        now = then + increase
        for q in (0.5, 0.99):
            expected = histogram_quantile(q, TTFT_BUCKETS_S, increase.tolist())
            got = quantile_between(q, TTFT_BUCKETS_S, now.tolist(), then.tolist())
            assert got == pytest.approx(expected) if expected is not None else got is None


# ---------------------------------------------------------------- the replica model


def test_service_rate_of_the_code_mix_is_prefill_bound() -> None:
    model = ReplicaModel()
    assert model.tpot_s(1) == pytest.approx(0.030)
    assert model.tpot_s(32) == pytest.approx(0.060)
    assert model.service_rate_per_s(2048, 28) == pytest.approx(16000 / 2048)
    # Long outputs make the batch the limit instead.
    assert model.service_rate_per_s(100, 2000) == pytest.approx(32 / (100 / 16000 + 2000 * 0.06))
    assert model.work_s(16000, 0) == pytest.approx(1.0)
    assert model.work_s(0, 32 / 0.06) == pytest.approx(1.0)


def test_replica_model_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        ReplicaModel(max_ongoing_requests=0)
    with pytest.raises(ValueError):
        ReplicaModel(tpot_batch1_s=0.05, tpot_full_batch_s=0.01)
