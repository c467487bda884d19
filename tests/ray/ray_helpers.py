"""Helpers for the real-Ray tests: waiting, replica counts, a cuttable TCP proxy, the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from autoscalerd.config import Config, parse_config
from autoscalerd.emulator import cluster as local
from autoscalerd.emulator import loadgen
from autoscalerd.emulator.cluster import LocalCluster
from tests.helpers import REPO, autoscalerd_bin

LLM = "llm/LlmReplica"
PLAIN = "plain/LlmReplica"

# One emulated request of the tests' shape (400 prompt + 40 output tokens) takes
# 400/2000 + 40·0.02 = 1.0 s, and a replica holds two: about 2 requests/s per replica.
PROMPT_TOKENS = 400
OUTPUT_TOKENS = 40
LLM_ARGS = {"max_ongoing_requests": 2, "prefill_tokens_per_s": 2000, "tpot_s": 0.02}

APPS = (
    local.AppSpec("llm", "/llm", external_scaler_enabled=True, args=LLM_ARGS),
    local.AppSpec(
        "plain",
        "/plain",
        external_scaler_enabled=False,
        args={"num_gpus": 0, "num_cpus": 0.5, "max_ongoing_requests": 4},
    ),
)


def cluster_config(
    cluster: LocalCluster,
    dashboard_url: str | None = None,
    **cluster_overrides: Any,
) -> Config:
    """A Config that reaches `cluster` (token from its file), for in-process plugins."""
    settings: dict[str, Any] = {
        "dashboard_url": dashboard_url or cluster.dashboard_url,
        "token_file": str(cluster.token_file),
        "address": cluster.gcs_address,
        "request_timeout_s": 3,
    }
    settings.update(cluster_overrides)
    document = {
        "cluster": settings,
        "defaults": {"autoscaling": {"look_back_period_s": 10}},
    }
    return parse_config(yaml.safe_dump(document))


def wait_for(
    condition: Callable[[], Any], timeout_s: float, interval_s: float = 0.5, what: str = ""
) -> Any:
    """Poll until `condition()` is truthy; its value, or AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what or condition}")


def deployment(cluster: LocalCluster, name: str) -> dict[str, Any]:
    app, dep = name.split("/", 1)
    return dict(cluster.applications()[app]["deployments"][dep])


def target_replicas(cluster: LocalCluster, name: str) -> int:
    return int(deployment(cluster, name)["target_num_replicas"])


def running_replicas(cluster: LocalCluster, name: str) -> int:
    return sum(1 for r in deployment(cluster, name)["replicas"] if r["state"] == "RUNNING")


def scale(cluster: LocalCluster, name: str, replicas: int, wait_s: float = 90.0) -> None:
    """Set a deployment's target through the external-scaler API and wait until it runs."""
    app, dep = name.split("/", 1)
    status, body = cluster.request(
        "POST",
        f"/api/v1/applications/{app}/deployments/{dep}/scale",
        {"target_num_replicas": replicas},
    )
    assert status == 200, (status, body)
    if wait_s:
        wait_for(
            lambda: (
                len(deployment(cluster, name)["replicas"]) == replicas
                and running_replicas(cluster, name) == replicas
            ),
            wait_s,
            what=f"{name} at {replicas} running replicas",
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TcpProxy:
    """A loopback TCP forwarder that a test can cut and restore, on its own thread.

    Cutting closes the listener and every open connection, so the client sees exactly what
    it would if the dashboard went away: refused connections.
    """

    def __init__(self, target_port: int, listen_port: int | None = None) -> None:
        self.target_port = target_port
        self.port = listen_port or free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def start(self) -> None:
        self._call(self._start())

    def cut(self) -> None:
        self._call(self._cut())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()
                self._writers.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


class Daemon:
    """`autoscalerd run --config F` as a user runs it; its JSON log lines, collected."""

    def __init__(
        self,
        config: dict[str, Any] | Path,
        workdir: Path,
        env: dict[str, str],
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if isinstance(config, Path):
            self.config_path = config
        else:
            self.config_path = workdir / f"autoscalerd-{time.monotonic_ns()}.yaml"
            self.config_path.write_text(yaml.safe_dump(config))
        self.lines: list[str] = []
        command = [autoscalerd_bin(), "run", "--config", str(self.config_path)]
        self.proc = subprocess.Popen(
            [*command, "--log-format", "json", *extra_args],
            cwd=REPO,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                out.append(event)
        return out

    def output(self) -> str:
        return "\n".join(self.lines)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        return int(self.proc.returncode)


@contextlib.contextmanager
def daemon(
    config: dict[str, Any] | Path,
    workdir: Path,
    env: dict[str, str],
    extra_args: tuple[str, ...] = (),
) -> Iterator[Daemon]:
    process = Daemon(config, workdir, env, extra_args)
    try:
        yield process
    finally:
        process.stop()


def daemon_env(cluster: LocalCluster) -> dict[str, str]:
    """The daemon finds the token through its config (token_file), not the environment."""
    env = cluster.env()
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_AUTH_MODE", None)
    env.pop("AUTOSCALERD_DEBUG", None)
    env["RAY_ADDRESS"] = cluster.gcs_address
    env.setdefault("HOME", os.environ.get("HOME", "/root"))
    return env


class BackgroundLoad:
    """Open-loop load from a thread of its own, so a test can wait on the cluster meanwhile."""

    def __init__(self, url: str, schedule: list[loadgen.ScheduledRequest]) -> None:
        self.result: loadgen.LoadResult | None = None
        self._url = url
        self._schedule = schedule
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        self.result = await loadgen.run(self._url, self._schedule, stop=self._stop, drain_s=15)

    def stop(self) -> loadgen.LoadResult | None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)
        return self.result


def daemon_config(
    cluster: LocalCluster,
    http_port: int,
    dashboard_url: str | None = None,
    actuators: tuple[str, ...] = ("ray_serve",),
    deployments: list[dict[str, Any]] | None = None,
    **cluster_overrides: Any,
) -> dict[str, Any]:
    """A daemon config with short delays: seconds where production uses minutes."""
    cluster_settings: dict[str, Any] = {
        "dashboard_url": dashboard_url or cluster.dashboard_url,
        "token_file": str(cluster.token_file),
        "address": cluster.gcs_address,
        "request_timeout_s": 2,
    }
    cluster_settings.update(cluster_overrides)
    return {
        "tick_s": 1.0,
        "log_level": "info",
        "cluster": cluster_settings,
        "discovery": {"enabled": True},
        "http": {"enabled": True, "addr": f"127.0.0.1:{http_port}"},
        "defaults": {
            "autoscaling": {
                "min_replicas": 1,
                "max_replicas": 3,
                "target_ongoing_requests": 2,
                "upscale_delay_s": 2,
                "downscale_delay_s": 8,
                "look_back_period_s": 5,
            },
            # The emulator's replica serves about 2 requests/s (see LLM_ARGS).
            "capacity": {
                "service_rate_per_replica": 2.0,
                "target_utilization": 0.8,
                "cold_start_s": 5,
                "actuation_delay_s": 1,
                "reactive_window_s": 5,
            },
            "forecast": {"enabled": False},
            # The error budget's windows at the tests' scale (their delays are seconds):
            # with the product's 5 min and 1 h, a load phase's misses would hold the
            # scale-down after it for minutes, as they should in production.
            "slo": {"burn_fast_window_s": 10, "burn_slow_window_s": 30},
            "max_metric_age_s": 5,
        },
        "deployments": deployments or [],
        "sensors": [{"type": "ray_serve", "metrics_interval_s": 1, "rate_window_s": 4}],
        "actuators": [{"type": name} for name in actuators],
    }


def healthz(port: int) -> int:
    """The daemon's /healthz status (0 when it does not answer)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0
