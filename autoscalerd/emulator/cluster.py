"""Start and stop a local autoscaling Ray cluster with the LLM emulator on it.

For the real-Ray tests and the demo: `start()` runs `ray start --head` with Ray's fake
multi-node provider (config/ray-cluster.yaml: a head, and GPU worker nodes the autoscaler
adds and removes), token auth on with a fresh token, and waits for the dashboard;
`deploy()` puts emulator apps on it with `serve.run(..., external_scaler_enabled=...)`;
`stop()` runs `ray stop --force`. `running()` does all three and always stops what it
started, also when starting or deploying fails.

`ray stop` stops every Ray process of this user on this machine, so `start()` refuses to
run where a Ray cluster already listens on the default ports rather than take it over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_CLUSTER_YAML = Path(__file__).resolve().parents[2] / "config" / "ray-cluster.yaml"
HOST = "127.0.0.1"
GCS_PORT = 6379  # the fake provider's worker nodes join the head on Ray's default port
DASHBOARD_PORT = 8265
SERVE_PORT = 8000


class ClusterError(RuntimeError):
    """The local cluster could not be started or the apps not deployed; one line + log path."""


@dataclass(frozen=True, slots=True)
class AppSpec:
    """One emulator application: its name, route, whether autoscalerd may scale it."""

    name: str
    route_prefix: str
    external_scaler_enabled: bool = True
    # build_app's args: num_replicas, max_ongoing_requests, num_gpus, num_cpus, tpot_s, ...
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LocalCluster:
    dashboard_url: str
    serve_url: str
    gcs_address: str
    token_file: Path
    workdir: Path
    token: str = field(repr=False)  # never printed

    def env(self) -> dict[str, str]:
        """The environment for a process that talks to this cluster (driver or daemon)."""
        env = dict(os.environ)
        env["RAY_AUTH_TOKEN"] = self.token
        # A driver given an explicit address sends the token only in token mode.
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_ADDRESS"] = self.gcs_address
        env.pop("RAY_FAKE_CLUSTER", None)
        return env

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One dashboard call with the token (blocking; for tests and the demo)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.dashboard_url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as answer:
                status, text = answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def applications(self) -> dict[str, Any]:
        status, body = self.request("GET", "/api/serve/applications/")
        if status != 200 or not isinstance(body, dict):
            raise ClusterError(f"GET /api/serve/applications/ answered {status}")
        apps = body.get("applications") or {}
        return dict(apps)

    def alive_nodes(self) -> list[dict[str, Any]]:
        status, body = self.request("GET", "/api/v0/nodes?detail=1&limit=100")
        if status != 200 or not isinstance(body, dict):
            raise ClusterError(f"GET /api/v0/nodes answered {status}")
        nodes = body["data"]["result"]["result"]
        return [n for n in nodes if n.get("state") == "ALIVE"]

    def gpu_nodes(self) -> int:
        return sum(1 for n in self.alive_nodes() if n.get("resources_total", {}).get("GPU"))


def ray_bin() -> str:
    """The `ray` CLI of this environment."""
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def start(
    workdir: Path,
    cluster_yaml: Path = REPO_CLUSTER_YAML,
    head_cpus: int = 2,
    metrics_report_interval_ms: int = 1000,
    ready_timeout_s: float = 120.0,
) -> LocalCluster:
    """Start the head of the local autoscaling cluster; the GPU workers come on demand."""
    for port in (GCS_PORT, DASHBOARD_PORT, SERVE_PORT):
        if _listening(port):
            raise ClusterError(
                f"something already listens on {HOST}:{port} (a Ray cluster?); stop it "
                "(`ray stop`) or point autoscalerd at it instead of starting a local one"
            )
    if not cluster_yaml.is_file():
        raise ClusterError(f"{cluster_yaml}: no such cluster YAML")
    workdir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    token_file = workdir / "auth_token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    env = dict(os.environ)
    env.update(
        {
            "RAY_FAKE_CLUSTER": "1",  # required by the fake multi-node provider
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": token,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray exports metrics every 10 s by default; faster keeps tests and demo short.
            "RAY_metrics_report_interval_ms": str(metrics_report_interval_ms),
        }
    )
    log_path = workdir / "ray-start.log"
    command = [
        ray_bin(),
        "start",
        "--head",
        f"--num-cpus={head_cpus}",
        "--num-gpus=0",
        f"--port={GCS_PORT}",
        f"--dashboard-host={HOST}",
        f"--dashboard-port={DASHBOARD_PORT}",
        f"--autoscaling-config={cluster_yaml}",
        "--disable-usage-stats",
    ]
    with log_path.open("w") as log:
        try:
            done = subprocess.run(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=ready_timeout_s
            )
        except subprocess.TimeoutExpired:
            stop()
            raise ClusterError(
                f"`ray start` did not finish in {ready_timeout_s:g} s; see {log_path}"
            ) from None
    if done.returncode != 0:
        stop()
        raise ClusterError(f"`ray start` failed (exit {done.returncode}); see {log_path}")
    cluster = LocalCluster(
        dashboard_url=f"http://{HOST}:{DASHBOARD_PORT}",
        serve_url=f"http://{HOST}:{SERVE_PORT}",
        gcs_address=f"{HOST}:{GCS_PORT}",
        token_file=token_file,
        workdir=workdir,
        token=token,
    )
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            cluster.applications()
            return cluster
        except (ClusterError, OSError):
            if time.monotonic() > deadline:
                stop()
                raise ClusterError(
                    f"dashboard {cluster.dashboard_url} not ready in {ready_timeout_s:g} s"
                ) from None
            time.sleep(0.5)


def deploy(cluster: LocalCluster, apps: Sequence[AppSpec], timeout_s: float = 180.0) -> None:
    """Deploy emulator apps (in a short-lived driver process) and wait until they run."""
    spec = [
        {
            "name": a.name,
            "route_prefix": a.route_prefix,
            "external_scaler_enabled": a.external_scaler_enabled,
            "args": dict(a.args),
        }
        for a in apps
    ]
    log_path = cluster.workdir / "deploy.log"
    with log_path.open("a") as log:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "autoscalerd.emulator.cluster", "deploy", json.dumps(spec)],
                env=cluster.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(f"deploying took over {timeout_s:g} s; see {log_path}") from None
    if done.returncode != 0:
        raise ClusterError(f"deploying failed (exit {done.returncode}); see {log_path}")
    deadline = time.monotonic() + timeout_s
    while True:
        states = {name: app.get("status") for name, app in cluster.applications().items()}
        if all(states.get(a.name) == "RUNNING" for a in apps):
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"apps not RUNNING after {timeout_s:g} s: {states}")
        time.sleep(0.5)


def stop(timeout_s: float = 60.0) -> None:
    """`ray stop --force`: ends every Ray process this user runs on this machine."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [ray_bin(), "stop", "--force"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
        )


@contextlib.contextmanager
def running(workdir: Path, apps: Sequence[AppSpec], **start_options: Any) -> Iterator[LocalCluster]:
    """A started cluster with `apps` deployed; stopped on exit, whatever happened."""
    try:
        cluster = start(workdir, **start_options)
        deploy(cluster, apps)
        yield cluster
    finally:
        stop()


def _deploy_main(spec_json: str) -> int:
    """Child process: connect as a driver, deploy, exit (Serve apps outlive their driver)."""
    import ray
    from ray import serve

    from autoscalerd.emulator.llm_app import build_app

    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level=logging.WARNING)
    # One proxy, on the head: a proxy per fake node would keep idle GPU nodes alive.
    serve.start(proxy_location="HeadOnly", http_options={"host": HOST, "port": SERVE_PORT})
    for app in json.loads(spec_json):
        serve.run(
            build_app(app["args"]),
            name=app["name"],
            route_prefix=app["route_prefix"],
            external_scaler_enabled=bool(app["external_scaler_enabled"]),
            blocking=False,
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "deploy":
        sys.exit(_deploy_main(sys.argv[2]))
    print(
        "usage: python -m autoscalerd.emulator.cluster deploy '<json app specs>'", file=sys.stderr
    )
    sys.exit(2)
