"""Ray Serve's (and vLLM's) Prometheus series, attributed to deployments and kept as windows.

Facts from Ray 2.60 (each node's metrics export port; labels besides Ray's own
`WorkerId`, `NodeAddress`, `SessionName`, ...):

| family (type)                                   | exported by | deployment labels           |
|-------------------------------------------------|-------------|-----------------------------|
| ray_serve_num_router_requests_total (counter)   | each router | application, deployment     |
| ray_serve_deployment_request_counter_total (c.) | each replica| application, deployment, replica |
| ray_serve_replica_processing_queries (gauge)    | each replica| application, deployment, replica |
| ray_serve_num_ongoing_requests_at_replicas (g.) | each router | application, deployment     |
| ray_serve_deployment_queued_queries (gauge)     | each router | application, deployment     |
| ray_serve_deployment_processing_latency_ms (h.) | each replica| application, deployment, replica |
| ray_serve_http_request_latency_ms (histogram)   | each proxy  | application (no deployment) |
| ray_serve_request_router_fulfillment_time_ms (h)| each router | application, deployment     |
| ray_serve_autoscaling_target_replicas (gauge)   | controller  | application, deployment     |

vLLM exports `vllm:<name>` on its own endpoint, and `ray_vllm_<name>` through Ray when it
runs in a Serve replica; those carry `WorkerId` (and, in some versions, `ReplicaId`), so
they are attributed through the replicas the Serve API lists.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autoscalerd.sense.prometheus import (
    Accumulator,
    CounterDeltas,
    HistogramAccumulator,
    Sample,
    family_of,
    label_key,
)
from autoscalerd.sense.serve_api import ServeState

# Signals: what a family means, independent of how it is spelled.
ROUTER_REQUESTS = "router_requests"
REPLICA_COMPLETIONS = "replica_completions"
REPLICA_PROCESSING = "replica_processing"
HANDLE_ONGOING = "handle_ongoing"
HANDLE_QUEUED = "handle_queued"
PROCESSING_LATENCY_MS = "processing_latency_ms"
HTTP_LATENCY_MS = "http_latency_ms"
ROUTER_WAIT_MS = "router_wait_ms"
TARGET_REPLICAS = "target_replicas"
VLLM_RUNNING = "vllm_running"
VLLM_WAITING = "vllm_waiting"
VLLM_KV_CACHE = "vllm_kv_cache_usage"
VLLM_TTFT_S = "vllm_ttft_s"
VLLM_E2E_S = "vllm_e2e_s"
VLLM_PROMPT_TOKENS = "vllm_prompt_tokens"
VLLM_GENERATION_TOKENS = "vllm_generation_tokens"
VLLM_QUEUE_S = "vllm_queue_s"  # waiting for the engine (scheduler queue), per request
VLLM_PREFILL_S = "vllm_prefill_s"  # prefill time per request
VLLM_PROMPT_LENGTH = "vllm_prompt_length"  # prompt tokens per request (histogram)
VLLM_TPOT_S = "vllm_tpot_s"  # time per output token
VLLM_SUCCESS = "vllm_success"  # finished requests

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
# A histogram's _sum and _count series, kept as counters under the signal plus this.
SUM, COUNT = ":sum", ":count"

_SERVE = {
    "ray_serve_num_router_requests": (ROUTER_REQUESTS, COUNTER),
    "ray_serve_deployment_request_counter": (REPLICA_COMPLETIONS, COUNTER),
    "ray_serve_replica_processing_queries": (REPLICA_PROCESSING, GAUGE),
    "ray_serve_num_ongoing_requests_at_replicas": (HANDLE_ONGOING, GAUGE),
    "ray_serve_deployment_queued_queries": (HANDLE_QUEUED, GAUGE),
    "ray_serve_deployment_processing_latency_ms": (PROCESSING_LATENCY_MS, HISTOGRAM),
    "ray_serve_http_request_latency_ms": (HTTP_LATENCY_MS, HISTOGRAM),
    "ray_serve_request_router_fulfillment_time_ms": (ROUTER_WAIT_MS, HISTOGRAM),
    "ray_serve_autoscaling_target_replicas": (TARGET_REPLICAS, GAUGE),
}
_VLLM = {
    "num_requests_running": (VLLM_RUNNING, GAUGE),
    "num_requests_waiting": (VLLM_WAITING, GAUGE),
    "kv_cache_usage_perc": (VLLM_KV_CACHE, GAUGE),
    "time_to_first_token_seconds": (VLLM_TTFT_S, HISTOGRAM),
    "e2e_request_latency_seconds": (VLLM_E2E_S, HISTOGRAM),
    "prompt_tokens": (VLLM_PROMPT_TOKENS, COUNTER),
    "generation_tokens": (VLLM_GENERATION_TOKENS, COUNTER),
    "request_queue_time_seconds": (VLLM_QUEUE_S, HISTOGRAM),
    "request_prefill_time_seconds": (VLLM_PREFILL_S, HISTOGRAM),
    "request_prompt_tokens": (VLLM_PROMPT_LENGTH, HISTOGRAM),
    "time_per_output_token_seconds": (VLLM_TPOT_S, HISTOGRAM),
    "request_success": (VLLM_SUCCESS, COUNTER),
}
FAMILIES: dict[str, tuple[str, str]] = {
    **_SERVE,
    **{f"vllm:{name}": meaning for name, meaning in _VLLM.items()},
    **{f"ray_vllm_{name}": meaning for name, meaning in _VLLM.items()},
}
FAMILY_NAMES = frozenset(FAMILIES)

# Labels that identify a series within a target but say nothing about the deployment.
_HISTOGRAM_BOUND = "le"


class Attribution:
    """Which deployment a series belongs to, from its labels and the Serve API's replicas."""

    def __init__(self, state: ServeState) -> None:
        self._names = set(state.deployments)
        self._ingress: dict[str, str] = {}
        self._by_replica: dict[str, str] = {}
        self._by_worker: dict[str, str] = {}
        for dep in state.deployments.values():
            if dep.ingress:
                self._ingress.setdefault(dep.app, dep.name)
            for replica_id in dep.replica_ids:
                self._by_replica[replica_id] = dep.name
            for worker_id in dep.worker_ids:
                self._by_worker[worker_id] = dep.name

    def deployment_of(self, labels: Mapping[str, str]) -> str | None:
        app = labels.get("application")
        dep = labels.get("deployment")
        if app and dep:
            return f"{app}/{dep}"
        if app:
            # Proxy-side series (HTTP latency) name only the app: they are its ingress's.
            return self._ingress.get(app)
        for key in ("ReplicaId", "replica_id", "replica"):
            replica = labels.get(key)
            if replica:
                # Serve's full replica id reads "app#deployment#suffix".
                parts = replica.split("#")
                if len(parts) >= 3:
                    return f"{parts[-3].split('::')[-1]}/{parts[-2]}"
                if replica in self._by_replica:
                    return self._by_replica[replica]
        worker = labels.get("WorkerId")
        if worker:
            return self._by_worker.get(worker)
        return None


@dataclass(frozen=True, slots=True)
class GaugeValue:
    total: float
    series: int
    at_s: float  # fetch time of the oldest endpoint that contributed

    @property
    def mean(self) -> float:
        return self.total / self.series if self.series else 0.0


class MetricsBook:
    """Everything the sensor remembers between scrapes, per deployment and signal."""

    def __init__(self, keep_s: float, gap_s: float) -> None:
        self.keep_s = keep_s
        # A longer pause than this between rounds (an outage) starts the windows afresh:
        # what piled up meanwhile must not read as a burst.
        self.gap_s = gap_s
        self._deltas = CounterDeltas()
        self._counters: dict[tuple[str, str], Accumulator] = {}
        self._histograms: dict[tuple[str, str], HistogramAccumulator] = {}
        # Latest gauges of each endpoint: url -> (fetched_at_s, {(deployment, signal): (sum, n)})
        self._gauges: dict[str, tuple[float, dict[tuple[str, str], tuple[float, int]]]] = {}
        self._signals: dict[str, set[str]] = {}
        self.last_mark_s: float | None = None
        self.round_s: float | None = None  # seconds between the last two rounds
        self.rounds = 0
        self.serve_samples_last_round = 0
        self._round_serve_samples = 0
        # Endpoints whose scrape this round held unknown values (NaN, ±Inf, negative).
        self._round_bad: set[str] = set()
        self.bad_last_round: frozenset[str] = frozenset()
        # When each endpoint last exported any Serve series.
        self._serve_seen_s: dict[str, float] = {}
        # (round time, share of the endpoints that answered with clean values).
        self._coverage: deque[tuple[float, float]] = deque()

    # ------------------------------------------------------------------ ingest

    def ingest(
        self,
        target: str,
        samples: Iterable[Sample],
        fetched_at_s: float,
        attribution: Attribution,
        count: bool,
    ) -> None:
        """One endpoint's scrape. `count=False` only records values (first scrape, or the
        first after a gap), so that history before we watched is not read as new traffic."""
        gauges: dict[tuple[str, str], tuple[float, int]] = {}
        serve_before = self._round_serve_samples
        for sample in samples:
            family = family_of(sample.name, FAMILY_NAMES)
            if family is None:
                continue
            signal, kind = FAMILIES[family]
            deployment = attribution.deployment_of(sample.labels)
            if deployment is None:
                continue
            if family in _SERVE:
                self._round_serve_samples += 1
            self._signals.setdefault(deployment, set()).add(signal)
            if kind == GAUGE:
                if not math.isfinite(sample.value) or sample.value < 0:
                    self._round_bad.add(target)
                    continue
                total, series = gauges.get((deployment, signal), (0.0, 0))
                gauges[(deployment, signal)] = (total + sample.value, series + 1)
            elif kind == COUNTER:
                if sample.name.endswith("_created"):
                    continue
                key = (target, sample.name, label_key(sample.labels))
                grew = self._deltas.advance(key, sample.value, count)
                if grew is None:
                    self._round_bad.add(target)
                    continue
                self._counter(deployment, signal).add(grew)
            elif sample.name.endswith(("_sum", "_count")) and family != sample.name:
                # A histogram's sum and count grow like counters.
                part = SUM if sample.name.endswith("_sum") else COUNT
                key = (target, sample.name, label_key(sample.labels))
                grew = self._deltas.advance(key, sample.value, count)
                if grew is None:
                    self._round_bad.add(target)
                    continue
                self._counter(deployment, signal + part).add(grew)
            elif sample.name.endswith("_bucket") and _HISTOGRAM_BOUND in sample.labels:
                bound = bucket_bound(sample.labels[_HISTOGRAM_BOUND])
                if bound is None:
                    self._round_bad.add(target)
                    continue
                key = (target, sample.name, label_key(sample.labels))
                grew = self._deltas.advance(key, sample.value, count)
                if grew is None:
                    self._round_bad.add(target)
                    continue
                self._histogram(deployment, signal).add(bound, grew)
        self._gauges[target] = (fetched_at_s, gauges)
        if self._round_serve_samples > serve_before:
            self._serve_seen_s[target] = fetched_at_s
        elif fetched_at_s - self._serve_seen_s.get(target, -math.inf) <= self.keep_s:
            # Serve's series vanished from an endpoint that had them within the window:
            # whatever it answered (an error page, another exporter), its share of the
            # load is missing from the window.
            self._round_bad.add(target)

    def forget_gauges(self, target: str) -> None:
        """An endpoint that did not answer: its last gauges no longer describe anything."""
        self._gauges.pop(target, None)

    def keep_targets(self, targets: Iterable[str]) -> None:
        """Forget the gauges of endpoints that are gone (removed nodes)."""
        alive = set(targets)
        for url in [u for u in self._gauges if u not in alive]:
            del self._gauges[url]

    def end_round(self, at_s: float, endpoints: int = 1, failed: int = 0) -> None:
        """Close a round of scrapes whose data was fetched by `at_s`: `endpoints` were
        scraped, `failed` of them did not answer. An endpoint that answered with unknown
        values (NaN, ±Inf, negative) counts as failed too: what it did not say is missing
        from every window over this round, so the totals are lower bounds."""
        bad = failed + len(self._round_bad)
        self.bad_last_round = frozenset(self._round_bad)
        self._round_bad = set()
        share = max(0.0, 1.0 - bad / endpoints) if endpoints > 0 else 0.0
        self._coverage.append((at_s, share))
        while self._coverage and self._coverage[0][0] < at_s - self.keep_s:
            self._coverage.popleft()
        gap = self.last_mark_s is not None and at_s - self.last_mark_s > self.gap_s
        for counter in self._counters.values():
            if gap:
                counter.rebase(at_s)
            else:
                counter.mark(at_s)
        for histogram in self._histograms.values():
            if gap:
                histogram.rebase(at_s)
            else:
                histogram.mark(at_s)
        self._deltas.end_round()
        self.round_s = None if gap or self.last_mark_s is None else at_s - self.last_mark_s
        self.last_mark_s = at_s
        self.rounds += 1
        self.serve_samples_last_round = self._round_serve_samples
        self._round_serve_samples = 0

    def _counter(self, deployment: str, signal: str) -> Accumulator:
        key = (deployment, signal)
        if key not in self._counters:
            self._counters[key] = Accumulator(self.keep_s)
            if self.last_mark_s is not None:
                # Start the history at the previous round, so this round's growth counts.
                self._counters[key].mark(self.last_mark_s)
        return self._counters[key]

    def _histogram(self, deployment: str, signal: str) -> HistogramAccumulator:
        key = (deployment, signal)
        if key not in self._histograms:
            self._histograms[key] = HistogramAccumulator(self.keep_s)
            if self.last_mark_s is not None:
                self._histograms[key].mark(self.last_mark_s)
        return self._histograms[key]

    # ------------------------------------------------------------------ queries

    def coverage_ratio(self, window_s: float) -> float | None:
        """The lowest share of endpoints that answered cleanly in any round of about the
        last `window_s`: below 1, every rate and count over that window is a lower bound."""
        if not self._coverage:
            return None
        end_s = self._coverage[-1][0]
        return min(share for at_s, share in self._coverage if at_s >= end_s - window_s)

    def has(self, deployment: str, signal: str) -> bool:
        return signal in self._signals.get(deployment, ())

    def rate_per_s(self, deployment: str, signal: str, window_s: float) -> float | None:
        """Growth per second; 0 when the signal was never exported for it (no traffic)."""
        counter = self._counters.get((deployment, signal))
        if counter is None:
            return 0.0 if self.rounds >= 2 else None
        return counter.rate_per_s(window_s)

    def quantile(self, deployment: str, signal: str, q: float, window_s: float) -> float | None:
        histogram = self._histograms.get((deployment, signal))
        return histogram.quantile(q, window_s) if histogram is not None else None

    def increase(
        self, deployment: str, signal: str, window_s: float
    ) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """A histogram's (bounds, per-bucket observations) over about `window_s`."""
        histogram = self._histograms.get((deployment, signal))
        return histogram.increase(window_s) if histogram is not None else None

    def mean(self, deployment: str, signal: str, window_s: float) -> float | None:
        """A histogram's mean over about `window_s`: its _sum's growth over its _count's."""
        total = self.rate_per_s(deployment, signal + SUM, window_s)
        count = self.rate_per_s(deployment, signal + COUNT, window_s)
        if total is None or not count:
            return None
        return total / count

    def gauge(self, deployment: str, signal: str) -> GaugeValue | None:
        total, series, oldest_s = 0.0, 0, None
        for fetched_at_s, gauges in self._gauges.values():
            found = gauges.get((deployment, signal))
            if found is None:
                continue
            total += found[0]
            series += found[1]
            oldest_s = fetched_at_s if oldest_s is None else min(oldest_s, fetched_at_s)
        if oldest_s is None:
            return None
        return GaugeValue(total, series, oldest_s)


def bucket_bound(text: str) -> float | None:
    """A bucket's upper bound: finite, or +Inf; anything else (NaN, -Inf) is no bucket."""
    try:
        bound = float(text)
    except ValueError:
        return None
    return bound if math.isfinite(bound) or bound == math.inf else None
