"""The Kubernetes manifests (config/kubernetes/), validated offline as an API server with
strict field validation would take them.

Core kinds (ConfigMap, Service, ...) against Kubernetes' own schemas (the
kubernetes-validate package, strict: an unknown field is an error). Custom resources
(KubeRay's RayCluster, the Prometheus operator's ServiceMonitor and PodMonitor, KEDA's
ScaledObject) against the OpenAPI schema of their published CRDs, vendored under
tests/data/crds/ (README.md there: source, version, licence), with unknown fields
rejected wherever the CRD does not keep them (x-kubernetes-preserve-unknown-fields): the
API server prunes those, and `kubectl apply` (strict field validation) refuses them, so
a typo in a field name is an error here too. CEL rules (x-kubernetes-validations) are not
evaluated. Then what ties the files together: the config in the ConfigMap is one that
`autoscalerd check-config` accepts, the worker groups it lists are the RayCluster's, and
the names the Service, the monitors and the ScaledObject refer to exist.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from autoscalerd import server
from autoscalerd.config import Config, parse_config
from tests.helpers import REPO, autoscalerd_bin

MANIFESTS = REPO / "config" / "kubernetes"
CRDS = REPO / "tests" / "data" / "crds"
# The oldest Kubernetes release KubeRay v1.7.0 supports here, and the newest the
# kubernetes-validate package knows.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
# Which vendored CRD defines each custom resource's group.
CRD_FILES = {
    "ray.io": "ray.io_rayclusters.yaml",
    "keda.sh": "keda.sh_scaledobjects.yaml",
}
CRD_FILES_BY_KIND = {
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
}
# KEDA's prometheus trigger metadata is a map of strings in the CRD; these are the keys
# its scaler reads (pkg/scalers/prometheus_scaler.go and authentication_types.go, v2.20.2).
KEDA_PROMETHEUS_METADATA = frozenset(
    {
        "serverAddress",
        "query",
        "queryParameters",
        "threshold",
        "activationThreshold",
        "namespace",
        "customHeaders",
        "ignoreNullValues",
        "unsafeSsl",
        "awsRegion",
        "timeout",
        "identityOwner",
        "authModes",
    }
)
GIB = 2**30


# ---------------------------------------------------------------- loading


def manifest_files() -> list[Path]:
    return sorted(MANIFESTS.glob("**/*.yaml"))


@functools.cache
def documents(path: Path) -> tuple[dict[str, Any], ...]:
    loaded = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert all(isinstance(doc, dict) for doc in loaded), path
    return tuple(loaded)


def all_documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in manifest_files() for doc in documents(path)]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for _, doc in all_documents()
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {MANIFESTS}"
    return found[0]


def is_core(doc: Mapping[str, Any]) -> bool:
    """Kubernetes' own API groups (core v1, apps, batch, rbac.authorization.k8s.io, ...)."""
    group = str(doc["apiVersion"]).rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def label(doc: Mapping[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


# ---------------------------------------------------------------- CRD schemas


@functools.cache
def crd(file_name: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loaded: dict[str, Any] = yaml.load((CRDS / file_name).read_text(), Loader=loader)
    assert loaded["kind"] == "CustomResourceDefinition", file_name
    return loaded


def crd_for(doc: Mapping[str, Any]) -> dict[str, Any]:
    group = str(doc["apiVersion"]).rpartition("/")[0]
    file_name = CRD_FILES_BY_KIND.get(doc["kind"]) or CRD_FILES.get(group)
    assert file_name, f"{label(doc)} ({doc['apiVersion']}): no vendored CRD for this kind"
    definition = crd(file_name)
    assert definition["spec"]["group"] == group, file_name
    assert definition["spec"]["names"]["kind"] == doc["kind"], file_name
    return definition


@functools.cache
def strict_schema(file_name: str, version: str) -> dict[str, Any]:
    definition = crd(file_name)
    [entry] = [v for v in definition["spec"]["versions"] if v["name"] == version]
    assert entry["served"], f"{file_name}: {version} is not served"
    schema = strict(entry["schema"]["openAPIV3Schema"])
    # The API server validates metadata as ObjectMeta, whatever the CRD says of it:
    # checked with Kubernetes' schema (check_metadata), left open here.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 schema of a CRD as a JSON Schema that refuses what the API server
    would prune: an object's fields the schema does not declare, unless the schema keeps
    them (x-kubernetes-preserve-unknown-fields) or allows any (additionalProperties)."""
    out: dict[str, Any] = {
        k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"
    }
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
    if isinstance(schema.get("additionalProperties"), Mapping):
        out["additionalProperties"] = strict(schema["additionalProperties"])
    if isinstance(schema.get("items"), Mapping):
        out["items"] = strict(schema["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [strict(s) for s in schema[key]]
    if isinstance(schema.get("not"), Mapping):
        out["not"] = strict(schema["not"])
    if schema.get("x-kubernetes-embedded-resource"):
        # An embedded object always has these, declared or not.
        out.setdefault("properties", {})
        for key in ("apiVersion", "kind"):
            out["properties"].setdefault(key, {"type": "string"})
        out["properties"].setdefault("metadata", {"type": "object"})
    is_object = schema.get("type") == "object" or "properties" in schema
    if (
        is_object
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if schema.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def crd_problems(doc: Mapping[str, Any]) -> list[str]:
    """Every way `doc` breaks its CRD's schema: `path: message`, one a line."""
    definition = crd_for(doc)
    version = str(doc["apiVersion"]).rpartition("/")[2]
    file_name = next(
        name
        for name in (*CRD_FILES.values(), *CRD_FILES_BY_KIND.values())
        if crd(name) is definition
    )
    validator = jsonschema.Draft4Validator(strict_schema(file_name, version))
    problems = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(doc)
    ]
    return problems + metadata_problems(doc.get("metadata", {}))


def metadata_problems(metadata: Mapping[str, Any]) -> list[str]:
    """`metadata` against Kubernetes' ObjectMeta, strict (through a ConfigMap around it)."""
    wrapper = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": dict(metadata)}
    return core_problems(wrapper, KUBERNETES_VERSIONS[-1])


def core_problems(doc: Mapping[str, Any], version: str) -> list[str]:
    try:
        kubernetes_validate.validate(dict(doc), version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(str(p) for p in error.path) or '(root)'}: {error.message}"]
    return []


def pod_templates(doc: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A RayCluster's pod templates, each as the Pod the operator makes of it."""
    spec = doc["spec"]
    groups = [("headGroupSpec", spec["headGroupSpec"])] + [
        (f"workerGroupSpecs[{g['groupName']}]", g) for g in spec.get("workerGroupSpecs", [])
    ]
    for where, group in groups:
        template = group["template"]
        metadata = {"name": "pod", **template.get("metadata", {})}
        yield where, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, **template}


# ---------------------------------------------------------------- every manifest validates


def test_every_manifest_is_a_known_kind() -> None:
    found = all_documents()
    assert {path.name for path, _ in found} >= {
        "kuberay-sidecar.yaml",
        "metrics.yaml",
        "podmonitor.yaml",
        "keda-scaledobject.yaml",
    }
    for path, doc in found:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), path
        if not is_core(doc):
            crd_for(doc)  # a custom resource with no vendored CRD fails here, by name


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_kinds_validate_strictly_against_kubernetes(version: str) -> None:
    core = [(path, doc) for path, doc in all_documents() if is_core(doc)]
    assert {doc["kind"] for _, doc in core} >= {"ConfigMap", "Service"}
    for path, doc in core:
        assert core_problems(doc, version) == [], f"{path.name}: {label(doc)}"


def test_custom_resources_validate_against_their_crds() -> None:
    custom = [(path, doc) for path, doc in all_documents() if not is_core(doc)]
    kinds = {doc["kind"] for _, doc in custom}
    assert kinds == {"RayCluster", "ServiceMonitor", "PodMonitor", "ScaledObject"}
    for path, doc in custom:
        assert crd_problems(doc) == [], f"{path.name}: {label(doc)}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_rayclusters_pod_templates_are_valid_pods(version: str) -> None:
    for where, pod in pod_templates(one("RayCluster")):
        assert core_problems(pod, version) == [], where


# ---------------------------------------------------------------- typos fail


def with_change(doc: Mapping[str, Any], path: str, key: str, value: Any) -> dict[str, Any]:
    """A copy of `doc` with `key: value` set in the mapping at the dotted `path` (list
    items by index)."""
    out = copy.deepcopy(dict(doc))
    node: Any = out
    for part in path.split(".") if path else []:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[key] = value
    return out


def without(doc: Mapping[str, Any], path: str, key: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(doc))
    node: Any = out
    for part in path.split(".") if path else []:
        node = node[int(part)] if isinstance(node, list) else node[part]
    del node[key]
    return out


@pytest.mark.parametrize(
    ("kind", "path", "typo"),
    [
        ("RayCluster", "spec", "enableInTreeAutoscalling"),
        ("RayCluster", "spec.headGroupSpec", "rayStartParam"),
        ("RayCluster", "spec.headGroupSpec.template.spec.containers.1", "readinesProbe"),
        (
            "RayCluster",
            "spec.headGroupSpec.template.spec.containers.1.securityContext",
            "runAsNonroot",
        ),
        ("RayCluster", "spec.workerGroupSpecs.0", "maxReplica"),
        ("ServiceMonitor", "spec.endpoints.0", "intervall"),
        ("ServiceMonitor", "spec.endpoints.0.authorization", "credential"),
        ("PodMonitor", "spec.podMetricsEndpoints.0", "prot"),
        ("ScaledObject", "spec", "scaleTargetRefs"),
        ("ScaledObject", "spec.triggers.0", "metricTyp"),
    ],
)
def test_a_misspelt_field_of_a_custom_resource_fails(kind: str, path: str, typo: str) -> None:
    doc = with_change(one(kind), path, typo, "x")
    problems = crd_problems(doc)
    assert any(f"'{typo}' was unexpected" in p for p in problems), problems


def test_a_wrong_type_or_a_missing_required_field_fails() -> None:
    cluster = one("RayCluster")
    typed = with_change(cluster, "spec.workerGroupSpecs.0", "maxReplicas", "eight")
    assert any("'eight' is not of type 'integer'" in p for p in crd_problems(typed))
    unnamed = without(cluster, "spec.workerGroupSpecs.0", "groupName")
    assert any("'groupName' is a required property" in p for p in crd_problems(unnamed))
    misnamed = with_change(cluster, "metadata", "labls", {})
    assert any("'labls' was unexpected" in p for p in crd_problems(misnamed))


@pytest.mark.parametrize(
    ("kind", "path", "typo"),
    [
        ("Service", "spec", "prots"),
        ("Service", "spec.ports.0", "targetport"),
        ("ConfigMap", "", "date"),
        ("ConfigMap", "metadata", "label"),
    ],
)
def test_a_misspelt_field_of_a_core_kind_fails(kind: str, path: str, typo: str) -> None:
    doc = with_change(one(kind), path, typo, "x")
    problems = core_problems(doc, KUBERNETES_VERSIONS[-1])
    assert any(f"'{typo}' was unexpected" in p for p in problems), problems


def test_a_misspelt_field_of_a_pod_template_fails() -> None:
    path = "spec.headGroupSpec.template.spec.containers.1.livenessProbe.httpGet"
    cluster = with_change(one("RayCluster"), path, "paht", "/healthz")
    [(_, head), *_] = pod_templates(cluster)
    problems = core_problems(head, KUBERNETES_VERSIONS[-1])
    assert any("'paht' was unexpected" in p for p in problems), problems


def test_the_conversion_keeps_what_the_crd_keeps_and_allows_null_where_nullable() -> None:
    schema = {
        "type": "object",
        "properties": {
            "kept": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "nullable": {"type": "string", "nullable": True},
            "closed": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
    validator = jsonschema.Draft4Validator(strict(schema))
    assert validator.is_valid({"kept": {"anything": [1]}, "map": {"k": "v"}, "nullable": None})
    assert not validator.is_valid({"closed": {"a": 1, "b": 2}})
    assert not validator.is_valid({"map": {"k": 1}})
    assert not validator.is_valid({"other": 1})


def test_a_misspelt_keda_prometheus_setting_fails() -> None:
    def unknown(doc: Mapping[str, Any]) -> set[str]:
        return {
            key
            for trigger in doc["spec"]["triggers"]
            if trigger["type"] == "prometheus"
            for key in trigger["metadata"]
            if key not in KEDA_PROMETHEUS_METADATA
        }

    scaled = one("ScaledObject")
    assert unknown(scaled) == set()
    assert unknown(with_change(scaled, "spec.triggers.0.metadata", "treshold", "1")) == {"treshold"}


# ---------------------------------------------------------------- the vendored CRDs


def test_the_vendored_crds_are_the_published_files() -> None:
    """Each file's SHA-256 is the one its README row gives (the upstream file's)."""
    readme = (CRDS / "README.md").read_text()
    rows = re.findall(r"^\| `([^`]+\.yaml)` \|.*\| `([0-9a-f]{64})` \|$", readme, re.MULTILINE)
    assert {name for name, _ in rows} == {p.name for p in CRDS.glob("*.yaml")}
    for name, sha256 in rows:
        assert hashlib.sha256((CRDS / name).read_bytes()).hexdigest() == sha256, name
    assert "Apache License" in (CRDS / "LICENSE").read_text()


def test_raycluster_has_no_scale_subresource_as_the_keda_manifest_says() -> None:
    """KEDA needs /scale. If a vendored KubeRay gains one, keda-scaledobject.yaml and the
    README must say which group it scales: this fails until they are updated."""
    subresources = [v.get("subresources", {}) for v in crd(CRD_FILES["ray.io"])["spec"]["versions"]]
    assert subresources and all("scale" not in s for s in subresources), subresources
    text = (MANIFESTS / "keda-scaledobject.yaml").read_text()
    assert "RayCluster has none" in text and "subresources: {status: {}}" in text


# ---------------------------------------------------------------- how the files fit


def sidecar_config() -> Config:
    configmap = one("ConfigMap", "autoscalerd-config")
    return parse_config(configmap["data"]["config.yaml"], source="autoscalerd-config")


def head_pod() -> dict[str, Any]:
    spec: dict[str, Any] = one("RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]
    return spec


def sidecar() -> dict[str, Any]:
    [container] = [c for c in head_pod()["containers"] if c["name"] == "autoscalerd"]
    return container


def test_check_config_accepts_the_configmaps_config(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    configmap = one("ConfigMap", "autoscalerd-config")
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    result = subprocess.run(
        [autoscalerd_bin(), "check-config", str(path)],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ": ok" in result.stdout


def test_the_sidecar_reaches_ray_on_the_pods_own_ports() -> None:
    config = sidecar_config()
    ray_head = head_pod()["containers"][0]  # KubeRay's Ray container is the first
    ports = {p["name"]: p["containerPort"] for p in ray_head["ports"]}
    assert config.cluster.dashboard_url == f"http://127.0.0.1:{ports['dashboard']}"
    assert config.cluster.address == f"127.0.0.1:{ports['gcs-server']}"
    assert {a.type for a in config.actuators} == {"ray_serve", "ray_autoscaler"}
    # Ray's sockets: the same /tmp/ray volume in both containers, the same user as Ray's.
    mounts = {m["mountPath"]: m["name"] for m in sidecar()["volumeMounts"]}
    assert {m["mountPath"]: m["name"] for m in ray_head["volumeMounts"]}["/tmp/ray"] == (
        mounts["/tmp/ray"]
    )
    assert sidecar()["securityContext"]["runAsUser"] == 1000


def test_the_tokens_come_from_the_secrets() -> None:
    cluster = one("RayCluster")
    env = {e["name"]: e for e in sidecar()["env"]}
    # KubeRay names the Secret it creates for authOptions.mode: token after the cluster.
    assert cluster["spec"]["authOptions"]["mode"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": cluster["metadata"]["name"],
        "key": "auth_token",
    }
    config = sidecar_config()
    assert config.http.require_token_for_reads is True and config.http.token is None
    api_token = env[config.http.token_env]["valueFrom"]["secretKeyRef"]
    assert api_token.get("optional") is not True  # no token: reads refused, so no start
    for monitor, endpoints in (
        ("ServiceMonitor", "endpoints"),
        ("PodMonitor", "podMetricsEndpoints"),
    ):
        [endpoint] = one(monitor)["spec"][endpoints]
        assert endpoint["authorization"]["credentials"] == {
            "name": api_token["name"],
            "key": api_token["key"],
        }
    assert "value" not in env[config.http.token_env] and "value" not in env["RAY_AUTH_TOKEN"]


def test_the_sidecar_is_probed_limited_and_locked_down() -> None:
    container = sidecar()
    config = sidecar_config()
    port = int(config.http.addr.rpartition(":")[2])
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["autoscalerd"] == port
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        path = container[probe]["httpGet"]["path"]
        # Probes cannot send the token: only the open paths will answer them.
        assert path in server.OPEN_PATHS and path == "/healthz", probe
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/autoscalerd"]["readOnly"] is True
    assert config.state.path is not None and config.state.path.startswith("/var/lib/autoscalerd/")
    assert "/var/lib/autoscalerd" in mounts and "/tmp" in mounts


def test_the_worker_groups_are_the_rayclusters() -> None:
    """cluster.worker_groups describes each worker group as KubeRay makes a Ray node of
    it: CPU, GPU and memory from the Ray container's limits."""
    specs = {g["groupName"]: g for g in one("RayCluster")["spec"]["workerGroupSpecs"]}
    groups = sidecar_config().cluster.worker_groups
    assert {g.name for g in groups} == set(specs)
    for group in groups:
        spec = specs[group.name]
        limits = spec["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert group.resources_per_worker == {
            "CPU": float(limits["cpu"]),
            "GPU": float(limits["nvidia.com/gpu"]),
            "memory": float(limits["memory"].removesuffix("Gi")) * GIB,
        }
        assert (group.min_workers, group.max_workers) == (spec["minReplicas"], spec["maxReplicas"])
    # No replica on the head: every one is on a listed group.
    assert one("RayCluster")["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


def test_the_service_and_monitors_find_the_sidecar() -> None:
    service = one("Service", "autoscalerd")
    cluster = one("RayCluster")
    # The labels KubeRay puts on the head pod.
    assert service["spec"]["selector"] == {
        "ray.io/cluster": cluster["metadata"]["name"],
        "ray.io/node-type": "head",
    }
    [port] = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in sidecar()["ports"]}
    monitor = one("ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    pod_monitor = one("PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    [pod_endpoint] = pod_monitor["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["port"] in {p["name"] for p in sidecar()["ports"]}
    # The alerting rules select job="autoscalerd": the Service's name, or relabelled.
    assert service["metadata"]["name"] == "autoscalerd"
    assert {"targetLabel": "job", "replacement": "autoscalerd"} in pod_endpoint["relabelings"]


def test_the_scaledobject_queries_a_configured_group_of_its_target() -> None:
    scaled = one("ScaledObject")
    cluster = one("RayCluster")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        cluster["apiVersion"],
        "RayCluster",
        cluster["metadata"]["name"],
    )
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"
    assert trigger["metadata"]["ignoreNullValues"] == "false"  # absent is not zero
    [group] = re.findall(
        r'autoscalerd_desired_workers\{[^}]*group="([^"]+)"', trigger["metadata"]["query"]
    )
    [spec] = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == group]
    assert scaled["spec"]["maxReplicaCount"] == spec["maxReplicas"]
    assert scaled["spec"]["minReplicaCount"] == spec["minReplicas"]
    assert group in {g.name for g in sidecar_config().cluster.worker_groups}
