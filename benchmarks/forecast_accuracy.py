"""Forecast accuracy and cost on the Azure LLM week: Holt-Winters vs seasonal-naive vs EWMA.

Replays data/traces/azure_llm_2024_code_10s_counts.csv (request counts per 10 s bin, 7 days
from Friday 2024-05-10) through the forecaster as the daemon drives it: observe every
10 s bin, refit every refit_interval_s from day 5 on (the first fit sees days 1-4), and at
the start of each bucket forecast the next one. Prints MAPE and MASE for day 5 and days 5-7,
how often the upper bound (z = 1) covered the actual rate, the statsmodels fit time, and the
per-call cost of observe and forecast.

    .venv/bin/python benchmarks/forecast_accuracy.py
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoscalerd.config import CapacityConfig, ForecastConfig  # noqa: E402
from autoscalerd.forecast import baselines  # noqa: E402
from autoscalerd.forecast.accuracy import (  # noqa: E402
    mape_percent,
    mase,
    rolling_forecast,
    seasonal_naive_scale,
)
from autoscalerd.forecast.holt_winters import (  # noqa: E402
    ForecasterState,
    fit,
    fit_state,
    forecast,
    install_fit,
    observe,
)

TRACE = ROOT / "data/traces/azure_llm_2024_code_10s_counts.csv"
DAY_S = 86_400.0
BIN_S = 10.0
FloatArray = np.ndarray[Any, np.dtype[np.float64]]


@functools.cache
def load_trace() -> tuple[FloatArray, FloatArray]:
    """Bin labels (epoch s) and request counts per 10 s bin."""
    raw = np.loadtxt(TRACE, delimiter=",", skiprows=1, dtype=str)
    labels_s = raw[:, 0].astype("datetime64[s]").astype(np.int64).astype(float)
    return labels_s, raw[:, 1].astype(float)


def accuracy_table(cfg: ForecastConfig, horizon_s: float, title: str) -> None:
    labels_s, counts = load_trace()
    day_1_s = labels_s[0]
    day_5_s = day_1_s + 4 * DAY_S
    started = time.perf_counter()
    # A bin covers [label - 5 s, label + 5 s): one tick ending at label + 5 s.
    run = rolling_forecast(
        labels_s + BIN_S / 2,
        counts / BIN_S,
        BIN_S,
        cfg,
        horizon_s=horizon_s,
        evaluate_from_s=day_5_s,
        fit_from_s=day_5_s,
    )
    replay_s = time.perf_counter() - started
    actual = run.actual_per_s
    training = run.bucket_start_s < day_5_s
    alpha = baselines.fit_ewma_alpha(actual[training])
    scale = seasonal_naive_scale(actual[training], cfg.season_length)
    rows = {
        f"holt_winters ({cfg.seasonal})": run.point_per_s,
        "seasonal_naive": baselines.seasonal_naive_one_step(actual, cfg.season_length),
        f"ewma (alpha={alpha:.2f}, fitted on days 1-4)": baselines.ewma_one_step(actual, alpha),
        "naive (last bucket)": baselines.ewma_one_step(actual, 1.0),
    }
    spans = {
        "day 5": (day_5_s, day_1_s + 5 * DAY_S),
        "days 5-7": (day_5_s, day_1_s + 7 * DAY_S),
    }
    print(f"\n## {title}")
    print(
        f"bucket_s={cfg.bucket_s:g} season_length={cfg.season_length} "
        f"history_seasons={cfg.history_seasons} refit_interval_s={cfg.refit_interval_s:g} "
        f"horizon_s={horizon_s:g}; {run.fits} fits; replay of the week took {replay_s:.1f} s"
    )
    header = f"{'forecaster':<44}" + "".join(
        f"{span + ' MAPE%':>16}{span + ' MASE':>16}" for span in spans
    )
    print(header)
    for name, predicted in rows.items():
        cells = ""
        for start_s, end_s in spans.values():
            chosen = (
                (run.bucket_start_s >= start_s)
                & (run.bucket_start_s < end_s)
                & ~np.isnan(run.point_per_s)
            )
            cells += f"{mape_percent(actual[chosen], predicted[chosen]):>16.2f}"
            cells += f"{mase(actual[chosen], predicted[chosen], scale):>16.3f}"
        print(f"{name:<44}{cells}")
    evaluated = ~np.isnan(run.point_per_s)
    coverage = float(np.mean(actual[evaluated] <= run.upper_per_s[evaluated]))
    headroom = float(np.mean(run.upper_per_s[evaluated] / run.point_per_s[evaluated] - 1.0))
    print(
        f"upper bound (z={cfg.z:g}) covered {coverage:.1%} of days 5-7 buckets "
        f"(84% expected for a calibrated bound); mean headroom over the point {headroom:.1%}"
    )


def fit_times(cfg: ForecastConfig) -> None:
    """statsmodels fit time on the rolling window ending at each hour of day 5."""
    _, counts = load_trace()
    per_bucket = int(cfg.bucket_s // BIN_S)
    usable = len(counts) // per_bucket * per_bucket
    rates = counts[:usable].reshape(-1, per_bucket).sum(axis=1) / cfg.bucket_s
    window = cfg.history_seasons * cfg.season_length
    buckets_per_hour = int(3600 // cfg.bucket_s)
    fit(rates[:window].tolist(), cfg)  # pays statsmodels' import once, outside the timing
    seconds, methods = [], set()
    for hour in range(24):
        end = 4 * cfg.season_length + hour * buckets_per_hour
        started = time.perf_counter()
        model = fit(rates[end - window : end].tolist(), cfg)
        seconds.append(time.perf_counter() - started)
        methods.add(model.method)
    print(
        f"fit ({window} buckets, {'/'.join(sorted(methods))}): median "
        f"{statistics.median(seconds) * 1e3:.0f} ms, max {max(seconds) * 1e3:.0f} ms "
        f"over 24 hourly windows"
    )


def call_costs(cfg: ForecastConfig) -> None:
    """Per-call cost of observe and forecast at 1 s ticks, with a full history and a fit."""
    labels_s, counts = load_trace()
    rates = np.repeat(counts / BIN_S, int(BIN_S))  # 1 s ticks
    first_s = labels_s[0]
    state = ForecasterState()
    warmup = int(cfg.history_seasons * cfg.season_length * cfg.bucket_s)
    # Warm up on 10 s ticks (cheaper), then time one day of 1 s ticks.
    for index in range(warmup // int(BIN_S)):
        end_s = first_s + (index + 1) * BIN_S
        state = observe(state, float(counts[index] / BIN_S), BIN_S, end_s, cfg)
    now_s = first_s + warmup
    state = install_fit(state, fit_state(state, cfg), now_s)
    day = rates[warmup : warmup + int(DAY_S)].tolist()
    closed_before = state.closed_buckets
    started = time.perf_counter()
    for rate in day:
        now_s += 1.0
        state = observe(state, rate, 1.0, now_s, cfg)
    mean_us = (time.perf_counter() - started) / len(day) * 1e6
    closes = state.closed_buckets - closed_before
    mid_s = now_s + 0.5
    repeats = 50_000
    started = time.perf_counter()
    for _ in range(repeats):
        observe(state, 1.0, 0.5, mid_s, cfg)
    open_us = (time.perf_counter() - started) / repeats * 1e6
    started = time.perf_counter()
    for _ in range(2000):
        observe(state, 1.0, 1.0, now_s + cfg.bucket_s, cfg)
    close_us = (time.perf_counter() - started) / 2000 * 1e6
    started = time.perf_counter()
    for _ in range(repeats):
        forecast(state, 65.0, mid_s, cfg)
    forecast_us = (time.perf_counter() - started) / repeats * 1e6
    print(
        f"observe: {mean_us:.2f} us mean over a day of 1 s ticks ({closes} bucket closes); "
        f"{open_us:.2f} us when no bucket closes, {close_us:.1f} us when one does; "
        f"forecast: {forecast_us:.2f} us"
    )


def main() -> None:
    capacity = CapacityConfig()
    lead_s = capacity.cold_start_s + capacity.actuation_delay_s
    five_minute = ForecastConfig(
        bucket_s=300.0, season_length=288, history_seasons=3, refit_interval_s=3600.0
    )
    minute = ForecastConfig(
        bucket_s=60.0, season_length=1440, history_seasons=3, refit_interval_s=3600.0
    )
    print("# Forecast accuracy on the Azure LLM code trace, 2024-05-10 (Fri) to 05-17")
    print(
        "MASE: MAE scaled by the seasonal-naive in-sample MAE on days 1-4 (lower is better, "
        "< 1 beats that yardstick); the scale is shared, so MASE ranks like MAE in req/s."
    )
    for cfg, horizon_s, title in (
        (five_minute, lead_s, f"300 s buckets, lead {lead_s:g} s (the next bucket)"),
        (
            five_minute.model_copy(update={"seasonal": "mul"}),
            lead_s,
            f"300 s buckets, multiplicative season, lead {lead_s:g} s",
        ),
        (minute, 0.0, "60 s buckets (the config defaults), the next bucket"),
    ):
        accuracy_table(cfg, horizon_s, title)
        fit_times(cfg)
        call_costs(cfg)


if __name__ == "__main__":
    main()
