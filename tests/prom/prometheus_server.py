"""A real Prometheus server (Debian's /usr/bin/prometheus) for the tests: a generated
config, a free loopback port, a storage folder of its own; stopped when done."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.ray.ray_helpers import free_port


def prometheus_bin() -> str:
    """The server binary; `make tools` installs it (Debian's prometheus package)."""
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )
    if found is None:
        import pytest

        pytest.fail(
            "prometheus (the server) not found on PATH: run `make tools` (installs Debian's "
            "prometheus package) or put the prometheus binary of a release on PATH"
        )
    return found


@dataclass
class PrometheusServer:
    url: str
    workdir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    # Basic auth for the test's own calls, when the server requires it.
    auth: tuple[str, str] | None = None
    targets: dict[str, Path] = field(default_factory=dict)

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = "?" + urllib.parse.urlencode(params) if params else ""
        request = urllib.request.Request(self.url + path + query)
        if self.auth is not None:
            import base64

            pair = base64.b64encode(":".join(self.auth).encode()).decode()
            request.add_header("Authorization", f"Basic {pair}")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            try:
                return json.loads(body)
            except ValueError:
                return {"status": "error", "errorType": str(exc.code), "error": body}

    def query(self, promql: str) -> dict[str, Any]:
        """An instant query's whole answer (status, data or error)."""
        answer: dict[str, Any] = self.get("/api/v1/query", {"query": promql})
        return answer

    def vector(self, promql: str) -> list[dict[str, Any]]:
        answer = self.query(promql)
        assert answer.get("status") == "success", (promql, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def set_targets(self, job: str, targets: list[str]) -> None:
        """The targets of a file-SD job of the config (written atomically)."""
        path = self.targets[job]
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps([{"targets": targets}]))
        temp.replace(path)

    def wait_for_series(self, promql: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.vector(promql)
            if found:
                return found
            assert time.monotonic() < deadline, f"no series for {promql} in {timeout_s:g} s"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def start(
    workdir: Path,
    scrape_configs: list[dict[str, Any]],
    file_sd_jobs: tuple[str, ...] = (),
    rule_files: tuple[Path, ...] = (),
    web_config: dict[str, Any] | None = None,
    auth: tuple[str, str] | None = None,
    scrape_interval_s: float = 1.0,
    ready_timeout_s: float = 30.0,
) -> PrometheusServer:
    """Start Prometheus scraping `scrape_configs` (plus one file-SD job per name in
    `file_sd_jobs`, its targets set later with `set_targets`) every `scrape_interval_s`."""
    workdir.mkdir(parents=True, exist_ok=True)
    targets: dict[str, Path] = {}
    jobs = list(scrape_configs)
    for job in file_sd_jobs:
        path = workdir / f"{job}-targets.json"
        path.write_text("[]")
        targets[job] = path
        jobs.append(
            {"job_name": job, "file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}]}
        )
    interval = f"{round(scrape_interval_s * 1000)}ms"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": jobs,
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    command = [
        prometheus_bin(),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    scheme = "http"
    if web_config is not None:
        web_path = workdir / "web.yml"
        web_path.write_text(yaml.safe_dump(web_config))
        command.append(f"--web.config.file={web_path}")
        if "tls_server_config" in web_config:
            scheme = "https"
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = PrometheusServer(f"{scheme}://127.0.0.1:{port}", workdir, process, log_path, auth)
    server.targets = targets
    deadline = time.monotonic() + ready_timeout_s
    while not _ready(server):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise AssertionError(f"prometheus did not become ready: {log_path.read_text()[-2000:]}")
        time.sleep(0.2)
    return server


def _ready(server: PrometheusServer) -> bool:
    if server.url.startswith("https"):
        # Readiness over TLS with the test's CA would need it here: the port is enough.
        import socket

        port = int(server.url.rsplit(":", 1)[1])
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0
        return False
    with contextlib.suppress(OSError, ValueError):
        return server.get("/api/v1/status/runtimeinfo").get("status") == "success"
    return False


@contextlib.contextmanager
def running(workdir: Path, **options: Any) -> Iterator[PrometheusServer]:
    server = start(workdir, **options)
    try:
        yield server
    finally:
        server.stop()
