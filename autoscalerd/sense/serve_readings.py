"""Observation fields from Serve's and vLLM's signals, whichever way the signals were read.

The `ray_serve` sensor keeps the nodes' scrapes in a `MetricsBook`; the `prometheus` sensor
asks a Prometheus server that scrapes the same nodes. Both answer the same questions (a
rate over a window, a gauge's total, a histogram's quantile, mean or bucket counts), so
what turns the answers into Observation fields is written once, here: which series stands
for which field, the fallbacks when one is not exported, the router backlog's lower bound
on the wait, the replica model's inputs, and the platform's own view of a deployment.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from autoscalerd.model import Histogram, Reading
from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.base import DeploymentInfo
from autoscalerd.sense.moments import second_moment
from autoscalerd.sense.serve_api import ServeDeployment

P99 = 0.99

# A histogram over a window: (finite upper bounds, observations per bucket with +Inf last).
BucketCounts = tuple[tuple[float, ...], tuple[float, ...]]
# Observation's keyword arguments: Readings, and the per-tick Histograms.
Fields = dict[str, Any]


class SignalBook(Protocol):
    """Answers about one deployment's signals (`serve_metrics` names them) over a window."""

    def has(self, deployment: str, signal: str) -> bool:
        """The deployment exports the signal (else its fields are left out, not zero)."""
        ...

    def rate_per_s(self, deployment: str, signal: str, window_s: float) -> float | None:
        """A counter's growth per second over about `window_s`."""
        ...

    def gauge(self, deployment: str, signal: str) -> sm.GaugeValue | None:
        """A gauge summed over the deployment's series, and as of when."""
        ...

    def quantile(self, deployment: str, signal: str, q: float, window_s: float) -> float | None:
        """A histogram's q-quantile over about `window_s`."""
        ...

    def increase(self, deployment: str, signal: str, window_s: float) -> BucketCounts | None:
        """A histogram's observations per bucket over about `window_s`."""
        ...

    def mean(self, deployment: str, signal: str, window_s: float) -> float | None:
        """A histogram's mean over about `window_s` (its _sum's growth over its _count's)."""
        ...


@dataclass(frozen=True, slots=True)
class Windows:
    """The windows a deployment's load is read over."""

    rate_s: float  # arrivals, completions, tokens
    look_back_s: float  # latency quantiles and means: the deployment's look_back_period_s
    tick_s: float  # the per-tick histograms the SLO guard counts misses from


def platform_fields(dep: ServeDeployment, state_at_s: float) -> Fields:
    """What Serve's REST API says of the deployment's replicas, as of `state_at_s`."""
    fields: Fields = {
        "running_replicas": Reading(float(dep.running_replicas), state_at_s),
        "starting_replicas": Reading(float(dep.starting_replicas), state_at_s),
    }
    if dep.max_ongoing_requests is not None:
        # The replica model's slots: Serve reports them with the deployment's config.
        fields["max_ongoing_requests"] = Reading(float(dep.max_ongoing_requests), state_at_s)
    if dep.target_replicas is not None:
        fields["platform_target_replicas"] = Reading(float(dep.target_replicas), state_at_s)
    return fields


def deployment_info(
    dep: ServeDeployment, state_at_s: float, controller_id: str | None
) -> DeploymentInfo:
    target = dep.target_replicas
    return DeploymentInfo(
        platform_epoch=controller_id,
        name=dep.name,
        app=dep.app,
        deployment=dep.deployment,
        external_scaler_enabled=dep.external_scaler_enabled,
        max_ongoing_requests=dep.max_ongoing_requests,
        resources_per_replica=dict(dep.resources_per_replica),
        platform_target_replicas=(
            Reading(float(target), state_at_s) if target is not None else None
        ),
        watches_platform=True,
        replicas=dep.placements,
    )


def load_fields(
    book: SignalBook,
    dep: ServeDeployment,
    at_s: float,
    windows: Windows,
    coverage: float | None,
) -> Fields:
    """Load, latency and the replica model's inputs of `dep`, time-stamped `at_s` (gauges
    with their own time). Call it only with a metrics pipeline that is alive: a signal
    that is missing then means nothing happened (no traffic, nothing in flight)."""
    name = dep.name
    window_s, look_back_s = windows.rate_s, windows.look_back_s
    fields: Fields = {}

    def put(field: str, value: float | None, reading_at_s: float) -> None:
        # A sum past float's range (two rates near it) is no reading, never an infinity.
        if value is not None and math.isfinite(value) and value >= 0:
            fields[field] = Reading(value, reading_at_s)

    put("arrival_rate_per_s", book.rate_per_s(name, sm.ROUTER_REQUESTS, window_s), at_s)
    put("completion_rate_per_s", book.rate_per_s(name, sm.REPLICA_COMPLETIONS, window_s), at_s)
    if book.has(name, sm.VLLM_PROMPT_TOKENS) or book.has(name, sm.VLLM_GENERATION_TOKENS):
        prompt = book.rate_per_s(name, sm.VLLM_PROMPT_TOKENS, window_s)
        generated = book.rate_per_s(name, sm.VLLM_GENERATION_TOKENS, window_s)
        if prompt is not None and generated is not None:
            put("token_rate_per_s", prompt + generated, at_s)

    ongoing = book.gauge(name, sm.REPLICA_PROCESSING) or book.gauge(name, sm.HANDLE_ONGOING)
    if ongoing is None:
        running = book.gauge(name, sm.VLLM_RUNNING)
        waiting = book.gauge(name, sm.VLLM_WAITING)
        if running is not None:
            total = running.total + (waiting.total if waiting else 0.0)
            ongoing = sm.GaugeValue(total, running.series, running.at_s)
    if ongoing is not None:
        put("ongoing_requests", ongoing.total, ongoing.at_s)
    else:
        put("ongoing_requests", 0.0, at_s)  # nothing in flight reports anything
    queued = book.gauge(name, sm.HANDLE_QUEUED)
    put("queued_requests", queued.total if queued else 0.0, queued.at_s if queued else at_s)

    e2e_ms = None
    if dep.ingress:
        e2e_ms = book.quantile(name, sm.HTTP_LATENCY_MS, P99, look_back_s)
    if e2e_ms is None:
        e2e_ms = book.quantile(name, sm.PROCESSING_LATENCY_MS, P99, look_back_s)
    if e2e_ms is not None:
        put("e2e_p99_s", e2e_ms / 1000.0, at_s)
    else:
        put("e2e_p99_s", book.quantile(name, sm.VLLM_E2E_S, P99, look_back_s), at_s)
    put("ttft_p99_s", book.quantile(name, sm.VLLM_TTFT_S, P99, look_back_s), at_s)
    wait_ms = book.quantile(name, sm.ROUTER_WAIT_MS, P99, look_back_s)
    wait_s = wait_ms / 1000.0 if wait_ms is not None else None
    # Serve records a request's router wait only once a replica takes it: the ones
    # still queued are invisible exactly when it matters. A request joining the queue
    # now waits about queued / completions per second (FIFO drain), so that is a
    # lower bound on the wait p99 while a backlog stands.
    completions = book.rate_per_s(name, sm.REPLICA_COMPLETIONS, window_s)
    if queued is not None and queued.total > 0:
        backlog_s = queued.total / completions if completions else math.inf
        backlog_s = min(backlog_s, look_back_s)  # nothing finished: at least that long
        wait_s = backlog_s if wait_s is None else max(wait_s, backlog_s)
    put("queue_wait_p99_s", wait_s, at_s)
    # An endpoint that did not answer (or answered NaN) is missing from every window over
    # that round: the rates above are then lower bounds, and the decision knows it.
    put("metrics_coverage_ratio", coverage, at_s)
    fields.update(_replica_model_inputs(book, dep, at_s, windows))
    kv = book.gauge(name, sm.VLLM_KV_CACHE)
    if kv is not None and kv.series:
        put("kv_cache_usage_ratio", kv.mean, kv.at_s)
    return fields


def _replica_model_inputs(
    book: SignalBook, dep: ServeDeployment, at_s: float, windows: Windows
) -> Fields:
    """vLLM's series where the replicas export them: the replica model's inputs and the
    per-tick histograms the SLO guard counts misses from."""
    name = dep.name
    window_s, look_back_s = windows.rate_s, windows.look_back_s
    fields: Fields = {}

    def put(field: str, value: float | None) -> None:
        if value is not None and math.isfinite(value) and value >= 0:
            fields[field] = Reading(value, at_s)

    if book.has(name, sm.VLLM_PROMPT_TOKENS):
        put("prompt_token_rate_per_s", book.rate_per_s(name, sm.VLLM_PROMPT_TOKENS, window_s))
    if book.has(name, sm.VLLM_GENERATION_TOKENS):
        put("output_token_rate_per_s", book.rate_per_s(name, sm.VLLM_GENERATION_TOKENS, window_s))
    if book.has(name, sm.VLLM_PREFILL_S):
        put("prefill_seconds_per_s", book.rate_per_s(name, sm.VLLM_PREFILL_S + sm.SUM, window_s))
        put(
            "prefilled_request_rate_per_s",
            book.rate_per_s(name, sm.VLLM_PREFILL_S + sm.COUNT, window_s),
        )
    if book.has(name, sm.VLLM_TPOT_S):
        tpot_s = book.mean(name, sm.VLLM_TPOT_S, look_back_s)
        put("tpot_mean_s", tpot_s)
        running = book.gauge(name, sm.VLLM_RUNNING)
        if tpot_s is not None and running is not None and dep.running_replicas:
            put("decode_batch_mean", running.total / dep.running_replicas)
    lengths = book.increase(name, sm.VLLM_PROMPT_LENGTH, look_back_s)
    if lengths is not None:
        put(
            "prompt_tokens_sq_mean", second_moment(lengths[0], lengths[1], (0.0,) * len(lengths[1]))
        )
    # The last round's observations, for the guard's counts.
    for field, signal, scale in (
        ("ttft_histogram", sm.VLLM_TTFT_S, 1.0),
        ("prompt_tokens_histogram", sm.VLLM_PROMPT_LENGTH, 1.0),
        ("router_wait_histogram", sm.ROUTER_WAIT_MS, 0.001),
        # vLLM's engine queue: the wait the guard holds against each request's budget.
        ("queue_wait_histogram", sm.VLLM_QUEUE_S, 1.0),
    ):
        increase = book.increase(name, signal, windows.tick_s)
        if increase is not None:
            bounds, counts = increase
            histogram = Histogram(tuple(b * scale for b in bounds), counts, at_s)
            if histogram.sane:  # counts past float's range or negative are no counts
                fields[field] = histogram
    return fields
