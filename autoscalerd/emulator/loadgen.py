"""Open-loop HTTP load: requests go out at their scheduled times, whatever the answers do.

A closed loop (next request after the last answer) slows down exactly when the server
does, hiding the overload an autoscaler must see. Here each request is sent at its time
without waiting for earlier ones. Bounded in count, duration and requests in flight, and
only to loopback addresses: it is a test and demo tool, not a load-testing service.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

MAX_REQUESTS = 100_000
MAX_DURATION_S = 3_600.0


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    at_s: float  # seconds after the start
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Answer:
    """One request's outcome as the client saw it (times relative to the run's start)."""

    request: ScheduledRequest
    sent_at_s: float
    status: int | None  # None: no HTTP answer (connection error, timeout)
    latency_s: float
    # What the emulator reports of its own service: prefill (TTFT at the replica) and total.
    server_ttft_s: float | None = None
    server_e2e_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(slots=True)
class LoadResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    dropped: int = 0  # not sent: too many in flight
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


def constant_rate(
    rate_per_s: float,
    duration_s: float,
    prompt_tokens: int = 512,
    output_tokens: int = 32,
    start_s: float = 0.0,
) -> list[ScheduledRequest]:
    """Evenly spaced requests: `rate_per_s` for `duration_s` seconds."""
    if rate_per_s <= 0 or duration_s <= 0:
        return []
    count = int(rate_per_s * duration_s)
    return [
        ScheduledRequest(start_s + i / rate_per_s, prompt_tokens, output_tokens)
        for i in range(count)
    ]


def poisson(
    rate_per_s: float,
    duration_s: float,
    prompt_tokens: int = 512,
    output_tokens: int = 32,
    seed: int = 0,
    start_s: float = 0.0,
) -> list[ScheduledRequest]:
    """Poisson arrivals (exponential gaps) at `rate_per_s` for `duration_s` seconds."""
    rng = random.Random(seed)
    out: list[ScheduledRequest] = []
    at_s = 0.0
    while rate_per_s > 0:
        at_s += rng.expovariate(rate_per_s)
        if at_s >= duration_s:
            break
        out.append(ScheduledRequest(start_s + at_s, prompt_tokens, output_tokens))
    return out


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"load goes to loopback addresses only (got {host or url!r})")


async def run(
    url: str,
    schedule: Sequence[ScheduledRequest],
    *,
    max_in_flight: int = 512,
    request_timeout_s: float = 60.0,
    max_duration_s: float = 600.0,
    drain_s: float = 30.0,
    stop: asyncio.Event | None = None,
    on_answer: Callable[[Answer], None] | None = None,
    on_sent: Callable[[], None] | None = None,
) -> LoadResult:
    """Send `schedule` to `url` (POST JSON); answers are counted as they come.

    Setting `stop` ends sending early; requests already sent still get `drain_s`.
    `on_sent` is called per request sent, `on_answer` per request ended (also failures).
    """
    check_loopback(url)
    if len(schedule) > MAX_REQUESTS:
        raise ValueError(f"at most {MAX_REQUESTS} requests per run (got {len(schedule)})")
    max_duration_s = min(max_duration_s, MAX_DURATION_S)
    result = LoadResult()
    in_flight: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(request: ScheduledRequest) -> None:
            sent = time.monotonic()
            status: int | None = None
            reported: dict[str, Any] = {}
            try:
                body = {
                    "prompt_tokens": request.prompt_tokens,
                    "output_tokens": request.output_tokens,
                }
                async with session.post(url, json=body) as answer:
                    text = await answer.read()
                    status = answer.status
                    result.statuses[answer.status] = result.statuses.get(answer.status, 0) + 1
                    if answer.status == 200:
                        result.ok += 1
                        result.latencies_s.append(time.monotonic() - sent)
                        with contextlib.suppress(ValueError):
                            parsed = json.loads(text)
                            if isinstance(parsed, dict):
                                reported = parsed
                    else:
                        result.failed += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError):
                result.failed += 1
            if on_answer is not None:
                on_answer(
                    Answer(
                        request=request,
                        sent_at_s=sent - started,
                        status=status,
                        latency_s=time.monotonic() - sent,
                        server_ttft_s=_number(reported.get("ttft_s")),
                        server_e2e_s=_number(reported.get("e2e_s")),
                    )
                )

        started = time.monotonic()
        for request in sorted(schedule, key=lambda r: r.at_s):
            if request.at_s > max_duration_s:
                break
            delay_s = started + request.at_s - time.monotonic()
            if stop is not None:
                with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, delay_s))
                if stop.is_set():
                    break
            elif delay_s > 0:
                await asyncio.sleep(delay_s)
            if len(in_flight) >= max_in_flight:
                result.dropped += 1
                continue
            task = asyncio.ensure_future(one(request))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            result.sent += 1
            if on_sent is not None:
                on_sent()
        if in_flight:
            _, late = await asyncio.wait(set(in_flight), timeout=drain_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            result.failed += len(late)
    return result


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
