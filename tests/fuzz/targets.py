"""What each parser may do with any input: return a sane value or raise its one error type.

A target's `check(data)` feeds `data` to a parser the way the daemon does and then uses
the result the way the daemon does. It returns normally, or raises:

- the parser's allowed error, once its message has been checked to be one line;
- `Skipped`, for input refused before the parser (a body `json.loads` refuses is its
  caller's business, not the Serve parsers');
- anything else for a bug: an unhandled exception, an AssertionError for a result that
  breaks the contract, `TooSlow` for an input that takes more than `CPU_LIMIT_S` of CPU,
  a warning (warnings are errors here: a warning on stderr is what a user sees).

The tests in this package and `benchmarks/fuzz.py` use these same targets.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import yarl

from autoscalerd import server, state
from autoscalerd.config import Config, ConfigError, DeploymentConfig, ForecastConfig, parse_config
from autoscalerd.decide import policy
from autoscalerd.forecast import holt_winters
from autoscalerd.forecast.holt_winters import MIN_HOLT_BUCKETS
from autoscalerd.model import DeploymentState, Histogram, Reading
from autoscalerd.sense import prometheus_http, serve_readings
from autoscalerd.sense import prometheus_queries as pq
from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.moments import second_moment
from autoscalerd.sense.prometheus import MetricsParseError, parse
from autoscalerd.sense.serve_api import (
    MetricsTarget,
    ServeDeployment,
    ServeState,
    ShapeError,
    parse_applications,
    parse_metrics_targets,
    parse_service_discovery,
)
from autoscalerd.sim.traces import MAX_TOKENS, TraceError, TraceWindow, load_trace_text
from tests.fuzz import seeds

# One input may take this much CPU; more is a hang to report, not a slow parser.
CPU_LIMIT_S = 5.0
# The daemon's clock under real time is the wall clock: times are this large.
NOW_S = 1_700_000_000.0
# Deployments of one input that are decided on; the rest only parse.
DECIDED_PER_INPUT = 3


class Skipped(Exception):
    """Input refused before the parser under test, by its caller."""


class TooSlow(Exception):
    """An input that used more than the CPU budget of one input."""


@contextmanager
def cpu_limit(seconds: float) -> Iterator[None]:
    """Raise TooSlow in the code inside once it has used `seconds` of CPU time.

    A CPU-time timer (SIGVTALRM), so that it neither fires while the machine is busy with
    other work nor touches the wall-clock alarm that pytest-timeout uses.
    """

    def expire(signum: int, frame: object) -> None:
        raise TooSlow(f"over {seconds:g} s of CPU time for one input")

    previous = signal.signal(signal.SIGVTALRM, expire)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


@dataclass(frozen=True)
class Target:
    name: str
    seeds: Callable[[], Sequence[bytes]]
    structure: str | None  # how the mutator may parse the seeds: "json", "yaml", ...
    allowed: tuple[type[BaseException], ...]
    run: Callable[[bytes], None]

    def warm_up(self) -> None:
        """Run every seed, and a forecaster fit, once without a CPU limit: the imports they
        do on first use (statsmodels, scipy, pandas) must not be cut by the limit, which
        would leave half-imported modules behind for the next input."""
        for seed in self.seeds():
            with contextlib.suppress(Exception):
                self.run(seed)
        small = ForecastConfig(season_length=4, history_seasons=2)
        for buckets in (MIN_HOLT_BUCKETS, 2 * small.season_length * small.history_seasons):
            holt_winters.fit([float(1 + i % 4) for i in range(buckets)], small)

    def check(self, data: bytes, cpu_s: float = CPU_LIMIT_S) -> None:
        with cpu_limit(cpu_s), warnings.catch_warnings():
            warnings.simplefilter("error")
            self.run(data)

    def outcome(self, data: bytes, cpu_s: float = CPU_LIMIT_S) -> str:
        """ "ok", "allowed" (the parser's own error) or "skipped"; a bug raises."""
        try:
            self.check(data, cpu_s)
        except Skipped:
            return "skipped"
        except self.allowed:
            return "allowed"
        return "ok"


def one_line(message: str, where: str = "") -> None:
    assert message.strip(), "an empty error message"
    assert "\n" not in message and "\r" not in message, f"not one line: {message!r}"
    assert where in message, f"{where!r} not named in {message!r}"


def _text(data: bytes) -> str:
    """Bytes as a str; bytes that are not UTF-8 become lone surrogates, which a str can
    hold and a parser must cope with too."""
    return data.decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------- deciding on what parsed


def decide_a_few(cfg: DeploymentConfig, current: DeploymentState, now_s: float) -> None:
    """A few ticks of the pipeline from `current`, as the loop runs them: decide, refit."""
    for tick in range(3):
        at_s = now_s + tick
        obs = seeds.observation(at_s, 20.0 + 10.0 * tick, vllm=tick > 0, deployment=cfg.name)
        decision, current = policy.decide(obs, current, cfg, at_s)
        target = decision.target_replicas
        assert isinstance(target, int) and not isinstance(target, bool), f"target {target!r}"
        assert target >= 0, f"a negative target: {target}"
        current = policy.refit_forecaster(current, cfg, at_s)


# ---------------------------------------------------------------- config


CONFIG_SOURCE = "fuzz.yaml"


def run_config(data: bytes) -> None:
    try:
        cfg = parse_config(_text(data), CONFIG_SOURCE)
    except ConfigError as exc:
        assert exc.problems, "a ConfigError without problems"
        for problem in exc.problems:
            one_line(problem, CONFIG_SOURCE)
        raise
    # A config that validates must run: the deployments it lists, and one discovered.
    names = [d.name for d in cfg.deployments[:DECIDED_PER_INPUT]] + ["fuzz/discovered"]
    for name in names:
        deployment = cfg.deployment(name)
        decide_a_few(deployment, policy.initial_state(deployment, NOW_S, None), NOW_S)


# ---------------------------------------------------------------- state files


def run_state(data: bytes) -> None:
    try:
        snapshot = state.decode(_text(data))
    except state.StateError as exc:
        one_line(str(exc))
        raise
    snapshot.same_clock(None)
    snapshot.resume_s(0.0, 10.0, snapshot.saved_wall_s + 5.0)
    defaults = Config()
    for name, saved in list(snapshot.deployments.items())[:DECIDED_PER_INPUT]:
        # The operator's settings go back into the loop as they are.
        for field in ("override_replicas", "applied_replicas"):
            replicas = getattr(saved, field)
            assert replicas is None or replicas >= 0, f"{name}: {field} {replicas} accepted"
        cfg = defaults.deployment(name)
        for down_s in (0.5, 3600.0):  # a restart within max_metric_age_s, and a long one
            now_s = saved.saved_at_s + down_s
            restored = state.restore(saved, now_s, cfg, None)
            if restored is not None:
                decide_a_few(cfg, restored, now_s)


# ---------------------------------------------------------------- traces

# Windows a trace is cut with; each input picks one by its length, so it reproduces.
TRACE_WINDOWS = (
    TraceWindow(),
    TraceWindow(start_s=5.0, duration_s=30.0, rate_scale=2.5, seed=1),
    TraceWindow(rate_scale=0.5, seed=2),
)


def trace_suffix(data: bytes) -> str:
    return ".jsonl" if data.lstrip()[:1] == b"{" else ".csv"


def run_trace(data: bytes) -> None:
    suffix = trace_suffix(data)
    window = TRACE_WINDOWS[len(data) % len(TRACE_WINDOWS)]
    try:
        requests = load_trace_text(data, suffix, window=window)
    except TraceError as exc:
        one_line(str(exc), f"trace{suffix}")
        raise
    arrival_s = requests.arrival_s
    assert np.all(np.isfinite(arrival_s)) and np.all(arrival_s >= 0), "arrival times"
    assert np.all(np.diff(arrival_s) >= 0), "arrivals out of order"
    if window.duration_s is not None:
        assert np.all(arrival_s < window.duration_s), "arrivals past the window"
    for tokens in (requests.prompt_tokens, requests.output_tokens):
        assert tokens.dtype == np.int64, tokens.dtype
        assert np.all((tokens >= 0) & (tokens <= MAX_TOKENS)), "token counts"


# ---------------------------------------------------------------- Prometheus text

# The Serve API's view the scrapes are attributed with (the seeds' replicas and workers).
SERVE_STATE = ServeState(
    {
        name: ServeDeployment(
            app=app,
            deployment=dep,
            external_scaler_enabled=True,
            ingress=True,
            target_replicas=1,
            running_replicas=1,
            starting_replicas=0,
            max_ongoing_requests=8,
            resources_per_replica={"GPU": 1.0},
            replica_ids=frozenset({"r1"} if app == "llm" else set()),
            worker_ids=frozenset({"w-rep"} if app == "llm" else {"proxy-n1"}),
        )
        for name, app, dep in (("llm/LlmReplica", "llm", "LlmReplica"), ("app/Dep", "app", "Dep"))
    }
)
SIGNALS = sorted({signal for signal, _ in sm.FAMILIES.values()})
_ENDPOINTS = ("http://192.0.2.2:8080/metrics", "http://192.0.2.3:8080/metrics")
# Every query of a window this long or shorter; keep_s of the book below.
_KEEP_S = 20.0


def new_book() -> sm.MetricsBook:
    return sm.MetricsBook(keep_s=_KEEP_S, gap_s=5.0)


def check_book(book: sm.MetricsBook, deployments: Sequence[str]) -> None:
    """Every query the sensor makes, on every signal: no exception, nothing negative."""
    coverage = book.coverage_ratio(10.0)
    assert coverage is None or 0.0 <= coverage <= 1.0, f"coverage {coverage}"
    for deployment in deployments:
        for name in SIGNALS:
            book.has(deployment, name)
            for part in ("", sm.SUM, sm.COUNT):
                rate = book.rate_per_s(deployment, name + part, 10.0)
                assert rate is None or not rate < 0, f"{deployment} {name}{part}: rate {rate}"
            book.mean(deployment, name, 10.0)
            quantile = book.quantile(deployment, name, 0.99, 10.0)
            assert quantile is None or isinstance(quantile, float), quantile
            increase = book.increase(deployment, name, 2.0)
            if increase is not None:
                bounds, counts = increase
                assert len(counts) == len(bounds) + 1, (bounds, counts)
                assert all(not count < 0 for count in counts), counts
                assert list(bounds) == sorted(set(bounds)), bounds
                assert all(math.isfinite(bound) for bound in bounds), bounds
                # What the sensor makes of it: the prompt mix's E[x²], the SLO guard's counts.
                second_moment(bounds, counts, (0.0,) * len(counts))
                Histogram(bounds, counts, 0.0).count_above(1.0)
            gauge = book.gauge(deployment, name)
            if gauge is not None:
                assert gauge.series > 0 and not gauge.total < 0, gauge
                gauge.mean  # noqa: B018 - the property the sensor reads


def run_prometheus(data: bytes) -> None:
    try:
        samples = parse(_text(data), sm.FAMILY_NAMES)
    except MetricsParseError as exc:
        one_line(str(exc))
        raise
    attribution = sm.Attribution(SERVE_STATE)
    book = new_book()
    # Three rounds 2 s apart from two endpoints, the first only recording, as the sensor
    # ingests them; the second endpoint exports half the series and a third never answers.
    for number, at_s in enumerate((0.0, 2.0, 4.0)):
        book.ingest(_ENDPOINTS[0], samples, at_s, attribution, count=number > 0)
        book.ingest(_ENDPOINTS[1], samples[::2], at_s, attribution, count=number > 0)
        book.end_round(at_s, endpoints=3, failed=1)
    found = {attribution.deployment_of(sample.labels) for sample in samples[:200]}
    deployments = sorted(
        {name for name in found if name is not None} | set(SERVE_STATE.deployments)
    )
    check_book(book, deployments[:8])


# ---------------------------------------------------------------- Serve's JSON


def check_url(target: MetricsTarget) -> None:
    """A metrics endpoint that aiohttp can request: http, a host, a port, /metrics."""
    try:
        url = yarl.URL(target.url)
    except ValueError as exc:
        raise AssertionError(f"{target.url!r} is not a URL: {exc}") from None
    assert url.scheme == "http" and url.host, target.url
    assert url.path == "/metrics" and not url.query_string and not url.fragment, target.url
    assert url.user is None and url.explicit_port is not None, target.url
    assert 0 < url.explicit_port < 65536, target.url


def check_serve_state(found: ServeState) -> None:
    for name, dep in found.deployments.items():
        assert name == dep.name == f"{dep.app}/{dep.deployment}", name
        for count in (dep.running_replicas, dep.starting_replicas):
            assert type(count) is int and count >= 0, count
        for optional in (dep.target_replicas, dep.max_ongoing_requests):
            assert optional is None or (type(optional) is int and optional >= 0), optional
        for resource, amount in dep.resources_per_replica.items():
            assert isinstance(resource, str), resource
            assert type(amount) is float and math.isfinite(amount) and amount > 0, amount
        for ids in (dep.replica_ids, dep.worker_ids, dep.node_ids):
            assert all(isinstance(item, str) and item for item in ids), ids
    assert found.controller_id is None or isinstance(found.controller_id, str)


def check_serve_body(body: Any) -> None:
    """The three Serve parsers on one JSON value; ShapeError if all three refuse it."""
    refusals: list[ShapeError] = []
    parsers: tuple[tuple[Callable[[Any], Any], Callable[[Any], None]], ...] = (
        (parse_applications, check_serve_state),
        (parse_metrics_targets, lambda targets: [check_url(t) for t in targets]),
        (parse_service_discovery, lambda targets: [check_url(t) for t in targets]),
    )
    for parser, check in parsers:
        try:
            found = parser(body)
        except ShapeError as exc:
            one_line(str(exc))
            refusals.append(exc)
            continue
        check(found)
    if len(refusals) == len(parsers):
        raise refusals[-1]


def run_serve_api(data: bytes) -> None:
    # As the dashboard client decodes an answer: UTF-8 text, then JSON.
    try:
        body = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        raise Skipped from None
    check_serve_body(body)


# ---------------------------------------------------------------- the HTTP API

# Tokens the Authorization header is checked against: ASCII, and one that is not.
HTTP_TOKENS = (seeds.HTTP_TOKEN, "t\u00f8k\u00e9n-\u00fc")


def check_api_error(exc: server.ApiError) -> None:
    assert 400 <= exc.status < 500, exc.status
    one_line(exc.message)
    for token in HTTP_TOKENS:
        assert token not in exc.message, "the token in an error message"


def check_authorization(header: str) -> None:
    for token in HTTP_TOKENS:
        try:
            server.check_bearer(header, token)
        except server.ApiError as exc:
            check_api_error(exc)
            assert exc.status in (401, 403), exc.status
        else:
            scheme, _, given = header.partition(" ")
            assert scheme.lower() == "bearer" and given.strip() == token, header


def check_override(body: dict[str, Any]) -> None:
    try:
        replicas, ttl_s = server.parse_override(body)
    except server.ApiError as exc:
        check_api_error(exc)
        raise
    assert type(replicas) is int and replicas >= 0, replicas
    assert ttl_s is None or (type(ttl_s) is float and 0 < ttl_s <= server.MAX_OVERRIDE_TTL_S)


def run_http(data: bytes) -> None:
    """The first line is an Authorization header's value, the rest an override's body."""
    header, _, raw = data.partition(b"\n")
    # aiohttp decodes header bytes as UTF-8 with surrogateescape.
    check_authorization(_text(header))
    try:
        body = server.json_body(raw)
    except server.ApiError as exc:
        check_api_error(exc)
        raise
    check_override(body)


# ---------------------------------------------------------------- Prometheus' HTTP API

# The prometheus sensor's round for the seed's Serve state: every query answered with the
# input (as if Prometheus answered each the same), then each deployment's load read.
_PROM_STATE = parse_applications(seeds.APPLICATIONS)
_PROM_PLAN = pq.plan({"job": "ray"}, (10.0, 30.0), 10.0, 30.0)


def run_prometheus_api(data: bytes) -> None:
    body = prometheus_http._json(_text(data))
    if not isinstance(body, dict):
        raise Skipped  # the client refuses an answer that is not a JSON object first
    results: list[list[prometheus_http.Sample] | prometheus_http.PrometheusError] = []
    for query in _PROM_PLAN:
        try:
            results.append(prometheus_http._vector(body, query.promql))
        except prometheus_http.PrometheusError as exc:
            one_line(str(exc))
            results.append(exc)
    answers = pq.answers(_PROM_PLAN, results, sm.Attribution(_PROM_STATE), NOW_S)
    for dep in _PROM_STATE.deployments.values():
        at_s = answers.as_of(dep.name)
        if at_s is None or not math.isfinite(at_s):
            continue
        windows = serve_readings.Windows(rate_s=10.0, look_back_s=30.0, tick_s=10.0)
        coverage = answers.coverage(dep.name, dep.running_replicas)
        assert 0.0 <= coverage <= 1.0, f"coverage {coverage}"
        fields = answers.known_fields(
            dep.name, serve_readings.load_fields(answers, dep, at_s, windows, coverage)
        )
        for name, value in fields.items():
            if isinstance(value, Reading):
                assert math.isfinite(value.value) and value.value >= 0, f"{name} {value}"
            elif isinstance(value, Histogram):
                assert value.sane, f"{name} {value}"


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target("config", seeds.configs, "yaml", (ConfigError,), run_config),
        Target("state", seeds.state_files, "json", (state.StateError,), run_state),
        Target("traces", seeds.traces, None, (TraceError,), run_trace),
        Target("prometheus", seeds.prometheus, "prometheus", (MetricsParseError,), run_prometheus),
        Target("serve_api", seeds.serve_json, "json", (ShapeError,), run_serve_api),
        Target("http", seeds.http_requests, None, (server.ApiError,), run_http),
        Target("prometheus_api", seeds.prometheus_answers, "json", (), run_prometheus_api),
    )
}
