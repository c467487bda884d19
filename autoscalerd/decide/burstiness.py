"""Burstiness of arrivals at the SLO's time scale, measured online.

The forecast gives the level of the arrival rate over minutes; the SLO is lost in the
seconds when requests arrive in clumps. What sizing needs is the peak-to-mean ratio of
arrivals per tick that the attainment target must ride through: the ratio r such that
requests arriving in ticks with count/mean above r are at most a share ε of all
requests. The ratio is a shape, so it carries over to the level the forecast predicts.

Each tick's count is divided by the level (an EWMA of the rate over `level_memory_s`) and
added, weighted by its requests, to a histogram of log-spaced ratio bins whose counts are
forgotten exponentially over `memory_s`. A Poisson stream of 30 requests/s reads about
1.4 at ε = 1 %; the Azure 2023 code trace, with 73 % of its seconds empty, reads 20-40.
Pure: `observe(state, ...) -> state`, `peak_to_mean(state, ...) -> float`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Ratio bins: 1.25^k for k = 0..40 covers 1 to about 7,500; below 1 is one bin.
_BIN_BASE = 1.25
_BINS = 41
# The level adapts over this time: longer than a burst, shorter than a tide.
LEVEL_MEMORY_S = 300.0
# How long the burst shape is remembered.
MEMORY_S = 3600.0
# Requests the histogram must hold before its quantile is used; until then, Poisson.
MIN_REQUESTS = 50.0


@dataclass(frozen=True, slots=True)
class BurstState:
    level_per_s: float | None = None
    # Request-weighted counts per ratio bin, and when they were last forgotten.
    weights: tuple[float, ...] = ()
    updated_at_s: float | None = None

    @property
    def requests(self) -> float:
        return float(sum(self.weights))


def observe(state: BurstState, arrivals: float, tick_s: float, now_s: float) -> BurstState:
    """Fold one tick's arrival count in."""
    rate_per_s = arrivals / tick_s if tick_s > 0 else 0.0
    level = state.level_per_s
    weights = list(state.weights) if state.weights else [0.0] * _BINS
    if state.updated_at_s is not None and now_s > state.updated_at_s:
        keep = math.exp(-(now_s - state.updated_at_s) / MEMORY_S)
        weights = [w * keep for w in weights]
    if level is None:
        level = rate_per_s
    else:
        alpha = 1.0 - math.exp(-tick_s / LEVEL_MEMORY_S)
        level = level + alpha * (rate_per_s - level)
    if arrivals > 0 and level > 0:
        ratio = rate_per_s / level
        weights[_bin(ratio)] += arrivals
    return BurstState(level_per_s=level, weights=tuple(weights), updated_at_s=now_s)


def peak_to_mean(state: BurstState, share: float, rate_per_s: float, tick_s: float) -> float:
    """The ratio that all but `share` of requests arrive at or below (≥ 1).

    Until enough requests have been seen, the Poisson value at `rate_per_s`.
    """
    poisson = _poisson_ratio(share, rate_per_s * tick_s)
    total = state.requests
    if total < MIN_REQUESTS:
        return poisson
    above = 0.0
    for index in range(len(state.weights) - 1, -1, -1):
        above += state.weights[index]
        if above / total > share:
            return max(1.0, _upper(index))
    return 1.0


def _bin(ratio: float) -> int:
    if ratio <= 1.0:
        return 0
    return min(_BINS - 1, 1 + int(math.log(ratio) / math.log(_BIN_BASE)))


def _upper(index: int) -> float:
    """The upper edge of bin `index`."""
    return _BIN_BASE**index


def _poisson_ratio(share: float, mean_count: float) -> float:
    """Normal approximation of a Poisson count's upper quantile, over its mean."""
    if mean_count <= 0:
        return 1.0
    z = _normal_quantile(1.0 - share)
    return 1.0 + z / math.sqrt(mean_count) + 1.0 / mean_count


def _normal_quantile(p: float) -> float:
    """Φ⁻¹(p) by bisection on erf: exact enough, and only at the few p a config gives."""
    low, high = -10.0, 10.0
    for _ in range(60):
        mid = 0.5 * (low + high)
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < p:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)
