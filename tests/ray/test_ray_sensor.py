"""The ray_serve sensor against the real cluster: discovery, load readings, failures."""

from __future__ import annotations

import asyncio
import time

import pytest

from autoscalerd.emulator import loadgen
from autoscalerd.emulator.cluster import LocalCluster
from autoscalerd.model import Observation
from autoscalerd.sense.base import SenseResult
from autoscalerd.sense.ray_serve import RayServeSensor
from tests.ray.ray_helpers import (
    LLM,
    OUTPUT_TOKENS,
    PLAIN,
    PROMPT_TOKENS,
    TcpProxy,
    cluster_config,
    free_port,
)

FAST = {"metrics_interval_s": 1, "rate_window_s": 4}


def sensor(cluster: LocalCluster, url: str | None = None, **overrides: object) -> RayServeSensor:
    return RayServeSensor(FAST, cluster_config(cluster, url, **overrides))


async def sense_until(
    probe: RayServeSensor, ok: object, timeout_s: float = 30.0
) -> tuple[SenseResult, Observation]:
    deadline = time.monotonic() + timeout_s
    while True:
        result = await probe.sense(time.time())
        obs = result.observations.get(LLM)
        if obs is not None and ok(obs):  # type: ignore[operator]
            return result, obs
        assert time.monotonic() < deadline, f"no matching observation; last: {obs}"
        await asyncio.sleep(0.5)


async def test_discovers_apps_and_replica_shape(llm_at_one: LocalCluster) -> None:
    probe = sensor(llm_at_one)
    try:
        result = await probe.sense(time.time())
        assert result.error is None
        llm, plain = result.deployments[LLM], result.deployments[PLAIN]
        assert (llm.app, llm.deployment) == ("llm", "LlmReplica")
        assert llm.external_scaler_enabled and not plain.external_scaler_enabled
        assert dict(llm.resources_per_replica) == {"GPU": 1.0}
        assert dict(plain.resources_per_replica) == {"CPU": 0.5}
        assert llm.max_ongoing_requests == 2
        assert llm.platform_target_replicas is not None
        assert llm.platform_target_replicas.value == 1
        obs = result.observations[LLM]
        assert obs.running_replicas is not None and obs.running_replicas.value == 1
        assert obs.platform_target_replicas is not None
        assert abs(time.time() - obs.running_replicas.at_s) < 5
    finally:
        await probe.close()


async def test_reads_load_latency_and_tokens_under_traffic(llm_at_one: LocalCluster) -> None:
    probe = sensor(llm_at_one)
    stop = asyncio.Event()
    schedule = loadgen.constant_rate(3.0, 30.0, PROMPT_TOKENS, OUTPUT_TOKENS)
    load = asyncio.ensure_future(loadgen.run(llm_at_one.serve_url + "/llm", schedule, stop=stop))
    try:
        _, obs = await sense_until(
            probe,
            lambda o: (
                o.arrival_rate_per_s is not None
                and o.arrival_rate_per_s.value > 1.0
                and o.e2e_p99_s is not None
                and o.ttft_p99_s is not None
                and o.token_rate_per_s is not None
                and o.token_rate_per_s.value > 0
            ),
            timeout_s=40,
        )
        now_s = time.time()
        assert obs.arrival_rate_per_s is not None
        assert obs.arrival_rate_per_s.value < 6.0  # about the 3/s sent, not a burst
        assert obs.ongoing_requests is not None and obs.ongoing_requests.value >= 0
        assert obs.queued_requests is not None
        assert obs.e2e_p99_s is not None and 0.5 < obs.e2e_p99_s.value < 60
        # vLLM-style series, attributed through the replicas' worker ids.
        assert obs.ttft_p99_s is not None and 0.05 < obs.ttft_p99_s.value < 10
        assert obs.token_rate_per_s is not None
        for reading in (obs.arrival_rate_per_s, obs.e2e_p99_s, obs.ongoing_requests):
            assert now_s - reading.at_s < 5, "readings carry the time they were fetched"
    finally:
        stop.set()
        result = await load
        await probe.close()
    assert result.ok > 0


async def test_dashboard_outage_makes_every_field_unknown(llm_at_one: LocalCluster) -> None:
    proxy = TcpProxy(int(llm_at_one.dashboard_url.rsplit(":", 1)[1]))
    proxy.start()
    probe = sensor(llm_at_one, proxy.url)
    try:
        await sense_until(probe, lambda o: o.arrival_rate_per_s is not None, timeout_s=20)
        proxy.cut()
        deadline = time.monotonic() + 10
        while True:
            result = await probe.sense(time.time())
            if result.error:
                break
            assert time.monotonic() < deadline, "outage never reported"
            await asyncio.sleep(0.3)
        assert "unreachable" in result.error
        assert LLM in result.deployments, "known deployments stay known"
        assert result.observations[LLM].known_fields() == {}
        proxy.start()
        result, _ = await sense_until(probe, lambda o: o.running_replicas is not None, timeout_s=20)
        assert result.error is None
    finally:
        await probe.close()
        proxy.close()


@pytest.mark.parametrize("case", ["wrong", "missing"])
async def test_token_problems_are_one_clear_line(
    ray_cluster: LocalCluster, case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    overrides: dict[str, object] = (
        {"token": "not-the-token"} if case == "wrong" else {"token_file": "/nonexistent/token"}
    )
    probe = sensor(ray_cluster, **overrides)
    try:
        result = await probe.sense(time.time())
    finally:
        await probe.close()
    assert result.error is not None
    assert "\n" not in result.error
    assert ("403 token rejected" if case == "wrong" else "401 token required") in result.error
    assert "ray get-auth-token" in result.error
    assert ray_cluster.token not in result.error and "not-the-token" not in result.error
    assert result.observations == {}


async def test_dead_dashboard_port_fails_fast_without_raising(ray_cluster: LocalCluster) -> None:
    probe = sensor(ray_cluster, f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    try:
        result = await probe.sense(time.time())
    finally:
        await probe.close()
    assert time.monotonic() - started < 2.0
    assert result.error is not None and "unreachable" in result.error
    assert "connection refused" in result.error


async def test_learns_the_emulated_replica_from_its_vllm_series(llm_at_one: LocalCluster) -> None:
    """The replica model from what the real sensor reads off the emulator's vLLM series:
    prefill speed, time per output token, the prompt mix, and the per-tick histograms the
    SLO guard counts misses from. The router backlog shows in the wait p99."""
    from autoscalerd.config import ReplicaModelConfig
    from autoscalerd.decide import replica_model, slo_guard

    probe = sensor(llm_at_one)
    stop = asyncio.Event()
    # 3 requests/s at 2 slots of about 1 s each: a backlog at the router.
    schedule = loadgen.constant_rate(3.0, 30.0, PROMPT_TOKENS, OUTPUT_TOKENS)
    load = asyncio.ensure_future(loadgen.run(llm_at_one.serve_url + "/llm", schedule, stop=stop))
    priors = ReplicaModelConfig()  # 8,000 prompt tokens/s, 30 ms per token: both wrong
    state = replica_model.ReplicaModelState()
    seen_backlog_wait = False
    counted = waits_counted = 0.0
    last_s: float | None = None
    try:
        deadline = time.monotonic() + 28.0
        while time.monotonic() < deadline:
            now_s = time.time()
            result = await probe.sense(now_s)
            obs = result.observations.get(LLM)
            if obs is not None:
                tick_s = now_s - last_s if last_s is not None else 1.0
                state = replica_model.learn(state, obs, priors, now_s, tick_s, 10.0)
                queued = obs.queued_requests.value if obs.queued_requests else 0.0
                wait = obs.queue_wait_p99_s.value if obs.queue_wait_p99_s else 0.0
                seen_backlog_wait |= queued > 0 and wait > 0.5
                counts = slo_guard.controllable_misses(
                    obs.ttft_histogram, obs.prompt_tokens_histogram, 1.0, 2000.0
                )
                if counts is not None:
                    counted += counts[0]
                mix = replica_model.view(state, priors, now_s, 1.0).prompt_mix
                waits = slo_guard.late_waits(obs.queue_wait_histogram, mix, 1.0, 2000.0)
                if waits is not None:
                    waits_counted += waits[0]
            last_s = now_s
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        result_load = await load
        await probe.close()
    assert result_load.ok > 0
    learned = replica_model.view(state, priors, time.time(), 1.0)
    # The emulator: 2,000 prompt tokens/s (0.2 s per 400-token prompt), 20 ms per output
    # token. Ray exports a histogram's _sum from its buckets, not the observations (0.2 s
    # in the 0.1-0.25 s bucket reads 0.175 s; 20 ms in 10-20 ms reads 15 ms), so the
    # learned values are as exact as the buckets: within them, and off the priors (8,000
    # tokens/s, 30 ms).
    assert 400 / 0.25 <= learned.prefill_tokens_per_s <= 400 / 0.1
    assert learned.prompt_tokens_mean == pytest.approx(PROMPT_TOKENS, rel=0.15)
    assert 0.01 <= learned.tpot_s(1.0) <= 0.02
    assert learned.prompt_mix and all(
        low <= PROMPT_TOKENS <= high for low, high, _ in learned.prompt_mix
    )
    assert counted > 10, "first tokens counted tick by tick from the TTFT histogram"
    assert waits_counted > 10, "engine queue waits counted tick by tick (vLLM's queue time)"
    assert seen_backlog_wait, "requests queued at the router show in the wait p99"
