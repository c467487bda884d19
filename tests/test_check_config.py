"""`autoscalerd check-config` as a user runs it (the real console script): each plugin's
settings checked by its own schema, near misses named (did you mean), and a file that is
not an autoscalerd config at all recognised for what it is. One line, exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from autoscalerd.config import ConfigError, plugin_settings
from tests.helpers import REPO, autoscalerd_bin

SERVE_CONFIG = """\
proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: 8000
applications:
  - name: llm
    route_prefix: /
    import_path: app:deployment
"""
RAY_SERVICE = """\
apiVersion: ray.io/v1
kind: RayService
metadata:
  name: llm
spec:
  serveConfigV2: |
    applications: []
"""
TWO_CONFIGS = "tick_s: 1\nactuators:\n  - type: log\n---\ntick_s: 2\n"

# case -> (file content, or the shipped file to check; what the one line says)
CASES: dict[str, tuple[str, list[str]]] = {
    "sensor setting": (
        "sensors:\n  - type: ray_serve\n    metrics_intervl_s: 2\n",
        ["sensors[0].metrics_intervl_s: unknown setting; did you mean 'metrics_interval_s'?"],
    ),
    "second actuator's setting": (
        "actuators:\n  - type: log\n  - type: ray_serve\n    max_atempts: 5\n",
        ["actuators[1].max_atempts: unknown setting; did you mean 'max_attempts'?"],
    ),
    "setting far from any": (
        "actuators:\n  - type: log\n    colour: red\n",
        ["actuators[0].colour: unknown setting; known: level"],
    ),
    "setting's value": (
        "actuators:\n  - type: ray_serve\n    max_attempts: 0\n",
        ["actuators[0].max_attempts: input should be greater than or equal to 1 (got 0)"],
    ),
    "sensor type": (
        "sensors:\n  - type: ray_serv\n",
        ["sensors[0].type: unknown plugin 'ray_serv'; did you mean 'ray_serve'?"],
    ),
    "actuator type": (
        "actuators:\n  - type: ray_autoscalr\n",
        ["actuators[0].type: unknown plugin 'ray_autoscalr'; did you mean 'ray_autoscaler'?"],
    ),
    "type far from any": (
        "sensors:\n  - type: kafka\n",
        ["sensors[0].type: unknown plugin 'kafka'; installed: ", "ray_serve", "replay"],
    ),
    "top-level key": (
        "tick_s: 1\ndeploymnets: []\n",
        ["deploymnets: unknown key; did you mean 'deployments'?"],
    ),
    "deployment key": (
        "deployments:\n  - name: llm/chat\n    autoscalng: {}\n",
        ["deployments[0].autoscalng: unknown key; did you mean 'autoscaling'?"],
    ),
    "ray serve config": (
        SERVE_CONFIG,
        [
            "this looks like a Ray Serve config (serve deploy), not an autoscalerd config",
            "see config/example.yaml",
        ],
    ),
    "kuberay manifest": (
        RAY_SERVICE,
        ["this looks like a Kubernetes manifest (kind: RayService)", "see config/example.yaml"],
    ),
    "kubernetes manifests": (
        "@config/kubernetes/kuberay-sidecar.yaml",
        [
            "this looks like Kubernetes manifests (kinds: ConfigMap, RayCluster)",
            "the config.yaml in a ConfigMap's data",
        ],
    ),
    "ray cluster launcher config": (
        "@config/ray-cluster.yaml",
        ["this looks like a Ray cluster launcher config (ray up)", "see config/example.yaml"],
    ),
    "several documents": (
        TWO_CONFIGS,
        [":4:1: several YAML documents (separated by ---)", "keep one"],
    ),
    "a list of deployments": (
        "- name: llm/chat\n- name: llm/code\n",
        ["top level must be a mapping", "a list of deployments goes under `deployments:`"],
    ),
    "a list of plugins": (
        "- type: ray_serve\n",
        ["top level must be a mapping", "a list of plugins goes under `sensors:` or"],
    ),
    "a value": ("just words\n", ["top level must be a mapping of settings, not a value (got str)"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_config_names_the_path_and_the_fix_in_one_line(
    case: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    content, expected = CASES[case]
    if content.startswith("@"):
        path = REPO / content[1:]
    else:
        path = tmp_path / "config.yaml"
        path.write_text(content)
    result = subprocess.run(
        [autoscalerd_bin(), "check-config", str(path)],
        cwd=REPO,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"autoscalerd: {path}"), line
    for fragment in expected:
        assert fragment in line, (fragment, line)


def test_the_shipped_kubernetes_configmap_holds_a_valid_config(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """What the manifests' line says to do works: the ConfigMap's config.yaml passes."""
    import yaml

    documents = yaml.safe_load_all((REPO / "config/kubernetes/kuberay-sidecar.yaml").read_text())
    [configmap] = [d for d in documents if d["kind"] == "ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    result = subprocess.run(
        [autoscalerd_bin(), "check-config", str(path)],
        cwd=REPO,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- nested plugin settings


class _Retry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_attempts: int = 3


class _Nested(BaseModel):
    model_config = ConfigDict(extra="forbid")
    retry: _Retry = _Retry()
    urls: list[int] = []


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"retry": {"max_atempts": 5}}, "retry.max_atempts: unknown setting; did you mean "),
        ({"urls": [1, "x"]}, "urls[1]: input should be a valid integer"),
        ({"retyr": {}}, "retyr: unknown setting; did you mean 'retry'?"),
    ],
)
def test_a_plugins_nested_setting_is_named_by_its_path(settings: dict, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plugin_settings(_Nested, settings)
    [problem] = caught.value.problems
    assert problem.startswith(line), problem
