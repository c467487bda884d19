"""Each request's wait budget from the prompt mix: TTFT less the prefill of its own prompt.

A request of p prompt tokens meets a TTFT SLO of `ttft_s` when its wait stays within
ttft_s − p / prefill_tokens_per_s; prompts whose prefill alone exceeds the SLO are lost
whatever the count. The guard (slo_guard.late_waits) and the sizing (sizing._late_share)
hold waits against these budgets, from the same prompt mix.

The mix comes from a histogram (vLLM's request_prompt_tokens, buckets in 1-2-5 steps), so
the lengths inside a bucket must be interpolated. Uniform, as Prometheus'
histogram_quantile has them, is wrong by a factor of two where it matters most: a
heavy-tailed length distribution falls by a decade or more across a 20,000-50,000-token
bucket, so most of the bucket's prompts sit near its lower edge. On the Mooncake
conversation trace, 53 % of that bucket's prompts are under 28,000 tokens; uniform says
27 %. Those are the prompts whose budget is shortest, so the uniform reading left out a
fifth of the late requests and a twentieth of the attainable ones. Here the density
inside a bucket is a power law x^α whose exponent is the slope, on log-log axes, of the
densities of the neighbouring buckets (piecewise linear in log-log: 50 % for that bucket).
A bucket with no occupied neighbour, or starting at 0, stays uniform. Each bucket is
then cut into `PIECES` pieces of equal mass, each taken as uniform by the consumers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

# Equal-mass pieces a bucket is cut into: each is read as uniform by the consumers.
PIECES = 3
# The exponent is bounded: two neighbours a decade apart in density over a 2x bucket
# step give about −3.3; beyond ±8 the fit says more about noise than about shape.
_ALPHA_MAX = 8.0


@lru_cache(maxsize=64)
def attainable_budgets(
    prompt_mix: tuple[tuple[float, float, float], ...],
    ttft_s: float,
    prefill_tokens_per_s: float,
) -> tuple[tuple[float, float, float], ...]:
    """From the mix's buckets (lower, upper tokens, share of requests): pieces of (share
    of requests that can meet the SLO, their lowest and highest wait budget). Prompts whose
    prefill alone exceeds the SLO are left out; the unbounded bucket is at its lower edge.
    Cached: the sizing asks for the same mix at every count it tries."""
    limit_tokens = ttft_s * prefill_tokens_per_s
    budgets: list[tuple[float, float, float]] = []
    for index, (low, high, share) in enumerate(prompt_mix):
        if share <= 0 or low >= limit_tokens:
            continue
        if math.isinf(high) or high <= low:
            budget_s = ttft_s - low / prefill_tokens_per_s
            budgets.append((share, budget_s, budget_s))
            continue
        alpha = _exponent(prompt_mix, index)
        top = min(high, limit_tokens)
        below = _cdf(top, low, high, alpha)
        piece = share * below / PIECES
        edges = [_quantile(below * k / PIECES, low, high, alpha) for k in range(PIECES + 1)]
        edges[-1] = top
        for k in range(PIECES):
            budgets.append(
                (
                    piece,
                    ttft_s - edges[k + 1] / prefill_tokens_per_s,
                    ttft_s - edges[k] / prefill_tokens_per_s,
                )
            )
    return tuple(budgets)


def _density(bucket: tuple[float, float, float]) -> tuple[float, float] | None:
    """(geometric centre, requests per token) of a bounded bucket off 0, else None."""
    low, high, share = bucket
    if low <= 0 or math.isinf(high) or high <= low or share <= 0:
        return None
    return math.sqrt(low * high), share / (high - low)


def _exponent(prompt_mix: Sequence[tuple[float, float, float]], index: int) -> float:
    """α of the density x^α inside bucket `index`: the log-log slope through the occupied
    neighbours that touch it (both when both do, else the one and the bucket itself)."""
    here = _density(prompt_mix[index])
    if here is None:
        return 0.0
    low, high, _ = prompt_mix[index]
    left = _density(prompt_mix[index - 1]) if index > 0 else None
    if left is not None and prompt_mix[index - 1][1] != low:
        left = None
    right = _density(prompt_mix[index + 1]) if index + 1 < len(prompt_mix) else None
    if right is not None and prompt_mix[index + 1][0] != high:
        right = None
    if left is None and right is None:
        return 0.0
    a = left if left is not None else here
    b = right if right is not None else here
    slope = math.log(b[1] / a[1]) / math.log(b[0] / a[0])
    return max(-_ALPHA_MAX, min(_ALPHA_MAX, slope))


def _cdf(x: float, low: float, high: float, alpha: float) -> float:
    """The share of a bucket [low, high] of density x^α below x."""
    if alpha == 0.0 or low <= 0:
        return (x - low) / (high - low)
    beta = alpha + 1.0
    if abs(beta) < 1e-9:
        return math.log(x / low) / math.log(high / low)
    return (x**beta - low**beta) / (high**beta - low**beta)


def _quantile(u: float, low: float, high: float, alpha: float) -> float:
    """The length below which a share u of a bucket [low, high] of density x^α lies."""
    if alpha == 0.0 or low <= 0:
        return low + u * (high - low)
    beta = alpha + 1.0
    if abs(beta) < 1e-9:
        return low * (high / low) ** u
    return (low**beta + u * (high**beta - low**beta)) ** (1.0 / beta)
