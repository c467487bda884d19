"""Would a clump measured as excess over the level tell on-off clumps from a busy stretch?

The burst term sizes for the requests of a window of w seconds at the attainment
quantile, measured in absolute terms (burstiness.py): it keeps an on-off service's clumps
through the lulls between them, and it also holds a conversation service's busier
stretch, a level that is high for a while, as if it were a clump. One way to tell them
apart is to measure each window's count as excess over the level around it and let the
sizing add the forecast's level back: a Poisson stream at any level then reads about
z·√(λw), and an on-off clump in a lull keeps its size. This script measures that
reading on the request-level traces without the simulator: per window, the busiest
window, the request-weighted quantile of the absolute count (what the histograms hold,
before the tail fit), and the quantile of the excess over two levels: burstiness's own
smoothed rate (an EWMA over the forecast's bucket, 300 s, before the tick) and the mean
of the 4w seconds before the window; with the Poisson reference at the trace's mean rate.

    .venv/bin/python benchmarks/clump_excess.py [--share 0.01] [TRACE ...]

A second per trace on one core.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np

from autoscalerd.decide.burstiness import CLUMP_TICKS
from autoscalerd.sim.traces import open_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ("azure_llm_2023_code.csv", "azure_llm_2023_conv.csv")
LEVEL_MEMORY_S = 300.0  # the forecast's default bucket, burstiness's level memory


def per_second_counts(path: Path) -> np.ndarray:
    arrivals = np.concatenate([batch.arrival_s for batch in open_trace(path).batches()])
    seconds = np.floor(arrivals).astype(np.int64)
    return np.bincount(seconds, minlength=int(seconds.max()) + 1).astype(float)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, share: float) -> float:
    """The value that all but `share` of the weight lies at or below."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][np.searchsorted(cumulative, 1.0 - share)])


def smoothed_level(counts: np.ndarray) -> np.ndarray:
    """The EWMA of the rate before each second, as burstiness.observe keeps it."""
    alpha = 1.0 - math.exp(-1.0 / LEVEL_MEMORY_S)
    level = np.empty_like(counts)
    current = counts[0]
    for index, count in enumerate(counts):
        level[index] = current
        current += alpha * (count - current)
    return level


def trailing_level(counts: np.ndarray, window: int) -> np.ndarray:
    """The mean rate over the 4·window seconds before each window ending at a second."""
    cumulative = np.concatenate([[0.0], np.cumsum(counts)])
    ends = np.arange(counts.size) - window + 1  # first second of the window
    starts = np.maximum(0, ends - 4 * window)
    spans = np.maximum(1, ends - starts)
    level = (cumulative[np.maximum(ends, 0)] - cumulative[starts]) / spans
    return np.where(ends > 0, level, counts.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--share", type=float, default=0.01, help="ε, the quantile's share")
    args = parser.parse_args()
    paths = args.traces or [ROOT / "data" / "traces" / name for name in TRACES]
    z = NormalDist().inv_cdf(1.0 - args.share)
    for path in paths:
        counts = per_second_counts(path)
        mean = counts.mean()
        ewma = smoothed_level(counts)
        print(f"{path.name}: {int(counts.sum())} requests over {counts.size} s")
        print(
            f"{'window':>7} {'busiest':>8} {'quantile':>9} {'over EWMA':>10} "
            f"{'over 4w':>8} {'Poisson':>8} {'mean':>7}"
        )
        for window in CLUMP_TICKS:
            windowed = np.convolve(counts, np.ones(window))[: counts.size]
            quantile = weighted_quantile(windowed, counts, args.share)
            over_ewma = weighted_quantile(windowed - ewma * window, counts, args.share)
            over_trailing = weighted_quantile(
                windowed - trailing_level(counts, window) * window, counts, args.share
            )
            print(
                f"{window:>6}s {windowed.max():>8.0f} {quantile:>9.0f} {over_ewma:>10.1f} "
                f"{over_trailing:>8.1f} {z * math.sqrt(mean * window):>8.1f} "
                f"{mean * window:>7.1f}"
            )


if __name__ == "__main__":
    main()
