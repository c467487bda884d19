"""A sensor's rounds on a background task, so that `sense()` answers at once.

The loop waits at most max(1 s, 0.8 * tick_s) for a sensor, and a server that answers
slowly must make readings older, not the tick late. So a sensor that talks to a server
runs its rounds here, one every `period_s`, and `sense()` returns what the last round
left. Only the very first round is waited for (at most `first_wait_s`): before it there
is nothing to answer with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable


class Rounds:
    """`run_round()` every `period_s` on a task of its own, started by the first `ready()`.

    A round that raises is handed to `on_failure` and the next round runs as usual:
    one bad answer never stops the polling.
    """

    def __init__(
        self,
        name: str,
        period_s: float,
        first_wait_s: float,
        run_round: Callable[[], Awaitable[None]],
        on_failure: Callable[[Exception], None],
    ) -> None:
        self._name = name
        self._period_s = period_s
        self._first_wait_s = first_wait_s
        self._run_round = run_round
        self._on_failure = on_failure
        self._task: asyncio.Task[None] | None = None
        self._first_round = asyncio.Event()

    @classmethod
    def every_tick(
        cls,
        name: str,
        tick_s: float,
        run_round: Callable[[], Awaitable[None]],
        on_failure: Callable[[Exception], None],
    ) -> Rounds:
        """A round every tick. The loop waits at most max(1 s, 0.8 * tick_s) for a sensor,
        so the first round is waited for three quarters of that, which fits."""
        return cls(name, tick_s, 0.75 * max(1.0, 0.8 * tick_s), run_round, on_failure)

    async def ready(self) -> None:
        """Start the rounds if they are not running; wait for the first one, within bounds."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._forever(), name=self._name)
        if not self._first_round.is_set():
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._first_round.wait(), self._first_wait_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._run_round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep polling whatever one round did
                self._on_failure(exc)
            finally:
                self._first_round.set()
            await asyncio.sleep(max(0.05, self._period_s - (time.monotonic() - started)))
