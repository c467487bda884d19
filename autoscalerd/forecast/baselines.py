"""Seasonal-naive and EWMA one-step forecasters: the yardsticks Holt-Winters must beat.

Each takes a whole series of closed-bucket rates and returns, for every bucket, the forecast
made one bucket earlier (NaN where there was nothing to forecast from), so the errors of
any forecaster line up index by index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
Series = Sequence[float] | FloatArray

# α values tried when fitting the EWMA: 0.05 to 1.0 (1.0 is the naive "last bucket" forecast).
EWMA_ALPHA_GRID: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 21))


def seasonal_naive_one_step(series: Series, season_length: int) -> FloatArray:
    """forecast[i] = series[i - season_length]: "the same bucket one season ago"."""
    values = np.asarray(series, dtype=float)
    out = np.full(len(values), np.nan)
    out[season_length:] = values[: len(values) - season_length]
    return out


def ewma_one_step(series: Series, alpha: float) -> FloatArray:
    """forecast[i] = EWMA of series[:i] (seeded with series[0]); forecast[0] is NaN."""
    values = np.asarray(series, dtype=float)
    out = np.full(len(values), np.nan)
    if len(values) == 0:
        return out
    level = float(values[0])
    for i in range(1, len(values)):
        out[i] = level
        level += alpha * (float(values[i]) - level)
    return out


def fit_ewma_alpha(series: Series, grid: Sequence[float] = EWMA_ALPHA_GRID) -> float:
    """The α from `grid` with the least squared one-step error on `series` (a training span)."""
    values = np.asarray(series, dtype=float)
    best_alpha, best_sse = grid[0], np.inf
    for alpha in grid:
        errors = values[1:] - ewma_one_step(values, alpha)[1:]
        sse = float(np.sum(errors * errors))
        if sse < best_sse:
            best_alpha, best_sse = alpha, sse
    return float(best_alpha)
