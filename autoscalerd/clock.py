"""Clocks: the loop asks one for the time and to wait, so a trace can replay in virtual time."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float: ...

    async def sleep_until(self, deadline_s: float) -> None: ...


class RealClock:
    """Wall time (monotonic for waiting)."""

    def now_s(self) -> float:
        return time.time()

    async def sleep_until(self, deadline_s: float) -> None:
        delay_s = deadline_s - time.time()
        if delay_s > 0:
            await asyncio.sleep(delay_s)


class VirtualClock:
    """Trace time. `speed` virtual seconds pass per wall second; speed=None runs flat out."""

    def __init__(self, start_s: float, speed: float | None = None) -> None:
        self._now_s = start_s
        self._speed = speed

    def now_s(self) -> float:
        return self._now_s

    async def sleep_until(self, deadline_s: float) -> None:
        step_s = deadline_s - self._now_s
        if step_s <= 0:
            await asyncio.sleep(0)
            return
        if self._speed is None:
            await asyncio.sleep(0)  # let the server and signal handlers run
        else:
            await asyncio.sleep(step_s / self._speed)
        self._now_s = deadline_s
