"""`autoscalerd run` as a real process: its JSON log events collected as they arrive, its
HTTP API, its signals."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import REPO, autoscalerd_bin


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Daemon:
    """`autoscalerd run` in a subprocess; its JSON log events collected as they arrive."""

    def __init__(
        self, config: Path, port: int, env: dict[str, str], speed: float | None = None
    ) -> None:
        self.port = port
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [autoscalerd_bin(), "run", "--config", str(config)]
            + (["--speed", str(speed)] if speed is not None else []),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"event": "unparsed", "line": line}
            with self._lock:
                self.events.append(event)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def find(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == name]

    def wait_event(self, name: str, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.find(name)
            if found:
                return found[0]
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.stderr}"
            time.sleep(0.05)
        raise AssertionError(f"no {name!r} event in {timeout_s} s; got {self.events[-5:]}")

    def request(
        self, method: str, path: str, body: str | None = None, token: str | None = None
    ) -> tuple[int, Any, str]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=body.encode() if body is not None else None,
            method=method,
            headers=headers,
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, text, kind = response.status, response.read().decode(), response.headers
        except urllib.error.HTTPError as error:
            status, text, kind = error.code, error.read().decode(), error.headers
        content_type = kind.get("Content-Type", "")
        parsed = json.loads(text) if content_type.startswith("application/json") else text
        assert "Traceback" not in text
        return status, parsed, content_type

    def get(self, path: str) -> tuple[int, Any]:
        status, body, _ = self.request("GET", path)
        return status, body

    def post(self, path: str, body: str | None = None, token: str | None = None) -> tuple[int, Any]:
        status, answer, content_type = self.request("POST", path, body, token)
        assert content_type.startswith("application/json"), content_type
        return status, answer

    def wait_http(self, path: str, status: int = 200, timeout_s: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.stderr}"
            with contextlib.suppress(OSError):
                got, last = self.get(path)
                if got == status:
                    return last
            time.sleep(0.1)
        raise AssertionError(f"{path} never answered {status}; last: {last}")

    def wait_until(self, check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.stderr}"
            if check():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 15.0) -> tuple[int, float]:
        started = time.monotonic()
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=timeout_s)
        return code, time.monotonic() - started

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
