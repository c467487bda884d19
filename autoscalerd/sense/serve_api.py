"""What Ray's dashboard says about Serve and the nodes, as plain values (no I/O here).

Shapes as of Ray 2.60:
- `GET /api/serve/applications/`: `applications.<app>` has `external_scaler_enabled`,
  `deployment_topology.ingress_deployment` and `deployments.<dep>` with
  `target_num_replicas`, `required_resources` (per replica, e.g. {"CPU": 0, "GPU": 1.0}),
  `deployment_config.max_ongoing_requests` and `.ray_actor_options`, and `replicas[]` with
  `state` (STARTING, RUNNING, ...), `replica_id`, `worker_id`, `node_id`, `node_ip`, `pid`.
  `controller_info.actor_id` names the Serve controller (a new one after a restart).
- `GET /nodes?view=summary`: `data.summary[].raylet` has `state`, `nodeId`,
  `nodeManagerAddress` and `metricsExportPort` (each node's Prometheus endpoint).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscalerd.decide.gpu_health import ReplicaPlacement

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
    # Each replica's process and node, to attribute GPUs to it.
    placements: tuple[ReplicaPlacement, ...] = ()

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


# A host name or an IPv4 address, as a node's address reads; IPv6 is checked apart.
_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")


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
    # Comparisons, not math.isfinite: they refuse NaN too, and an integer of hundreds of
    # digits, which cannot become a float.
    if not 0 <= value <= 1e9:
        return None
    return int(value)


def _amount(value: Any) -> float | None:
    """A resource amount: a finite number > 0, else none."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        amount = float(value)
    except OverflowError:  # an integer past float's range
        return None
    return amount if math.isfinite(amount) and amount > 0 else None


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
        placements=_placements(replicas),
    )


def _placements(replicas: list[Any]) -> tuple[ReplicaPlacement, ...]:
    out = []
    for replica in replicas:
        if not isinstance(replica, Mapping) or not replica.get("replica_id"):
            continue
        pid = _count(replica.get("pid"))
        node_ip = replica.get("node_ip")
        actor = replica.get("actor_name")
        out.append(
            ReplicaPlacement(
                str(replica["replica_id"]),
                pid or None,
                str(node_ip) if isinstance(node_ip, str) and node_ip else None,
                str(replica.get("state", "")),
                actor if isinstance(actor, str) and actor else None,
            )
        )
    return tuple(out)


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
        resources = options.get("resources")
        source = dict(resources) if isinstance(resources, Mapping) else {}
        source["CPU"] = options.get("num_cpus", 1)
        source["GPU"] = options.get("num_gpus", 0)
        if options.get("memory"):
            source["memory"] = options["memory"]
    # Zero entries mean "none"; keeping them would make empty bundles look meaningful.
    amounts = {str(k): _amount(v) for k, v in source.items()}
    return {k: v for k, v in amounts.items() if v is not None}


def _metrics_url(host: Any, port: Any) -> str | None:
    """`http://host:port/metrics`; None unless `host` is a name or an IP address and `port`
    a TCP port: anything else makes another URL than meant, or none that can be fetched."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None
    if not isinstance(host, str):
        return None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
        host = f"[{host}]"
    elif not _HOST_NAME.fullmatch(host):
        return None
    return f"http://{host}:{port}/metrics"


def _split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a file-SD target `host:port`, `[v6]:port` or `host` (port 80)."""
    if address.startswith("["):
        host, closed, rest = address[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else "80"
    else:
        host, colon, port_text = address.rpartition(":")
        if not colon:
            host, port_text = address, "80"
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        return None
    return host, int(port_text)


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
        url = _metrics_url(raylet.get("nodeManagerAddress"), raylet.get("metricsExportPort"))
        if url is None:
            continue  # no usable endpoint: that node is not scraped
        targets.append(MetricsTarget(str(raylet.get("nodeId", "")), url))
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
            split = _split_address(address) if isinstance(address, str) else None
            url = _metrics_url(*split) if split is not None else None
            if url is not None:
                targets.append(MetricsTarget("", url))
    return targets
