"""The simulated sensor: what a real one would report of the simulated cluster, per tick.

Counters become rates over the tick, gauges are read as they stand, and latency is seen
only through cumulative histogram buckets (vLLM's bounds), differenced over the look-back
window and read with Prometheus' `histogram_quantile` interpolation, so a policy under test
knows no more than it would in production.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from autoscalerd.model import Histogram, Observation, Reading
from autoscalerd.sense.moments import second_moment
from autoscalerd.sim.cluster import (
    E2E_BUCKETS_S,
    PROMPT_TOKEN_BUCKETS,
    TTFT_BUCKETS_S,
    Cluster,
    Counters,
)


def histogram_quantile(
    quantile: float, bounds_s: Sequence[float], counts: Sequence[int]
) -> float | None:
    """Prometheus' histogram_quantile over non-cumulative bucket counts (+Inf last).

    Linear interpolation inside the bucket that holds the rank; the first bucket starts
    at 0; a rank in the +Inf bucket reads as the highest finite bound. None when empty.
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank = quantile * total
    below = 0
    for index, count in enumerate(counts):
        if count and below + count >= rank:
            if index == len(bounds_s):
                return bounds_s[-1]
            lower_s = bounds_s[index - 1] if index else 0.0
            return lower_s + (bounds_s[index] - lower_s) * (rank - below) / count
        below += count
    return bounds_s[-1]


def quantile_between(
    quantile: float,
    bounds_s: Sequence[float],
    now: Sequence[int],
    then: Sequence[int],
) -> float | None:
    """`histogram_quantile` of the increase between two cumulative snapshots.

    The same answer as differencing and calling histogram_quantile, found by scanning down
    from the top bucket: a high quantile sits near the top, so few buckets are visited.
    """
    total = sum(now) - sum(then)
    if total <= 0:
        return None
    rank = quantile * total
    index = len(now) - 1
    cumulative = total  # requests in buckets 0..index
    while index > 0:
        below = cumulative - (now[index] - then[index])
        if below < rank:
            break
        cumulative = below
        index -= 1
    if index == len(bounds_s):
        return bounds_s[-1]
    count = now[index] - then[index]
    lower_s = bounds_s[index - 1] if index else 0.0
    below = cumulative - count
    return lower_s + (bounds_s[index] - lower_s) * (rank - below) / count


class SimSensor:
    """One Observation per tick of the simulated deployment."""

    def __init__(
        self, cluster: Cluster, deployment: str, look_back_s: float, tick_s: float
    ) -> None:
        self._cluster = cluster
        self._deployment = deployment
        # Snapshots of the cumulative counters, one per tick, the oldest `look_back_s` ago.
        self._snapshots: deque[Counters] = deque(maxlen=max(1, round(look_back_s / tick_s)) + 1)
        self._snapshots.append(cluster.counters())
        # Requests decoding per running replica, one per tick over the same window.
        self._batches: deque[float] = deque(maxlen=self._snapshots.maxlen)
        self._last_s: float | None = None

    def observe(self, now_s: float) -> Observation:
        cluster = self._cluster
        previous = self._snapshots[-1]
        counters = cluster.counters()
        self._snapshots.append(counters)
        oldest = self._snapshots[0]
        gauges = cluster.gauges()
        interval_s = now_s - self._last_s if self._last_s is not None else now_s
        self._last_s = now_s
        per_s = 1.0 / interval_s if interval_s > 0 else 0.0
        tokens = (
            counters.prompt_tokens
            - previous.prompt_tokens
            + counters.output_tokens
            - previous.output_tokens
        )

        def reading(value: float | None) -> Reading | None:
            return None if value is None else Reading(value, now_s)

        if gauges.running_replicas:
            self._batches.append(gauges.decoding_requests / gauges.running_replicas)
        decoded_tokens = counters.output_tokens - oldest.output_tokens
        tpot_mean_s = (
            (counters.decode_s - oldest.decode_s) / decoded_tokens if decoded_tokens > 0 else None
        )
        batch_mean = sum(self._batches) / len(self._batches) if self._batches else None

        def tick_counts(now: tuple[int, ...], then: tuple[int, ...]) -> tuple[float, ...]:
            return tuple(float(a - b) for a, b in zip(now, then, strict=True))

        waits = tick_counts(counters.queue_wait_buckets, previous.queue_wait_buckets)

        return Observation(
            deployment=self._deployment,
            sensed_at_s=now_s,
            arrival_rate_per_s=Reading((counters.arrivals - previous.arrivals) * per_s, now_s),
            token_rate_per_s=Reading(tokens * per_s, now_s),
            completion_rate_per_s=Reading(
                (counters.completions - previous.completions) * per_s, now_s
            ),
            max_ongoing_requests=Reading(float(cluster.model.max_ongoing_requests), now_s),
            prompt_token_rate_per_s=Reading(
                (counters.prompt_tokens - previous.prompt_tokens) * per_s, now_s
            ),
            output_token_rate_per_s=Reading(
                (counters.output_tokens - previous.output_tokens) * per_s, now_s
            ),
            prefill_seconds_per_s=Reading((counters.prefill_s - previous.prefill_s) * per_s, now_s),
            prefilled_request_rate_per_s=Reading(
                (counters.prefilled - previous.prefilled) * per_s, now_s
            ),
            prompt_tokens_sq_mean=reading(
                second_moment(
                    PROMPT_TOKEN_BUCKETS,
                    counters.prompt_token_buckets,
                    oldest.prompt_token_buckets,
                )
            ),
            tpot_mean_s=reading(tpot_mean_s),
            decode_batch_mean=reading(batch_mean if tpot_mean_s is not None else None),
            queue_wait_histogram=Histogram(TTFT_BUCKETS_S, waits, now_s),
            ttft_histogram=Histogram(
                TTFT_BUCKETS_S, tick_counts(counters.ttft_buckets, previous.ttft_buckets), now_s
            ),
            prompt_tokens_histogram=Histogram(
                PROMPT_TOKEN_BUCKETS,
                tick_counts(counters.prompt_token_buckets, previous.prompt_token_buckets),
                now_s,
            ),
            ongoing_requests=Reading(float(gauges.ongoing_requests), now_s),
            queued_requests=Reading(float(gauges.queued_requests), now_s),
            running_replicas=Reading(float(gauges.running_replicas), now_s),
            starting_replicas=Reading(float(gauges.starting_replicas), now_s),
            platform_target_replicas=Reading(float(gauges.target_replicas), now_s),
            ttft_p99_s=reading(
                quantile_between(0.99, TTFT_BUCKETS_S, counters.ttft_buckets, oldest.ttft_buckets)
            ),
            e2e_p99_s=reading(
                quantile_between(0.99, E2E_BUCKETS_S, counters.e2e_buckets, oldest.e2e_buckets)
            ),
            queue_wait_p99_s=reading(
                quantile_between(
                    0.99, TTFT_BUCKETS_S, counters.queue_wait_buckets, oldest.queue_wait_buckets
                )
            ),
        )
