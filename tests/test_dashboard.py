"""The Grafana dashboard: provisionable JSON whose every query is PromQL promtool parses,
over series the daemon really exports, selected by the dashboard's variables."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import REPO
from tests.test_alerts import exported_series, metric_names, readme_section, run_promtool

DASHBOARD = REPO / "config" / "grafana" / "autoscalerd.json"
PROVIDER = REPO / "config" / "grafana" / "dashboards.yaml"
# What Grafana puts in place of its variables: "All" of a multi-value variable is the
# allValue, `.*`; the built-in intervals are a duration.
SUBSTITUTIONS = {
    "$application": ".*",
    "$deployment": ".*",
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
}
FILTERS = ('application=~"$application"', 'deployment=~"$deployment"')


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL) of every panel target: all the dashboard's queries."""
    return [
        (panel["title"], target["refId"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def substituted(expr: str) -> str:
    # Longest first: $__rate_interval before $__range.
    for name in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(name, SUBSTITUTIONS[name])
    return expr


def test_panels_have_ids_datasources_and_targets() -> None:
    dashboard = load()
    assert dashboard["uid"] == "autoscalerd"
    assert dashboard.get("id") is None  # provisioning assigns it
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for panel in panels:
        assert panel["type"] != "row", "rows would hide panels' queries from `queries()`"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == panel["datasource"], panel["title"]
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]


def test_template_variables_exist_and_are_used() -> None:
    dashboard = load()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "application", "deployment"}
    assert variables["datasource"]["query"] == "prometheus"
    assert "$application" in variables["deployment"]["definition"]
    exprs = [expr for _, _, expr in queries(dashboard)]
    for name in ("application", "deployment"):
        assert any(f"${name}" in expr for expr in exprs), f"${name} is used by no panel"


def test_per_deployment_series_are_filtered_by_both_variables() -> None:
    series = exported_series()
    for title, ref_id, expr in queries(load()):
        used = metric_names(expr)
        assert used, f"{title} {ref_id}: no autoscalerd series"
        for name in used:
            assert name in series, f"{title} {ref_id}: {name} is not exported by autoscalerd"
            if "application" not in series[name]:
                continue
            for selector in re.findall(rf"\b{name}\{{([^}}]*)\}}", expr) or [""]:
                for wanted in FILTERS:
                    assert wanted in selector, f"{title} {ref_id}: {name} without {wanted}"


def test_every_query_parses(tmp_path: Path) -> None:
    # promtool parses PromQL without a server when it checks recording rules.
    rules = []
    for number, (title, ref_id, expr) in enumerate(queries(load())):
        promql = substituted(expr)
        assert "$" not in promql, f"{title} {ref_id}: a variable the test does not know"
        rules.append({"record": f"autoscalerd_dashboard:query_{number}", "expr": promql})
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_provider_points_at_a_folder_of_dashboards() -> None:
    provider = yaml.safe_load(PROVIDER.read_text())
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"]


def test_readme_lists_every_panel() -> None:
    section = readme_section("Dashboard")
    for panel in load()["panels"]:
        assert f"**{panel['title']}**" in section, f"README: panel {panel['title']} not listed"
