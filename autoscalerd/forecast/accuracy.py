"""Forecast accuracy: error measures, and a rolling replay that drives the forecaster as the
daemon does (observe every tick, refit when due, forecast one lead time ahead)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscalerd.config import ForecastConfig
from autoscalerd.forecast.holt_winters import (
    ForecasterState,
    fit_state,
    forecast,
    install_fit,
    observe,
    refit_due,
)

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
Series = Sequence[float] | FloatArray


def mape_percent(actual: Series, predicted: Series) -> float:
    """Mean absolute percentage error over the buckets with a non-zero actual rate."""
    observed = np.asarray(actual, dtype=float)
    forecasted = np.asarray(predicted, dtype=float)
    keep = observed != 0.0
    return float(np.mean(np.abs(forecasted[keep] - observed[keep]) / np.abs(observed[keep])) * 100)


def seasonal_naive_scale(training: Series, season_length: int) -> float:
    """MASE's denominator: the in-sample MAE of the seasonal-naive forecast on training data."""
    values = np.asarray(training, dtype=float)
    return float(np.mean(np.abs(values[season_length:] - values[:-season_length])))


def mase(actual: Series, predicted: Series, scale: float) -> float:
    """Mean absolute scaled error (Hyndman & Koehler 2006): MAE / `scale`. Below 1 beats the
    in-sample seasonal-naive forecast; defined for zero rates, unlike MAPE."""
    observed = np.asarray(actual, dtype=float)
    forecasted = np.asarray(predicted, dtype=float)
    return float(np.mean(np.abs(forecasted - observed)) / scale)


@dataclass(frozen=True, slots=True)
class RollingForecast:
    """Every closed bucket of a replay, and the forecast made for each evaluated one.

    Arrays run over all closed buckets; point/upper are NaN for buckets not evaluated.
    """

    bucket_start_s: FloatArray
    actual_per_s: FloatArray
    point_per_s: FloatArray
    upper_per_s: FloatArray
    methods: tuple[str, ...]  # forecast method per bucket ("" where not evaluated)
    fits: int
    state: ForecasterState


def rolling_forecast(
    tick_end_s: Series,
    rate_per_s: Series,
    interval_s: float,
    cfg: ForecastConfig,
    *,
    horizon_s: float,
    evaluate_from_s: float,
    fit_from_s: float,
) -> RollingForecast:
    """Replay ticks through observe; refit (inline) whenever refit_due once `fit_from_s` is
    reached; and when a bucket opens at or after `evaluate_from_s`, forecast `horizon_s`
    ahead, which is compared with the bucket's mean rate once it closes.

    `fit_from_s` lets a replay skip the refits over the training span (they would not
    change the evaluated forecasts much, and cost a statsmodels fit each).
    """
    state = ForecasterState()
    starts: list[float] = []
    actual: list[float] = []
    pending: dict[int, tuple[float, float, str]] = {}
    scored: dict[int, tuple[float, float, str]] = {}
    fits = 0
    for end_s, rate in zip(tick_end_s, rate_per_s, strict=True):
        end_s = float(end_s)
        closed_before = state.closed_buckets
        state = observe(state, float(rate), interval_s, end_s, cfg)
        newly_closed = state.closed_buckets - closed_before
        if newly_closed <= 0:
            continue
        assert state.bucket_start_s is not None
        for back in range(newly_closed, 0, -1):
            index = state.closed_buckets - back
            starts.append(state.bucket_start_s - back * cfg.bucket_s)
            actual.append(state.history[-back])
            if index in pending:
                scored[index] = pending.pop(index)
        if end_s >= fit_from_s and refit_due(state, end_s, cfg):
            state = install_fit(state, fit_state(state, cfg), end_s)
            fits += 1
        if state.bucket_start_s is not None and state.bucket_start_s >= evaluate_from_s:
            predicted = forecast(state, horizon_s, end_s, cfg)
            if predicted is not None:
                pending[state.closed_buckets] = (
                    predicted.point_per_s,
                    predicted.upper_per_s,
                    predicted.method,
                )
    first_index = state.closed_buckets - len(actual)
    point = np.full(len(actual), np.nan)
    upper = np.full(len(actual), np.nan)
    methods = [""] * len(actual)
    for index, (point_per_s, upper_per_s, method) in scored.items():
        row = index - first_index
        point[row], upper[row], methods[row] = point_per_s, upper_per_s, method
    return RollingForecast(
        bucket_start_s=np.asarray(starts, dtype=float),
        actual_per_s=np.asarray(actual, dtype=float),
        point_per_s=point,
        upper_per_s=upper,
        methods=tuple(methods),
        fits=fits,
        state=state,
    )
