"""sd_notify: tell systemd (Type=notify) that the daemon is ready, alive, reloading, stopping.

The protocol is one datagram of `KEY=value` lines to the unix socket named by
$NOTIFY_SOCKET (a leading '@' names the abstract namespace). Without that variable every
call is a no-op, so the same code runs under systemd, in a container and in a terminal.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from autoscalerd import logs

if TYPE_CHECKING:
    from autoscalerd.loop import Controller, TickReport

# systemd truncates STATUS= in `systemctl status`; a longer line only costs bytes.
STATUS_MAX_CHARS = 200


def socket_address(value: str) -> str:
    """The address to send to: '@name' is the abstract socket '\\0name'."""
    return "\0" + value[1:] if value.startswith("@") else value


class Notifier:
    """Sends sd_notify messages over one datagram socket, opened on first use."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        target = env.get("NOTIFY_SOCKET", "")
        self.address = socket_address(target) if target else None
        self._socket: socket.socket | None = None
        self._log = logs.get("autoscalerd.notify")
        self._failing = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send one message; True when it left. Failures are logged once, never raised."""
        if self.address is None:
            return False
        try:
            if self._socket is None:
                self._socket = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                )
            self._socket.sendto("\n".join(lines).encode("utf-8", "replace"), self.address)
        except OSError as exc:
            if not self._failing:
                self._log.warning("notify_failed", error=f"{type(exc).__name__}: {exc}")
            self._failing = True
            return False
        if self._failing:
            self._log.info("notify_recovered")
        self._failing = False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={_one_line(status)}")

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets Type=notify-reload (systemd 253+) match this to its SIGHUP.
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={_one_line(status)}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={_one_line(status)}")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class TickNotifier:
    """The Controller listener: READY=1 after the first completed tick, then WATCHDOG=1 and
    a STATUS= summary every tick."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.ready_sent = False

    def __call__(self, controller: Controller, report: TickReport) -> None:
        line = status_line(controller, report)
        if not self.ready_sent:
            self.ready_sent = self.notifier.ready(line) or not self.notifier.enabled
            self.notifier.send("WATCHDOG=1")
            return
        self.notifier.send("WATCHDOG=1", f"STATUS={_one_line(line)}")


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """Half of WatchdogSec= (as systemd advises), or None when no watchdog is armed for us."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2e6


async def keep_watchdog_fed(
    notifier: Notifier, interval_s: float, healthy: Callable[[], bool]
) -> None:
    """WATCHDOG=1 between ticks too, while the loop is healthy (/healthz's rule).

    Ticks already ping; this covers a tick_s longer than half of WatchdogSec, and it stops
    pinging the moment ticks stop completing, so a wedged loop is still restarted.
    """
    while True:
        await asyncio.sleep(interval_s)
        if healthy():
            notifier.send("WATCHDOG=1")


def status_line(controller: Controller, report: TickReport) -> str:
    """One line for `systemctl status`: tick count, each deployment's target, problems."""
    parts = [f"tick {controller.ticks_completed} ({report.duration_s * 1000:.0f} ms)"]
    targets = []
    for name, runtime in sorted(controller.deployments.items()):
        decision = runtime.last_decision
        if decision is None:
            continue
        mark = " paused" if runtime.paused else ""
        mark += " override" if runtime.override_replicas is not None else ""
        targets.append(f"{name}={decision.target_replicas}{mark}")
    parts.append(", ".join(targets) if targets else "no deployments yet")
    if controller.sensor_errors:
        parts.append("sensor errors: " + ", ".join(sorted(controller.sensor_errors)))
    if controller.dry_run:
        parts.append("dry run")
    return "; ".join(parts)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:STATUS_MAX_CHARS]
