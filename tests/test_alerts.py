"""The Prometheus alerting rules: valid for promtool, unit-tested firing and quiet, over
series the daemon really exports, each with a runbook the README has."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from autoscalerd.metrics import Metrics
from tests.helpers import REPO

PROMETHEUS = REPO / "config" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yaml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yaml"
README = REPO / "README.md"
RUNBOOK_BASE = "https://github.com/autoscalerd/autoscalerd#"
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    """promtool's path; CI installs it with `make tools` (Debian package prometheus)."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool not found on PATH: run `make tools` (installs Debian's prometheus "
            "package) or put promtool from a Prometheus release on PATH"
        )
    return found


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def exported_series() -> dict[str, tuple[str, ...]]:
    """Every series name autoscalerd's registry can export, with its label names."""
    series: dict[str, tuple[str, ...]] = {}
    for value in vars(Metrics()).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        name, labels, kind = value._name, tuple(value._labelnames), value._type
        if kind == "counter":
            series[f"{name}_total"] = labels
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                series[name + suffix] = labels
        else:
            series[name] = labels
    return series


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bautoscalerd_[a-z0-9_]+", expr))


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n### {title}\n")
    end = re.search(r"\n#{2,3} ", text[start + 1 :])
    return text[start : start + 1 + end.start()] if end else text[start:]


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", ALERTS_TEST)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    # promtool passes a test of an alert name that no rule has; this catches a rename.
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert firing == names, f"untested firing: {names - firing}, unknown: {firing - names}"
    assert quiet == names, f"untested quiet: {names - quiet}, unknown: {quiet - names}"


def test_alerts_use_exported_series_and_their_labels() -> None:
    series = exported_series()
    for rule in alert_rules():
        used = metric_names(rule["expr"])
        assert used or "up{" in rule["expr"], rule["alert"]
        for name in used:
            assert name in series, f"{rule['alert']}: {name} is not exported by autoscalerd"
        text = " ".join(rule["annotations"].values())
        for label in re.findall(r"\$labels\.(\w+)", text):
            exported = {label for name in used for label in series[name]}
            assert label in exported | {"instance", "job"}, f"{rule['alert']}: no label {label}"


def test_alerts_have_severity_summary_description_and_runbook() -> None:
    series = exported_series()
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, name
        assert annotations["runbook"] == RUNBOOK_BASE + github_anchor(f"Runbook: {name}")
        per_deployment = any(
            "application" in series[metric] for metric in metric_names(rule["expr"])
        )
        if per_deployment:
            for field in ("summary", "description"):
                text = annotations[field]
                assert "$labels.application" in text and "$labels.deployment" in text, (
                    f"{name}: its {field} should name the application and deployment"
                )


def test_readme_lists_every_alert_with_its_runbook() -> None:
    section = readme_section("Alerts")
    headings = re.findall(r"^#### (.+)$", section, flags=re.MULTILINE)
    runbooks = [h.removeprefix("Runbook: ") for h in headings if h.startswith("Runbook: ")]
    names = [rule["alert"] for rule in alert_rules()]
    assert runbooks == names, "README: one '#### Runbook: <alert>' per alert, in file order"
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in section.split("#### ")[0], f"{rule['alert']} not listed"


def test_example_prometheus_config_loads_the_alerts() -> None:
    result = run_promtool("check", "config", PROMETHEUS / "prometheus.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "alerts.yaml" in result.stdout
