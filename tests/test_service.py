"""autoscalerd as a service: the real `autoscalerd run` process, replaying a trace written
here in scaled real time (--speed), with its HTTP API on a free port, a state file,
signals, and a NOTIFY_SOCKET datagram socket of the test's own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon import Daemon, free_port

NAME = "llm/chat"
TOKEN = "s3cret-token-for-tests"
TOKEN_ENV = "AUTOSCALERD_TEST_TOKEN"
TRACE_START_S = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()
METRIC_FAMILIES = [
    "autoscalerd_build_info",
    "autoscalerd_observed_arrival_rate_per_second",
    "autoscalerd_forecast_arrival_rate_per_second",
    "autoscalerd_service_rate_per_replica_per_second",
    "autoscalerd_current_replicas",
    "autoscalerd_desired_replicas",
    "autoscalerd_applied_replicas",
    "autoscalerd_paused",
    "autoscalerd_decisions_total",
    "autoscalerd_actuation_attempts_total",
    "autoscalerd_actuation_errors_total",
    "autoscalerd_sensor_errors_total",
    "autoscalerd_sensor_up",
    "autoscalerd_input_age_seconds",
    "autoscalerd_ticks_total",
    "autoscalerd_tick_duration_seconds",
    "autoscalerd_forecast_refit_duration_seconds",
    "autoscalerd_config_reloads_total",
    "autoscalerd_config_last_reload_successful",
    "autoscalerd_state_saves_total",
]


# ---------------------------------------------------------------- fixtures and helpers


def write_trace(path: Path, phases: list[tuple[float, float]]) -> Path:
    """An Azure-format trace: for each (seconds, requests per s), evenly spaced arrivals,
    half a gap off the whole seconds where ticks fall, after one request at the start
    (the replay's clock starts at the first request)."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    start_s = TRACE_START_S
    lines.append(f"{datetime.fromtimestamp(start_s, tz=timezone.utc):%Y-%m-%d %H:%M:%S.%f},500,100")
    for duration_s, rate_per_s in phases:
        count = int(duration_s * rate_per_s)
        for i in range(count):
            at = datetime.fromtimestamp(start_s + (i + 0.5) / rate_per_s, tz=timezone.utc)
            lines.append(f"{at:%Y-%m-%d %H:%M:%S.%f},500,100")
        start_s += duration_s
    path.write_text("\n".join(lines) + "\n")
    return path


def write_config(path: Path, trace: Path, port: int, state: Path, **changes: Any) -> Path:
    """A replay config: 33 to 40 req/s at μ=10 and ρ=0.8 need 5 replicas, 4 req/s 1."""
    config: dict[str, Any] = {
        "tick_s": 1.0,
        "discovery": {"enabled": False},
        "http": {"addr": f"127.0.0.1:{port}", "token_env": TOKEN_ENV},
        "state": {"path": str(state), "every_ticks": 5},
        "sensors": [{"type": "replay", "path": str(trace), "deployment": NAME}],
        "actuators": [{"type": "log"}],
        "deployments": [
            {
                "name": NAME,
                "autoscaling": {
                    "min_replicas": 1,
                    "max_replicas": 8,
                    "upscale_delay_s": 0,
                    "downscale_delay_s": 60,
                    "look_back_period_s": 10,
                },
                "capacity": {
                    "sizing": "utilization",
                    "service_rate_per_replica": 10,
                    "target_utilization": 0.8,
                },
                "forecast": {"enabled": False},
                "max_metric_age_s": 5,
            }
        ],
    }
    for key, value in changes.items():
        config[key] = value
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def service_env(cli_env: dict[str, str]) -> dict[str, str]:
    env = dict(cli_env)
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "STATE_DIRECTORY", TOKEN_ENV):
        env.pop(name, None)
    return env


@contextlib.contextmanager
def running(config: Path, port: int, env: dict[str, str], speed: float) -> Iterator[Daemon]:
    daemon = Daemon(config, port, env, speed)
    try:
        yield daemon
    finally:
        daemon.close()


def decisions(daemon: Daemon, limit: int = 1000) -> list[dict[str, Any]]:
    status, body = daemon.get(f"/v1/decisions?deployment={NAME}&limit={limit}")
    assert status == 200, body
    return list(body["decisions"])


# ---------------------------------------------------------------- the tests


def test_every_endpoint_and_the_bearer_token_rules(
    tmp_path: Path, service_env: dict[str, str]
) -> None:
    trace = write_trace(tmp_path / "trace.csv", [(900, 36.0)])
    port = free_port()
    config = write_config(tmp_path / "config.yaml", trace, port, tmp_path / "state.json")
    env = {**service_env, TOKEN_ENV: TOKEN}
    with running(config, port, env, speed=2) as daemon:
        assert daemon.wait_http("/healthz")["status"] == "ok"
        assert daemon.wait_http("/readyz")["status"] == "ready"

        status, text, content_type = daemon.request("GET", "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        for family in METRIC_FAMILIES:
            assert f"# TYPE {family} " in text, family
        assert 'autoscalerd_desired_replicas{application="llm",deployment="chat"} 5.0' in text

        status, body = daemon.get("/v1/status")
        assert status == 200 and body["ready"] is True
        chat = body["deployments"][NAME]
        assert chat["config"]["autoscaling"]["max_replicas"] == 8
        assert chat["paused"] is False and chat["override"] is None
        assert 33 <= chat["last_observation"]["inputs"]["arrival_rate_per_s"]["value"] <= 40
        assert "capacity" in chat["last_decision"]["reasons"]

        recent = decisions(daemon, limit=2)
        assert 1 <= len(recent) <= 2 and all(d["deployment"] == NAME for d in recent)

        path = f"/v1/deployments/{NAME}/pause"
        assert daemon.post(path)[0] == 401
        assert daemon.post(path, token="wrong")[0] == 403
        status, body = daemon.post(path, '{"reason": "tests"}', TOKEN)
        assert status == 200 and body["paused"] is True
        daemon.wait_until(lambda: "paused" in decisions(daemon, 1)[0]["reasons"], "a paused tick")
        resumed = daemon.post(f"/v1/deployments/{NAME}/resume", '{"reason": "tests"}', TOKEN)
        assert resumed[1]["paused"] is False
        status, body = daemon.post(
            f"/v1/deployments/{NAME}/override",
            '{"replicas": 3, "ttl_s": 600, "reason": "t"}',
            TOKEN,
        )
        assert status == 200 and body["override"]["replicas"] == 3
        daemon.wait_until(
            lambda: decisions(daemon, 1)[0]["target_replicas"] == 3, "the override applied"
        )
        status, body = daemon.post(f"/v1/deployments/{NAME}/override", '{"replicas": ', TOKEN)
        assert status == 400 and "malformed JSON" in body["error"]
        status, body = daemon.post("/v1/deployments/llm/other/pause", token=TOKEN)
        assert status == 404 and "not managed" in body["error"]
        assert daemon.get("/v1/decisions?limit=-1")[0] == 400

        code, _ = daemon.stop()
    assert code == 0, daemon.stderr
    assert daemon.find("operator_pause") and not any("s3cret" in line for line in daemon.stderr)
    assert TOKEN not in json.dumps(daemon.events)


def test_sighup_rejects_a_bad_config_whole_then_applies_a_good_one(
    tmp_path: Path, service_env: dict[str, str]
) -> None:
    trace = write_trace(tmp_path / "trace.csv", [(900, 36.0)])
    port = free_port()
    state = tmp_path / "state.json"
    state.write_text('{"format": "autoscalerd-state", "version": 2, "saved_at_s": "soon"}')
    config = write_config(tmp_path / "config.yaml", trace, port, state)
    good = yaml.safe_load(config.read_text())
    with running(config, port, service_env, speed=2) as daemon:
        # The unusable state file is moved aside and the daemon runs anyway.
        unusable = daemon.wait_event("state_unusable")
        assert "saved_at_s: expected a number" in unusable["problem"]
        assert Path(unusable["moved_to"]).exists()
        daemon.wait_http("/readyz")
        # No token configured: the write endpoints are off, whatever is sent.
        status, body = daemon.post(f"/v1/deployments/{NAME}/pause", token=TOKEN)
        assert status == 403 and "disabled: no token configured" in body["error"]

        bad = json.loads(json.dumps(good))
        bad["http"]["token"] = TOKEN
        bad["deployments"][0]["autoscaling"]["min_replicas"] = 9  # above max_replicas: 8
        config.write_text(yaml.safe_dump(bad))
        daemon.proc.send_signal(signal.SIGHUP)
        rejected = daemon.wait_event("reload_rejected")
        assert "max_replicas: must be >= min_replicas (9)" in " ".join(rejected["problems"])
        _, metrics = daemon.get("/metrics")
        assert 'autoscalerd_config_reloads_total{result="rejected"} 1.0' in metrics
        assert "autoscalerd_config_last_reload_successful 0.0" in metrics
        # Rejected whole: neither the bounds nor the token of the bad file took effect.
        assert daemon.post(f"/v1/deployments/{NAME}/pause", token=TOKEN)[0] == 403
        status, body = daemon.get("/v1/status")
        assert body["deployments"][NAME]["config"]["autoscaling"]["min_replicas"] == 1

        good["http"]["token"] = TOKEN
        good["deployments"][0]["autoscaling"]["max_replicas"] = 4
        config.write_text(yaml.safe_dump(good))
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_event("reloaded")
        # Applied at the next tick, the deployment's state kept: capped from 5 to 4.
        daemon.wait_until(
            lambda: decisions(daemon, 1)[0]["target_replicas"] == 4, "the new max_replicas"
        )
        history = decisions(daemon)
        assert history[0]["decided_at_s"] < history[-1]["decided_at_s"]  # one ring, kept
        assert daemon.post(f"/v1/deployments/{NAME}/pause")[0] == 401
        assert daemon.post(f"/v1/deployments/{NAME}/pause", '{"reason": "tests"}', TOKEN)[0] == 200
        _, metrics = daemon.get("/metrics")
        assert 'autoscalerd_config_reloads_total{result="applied"} 1.0' in metrics
        assert "autoscalerd_config_last_reload_successful 1.0" in metrics
        code, _ = daemon.stop()
    assert code == 0, daemon.stderr


def test_sd_notify_messages_and_sigterm_exit_within_10_s(
    tmp_path: Path, service_env: dict[str, str]
) -> None:
    trace = write_trace(tmp_path / "trace.csv", [(900, 36.0)])
    port = free_port()
    state = tmp_path / "state.json"
    config = write_config(tmp_path / "config.yaml", trace, port, state)
    # An abstract-namespace socket, as systemd may hand out ('@' in NOTIFY_SOCKET).
    name = f"autoscalerd-test-{os.getpid()}-{port}"
    messages: list[tuple[float, str]] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        listener.settimeout(0.2)
        done = threading.Event()

        def receive() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    messages.append((time.monotonic(), listener.recv(4096).decode()))

        reader = threading.Thread(target=receive, daemon=True)
        reader.start()
        env = {**service_env, "NOTIFY_SOCKET": f"@{name}", "WATCHDOG_USEC": "2000000"}
        with running(config, port, env, speed=2) as daemon:

            def seen(key: str) -> list[str]:
                return [m for _, m in list(messages) if key in m.split("\n")]

            daemon.wait_until(lambda: len(seen("WATCHDOG=1")) >= 3, "three WATCHDOG=1")
            ready = seen("READY=1")
            assert len(ready) == 1 and "STATUS=tick 1 " in ready[0], messages
            assert any(f"{NAME}=5" in m for m in seen("WATCHDOG=1")), messages
            assert daemon.wait_http("/healthz")

            daemon.proc.send_signal(signal.SIGHUP)
            daemon.wait_until(lambda: len(seen("READY=1")) == 2, "READY=1 after the reload")
            reloading = seen("RELOADING=1")
            assert len(reloading) == 1 and "MONOTONIC_USEC=" in reloading[0]

            code, elapsed_s = daemon.stop(signal.SIGTERM)
            time.sleep(0.3)
        done.set()
        reader.join(timeout=2)
    assert code == 0, daemon.stderr
    print(f"SIGTERM to exit: {elapsed_s:.2f} s")
    assert elapsed_s < 10.0
    stopping = seen("STOPPING=1")
    assert stopping and "STATUS=stopping on SIGTERM" in stopping[0]
    saved = json.loads(state.read_text())
    assert saved["deployments"][NAME]["state"]["target_replicas"] == 5
    assert daemon.find("state_saved") and daemon.find("stopped")


def test_kill_9_then_restart_restores_state_and_blocks_scale_down_for_the_window(
    tmp_path: Path, service_env: dict[str, str]
) -> None:
    # 20 s at 36 req/s (5 replicas), then 4 req/s (1 replica) for the rest of the trace.
    trace = write_trace(tmp_path / "trace.csv", [(20, 36.0), (1000, 4.0)])
    port = free_port()
    state = tmp_path / "state.json"
    config = write_config(tmp_path / "config.yaml", trace, port, state)
    speed = 20.0  # 60 s of downscale_delay_s pass in 3 s

    def saved_target() -> int:
        with contextlib.suppress(OSError, ValueError, KeyError):
            return int(
                json.loads(state.read_text())["deployments"][NAME]["state"]["target_replicas"]
            )
        return 0

    first = Daemon(config, port, service_env, speed)
    try:
        first.wait_until(lambda: saved_target() == 5, "a saved target of 5")
        first.proc.kill()  # SIGKILL: no chance to save anything more
        assert first.proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        first.close()
    saved = json.loads(state.read_text())
    # Down a while: the trace moves on to the quiet phase meanwhile (1.5 s is 30 s of
    # trace at this speed, whatever the restart itself takes).
    time.sleep(1.5)

    with running(config, port, service_env, speed) as daemon:
        restored = daemon.wait_event("state_restored")
        assert restored["replicas"] == 5 and restored["fresh_history_kept"] is False
        resumed_s = daemon.wait_event("replay_resumed")["at_s"]
        assert resumed_s >= saved["saved_at_s"] and resumed_s > TRACE_START_S + 30
        daemon.wait_until(
            lambda: any(e["target"] < e["previous"] for e in daemon.find("decision")),
            "the scale-down after the protected window",
        )
        history = decisions(daemon)
        code, _ = daemon.stop()
    assert code == 0, daemon.stderr
    # The restored target is where the restarted daemon started from (not min_replicas).
    assert history[0]["previous_replicas"] == 5
    window_end_s = resumed_s + 60.0
    protected = [d for d in history if d["decided_at_s"] < window_end_s]
    assert protected and all(d["target_replicas"] == 5 for d in protected)
    # Load wanted fewer replicas throughout: the window, not the load, held them.
    assert all(d["replicas_sustained"] == 1 for d in protected if d["replicas_sustained"])
    [down] = [d for d in daemon.find("decision") if d["target"] < d["previous"]][:1]
    assert down["decided_at_s"] >= window_end_s and down["target"] == 1


async def test_a_tick_stuck_in_a_sensor_is_abandoned_at_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound behind "exit within 10 s": a stop waits STOP_GRACE_S for the tick, no more."""
    from autoscalerd import loop
    from autoscalerd.clock import RealClock
    from autoscalerd.config import Config

    class HangingSensor:
        name = "hanging"
        entered = asyncio.Event()

        async def sense(self, now_s: float) -> Any:
            self.entered.set()
            await asyncio.sleep(3600)  # the sensor's own timeout is 0.8 x tick_s = 48 s

        async def close(self) -> None:
            await asyncio.sleep(3600)  # closing hangs too: bounded by CLOSE_TIMEOUT_S

    monkeypatch.setattr(loop, "STOP_GRACE_S", 0.2)
    monkeypatch.setattr(loop, "CLOSE_TIMEOUT_S", 0.2)
    config = Config.model_validate({"tick_s": 60, "http": {"enabled": False}})
    sensor = HangingSensor()
    controller = loop.Controller(config, [sensor], [], RealClock())
    running = asyncio.create_task(controller.run())
    await asyncio.wait_for(sensor.entered.wait(), 5)
    started = time.monotonic()
    controller.stop()
    await asyncio.wait_for(running, 5)
    assert time.monotonic() - started < 1.0
    assert controller.ticks_completed == 0
