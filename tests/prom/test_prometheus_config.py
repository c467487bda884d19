"""The `prometheus` sensor's settings and the shipped example config (no server needed),
and its answers' rules on given query results: what is unknown stays unknown."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import yaml

from autoscalerd.config import ConfigError, parse_config
from autoscalerd.sense import prometheus_queries as pq
from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.prometheus_api import PrometheusSensor
from autoscalerd.sense.prometheus_http import PrometheusError, Sample
from tests.helpers import REPO, autoscalerd_bin

EXAMPLE = REPO / "config" / "prometheus-source.yaml"
CONFIG = parse_config("cluster: {dashboard_url: 'http://127.0.0.1:8265'}\n")


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"urll": "http://x:9090"}, "urll: unknown setting"),
        ({"url": "ftp://x"}, "url: must be http(s)://host:port"),
        ({"url": "http://x:9090", "window_s": 5}, "at least two scrape intervals (30 s)"),
        (
            {"url": "http://x:9090", "bearer_token_env": "T", "bearer_token_file": "/t"},
            "set one, not both",
        ),
        (
            {"url": "http://x:9090", "matchers": {"bad-label": "x"}},
            "'bad-label' is not a label name",
        ),
        (
            {"url": "https://x:9090", "ca_file": "/nonexistent/ca.pem"},
            "ca_file: no such file",
        ),
        (
            {"url": "http://x:9090", "basic_auth": {"username": "u"}},
            "password_file or password_env: set exactly one",
        ),
    ],
)
def test_bad_settings_are_one_line_errors(settings: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PrometheusSensor(settings, CONFIG)
    problems = caught.value.problems
    assert any(expected in line for line in problems), problems
    assert all("\n" not in line for line in problems)


def test_credentials_in_the_url_are_refused_and_not_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        PrometheusSensor({"url": "http://admin:hunter2-secret@x:9090"}, CONFIG)
    assert "hunter2-secret" not in str(caught.value)
    assert "credentials in the url are not used; set basic_auth" in str(caught.value)


def test_check_config_names_the_sensor_setting(tmp_path: Path, cli_env: dict[str, str]) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["sensors"][0]["window_s"] = "soon"
    config["sensors"][0]["url"] = "http://ops:s3cret-pass@prometheus:9090"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [autoscalerd_bin(), "check-config", str(path)],
        capture_output=True, text=True, env=cli_env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert any("sensors[0].window_s" in line for line in lines), lines
    assert any("sensors[0].url" in line and "basic_auth" in line for line in lines), lines
    assert "s3cret-pass" not in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_shipped_example_config_is_valid(cli_env: dict[str, str]) -> None:
    done = subprocess.run(
        [autoscalerd_bin(), "check-config", str(EXAMPLE)],
        capture_output=True, text=True, env=cli_env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert [s.type for s in parse_config(EXAMPLE.read_text()).sensors] == ["prometheus"]


# ------------------------------------------------------------------ the answers' rules


class ByLabels:
    def deployment_of(self, labels: dict[str, str]) -> str | None:
        app, dep = labels.get("application"), labels.get("deployment")
        return f"{app}/{dep}" if app and dep else None


LABELS = {"application": "llm", "deployment": "LlmReplica"}
NAME = "llm/LlmReplica"


def round_of(answers: dict[str, list[Sample] | PrometheusError]) -> pq.Answers:
    """A round over the real plan, each query answered by signal (unlisted: no series)."""
    plan = pq.plan({"job": "ray"}, [10.0], 2.0, 10.0)
    results: list[list[Sample] | PrometheusError] = []
    for query in plan:
        key = query.kind if query.kind in (pq.FRESHNESS, pq.TARGETS) else query.signal
        results.append(answers.get(key, []))
    return pq.answers(plan, results, ByLabels(), evaluated_at_s=1000.0)


def healthy() -> dict[str, list[Sample] | PrometheusError]:
    return {
        sm.ROUTER_REQUESTS: [Sample(LABELS, 3.0)],
        sm.REPLICA_PROCESSING: [Sample(LABELS, 2.0)],
        pq.FRESHNESS: [Sample(LABELS, 998.5)],
        pq.TARGETS: [Sample({}, 1.0)],
    }


def test_every_query_carries_the_matchers_and_aggregates() -> None:
    for query in pq.plan({"job": "ray", "cluster": 'a"b'}, [30.0], 30.0, 30.0):
        assert 'job="ray"' in query.promql and 'cluster="a\\"b"' in query.promql, query.promql
        assert query.promql.split("(")[0].strip() in ("sum by", "count by", "min by", "avg")


def test_a_healthy_round_reads_zero_only_where_nothing_was_counted() -> None:
    answers = round_of(healthy())
    assert answers.rate_per_s(NAME, sm.ROUTER_REQUESTS, 10.0) == 3.0
    # Answered, with no series for it: nothing counted.
    assert answers.rate_per_s(NAME, sm.REPLICA_COMPLETIONS, 10.0) == 0.0
    # A window the round did not ask for is no answer.
    assert answers.rate_per_s(NAME, sm.ROUTER_REQUESTS, 60.0) is None
    assert answers.as_of(NAME) == 998.5
    # Two of three running replicas export their series: a third of the load is unseen.
    assert answers.coverage(NAME, running_replicas=3) == pytest.approx(2 / 3)
    assert answers.coverage(NAME, running_replicas=0) == 1.0


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_garbage_is_unknown_and_partial(value: float) -> None:
    answers = round_of({**healthy(), sm.ROUTER_REQUESTS: [Sample(LABELS, value)]})
    assert answers.rate_per_s(NAME, sm.ROUTER_REQUESTS, 10.0) is None
    assert answers.coverage(NAME, running_replicas=0) == pytest.approx(0.8)
    fields = {"arrival_rate_per_s": 0.0, "running_replicas": 1.0}
    assert answers.known_fields(NAME, fields) == {"running_replicas": 1.0}  # type: ignore[arg-type]


def test_a_failed_query_is_unknown_for_every_deployment() -> None:
    failed = PrometheusError("error", "prometheus query ...: execution: boom")
    answers = round_of({**healthy(), sm.HANDLE_QUEUED: failed})
    assert answers.gauge(NAME, sm.HANDLE_QUEUED) is None
    assert answers.coverage(NAME, running_replicas=0) == pytest.approx(0.8)
    assert answers.failures == [str(failed)] and not answers.dead


def test_targets_that_missed_scrapes_make_the_round_partial() -> None:
    answers = round_of({**healthy(), pq.TARGETS: [Sample({}, 0.75)]})
    assert answers.coverage(NAME, running_replicas=0) == 0.75
    nothing = round_of({**healthy(), pq.TARGETS: []})
    assert nothing.coverage(NAME, running_replicas=0) == 0.0


def test_all_queries_failing_is_prometheus_down() -> None:
    failed = PrometheusError("unavailable", "prometheus http://x:9090 unreachable")
    plan = pq.plan({}, [10.0], 2.0, 10.0)
    answers = pq.answers(plan, [failed] * len(plan), ByLabels(), 1000.0)
    assert answers.dead and answers.as_of(NAME) is None


# ------------------------------------------------------------------ Prometheus' answers


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"status": "success"}, "answer has no 'data'"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "'matrix'"),
        ({"status": "success", "data": {"resultType": "vector", "result": [1]}}, "labels"),
        (
            {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
            "not [time",
        ),
        (
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "x"]}]},
            },
            "no number",
        ),
    ],
)
def test_answers_out_of_shape_are_one_line_errors(body: dict[str, object], expected: str) -> None:
    from autoscalerd.sense.prometheus_http import _vector

    with pytest.raises(PrometheusError) as caught:
        _vector(body, "sum(up)")
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("prometheus query sum(up): ")


def test_values_keep_nan_and_infinity_for_the_rules_to_judge() -> None:
    from autoscalerd.sense.prometheus_http import _vector

    result = [{"metric": {"a": "b"}, "value": [1.0, v]} for v in ("NaN", "+Inf", "-1", "2.5")]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    values = [sample.value for sample in _vector(body, "x")]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -1.0, 2.5]
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}}
    assert [s.value for s in _vector(scalar, "x")] == [3.0]
