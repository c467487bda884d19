"""Each request's wait budget from the prompt mix: TTFT less the prefill of its own prompt.

A request of p prompt tokens meets a TTFT SLO of `ttft_s` when its wait stays within
ttft_s − p / prefill_tokens_per_s; prompts whose prefill alone exceeds the SLO are lost
whatever the count. The guard (slo_guard.late_waits) and the sizing (sizing._late_share)
hold waits against these budgets, from the same prompt mix.

The mix comes from a histogram (vLLM's request_prompt_tokens, buckets in 1-2-5 steps), so
the lengths inside a bucket must be interpolated: bucket_shape reads each as a power law
from its neighbours. Uniform, as Prometheus' histogram_quantile has them, is wrong by a
factor of two where it matters most: on the Mooncake conversation trace, 53 % of the
20,000-50,000-token bucket's prompts are under 28,000 tokens; uniform says 27 %. Those are
the prompts whose budget is shortest, so the uniform reading left out a fifth of the late
requests and a twentieth of the attainable ones. Each bucket is then cut into `PIECES`
pieces of equal mass, each taken as uniform by the consumers.
"""

from __future__ import annotations

import math
from functools import lru_cache

from autoscalerd import bucket_shape

# Equal-mass pieces a bucket is cut into: each is read as uniform by the consumers.
PIECES = 3


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
        alpha = bucket_shape.exponent(
            prompt_mix[index],
            prompt_mix[index - 1] if index > 0 else None,
            prompt_mix[index + 1] if index + 1 < len(prompt_mix) else None,
        )
        top = min(high, limit_tokens)
        below = bucket_shape.share_below(top, low, high, alpha)
        piece = share * below / PIECES
        edges = [
            bucket_shape.quantile(below * k / PIECES, low, high, alpha) for k in range(PIECES + 1)
        ]
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
