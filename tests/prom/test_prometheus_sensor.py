"""The `prometheus` sensor against the real Prometheus and the real cluster: what it reads
when a query fails, answers garbage or finds no series, what the decision does with that,
and its credentials: a real Prometheus that requires basic auth over TLS, and a bearer
token checked by a proxy in front of Prometheus (which takes no bearer tokens itself)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from autoscalerd.config import Config
from autoscalerd.decide.policy import decide
from autoscalerd.emulator.cluster import LocalCluster
from autoscalerd.model import DeploymentState, Observation, Reason
from autoscalerd.sense.base import SenseResult
from autoscalerd.sense.prometheus_api import PrometheusSensor
from tests.prom import prometheus_server as ps
from tests.prom.conftest import RAY_JOB
from tests.prom.fault_proxy import FaultProxy
from tests.ray.ray_helpers import LLM, cluster_config, free_port

FAST = {"matchers": {"job": "ray"}, "scrape_interval_s": 1, "query_interval_s": 1}
LOAD_FIELDS = ("arrival_rate_per_s", "ongoing_requests", "queued_requests")
# How the sensor's queries for one signal start (the freshness query names every series,
# so a bare series name would fail that one too).
QUEUED_QUERY = "sum by (application, deployment) (ray_serve_deployment_queued_queries{"
ONGOING_QUERY = "sum by (application, deployment) (ray_serve_replica_processing_queries{"
ARRIVALS_QUERY = "(rate(ray_serve_num_router_requests_total{"

# basic auth for the TLS server: `htpasswd -nbBC 4 autoscalerd prometheus-test-password`
# (bcrypt, cost 4: Prometheus checks it on every request; the test password only).
USER, PASSWORD = "autoscalerd", "prometheus-test-password"
PASSWORD_HASH = "$2b$04$M1Qirtv4/QbcqI2UZ3o0QeE6TvjZ1n0y3qj6p0IOGoUKIx9xrcXUW"


def sensor(config: Config, url: str, **settings: Any) -> PrometheusSensor:
    return PrometheusSensor({**FAST, "url": url, **settings}, config)


async def sense_until(probe: PrometheusSensor, ok: Any, timeout_s: float = 20.0) -> SenseResult:
    deadline = time.monotonic() + timeout_s
    while True:
        result = await probe.sense(time.time())
        if ok(result):
            return result
        assert time.monotonic() < deadline, (
            f"no matching answer; last: {result}; answers: {explain(probe)}"
        )
        await asyncio.sleep(0.5)


def explain(probe: PrometheusSensor) -> str:
    """What the sensor's last round of queries answered for llm (for a failure message)."""
    answers = probe._answers
    if answers is None:
        return "none yet"
    mine = {k: v for k, v in answers.counts.items() if k[0] == LLM}
    gauges = {k: v for k, v in answers.gauges.items() if k[0] == LLM}
    return (
        f"failures={answers.failures[:3]} unknown={sorted(answers.unknown)} "
        f"targets_share={answers.targets_share} counts={mine} gauges={gauges} "
        f"present={sorted(s for d, s in answers.present if d == LLM)}"
    )


def fresh_load(result: SenseResult) -> bool:
    obs = result.observations.get(LLM)
    return obs is not None and obs.arrival_rate_per_s is not None


def complete_load(result: SenseResult) -> bool:
    """Fresh load with every Ray target scraped: a fault injected then is the only one (on
    a busy machine Prometheus may miss a scrape of Ray's metrics agent for a while)."""
    if not fresh_load(result):
        return False
    coverage = result.observations[LLM].metrics_coverage_ratio
    return coverage is not None and coverage.value >= 1.0


def idle(result: SenseResult) -> bool:
    obs = result.observations.get(LLM)
    return (
        obs is not None
        and obs.arrival_rate_per_s is not None
        and obs.arrival_rate_per_s.value == 0
        and obs.ongoing_requests is not None
        and obs.ongoing_requests.value == 0
        and obs.queued_requests is not None
        and obs.queued_requests.value == 0
    )


def quiet(result: SenseResult) -> bool:
    """Idle, and no request in the histograms of the query window either."""
    return idle(result) and calm(result.observations[LLM])


def calm(obs: Observation) -> bool:
    """Read in full, and no request in the tick's histograms."""
    histograms = (
        obs.queue_wait_histogram,
        obs.router_wait_histogram,
        obs.ttft_histogram,
        obs.prompt_tokens_histogram,
    )
    coverage = obs.metrics_coverage_ratio
    return (
        coverage is not None
        and coverage.value >= 1.0
        and all(h is None or sum(h.counts) == 0 for h in histograms)
    )


@pytest.fixture
def config(llm_at_one: LocalCluster) -> Config:
    return cluster_config(llm_at_one)


@pytest.fixture
def proxy(prometheus: ps.PrometheusServer) -> Iterator[FaultProxy]:
    server = FaultProxy(prometheus.url)
    yield server
    server.close()


# ------------------------------------------------------------------ unknown, never zero


async def test_a_failing_query_costs_only_what_it_feeds(config: Config, proxy: FaultProxy) -> None:
    probe = sensor(config, proxy.url)
    try:
        await sense_until(probe, complete_load, timeout_s=60)
        proxy.fail.add(QUEUED_QUERY)
        result = await sense_until(
            probe, lambda r: r.observations[LLM].queued_requests is None, timeout_s=10
        )
    finally:
        await probe.close()
    obs = result.observations[LLM]
    assert result.error is None, "one failed query is not the sensor down"
    # The queue and what it bounds are unknown; the rest is read.
    assert obs.queued_requests is None and obs.queue_wait_p99_s is None
    assert obs.arrival_rate_per_s is not None and obs.ongoing_requests is not None
    assert obs.running_replicas is not None and obs.running_replicas.value == 1
    # Partial: the load may be a lower bound.
    assert obs.metrics_coverage_ratio is not None and obs.metrics_coverage_ratio.value < 1.0


async def test_nan_answers_are_unknown_not_zero(config: Config, proxy: FaultProxy) -> None:
    probe = sensor(config, proxy.url)
    try:
        await sense_until(probe, complete_load, timeout_s=60)
        proxy.nan.update({ARRIVALS_QUERY, ONGOING_QUERY})
        result = await sense_until(
            probe, lambda r: r.observations[LLM].arrival_rate_per_s is None, timeout_s=10
        )
    finally:
        await probe.close()
    obs = result.observations[LLM]
    assert obs.arrival_rate_per_s is None and obs.ongoing_requests is None
    assert obs.queued_requests is not None, "what the NaNs do not feed is still read"
    assert obs.metrics_coverage_ratio is not None and obs.metrics_coverage_ratio.value < 1.0
    assert all(
        getattr(obs, f) is None or getattr(obs, f).value == getattr(obs, f).value
        for f in obs.known_fields()
    ), "no NaN passed on"


async def test_no_series_for_a_deployment_with_replicas_is_no_reading(
    config: Config, prometheus: ps.PrometheusServer
) -> None:
    # A Prometheus that scrapes another cluster: nothing of this one's replicas.
    probe = sensor(config, prometheus.url, matchers={"job": "another-ray-cluster"})
    try:
        result = await sense_until(probe, lambda r: LLM in r.observations, timeout_s=10)
        await asyncio.sleep(1.5)
        result = await probe.sense(time.time())
    finally:
        await probe.close()
    obs = result.observations[LLM]
    assert obs.running_replicas is not None and obs.running_replicas.value == 1
    for field in LOAD_FIELDS:
        assert getattr(obs, field) is None, field
    assert obs.metrics_coverage_ratio is not None and obs.metrics_coverage_ratio.value == 0.0


async def test_prometheus_down_fails_the_sensor_with_every_load_field_unknown(
    config: Config,
) -> None:
    probe = sensor(config, f"http://127.0.0.1:{free_port()}")
    try:
        result = await sense_until(probe, lambda r: r.error is not None and LLM in r.deployments)
    finally:
        await probe.close()
    assert result.error is not None
    assert "unreachable (connection refused)" in result.error and "\n" not in result.error
    obs = result.observations[LLM]
    assert obs.running_replicas is not None, "the platform is still read"
    assert obs.arrival_rate_per_s is None and obs.ongoing_requests is None


async def watch(probe: PrometheusSensor, seconds: float) -> list[Observation]:
    """The sensor's observations of llm, once a second."""
    seen: list[Observation] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        result = await probe.sense(time.time())
        if LLM in result.observations:
            seen.append(result.observations[LLM])
        await asyncio.sleep(1.0)
    return seen


async def watch_calm(
    probe: PrometheusSensor, seconds: float, timeout_s: float
) -> list[Observation]:
    """`seconds` of llm's observations, quiet and read in full throughout. Not every such
    stretch is: the worker node that an earlier test's replica left is removed by Ray's
    autoscaler some time later, and Prometheus, still finding it in Ray's service discovery
    for a scrape or two, fails to scrape it; the sensor then rightly reads partial data for
    a window. Watched again until a stretch is calm, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        await sense_until(probe, quiet, timeout_s=max(1.0, deadline - time.monotonic()))
        seen = await watch(probe, seconds)
        if seen and all(calm(obs) for obs in seen):
            return seen
        coverage = [o.metrics_coverage_ratio and o.metrics_coverage_ratio.value for o in seen]
        assert time.monotonic() < deadline, (
            f"no calm {seconds:g} s in {timeout_s:g} s; coverage {coverage}; {explain(probe)}"
        )


def decided(config: Config, observations: list[Observation]) -> tuple[int, set[Reason]]:
    """The daemon's decide() over the observations, from 3 replicas and a fresh start long
    ago: with no load, it would scale down after the 2 s downscale delay."""
    cfg = config.deployment(LLM).model_copy(
        update={
            "autoscaling": config.deployment(LLM).autoscaling.model_copy(
                update={"downscale_delay_s": 2.0, "upscale_delay_s": 0.0, "max_replicas": 3}
            ),
            "max_metric_age_s": 5.0,
        }
    )
    first_s = observations[0].sensed_at_s
    state = DeploymentState(target_replicas=3, started_at_s=first_s - 3600)
    reasons: set[Reason] = set()
    for obs in observations:
        decision, state = decide(obs, state, cfg, obs.sensed_at_s)
        reasons.update(decision.reasons)
    return state.target_replicas, reasons


async def test_partial_and_missing_readings_never_scale_down(
    config: Config, proxy: FaultProxy
) -> None:
    """The same idle cluster through the same decide(): read in full it scales down; with
    the ongoing query failing (partial), or with no series at all, it holds."""
    probe = sensor(config, proxy.url)
    missing = sensor(config, proxy.url, matchers={"job": "another-ray-cluster"})
    try:
        # Idle: what an earlier test's load left queued at Serve's router has drained,
        # and its waits have left the query window (else the SLO guard, burning on them,
        # rightly holds the control's scale-down too); every Ray target scraped.
        healthy = await watch_calm(probe, 6, timeout_s=90)
        proxy.fail.add(ONGOING_QUERY)
        await sense_until(probe, lambda r: r.observations[LLM].ongoing_requests is None)
        partial, nothing = await asyncio.gather(watch(probe, 6), watch(missing, 6))
    finally:
        await probe.close()
        await missing.close()
    target, reasons = decided(config, healthy)
    assert target < 3, f"the control: fresh and complete, it scales down ({reasons})"
    target, reasons = decided(config, partial)
    assert target == 3 and Reason.PARTIAL_DATA in reasons, reasons
    target, reasons = decided(config, nothing)
    assert target == 3 and reasons & {Reason.PARTIAL_DATA, Reason.STALE_DATA}, reasons


# ------------------------------------------------------------------ credentials


@pytest.fixture(scope="module")
def tls_prometheus(
    ray_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ps.PrometheusServer, Path]]:
    """A second real Prometheus that requires basic auth, over TLS with its own CA."""
    workdir = tmp_path_factory.mktemp("prometheus-tls")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    web = {
        "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
        "basic_auth_users": {USER: PASSWORD_HASH},
    }
    with ps.running(workdir, scrape_configs=[RAY_JOB], web_config=web) as server:
        yield server, cert


async def test_basic_auth_over_tls_against_a_real_prometheus(
    config: Config, tls_prometheus: tuple[ps.PrometheusServer, Path], tmp_path: Path
) -> None:
    server, ca = tls_prometheus
    good, bad = tmp_path / "password", tmp_path / "wrong"
    good.write_text(PASSWORD + "\n")
    bad.write_text("not-the-password-4711\n")
    auth = {"username": USER, "password_file": str(good)}
    probe = sensor(config, server.url, basic_auth=auth, ca_file=str(ca))
    try:
        result = await sense_until(probe, fresh_load, timeout_s=30)
    finally:
        await probe.close()
    assert result.error is None

    with capture_logs() as logs:
        wrong = sensor(
            config, server.url, basic_auth={**auth, "password_file": str(bad)}, ca_file=str(ca)
        )
        untrusted = sensor(config, server.url, basic_auth=auth)
        try:
            rejected = await sense_until(wrong, lambda r: r.error is not None)
            unverified = await sense_until(untrusted, lambda r: r.error is not None)
        finally:
            await wrong.close()
            await untrusted.close()
    assert rejected.error is not None and "401 unauthorized" in rejected.error
    assert f"basic auth password from {bad}" in rejected.error and "\n" not in rejected.error
    assert unverified.error is not None and "certificate" in unverified.error
    everything = " ".join([rejected.error, unverified.error, str(logs)])
    assert "not-the-password-4711" not in everything and PASSWORD not in everything


async def test_bearer_token_is_sent_and_never_shown(
    config: Config, prometheus: ps.PrometheusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "prom-token-0f9e8d7c6b5a"
    gate = FaultProxy(prometheus.url, bearer_token=token)
    monkeypatch.setenv("PROMETHEUS_TOKEN", token)
    monkeypatch.setenv("WRONG_PROMETHEUS_TOKEN", "wrong-token-1a2b3c4d")
    try:
        with capture_logs() as logs:
            probe = sensor(config, gate.url, bearer_token_env="PROMETHEUS_TOKEN")
            wrong = sensor(config, gate.url, bearer_token_env="WRONG_PROMETHEUS_TOKEN")
            try:
                accepted = await sense_until(probe, fresh_load)
                rejected = await sense_until(wrong, lambda r: r.error is not None)
                # A query whose error answer quotes the token back: logged, scrubbed.
                gate.fail.add(QUEUED_QUERY)
                await sense_until(probe, lambda r: r.observations[LLM].queued_requests is None)
            finally:
                await probe.close()
                await wrong.close()
    finally:
        gate.close()
    assert accepted.error is None
    assert f"Bearer {token}" in gate.seen_authorization
    # The proxy echoes the header it refused in its 401; the sensor's error does not.
    assert rejected.error is not None and "401 unauthorized" in rejected.error
    assert "bearer token from $WRONG_PROMETHEUS_TOKEN" in rejected.error
    problems = [e for e in logs if e.get("event") == "sensor_problem"]
    assert any("injected failure" in str(e) and "[redacted]" in str(e) for e in problems), logs
    everything = " ".join([rejected.error, str(logs)])
    assert "wrong-token-1a2b3c4d" not in everything and token not in everything
