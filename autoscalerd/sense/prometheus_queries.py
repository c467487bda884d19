"""The PromQL the `prometheus` sensor asks, and the answers as a `SignalBook` (pure).

Every query is an instant query that aggregates in Prometheus: a counter's
`sum by (...) (rate(...[W]))`, a gauge's `sum by (...)`, a histogram's
`sum by (..., le) (increase(..._bucket[W]))`. They group by the labels that say which
deployment a series belongs to (`serve_metrics.Attribution`): Serve's own series carry
`application` and `deployment`; vLLM's, exported through Ray, carry only `WorkerId` (or a
replica id), which the Serve API's replicas map to a deployment. So the last step of the
aggregation, per deployment, is done here, and a histogram's quantile is taken from the
buckets Prometheus summed, with Prometheus' own interpolation (the same code the direct
sensor uses).

Freshness: an instant query's sample carries the evaluation time, not the scrape's, so
each round also asks `min by (...) (timestamp(...))` of the series read: a deployment's
readings are as old as its oldest series' newest sample.

What is unknown stays unknown: a query that failed, a NaN, infinite or negative answer
for a deployment, makes the fields it feeds unknown for that round (FED_BY), never zero.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.prometheus import HistogramAccumulator
from autoscalerd.sense.prometheus_http import PrometheusError, Sample
from autoscalerd.sense.serve_readings import BucketCounts, Fields

# Labels that name a series' deployment, directly or through the Serve API's replicas.
SERVE_KEYS = ("application", "deployment")
REPLICA_KEYS = (*SERVE_KEYS, "ReplicaId", "replica_id", "replica", "WorkerId")

RATE, GAUGE, COUNT, BUCKETS, FRESHNESS, TARGETS = (
    "rate",
    "gauge",
    "count",
    "buckets",
    "freshness",
    "targets",
)

# The signals whose answers are the deployment's load: without one of them, or with a
# target down, the load readings are lower bounds (scale up on them, never down).
LOAD_SIGNALS = (
    sm.ROUTER_REQUESTS,
    sm.REPLICA_COMPLETIONS,
    sm.REPLICA_PROCESSING,
    sm.HANDLE_ONGOING,
    sm.HANDLE_QUEUED,
)
_COUNTERS = (
    sm.ROUTER_REQUESTS,
    sm.REPLICA_COMPLETIONS,
    sm.VLLM_PROMPT_TOKENS,
    sm.VLLM_GENERATION_TOKENS,
)
_GAUGES = (
    sm.REPLICA_PROCESSING,
    sm.HANDLE_ONGOING,
    sm.HANDLE_QUEUED,
    sm.VLLM_RUNNING,
    sm.VLLM_WAITING,
    sm.VLLM_KV_CACHE,
)
# Histograms read over the look-back window; their _sum and _count as rates where a mean
# is wanted.
_HISTOGRAMS = (
    sm.HTTP_LATENCY_MS,
    sm.PROCESSING_LATENCY_MS,
    sm.VLLM_E2E_S,
    sm.VLLM_TTFT_S,
    sm.ROUTER_WAIT_MS,
    sm.VLLM_PROMPT_LENGTH,
)
_MEANS = (sm.VLLM_PREFILL_S, sm.VLLM_TPOT_S)
# The per-tick histograms the SLO guard counts misses from.
_TICK_HISTOGRAMS = (sm.VLLM_TTFT_S, sm.VLLM_PROMPT_LENGTH, sm.ROUTER_WAIT_MS, sm.VLLM_QUEUE_S)

# Which signals feed which Observation field: when one of them is unknown for a
# deployment (its query failed, or it answered garbage), so is the field.
FED_BY: dict[str, tuple[str, ...]] = {
    "arrival_rate_per_s": (sm.ROUTER_REQUESTS,),
    "completion_rate_per_s": (sm.REPLICA_COMPLETIONS,),
    "token_rate_per_s": (sm.VLLM_PROMPT_TOKENS, sm.VLLM_GENERATION_TOKENS),
    "ongoing_requests": (
        sm.REPLICA_PROCESSING,
        sm.HANDLE_ONGOING,
        sm.VLLM_RUNNING,
        sm.VLLM_WAITING,
    ),
    "queued_requests": (sm.HANDLE_QUEUED,),
    "e2e_p99_s": (sm.HTTP_LATENCY_MS, sm.PROCESSING_LATENCY_MS, sm.VLLM_E2E_S),
    "ttft_p99_s": (sm.VLLM_TTFT_S,),
    "queue_wait_p99_s": (sm.ROUTER_WAIT_MS, sm.HANDLE_QUEUED, sm.REPLICA_COMPLETIONS),
    "kv_cache_usage_ratio": (sm.VLLM_KV_CACHE,),
    "prompt_token_rate_per_s": (sm.VLLM_PROMPT_TOKENS,),
    "output_token_rate_per_s": (sm.VLLM_GENERATION_TOKENS,),
    "prefill_seconds_per_s": (sm.VLLM_PREFILL_S,),
    "prefilled_request_rate_per_s": (sm.VLLM_PREFILL_S,),
    "tpot_mean_s": (sm.VLLM_TPOT_S,),
    "decode_batch_mean": (sm.VLLM_TPOT_S, sm.VLLM_RUNNING),
    "prompt_tokens_sq_mean": (sm.VLLM_PROMPT_LENGTH,),
    "ttft_histogram": (sm.VLLM_TTFT_S,),
    "prompt_tokens_histogram": (sm.VLLM_PROMPT_LENGTH,),
    "router_wait_histogram": (sm.ROUTER_WAIT_MS,),
    "queue_wait_histogram": (sm.VLLM_QUEUE_S,),
}


@dataclass(frozen=True, slots=True)
class Query:
    kind: str  # RATE, GAUGE, COUNT, BUCKETS, FRESHNESS or TARGETS
    signal: str  # a serve_metrics signal ("" for FRESHNESS and TARGETS)
    window_s: float  # the range of RATE, BUCKETS and TARGETS; 0 for an instant value
    promql: str


def _families(signal: str) -> list[str]:
    return sorted(name for name, (meaning, _) in sm.FAMILIES.items() if meaning == signal)


def _keys(signal: str) -> tuple[str, ...]:
    serve = all(name.startswith("ray_serve_") for name in _families(signal))
    return SERVE_KEYS if serve else REPLICA_KEYS


def matchers_text(matchers: Mapping[str, str]) -> str:
    """`job="ray", cluster="prod"`: the extra matchers every selector carries."""
    return ", ".join(
        f"{label}={json.dumps(value, ensure_ascii=False)}"
        for label, value in sorted(matchers.items())
    )


def _selector(names: Sequence[str], matchers: str) -> str:
    """A selector for series named any of `names` (vLLM's own endpoint and Ray spell them
    differently), with the extra matchers."""
    if len(names) == 1:
        return f"{names[0]}{{{matchers}}}"
    alternatives = "|".join(names)
    return f'{{__name__=~"{alternatives}"' + (f", {matchers}" if matchers else "") + "}"


def _range(window_s: float) -> str:
    return f"[{max(1, round(window_s * 1000))}ms]"


def plan(
    matchers: Mapping[str, str],
    windows_s: Iterable[float],
    tick_window_s: float,
    coverage_window_s: float,
) -> list[Query]:
    """Every query of one round: rates and histograms once per window in `windows_s`."""
    m = matchers_text(matchers)
    queries: list[Query] = []
    for window_s in sorted(set(windows_s)):
        r = _range(window_s)
        for signal in _COUNTERS:
            names = [f"{n}_total" for n in _families(signal)]
            by = ", ".join(_keys(signal))
            queries.append(
                Query(RATE, signal, window_s, f"sum by ({by}) (rate({_selector(names, m)}{r}))")
            )
        for signal in _MEANS:
            by = ", ".join(_keys(signal))
            for suffix, part in (("_sum", sm.SUM), ("_count", sm.COUNT)):
                names = [n + suffix for n in _families(signal)]
                promql = f"sum by ({by}) (rate({_selector(names, m)}{r}))"
                queries.append(Query(RATE, signal + part, window_s, promql))
        for signal in _HISTOGRAMS:
            queries.append(_buckets(signal, window_s, m))
    for signal in _TICK_HISTOGRAMS:
        queries.append(_buckets(signal, tick_window_s, m))
    for signal in _GAUGES:
        by = ", ".join(_keys(signal))
        selector = _selector(_families(signal), m)
        queries.append(Query(GAUGE, signal, 0.0, f"sum by ({by}) ({selector})"))
        if signal in (sm.REPLICA_PROCESSING, sm.VLLM_KV_CACHE):
            queries.append(Query(COUNT, signal, 0.0, f"count by ({by}) ({selector})"))
    queries.append(Query(FRESHNESS, "", 0.0, _freshness(m)))
    queries.append(Query(TARGETS, "", coverage_window_s, _targets(coverage_window_s, m)))
    return queries


def _buckets(signal: str, window_s: float, matchers: str) -> Query:
    by = ", ".join((*_keys(signal), "le"))
    names = [f"{n}_bucket" for n in _families(signal)]
    promql = f"sum by ({by}) (increase({_selector(names, matchers)}{_range(window_s)}))"
    return Query(BUCKETS, signal, window_s, promql)


def _freshness(matchers: str) -> str:
    """When each group's newest sample was scraped (buckets come with their _count).

    timestamp() drops the metric's name, and series of two names may then share their
    labels: each name's timestamps get a `series` label before they are put together.
    """
    names: list[str] = []
    for signal in (*_COUNTERS, *_GAUGES):
        suffix = "_total" if signal in _COUNTERS else ""
        names += [n + suffix for n in _families(signal)]
    for signal in (*_HISTOGRAMS, *_MEANS):
        names += [n + "_count" for n in _families(signal)]
    each = " or ".join(
        f'label_replace(timestamp({_selector([name], matchers)}), "series", "{name}", "", "")'
        for name in sorted(set(names))
    )
    return f"min by ({', '.join(REPLICA_KEYS)}) ({each})"


def _targets(window_s: float, matchers: str) -> str:
    """The share of the scrape targets, of the jobs that export Serve's replicas, that
    answered every scrape over the window. A target Prometheus no longer scrapes (a node
    removed from service discovery) leaves; one that fails its scrapes counts."""
    up = f"up{{{matchers}}}" if matchers else "up"
    jobs = _selector(_families(sm.REPLICA_PROCESSING), matchers)
    return f"avg(min_over_time({up}{_range(window_s)}) and on (job) group by (job) ({jobs}))"


# ------------------------------------------------------------------ the answers


class Attributes(Protocol):
    """Which deployment a series belongs to (serve_metrics.Attribution)."""

    def deployment_of(self, labels: Mapping[str, str]) -> str | None: ...


def _garbage(value: float) -> bool:
    return not math.isfinite(value) or value < 0


def _base(signal: str) -> str:
    """The signal a histogram's _sum or _count belongs to."""
    return signal.partition(":")[0]


@dataclass
class Answers:
    """One round's answers per deployment, as the `SignalBook` that `load_fields` reads.

    Windows are those the round asked for: a window it did not ask for answers None.
    """

    evaluated_at_s: float  # when the round was answered (the daemon's clock)
    rates: dict[tuple[str, str, float], float] = field(default_factory=dict)
    gauges: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    counts: dict[tuple[str, str], float] = field(default_factory=dict)
    buckets: dict[tuple[str, str, float], dict[float, float]] = field(default_factory=dict)
    # (deployment, signal) with a series this round.
    present: set[tuple[str, str]] = field(default_factory=set)
    # (deployment, signal) unknown this round: garbage for that deployment, or ("", signal)
    # for a query that failed, which every deployment misses.
    unknown: set[tuple[str, str]] = field(default_factory=set)
    # (kind, signal, window_s) of the queries that answered.
    answered: set[tuple[str, str, float]] = field(default_factory=set)
    fresh_at_s: dict[str, float] = field(default_factory=dict)
    targets_share: float = 0.0
    failures: list[str] = field(default_factory=list)
    queries: int = 0

    @property
    def dead(self) -> bool:
        """Nothing answered: Prometheus is down or refuses every query."""
        return self.queries > 0 and len(self.failures) == self.queries

    def _known(self, deployment: str, signal: str) -> bool:
        base = _base(signal)
        return ("", base) not in self.unknown and (deployment, base) not in self.unknown

    # ---------------------------------------------------------------- SignalBook

    def has(self, deployment: str, signal: str) -> bool:
        return (deployment, signal) in self.present

    def rate_per_s(self, deployment: str, signal: str, window_s: float) -> float | None:
        if not self._known(deployment, signal) or (RATE, signal, window_s) not in self.answered:
            return None
        # Answered, with no series for the deployment: nothing counted (no traffic).
        return self.rates.get((deployment, signal, window_s), 0.0)

    def gauge(self, deployment: str, signal: str) -> sm.GaugeValue | None:
        found = self.gauges.get((deployment, signal))
        if found is None or not self._known(deployment, signal):
            return None
        total, groups = found
        series = self.counts.get((deployment, signal), groups)
        return sm.GaugeValue(total, int(series), self.as_of(deployment) or self.evaluated_at_s)

    def quantile(self, deployment: str, signal: str, q: float, window_s: float) -> float | None:
        window = self._window(deployment, signal, window_s)
        return window.quantile(q, 1.0) if window is not None else None

    def increase(self, deployment: str, signal: str, window_s: float) -> BucketCounts | None:
        window = self._window(deployment, signal, window_s)
        return window.increase(1.0) if window is not None else None

    def mean(self, deployment: str, signal: str, window_s: float) -> float | None:
        total = self.rate_per_s(deployment, signal + sm.SUM, window_s)
        count = self.rate_per_s(deployment, signal + sm.COUNT, window_s)
        return total / count if total is not None and count else None

    def _window(self, deployment: str, signal: str, window_s: float) -> HistogramAccumulator | None:
        """Prometheus' bucket increases as a history of two marks (the window's start and
        end), so that the direct sensor's quantile and bucket arithmetic apply unchanged."""
        found = self.buckets.get((deployment, signal, window_s))
        if found is None or not self._known(deployment, signal):
            return None
        window = HistogramAccumulator(keep_s=math.inf)
        window.mark(0.0)
        for bound, count in found.items():
            window.add(bound, count)
        window.mark(1.0)
        return window

    # ---------------------------------------------------------------- the rest

    def as_of(self, deployment: str) -> float | None:
        """When the deployment's oldest series was last scraped (never after the round)."""
        at_s = self.fresh_at_s.get(deployment)
        return min(at_s, self.evaluated_at_s) if at_s is not None else None

    def coverage(self, deployment: str, running_replicas: int) -> float:
        """The lowest of: the share of Ray's scrape targets that answered throughout the
        window, the share of the load queries known for the deployment, and the share of
        its running replicas that export their series. Below 1 the load is a lower bound."""
        known = sum(1 for signal in LOAD_SIGNALS if self._known(deployment, signal))
        shares = [self.targets_share, known / len(LOAD_SIGNALS)]
        replicas = self.counts.get((deployment, sm.REPLICA_PROCESSING))
        if running_replicas > 0:
            exporting = replicas if self._known(deployment, sm.REPLICA_PROCESSING) else 0.0
            shares.append(min(1.0, (exporting or 0.0) / running_replicas))
        return max(0.0, min(shares))

    def known_fields(self, deployment: str, fields: Fields) -> Fields:
        """`fields` less those fed by a signal unknown for the deployment this round."""
        return {
            name: value
            for name, value in fields.items()
            if all(self._known(deployment, s) for s in FED_BY.get(name, ()))
        }


def answers(
    queries: Sequence[Query],
    results: Sequence[list[Sample] | PrometheusError],
    attribution: Attributes,
    evaluated_at_s: float,
) -> Answers:
    """The round's answers, attributed to deployments and summed per deployment."""
    out = Answers(evaluated_at_s, queries=len(queries))
    for query, result in zip(queries, results, strict=True):
        if isinstance(result, PrometheusError):
            out.failures.append(str(result))
            if query.signal:
                out.unknown.add(("", _base(query.signal)))
            continue
        out.answered.add((query.kind, query.signal, query.window_s))
        if query.kind == TARGETS:
            values = [s.value for s in result if math.isfinite(s.value)]
            out.targets_share = max(0.0, min(1.0, min(values))) if values else 0.0
            continue
        for sample in result:
            deployment = attribution.deployment_of(sample.labels)
            if deployment is not None:
                _add(out, query, deployment, sample)
    return out


def _add(out: Answers, query: Query, deployment: str, sample: Sample) -> None:
    value = sample.value
    if query.kind == FRESHNESS:
        if math.isfinite(value):
            out.fresh_at_s[deployment] = min(value, out.fresh_at_s.get(deployment, math.inf))
        return
    base = _base(query.signal)
    if _garbage(value):
        out.unknown.add((deployment, base))
        return
    out.present.add((deployment, base))
    if query.kind == RATE:
        key = (deployment, query.signal, query.window_s)
        out.rates[key] = out.rates.get(key, 0.0) + value
    elif query.kind == GAUGE:
        total, groups = out.gauges.get((deployment, query.signal), (0.0, 0))
        out.gauges[(deployment, query.signal)] = (total + value, groups + 1)
    elif query.kind == COUNT:
        key2 = (deployment, query.signal)
        out.counts[key2] = out.counts.get(key2, 0.0) + value
    elif query.kind == BUCKETS:
        bound = sm.bucket_bound(sample.labels.get("le", ""))
        if bound is None:
            out.unknown.add((deployment, base))
            return
        buckets = out.buckets.setdefault((deployment, query.signal, query.window_s), {})
        buckets[bound] = buckets.get(bound, 0.0) + value
