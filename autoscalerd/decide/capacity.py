"""The arithmetic of sizing: rates over windows, the service rate μ, and replica counts.

Pure functions, no state of their own: the policy passes windows in and gets numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

_Sample = TypeVar("_Sample", bound=tuple[float, ...])

# A tolerance so that 3.0000000001 replicas stays 3, not 4.
_EPSILON = 1e-9


# More replicas than any count the bounds allow: what an overflowing ratio rounds to.
_MAX_COUNT = 10**9


def ceil_replicas(value: float) -> int:
    if not value < _MAX_COUNT:  # inf, NaN or beyond: bounded, never an OverflowError
        return _MAX_COUNT
    return max(0, math.ceil(value - _EPSILON))


def window(samples: Sequence[_Sample], now_s: float, window_s: float) -> tuple[_Sample, ...]:
    """The samples no older than `window_s` (oldest first), as a new tuple."""
    cutoff_s = now_s - window_s
    start = 0
    while start < len(samples) and samples[start][0] < cutoff_s:
        start += 1
    return tuple(samples[start:])


def tail(samples: Sequence[_Sample], since_s: float) -> Sequence[_Sample]:
    """The samples at or after `since_s`. Scans from the newest end: windows are short."""
    start = len(samples)
    while start > 0 and samples[start - 1][0] >= since_s:
        start -= 1
    return samples[start:]


def mean_rate(
    samples: Sequence[tuple[float, float]], now_s: float, window_s: float
) -> float | None:
    recent = tail(samples, now_s - window_s)
    if not recent:
        return None
    return sum(rate for _, rate in recent) / len(recent)


def derate(kv_cache_usage_ratio: float | None, above: float) -> float:
    """Capacity factor in (0, 1]: KV-cache pressure above `above` halves μ linearly at 100%.

    GPU faults are not a factor on every replica: they take capacity from the replicas
    on the faulty GPUs, and the policy adds those replicas' worth (gpu_health.py)."""
    factor = 1.0
    if kv_cache_usage_ratio is not None and kv_cache_usage_ratio > above and above < 1.0:
        pressure = min(1.0, (kv_cache_usage_ratio - above) / (1.0 - above))
        factor *= 1.0 - 0.5 * pressure
    return factor


def replicas_for_rate(
    arrival_rate_per_s: float, service_rate_per_s: float, target_utilization: float
) -> int:
    """⌈λ / (ρ·μ)⌉. A tiny ρ·μ (each only > 0 by config) can make the quotient overflow,
    or the product underflow to zero: the count is then bounded as every count is."""
    if arrival_rate_per_s <= 0:
        return 0
    per_replica_per_s = target_utilization * service_rate_per_s
    if not per_replica_per_s > 0:
        return ceil_replicas(math.inf)
    return ceil_replicas(arrival_rate_per_s / per_replica_per_s)


def replicas_for_backlog(queued: float, service_rate_per_s: float, drain_s: float) -> int:
    """⌈Q / (μ·drain_s)⌉: enough extra replicas to drain the queue within drain_s."""
    if queued <= 0:
        return 0
    return ceil_replicas(queued / (service_rate_per_s * drain_s))


def backlog_at_landing_requests(
    queued: float, arrival_rate_per_s: float | None, served_per_s: float | None, lead_s: float
) -> float:
    """Q + max(0, λ − served)·lead: the queue when capacity asked for now can land.

    While arrivals outrun what runs, the queue grows until new replicas start serving;
    those replicas must drain what is there then, not what is there now.
    """
    if arrival_rate_per_s is None or served_per_s is None:
        return queued
    return queued + max(0.0, arrival_rate_per_s - served_per_s) * lead_s


def replicas_for_concurrency(ongoing: float, target_ongoing_requests: float) -> int:
    """Ray Serve's rule: ⌈ongoing / target_ongoing_requests⌉."""
    return ceil_replicas(ongoing / target_ongoing_requests)
