"""Exponentially forgotten sums: the memory of every online estimate in `decide`.

A value seen `t` seconds ago weighs exp(−t / memory_s). Ratios of such sums are the
estimates (prefill tokens per prefill second, bad requests per request, requests per
burst-ratio bin), so old evidence fades at the same rate in numerator and denominator.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sums:
    """Forgotten sums of one estimator, with its raw sample count and last update."""

    values: tuple[float, ...]
    samples: int = 0
    updated_at_s: float | None = None

    def decayed(self, now_s: float, memory_s: float) -> tuple[float, ...]:
        if self.updated_at_s is None or now_s <= self.updated_at_s:
            return self.values
        keep = math.exp(-(now_s - self.updated_at_s) / memory_s)
        # map over the float methods: the burst histograms' hundreds of bins each tick.
        return tuple(map(keep.__mul__, self.values))

    def add(self, now_s: float, memory_s: float, *deltas: float) -> Sums:
        values = self.decayed(now_s, memory_s)
        if len(deltas) != len(values):
            raise ValueError(f"{len(deltas)} deltas for {len(values)} sums")
        return Sums(tuple(map(operator.add, values, deltas)), self.samples + 1, now_s)
