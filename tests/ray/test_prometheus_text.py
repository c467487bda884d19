"""Prometheus text as Ray 2.60 exports it: parsing, counter resets, windows, attribution.

Pure (no cluster): the series below are copied from a Ray 2.60 node's metrics port.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.prometheus import (
    Accumulator,
    CounterDeltas,
    HistogramAccumulator,
    MetricsParseError,
    histogram_quantile,
    parse,
)
from autoscalerd.sense.serve_api import (
    ServeDeployment,
    ServeState,
    parse_applications,
    parse_metrics_targets,
    parse_service_discovery,
)

COMMON = 'Component="core_worker",NodeAddress="192.0.2.2",SessionName="s",Version="2.60.0"'
RAY_TEXT = f"""# HELP ray_node_cpu_utilization Total CPU usage
# TYPE ray_node_cpu_utilization gauge
ray_node_cpu_utilization{{ip="192.0.2.2"}} 12.5
# HELP ray_serve_num_router_requests_total The number of requests processed by the router.
# TYPE ray_serve_num_router_requests_total counter
ray_serve_num_router_requests_total{{{COMMON},WorkerId="w-proxy",application="llm",deployment="LlmReplica",handle="h1",route="/llm"}} {{router}}
# TYPE ray_serve_replica_processing_queries gauge
ray_serve_replica_processing_queries{{{COMMON},WorkerId="w-rep",application="llm",deployment="LlmReplica",replica="r1"}} 2.0
# TYPE ray_serve_deployment_processing_latency_ms histogram
ray_serve_deployment_processing_latency_ms_bucket{{{COMMON},WorkerId="w-rep",application="llm",deployment="LlmReplica",le="100.0",replica="r1",route="/llm"}} {{b100}}
ray_serve_deployment_processing_latency_ms_bucket{{{COMMON},WorkerId="w-rep",application="llm",deployment="LlmReplica",le="1000.0",replica="r1",route="/llm"}} {{b1000}}
ray_serve_deployment_processing_latency_ms_bucket{{{COMMON},WorkerId="w-rep",application="llm",deployment="LlmReplica",le="+Inf",replica="r1",route="/llm"}} {{b1000}}
ray_serve_deployment_processing_latency_ms_count{{{COMMON},WorkerId="w-rep",application="llm",deployment="LlmReplica",replica="r1",route="/llm"}} {{b1000}}
ray_serve_deployment_processing_latency_ms_sum{{{COMMON},WorkerId="w-rep",application="llm",deployment="LlmReplica",replica="r1",route="/llm"}} 1.0
# TYPE ray_serve_http_request_latency_ms histogram
ray_serve_http_request_latency_ms_bucket{{{COMMON},WorkerId="w-proxy",application="llm",le="+Inf",method="POST",route="/llm",status_code="200"}} 0.0
# TYPE ray_vllm_num_requests_running gauge
ray_vllm_num_requests_running{{{COMMON},WorkerId="w-rep",model_name="m"}} 3.0
"""


def ray_text(router: float, b100: float, b1000: float) -> str:
    return (
        RAY_TEXT.replace("{router}", str(router))
        .replace("{b100}", str(b100))
        .replace("{b1000}", str(b1000))
    )


STATE = ServeState(
    {
        "llm/LlmReplica": ServeDeployment(
            app="llm",
            deployment="LlmReplica",
            external_scaler_enabled=True,
            ingress=True,
            target_replicas=1,
            running_replicas=1,
            starting_replicas=0,
            max_ongoing_requests=2,
            resources_per_replica={"GPU": 1.0},
            replica_ids=frozenset({"r1"}),
            worker_ids=frozenset({"w-rep"}),
        )
    }
)


def test_parse_keeps_only_wanted_families() -> None:
    samples = parse(ray_text(3, 1, 2), sm.FAMILY_NAMES)
    names = {s.name for s in samples}
    assert "ray_node_cpu_utilization" not in names
    assert "ray_serve_num_router_requests_total" in names
    assert "ray_vllm_num_requests_running" in names
    assert "ray_serve_deployment_processing_latency_ms_bucket" in names


def test_parse_rejects_garbage() -> None:
    with pytest.raises(MetricsParseError):
        parse('ray_serve_num_router_requests_total{application="x" 1\n', sm.FAMILY_NAMES)
    # An error page holds none of the families asked for, and is still no scrape: read as
    # one, the endpoint's share of the load would silently vanish.
    for page in ("<html><body>502 Bad Gateway</body></html>\n", "\x00\x01 this is {not\n"):
        with pytest.raises(MetricsParseError, match="line 1: not an exposition line"):
            parse(page, sm.FAMILY_NAMES)
    assert parse(RAY_TEXT.replace("{router}", "1"), frozenset()) == []


def test_counter_deltas_handle_resets_and_new_series() -> None:
    deltas = CounterDeltas()
    assert deltas.advance("a", 5.0, count=False) == 0.0  # baseline: history before us
    assert deltas.advance("a", 8.0, count=True) == 3.0
    assert deltas.advance("a", 2.0, count=True) == 2.0  # reset: grew by 2 since
    assert deltas.advance("b", 4.0, count=True) == 4.0  # appeared while watched
    # NaN, ±Inf and negative readings are unknown, never zero growth; the next good value
    # counts from the last good one.
    assert deltas.advance("a", math.nan, count=True) is None
    assert deltas.advance("a", math.inf, count=True) is None
    assert deltas.advance("a", -1.0, count=True) is None
    assert deltas.advance("a", 5.0, count=True) == 3.0


def test_accumulator_rate_over_window_and_rebase() -> None:
    acc = Accumulator(keep_s=60)
    for second in range(11):
        acc.mark(float(second))
        acc.add(2.0)  # 2 per second
    acc.mark(11.0)
    assert acc.rate_per_s(4.0) == pytest.approx(2.0)
    acc.add(500.0)  # what piled up during an outage
    acc.rebase(40.0)
    assert acc.rate_per_s(4.0) is None, "one mark after a rebase: no rate yet"
    acc.add(6.0)
    acc.mark(43.0)
    assert acc.rate_per_s(4.0) == pytest.approx(2.0)


def test_histogram_quantile_matches_prometheus() -> None:
    # 100 observations: 90 at <=100 ms, 9 in (100, 1000], 1 above.
    buckets = [(100.0, 90.0), (1000.0, 99.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(100.0 * 50 / 90)
    assert histogram_quantile(0.95, buckets) == pytest.approx(100 + 900 * 5 / 9)
    assert histogram_quantile(0.999, buckets) == 1000.0  # +Inf: the largest finite bound
    assert histogram_quantile(0.99, [(1.0, 0.0), (math.inf, 0.0)]) is None


def test_histogram_window_uses_bucket_deltas() -> None:
    hist = HistogramAccumulator(keep_s=60)
    hist.add(100.0, 1000.0)  # old observations, all fast
    hist.add(math.inf, 1000.0)
    hist.mark(0.0)
    hist.mark(50.0)
    hist.add(math.inf, 10.0)  # recent ones, all slow
    hist.add(1000.0, 10.0)
    hist.mark(55.0)
    assert hist.quantile(0.99, 10.0) == pytest.approx(100 + 900 * 9.9 / 10)


def test_book_attributes_series_and_survives_a_reset() -> None:
    book = sm.MetricsBook(keep_s=60, gap_s=5)
    who = sm.Attribution(STATE)
    book.ingest("t", parse(ray_text(10, 5, 5), sm.FAMILY_NAMES), 0.0, who, count=False)
    book.end_round(0.0)
    book.ingest("t", parse(ray_text(14, 5, 9), sm.FAMILY_NAMES), 2.0, who, count=True)
    book.end_round(2.0)
    # The proxy restarted: its counter starts again from 0 and is at 2.
    book.ingest("t", parse(ray_text(2, 5, 9), sm.FAMILY_NAMES), 4.0, who, count=True)
    book.end_round(4.0)
    name = "llm/LlmReplica"
    assert book.rate_per_s(name, sm.ROUTER_REQUESTS, 4.0) == pytest.approx((4 + 2) / 4)
    processing = book.gauge(name, sm.REPLICA_PROCESSING)
    assert processing is not None and processing.total == 2.0 and processing.at_s == 4.0
    vllm = book.gauge(name, sm.VLLM_RUNNING)  # attributed through the replica's WorkerId
    assert vllm is not None and vllm.total == 3.0
    # 4 new observations, all in (100, 1000] ms.
    p99 = book.quantile(name, sm.PROCESSING_LATENCY_MS, 0.99, 10.0)
    assert p99 is not None and 100 < p99 <= 1000
    assert book.rate_per_s("other/Dep", sm.ROUTER_REQUESTS, 4.0) == 0.0


def test_nan_counters_and_a_failed_endpoint_make_the_window_incomplete() -> None:
    book = sm.MetricsBook(keep_s=60, gap_s=5)
    who = sm.Attribution(STATE)
    name = "llm/LlmReplica"
    for second, router in ((0, 10), (2, 20), (4, 30)):
        book.ingest("t", parse(ray_text(router, 5, 5), sm.FAMILY_NAMES), second, who, True)
        book.end_round(float(second), endpoints=1)
    assert book.coverage_ratio(10.0) == 1.0
    # The router counter reads NaN: unknown, not "no growth"; the window says so.
    book.ingest("t", parse(ray_text(math.nan, 5, 5), sm.FAMILY_NAMES), 6.0, who, True)
    book.end_round(6.0, endpoints=1)
    assert book.coverage_ratio(10.0) == 0.0
    book.ingest("t", parse(ray_text(50, 5, 5), sm.FAMILY_NAMES), 8.0, who, True)
    book.end_round(8.0, endpoints=1)
    # Back after a round of NaN, the counter starts again from its value (what it grew
    # meanwhile is not one round's growth): the window is a lower bound, and says so.
    assert book.rate_per_s(name, sm.ROUTER_REQUESTS, 8.0) == pytest.approx((30 - 10) / 8)
    assert book.coverage_ratio(1.0) == 1.0 and book.coverage_ratio(10.0) == 0.0
    # One of two endpoints failed: half the window's sources.
    book.end_round(10.0, endpoints=2, failed=1)
    assert book.coverage_ratio(1.0) == 0.5


def test_a_nan_bucket_bound_is_dropped_not_added_each_scrape() -> None:
    text = ray_text(1, 1, 1).replace('le="100.0"', 'le="NaN"')
    book = sm.MetricsBook(keep_s=60, gap_s=5)
    who = sm.Attribution(STATE)
    for second in range(5):
        book.ingest("t", parse(text, sm.FAMILY_NAMES), float(second), who, True)
        book.end_round(float(second), endpoints=1)
    increase = book.increase("llm/LlmReplica", sm.PROCESSING_LATENCY_MS, 10.0)
    assert increase is not None and increase[0] == (1000.0,)


def test_one_bad_deployment_or_file_entry_affects_that_entry_only() -> None:
    good = {"target_num_replicas": 3, "replicas": [{"state": "RUNNING", "replica_id": "a"}]}
    body = {
        "applications": {
            "llm": {
                "deployments": {
                    "Good": good,
                    "NanTarget": {"target_num_replicas": math.nan},
                    "InfTarget": {"target_num_replicas": math.inf},
                    "Negative": {"target_num_replicas": -2},
                    "Garbage": "not an object",
                }
            },
            "broken": ["not", "an", "object"],
        }
    }
    state = parse_applications(body)
    assert state.deployments["llm/Good"].target_replicas == 3
    for name in ("NanTarget", "InfTarget", "Negative"):
        assert state.deployments[f"llm/{name}"].target_replicas is None  # unknown, not 0
    assert "llm/Garbage" not in state.deployments
    assert set(state.skipped) == {
        "application 'broken' is not an object",
        "deployment llm/Garbage is not an object",
    }
    targets = parse_service_discovery(
        [{"targets": "10.0.0.1:8080"}, {"targets": 7}, {"targets": ["10.0.0.2:8080", 9]}, 3]
    )
    assert [t.url for t in targets] == ["http://10.0.0.2:8080/metrics"]


def test_attribution_by_full_replica_id() -> None:
    who = sm.Attribution(ServeState({}))
    assert who.deployment_of({"ReplicaId": "SERVE_REPLICA::chat#Llm#abc"}) == "chat/Llm"
    assert who.deployment_of({"WorkerId": "unknown"}) is None


def test_serve_api_shapes() -> None:
    body = {
        "applications": {
            "llm": {
                "external_scaler_enabled": True,
                "deployment_topology": {"ingress_deployment": "LlmReplica"},
                "deployments": {
                    "LlmReplica": {
                        "target_num_replicas": 3,
                        "required_resources": {"CPU": 0, "GPU": 1.0},
                        "deployment_config": {"max_ongoing_requests": 8},
                        "replicas": [
                            {
                                "state": "RUNNING",
                                "replica_id": "a",
                                "worker_id": "w",
                                "node_id": "n",
                            },
                            {"state": "STARTING", "replica_id": "b"},
                            {"state": "STOPPING", "replica_id": "c"},
                        ],
                    }
                },
            }
        }
    }
    dep = parse_applications(body).deployments["llm/LlmReplica"]
    assert (dep.target_replicas, dep.running_replicas, dep.starting_replicas) == (3, 1, 1)
    assert dict(dep.resources_per_replica) == {"GPU": 1.0}
    assert dep.ingress and dep.external_scaler_enabled and dep.max_ongoing_requests == 8
    nodes = {
        "data": {
            "summary": [
                {
                    "raylet": {
                        "state": "ALIVE",
                        "nodeId": "n1",
                        "nodeManagerAddress": "10.0.0.1",
                        "metricsExportPort": 43547,
                    }
                },
                {
                    "raylet": {
                        "state": "DEAD",
                        "nodeId": "n2",
                        "nodeManagerAddress": "10.0.0.2",
                        "metricsExportPort": 1,
                    }
                },
            ]
        }
    }
    [target] = parse_metrics_targets(nodes)
    assert target.url == "http://10.0.0.1:43547/metrics" and target.node_id == "n1"


def test_a_drained_node_going_away_is_not_partial_but_a_serving_one_is() -> None:
    from autoscalerd.config import Config
    from autoscalerd.sense.ray_serve import RayServeSensor
    from autoscalerd.sense.serve_api import MetricsTarget

    sensor = RayServeSensor({}, Config(), wall_clock=lambda: 100.0)
    head = "http://127.0.0.1:8080/metrics"
    serving = "http://192.0.2.7:8080/metrics"
    drained = "http://192.0.2.9:8080/metrics"
    sensor._targets = [
        MetricsTarget("head", head),
        MetricsTarget("n7", serving),
        MetricsTarget("n9", drained),
    ]
    state = ServeState(
        {
            "llm/LlmReplica": dataclasses.replace(
                STATE.deployments["llm/LlmReplica"], node_ids=frozenset({"n7"})
            )
        }
    )
    text = ray_text(10, 5, 5)
    sensor._ingest(state, {head: (100.0, text), serving: (100.0, text), drained: "HTTP 500"})
    assert sensor._book.coverage_ratio(1.0) == 1.0
    sensor._ingest(state, {head: (101.0, text), serving: "HTTP 500", drained: "HTTP 500"})
    assert sensor._book.coverage_ratio(0.5) == 0.5
