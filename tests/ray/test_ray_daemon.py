"""The real daemon (`autoscalerd run`, a separate process) against the real cluster."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autoscalerd.emulator import loadgen
from autoscalerd.emulator.cluster import LocalCluster
from tests.helpers import REPO
from tests.ray.ray_helpers import (
    LLM,
    OUTPUT_TOKENS,
    PLAIN,
    PROMPT_TOKENS,
    BackgroundLoad,
    Daemon,
    TcpProxy,
    daemon,
    daemon_config,
    daemon_env,
    free_port,
    healthz,
    running_replicas,
    scale,
    target_replicas,
    wait_for,
)


def managed(proc: Daemon, name: str) -> bool:
    return any(e.get("deployment") == name for e in proc.events("deployment_managed"))


def failures(proc: Daemon, event: str, needle: str) -> list[dict[str, object]]:
    return [e for e in proc.events(event) if needle in str(e.get("error", ""))]


def test_scales_up_under_load_and_down_after_with_gpu_nodes(
    llm_at_one: LocalCluster, tmp_path: Path
) -> None:
    """Load -> more replicas -> more GPU nodes; no load -> back down, nodes go. Meanwhile
    the app deployed without external scaling gets its 412, and the others still scale."""
    cluster = llm_at_one
    port = free_port()
    config = daemon_config(
        cluster,
        port,
        actuators=("ray_serve", "ray_autoscaler"),
        # Listed, so it is managed although not discovered; its minimum forces a call.
        deployments=[{"name": PLAIN, "autoscaling": {"min_replicas": 2}}],
    )
    with daemon(config, tmp_path, daemon_env(cluster)) as proc:
        wait_for(lambda: managed(proc, LLM), 60, what="llm managed")
        # From the one GPU node llm's single replica needs (idle ones left by earlier
        # tests go after Ray's idle timeout).
        wait_for(lambda: cluster.gpu_nodes() == 1, 120, 1.0, "a single GPU node")
        # 4 requests/s of 1 s each, 2 per replica: ⌈4 / (0.8·2)⌉ = 3 replicas.
        schedule = loadgen.constant_rate(4.0, 120.0, PROMPT_TOKENS, OUTPUT_TOKENS)
        load = BackgroundLoad(cluster.serve_url + "/llm", schedule)
        try:
            wait_for(lambda: target_replicas(cluster, LLM) == 3, 60, what="target 3")
            wait_for(lambda: cluster.gpu_nodes() >= 3, 90, 1.0, "three GPU nodes")
            wait_for(lambda: running_replicas(cluster, LLM) == 3, 90, 1.0, "3 running")
        finally:
            result = load.stop()
        assert result is not None and result.ok > 0
        assert failures(proc, "actuation_failed", "not_enabled"), proc.output()[-3000:]
        [rejected] = [
            e for e in failures(proc, "actuation_failed", "412") if PLAIN in str(e["name"])
        ][:1]
        assert "external_scaler_enabled" in str(rejected["error"])
        assert target_replicas(cluster, PLAIN) == 1

        wait_for(lambda: target_replicas(cluster, LLM) == 1, 60, what="back to 1")
        wait_for(lambda: cluster.gpu_nodes() == 1, 120, 1.0, "idle GPU nodes gone")
        assert proc.alive() and healthz(port) == 200
    assert cluster.token not in proc.output()


def test_dashboard_outage_holds_target_and_recovers(
    llm_at_one: LocalCluster, tmp_path: Path
) -> None:
    """Dashboard unreachable for longer than max_metric_age_s and the downscale delay: no
    scale-down, the loop keeps ticking, and it resumes once the dashboard is back."""
    cluster = llm_at_one
    scale(cluster, LLM, 2)
    proxy = TcpProxy(int(cluster.dashboard_url.rsplit(":", 1)[1]))
    proxy.start()
    port = free_port()
    config = daemon_config(cluster, port, dashboard_url=proxy.url)
    config["defaults"]["autoscaling"]["downscale_delay_s"] = 10
    config["defaults"]["max_metric_age_s"] = 3
    try:
        with daemon(config, tmp_path, daemon_env(cluster)) as proc:
            wait_for(lambda: managed(proc, LLM), 60, what="llm managed")
            time.sleep(2)
            proxy.cut()
            wait_for(lambda: failures(proc, "sensor_failed", "unreachable"), 15, what="outage seen")
            # Longer than max_metric_age_s (3) and downscale_delay_s (10): still held.
            outage_end = time.monotonic() + 15
            while time.monotonic() < outage_end:
                assert target_replicas(cluster, LLM) == 2
                assert proc.alive()
                time.sleep(1)
            assert healthz(port) == 200, "the loop kept ticking through the outage"
            proxy.start()
            restored = time.monotonic()
            wait_for(lambda: proc.events("sensor_recovered"), 20, what="recovery logged")
            wait_for(lambda: target_replicas(cluster, LLM) == 1, 60, what="scale-down resumed")
            # Not before a full downscale delay of fresh data after the outage.
            assert time.monotonic() - restored >= 8
    finally:
        proxy.close()
    assert cluster.token not in proc.output()


@pytest.mark.parametrize("case", ["wrong", "missing"])
def test_token_problems_are_reported_and_the_daemon_keeps_running(
    ray_cluster: LocalCluster, tmp_path: Path, case: str
) -> None:
    overrides = (
        {"token": "wrong-token-value"} if case == "wrong" else {"token_file": "/nonexistent/token"}
    )
    config = daemon_config(ray_cluster, free_port(), **overrides)
    env = daemon_env(ray_cluster)
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token to fall back on
    with daemon(config, tmp_path, env) as proc:
        expected = "403 token rejected" if case == "wrong" else "401 token required"
        [event] = wait_for(lambda: failures(proc, "sensor_failed", expected), 30, what=expected)
        assert "ray get-auth-token" in str(event["error"])
        time.sleep(2)
        assert proc.alive()
    output = proc.output()
    assert "wrong-token-value" not in output and ray_cluster.token not in output


def test_shipped_ray_config_works_unedited(llm_at_one: LocalCluster, tmp_path: Path) -> None:
    """config/ray.yaml against a local Ray on default ports, the token in $RAY_AUTH_TOKEN."""
    env = daemon_env(llm_at_one)
    env["RAY_AUTH_TOKEN"] = llm_at_one.token
    env["HOME"] = str(tmp_path)
    port = free_port()
    config = REPO / "config" / "ray.yaml"
    with daemon(config, tmp_path, env, ("--http-addr", f"127.0.0.1:{port}")) as proc:
        wait_for(lambda: managed(proc, LLM), 60, what="llm discovered and managed")
        time.sleep(3)
        assert not managed(proc, PLAIN), "apps without external scaling are not discovered"
        assert not proc.events("sensor_failed") and not proc.events("actuation_failed")
        assert proc.alive() and healthz(port) == 200
    assert llm_at_one.token not in proc.output()
