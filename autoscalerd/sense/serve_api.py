"""What Ray's dashboard says about Serve and the nodes, as plain values (no I/O here).

Shapes as of Ray 2.60:
- `GET /api/serve/applications/`: `applications.<app>` has `external_scaler_enabled`,
  `deployment_topology.ingress_deployment` and `deployments.<dep>` with
  `target_num_replicas`, `required_resources` (per replica, e.g. {"CPU": 0, "GPU": 1.0}),
  `deployment_config.max_ongoing_requests` and `.ray_actor_options`, and `replicas[]` with
  `state` (STARTING, RUNNING, ...), `replica_id`, `worker_id`, `node_id`.
  `controller_info.actor_id` names the Serve controller (a new one after a restart).
- `GET /nodes?view=summary`: `data.summary[].raylet` has `state`, `nodeId`,
  `nodeManagerAddress` and `metricsExportPort` (each node's Prometheus endpoint).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Replica states: serving traffic, or on the way to it. STOPPING counts as neither.
SERVING_STATES = frozenset({"RUNNING", "PENDING_MIGRATION"})
STARTING_STATES = frozenset({"STARTING", "UPDATING", "RECOVERING"})


@dataclass(frozen=True, slots=True)
class ServeDeployment:
    app: str
    deployment: str
    external_scaler_enabled: bool
    ingress: bool
    target_replicas: int | None
    running_replicas: int
    starting_replicas: int
    max_ongoing_requests: int | None
    resources_per_replica: Mapping[str, float]
    replica_ids: frozenset[str] = frozenset()
    worker_ids: frozenset[str] = frozenset()
    node_ids: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return f"{self.app}/{self.deployment}"


@dataclass(frozen=True, slots=True)
class MetricsTarget:
    node_id: str
    url: str


@dataclass(frozen=True, slots=True)
class ServeState:
    deployments: Mapping[str, ServeDeployment] = field(default_factory=dict)
    # Entries left out because they were not in Serve's shape: one line each.
    skipped: tuple[str, ...] = ()
    # The Serve controller's actor id: a new one after a head or controller restart, when
    # every target the daemon set is gone.
    controller_id: str | None = None

    def ingress_of(self, app: str) -> str | None:
        for dep in self.deployments.values():
            if dep.app == app and dep.ingress:
                return dep.name
        return None


class ShapeError(ValueError):
    """The dashboard answered, but not in the shape this Ray version should have."""


def parse_applications(body: Any) -> ServeState:
    if not isinstance(body, Mapping):
        raise ShapeError("applications answer is not a JSON object")
    apps = body.get("applications")
    if apps is None:
        apps = {}
    if not isinstance(apps, Mapping):
        raise ShapeError("'applications' is not an object")
    out: dict[str, ServeDeployment] = {}
    skipped: list[str] = []
    # One application or deployment out of shape affects that entry only.
    for app_name, app in apps.items():
        if not isinstance(app, Mapping):
            skipped.append(f"application {app_name!r} is not an object")
            continue
        topology = app.get("deployment_topology") or {}
        ingress = topology.get("ingress_deployment") if isinstance(topology, Mapping) else None
        deployments = app.get("deployments") or {}
        if not isinstance(deployments, Mapping):
            skipped.append(f"application {app_name!r}: 'deployments' is not an object")
            continue
        external = app.get("external_scaler_enabled", False) is True
        for dep_name, dep in deployments.items():
            try:
                parsed = _deployment(str(app_name), str(dep_name), dep, external, ingress)
            except ShapeError as exc:
                skipped.append(str(exc))
                continue
            out[parsed.name] = parsed
    controller = body.get("controller_info")
    actor = controller.get("actor_id") if isinstance(controller, Mapping) else None
    return ServeState(out, tuple(skipped), str(actor) if actor else None)


def _count(value: Any) -> int | None:
    """A replica or request count: a finite number >= 0, else unknown (never 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0 or value > 1e9:
        return None
    return int(value)


def _deployment(app: str, name: str, dep: Any, external: bool, ingress: Any) -> ServeDeployment:
    if not isinstance(dep, Mapping):
        raise ShapeError(f"deployment {app}/{name} is not an object")
    replicas = dep.get("replicas") or []
    if not isinstance(replicas, list):
        raise ShapeError(f"deployment {app}/{name}: 'replicas' is not a list")
    states = [str(r.get("state", "")) for r in replicas if isinstance(r, Mapping)]
    config = dep.get("deployment_config") or {}
    target = _count(dep.get("target_num_replicas"))
    max_ongoing = _count(
        config.get("max_ongoing_requests") if isinstance(config, Mapping) else None
    )
    return ServeDeployment(
        app=app,
        deployment=name,
        external_scaler_enabled=external,
        # A single-deployment app built without topology still has its one ingress.
        ingress=(ingress == name) if ingress else True,
        target_replicas=target,
        running_replicas=sum(1 for s in states if s in SERVING_STATES),
        starting_replicas=sum(1 for s in states if s in STARTING_STATES),
        max_ongoing_requests=max_ongoing or None,
        resources_per_replica=_resources(dep, config),
        replica_ids=_ids(replicas, "replica_id"),
        worker_ids=_ids(replicas, "worker_id"),
        node_ids=_ids(replicas, "node_id"),
    )


def _ids(replicas: list[Any], key: str) -> frozenset[str]:
    return frozenset(str(r[key]) for r in replicas if isinstance(r, Mapping) and r.get(key))


def _resources(dep: Mapping[str, Any], config: Any) -> dict[str, float]:
    """Per-replica resources: Serve's `required_resources`, else from `ray_actor_options`."""
    required = dep.get("required_resources")
    if isinstance(required, Mapping) and required:
        source = {str(k): v for k, v in required.items()}
    else:
        options = config.get("ray_actor_options") if isinstance(config, Mapping) else None
        options = options if isinstance(options, Mapping) else {}
        source = dict(options.get("resources") or {})
        source["CPU"] = options.get("num_cpus", 1)
        source["GPU"] = options.get("num_gpus", 0)
        if options.get("memory"):
            source["memory"] = options["memory"]
    # Zero entries mean "none"; keeping them would make empty bundles look meaningful.
    return {
        k: float(v)
        for k, v in source.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    }


def parse_metrics_targets(body: Any) -> list[MetricsTarget]:
    """Every alive node's Prometheus endpoint from `GET /nodes?view=summary`."""
    if not isinstance(body, Mapping):
        raise ShapeError("nodes answer is not a JSON object")
    data = body.get("data")
    summary = data.get("summary") if isinstance(data, Mapping) else None
    if not isinstance(summary, list):
        raise ShapeError("nodes answer has no 'data.summary' list")
    targets: list[MetricsTarget] = []
    for node in summary:
        raylet = node.get("raylet") if isinstance(node, Mapping) else None
        if not isinstance(raylet, Mapping) or raylet.get("state") != "ALIVE":
            continue
        address = raylet.get("nodeManagerAddress")
        port = raylet.get("metricsExportPort")
        if not address or not isinstance(port, int) or port <= 0:
            continue
        host = f"[{address}]" if ":" in str(address) else str(address)
        targets.append(
            MetricsTarget(str(raylet.get("nodeId", "")), f"http://{host}:{port}/metrics")
        )
    return targets


def parse_service_discovery(body: Any) -> list[MetricsTarget]:
    """Targets from the head's `prom_metrics_service_discovery.json` (Prometheus file SD)."""
    if not isinstance(body, list):
        raise ShapeError("service discovery file is not a JSON list")
    targets: list[MetricsTarget] = []
    for group in body:
        addresses = group.get("targets") if isinstance(group, Mapping) else None
        if not isinstance(addresses, list):
            continue  # one malformed group affects that group only
        for address in addresses:
            if isinstance(address, str) and address and "/" not in address:
                targets.append(MetricsTarget("", f"http://{address}/metrics"))
    return targets
