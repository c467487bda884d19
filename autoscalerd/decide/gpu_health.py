"""GPU health: what one GPU's readings say about the capacity of the replica on it.

Pure. Sensors report GPU facts (`GpuReading`: NVML on this host, Ray's node series and
NVIDIA's dcgm-exporter for the others); this module turns each into a health state and
a capacity share, joins GPUs to Serve replicas, and sums what a deployment has lost in
replicas' worth of capacity. The decision adds that much, at once (stage 4 of policy.py):
lost capacity is not a load fluctuation.

- **failed** (share 0): an XID whose immediate action in NVIDIA's Xid catalogue is to
  reset the GPU or the node (the GPU must be drained), a volatile double-bit ECC count,
  a row-remapping failure, or a GPU that stopped answering NVML.
- **degraded** (share = measured): sustained hardware clock slowdown (HW slowdown, HW
  thermal, HW power brake) for `throttle_sustain_s`, at the SM clock's share of its
  maximum; an XID whose action is to restart the application (the replica's process
  died or will: its share until it is replaced is what it serves, taken as 0.5); pending
  page retirement or row remapping (works until the next reset: share 1, reported).
- **healthy**: everything else. Utilisation never changes health or capacity: a GPU
  whose KV cache is full reads 90 % busy while the queue is what matters.

A replica on several GPUs (tensor parallel) has the share of its worst GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HEALTHY, DEGRADED, FAILED = "healthy", "degraded", "failed"

# NVIDIA's Xid catalogue (Ampere and newer), immediate action per Xid, for the events a
# serving replica meets. RESET_GPU / RESTART_BM: drain (failed). RESTART_APP: the process
# on the GPU is lost (degraded until replaced). Others: reported, no capacity change.
_XID_FAILED = {
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    136: "link training failure",
    140: "unrecovered ECC error",
}
_XID_RESTART_APP = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing (reset channel)",
    45: "preemptive cleanup",
    94: "contained ECC error",
    109: "context switch timeout",
}
_XID_NOTED = {
    63: "row remapping pending (ECC page retirement recorded)",
    92: "high single-bit ECC error rate",
}
# A replica whose process an XID took down serves about this share until replaced.
_RESTART_APP_SHARE = 0.5
# Clock-event reasons that mean the hardware, not a setting, is slowing the GPU.
HARDWARE_THROTTLE = frozenset({"hw_slowdown", "hw_thermal", "hw_power_brake"})


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What a sensor read of one GPU. Every measurement may be unknown (None)."""

    uuid: str
    at_s: float
    source: str = "nvml"  # nvml | ray | dcgm
    node_ip: str | None = None  # None: the daemon's own host (NVML)
    index: int | None = None
    name: str = ""
    sm_util_ratio: float | None = None
    memory_util_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    # Current clock-event reasons: hw_slowdown, hw_thermal, hw_power_brake, sw_thermal,
    # sw_power_cap, idle, ...; and since when hardware throttling has been continuous.
    throttle: tuple[str, ...] = ()
    hardware_throttle_since_s: float | None = None
    ecc_dbe_volatile: float | None = None
    retirement_pending: bool | None = None
    remap_failed: bool | None = None
    # XID events seen on this GPU (xid, at_s), most recent last; kept by the sensor for
    # as long as they matter (a drain XID until the processes on the GPU change).
    xids: tuple[tuple[int, float], ...] = ()
    pids: tuple[int, ...] = ()  # compute processes on the GPU
    lost: str | None = None  # the GPU stopped answering: why


@dataclass(frozen=True, slots=True)
class GpuHealth:
    uuid: str
    state: str  # healthy | degraded | failed
    reason: str  # one line; "" when healthy
    share: float  # capacity left, 0..1
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """A Serve replica and where it runs (Serve's REST API)."""

    replica_id: str
    pid: int | None
    node_ip: str | None
    state: str = "RUNNING"
    actor_name: str | None = None  # the replica's Ray actor (namespace "serve")


@dataclass(frozen=True, slots=True)
class ReplicaGpu:
    """One GPU attributed to one replica, with its health."""

    replica_id: str
    gpu_uuid: str
    node_ip: str | None
    state: str
    reason: str
    share: float
    source: str


def assess(gpu: GpuReading, now_s: float, throttle_sustain_s: float) -> GpuHealth:
    if gpu.lost:
        return GpuHealth(gpu.uuid, FAILED, f"GPU not answering ({gpu.lost})", 0.0)
    for xid, _ in reversed(gpu.xids):
        if xid in _XID_FAILED:
            return GpuHealth(gpu.uuid, FAILED, f"XID {xid}: {_XID_FAILED[xid]}", 0.0, xid)
    if gpu.ecc_dbe_volatile is not None and gpu.ecc_dbe_volatile > 0:
        return GpuHealth(gpu.uuid, FAILED, "volatile double-bit ECC errors", 0.0, 48)
    if gpu.remap_failed:
        return GpuHealth(gpu.uuid, FAILED, "row remapping failed", 0.0, 64)
    for xid, _ in reversed(gpu.xids):
        if xid in _XID_RESTART_APP:
            reason = f"XID {xid}: {_XID_RESTART_APP[xid]} (the replica's process is lost)"
            return GpuHealth(gpu.uuid, DEGRADED, reason, _RESTART_APP_SHARE, xid)
    since_s = gpu.hardware_throttle_since_s
    hardware = sorted(HARDWARE_THROTTLE.intersection(gpu.throttle))
    if hardware and since_s is not None and now_s - since_s >= throttle_sustain_s:
        share = _clock_share(gpu)
        reason = f"{', '.join(hardware)} for {now_s - since_s:.0f} s (SM clock at {share:.0%})"
        return GpuHealth(gpu.uuid, DEGRADED, reason, share)
    if gpu.retirement_pending:
        return GpuHealth(gpu.uuid, DEGRADED, "page retirement or row remap pending reset", 1.0)
    for xid, _ in reversed(gpu.xids):
        if xid in _XID_NOTED:
            return GpuHealth(gpu.uuid, DEGRADED, f"XID {xid}: {_XID_NOTED[xid]}", 1.0, xid)
    return GpuHealth(gpu.uuid, HEALTHY, "", 1.0)


def _clock_share(gpu: GpuReading) -> float:
    clock, top = gpu.sm_clock_mhz, gpu.sm_clock_max_mhz
    if clock is None or top is None or not top > 0 or not math.isfinite(clock):
        return 0.5  # slowed by the hardware, by an amount nobody reported
    return max(0.0, min(1.0, clock / top))


def attribute(
    gpus: Iterable[GpuReading],
    replicas: Sequence[ReplicaPlacement],
    local_ips: frozenset[str],
    now_s: float,
    throttle_sustain_s: float,
) -> tuple[list[ReplicaGpu], list[GpuHealth]]:
    """(each replica's GPUs with their health, the GPUs no replica could be found on).

    A GPU belongs to the replica whose process (Serve's `pid`) runs on it, on the same
    node: NVML's GPUs are this host's (a replica whose node_ip is one of `local_ips`),
    Ray's and DCGM's carry their node's ip.
    """
    by_place: dict[tuple[str | None, int], ReplicaPlacement] = {}
    for replica in replicas:
        if replica.pid is not None:
            node = "local" if replica.node_ip in local_ips else replica.node_ip
            by_place[(node, replica.pid)] = replica
    attributed: list[ReplicaGpu] = []
    unattributed: list[GpuHealth] = []
    for gpu in _best_per_uuid(gpus):
        health = assess(gpu, now_s, throttle_sustain_s)
        node = "local" if gpu.node_ip is None or gpu.node_ip in local_ips else gpu.node_ip
        owners = {by_place[(node, pid)] for pid in gpu.pids if (node, pid) in by_place}
        if not owners:
            unattributed.append(health)
            continue
        for owner in sorted(owners, key=lambda r: r.replica_id):
            attributed.append(
                ReplicaGpu(
                    owner.replica_id,
                    gpu.uuid,
                    gpu.node_ip,
                    health.state,
                    health.reason,
                    health.share,
                    gpu.source,
                )
            )
    return attributed, unattributed


def _best_per_uuid(gpus: Iterable[GpuReading]) -> list[GpuReading]:
    """One reading per GPU: the sources merged, health facts from any of them."""
    merged: dict[str, GpuReading] = {}
    for gpu in gpus:
        known = merged.get(gpu.uuid)
        if known is None:
            merged[gpu.uuid] = gpu
            continue
        merged[gpu.uuid] = GpuReading(
            uuid=gpu.uuid,
            at_s=max(known.at_s, gpu.at_s),
            source=known.source if known.source == gpu.source else f"{known.source}+{gpu.source}",
            node_ip=known.node_ip if known.node_ip is not None else gpu.node_ip,
            index=known.index if known.index is not None else gpu.index,
            name=known.name or gpu.name,
            sm_util_ratio=_first(known.sm_util_ratio, gpu.sm_util_ratio),
            memory_util_ratio=_first(known.memory_util_ratio, gpu.memory_util_ratio),
            memory_used_bytes=_first(known.memory_used_bytes, gpu.memory_used_bytes),
            memory_total_bytes=_first(known.memory_total_bytes, gpu.memory_total_bytes),
            power_w=_first(known.power_w, gpu.power_w),
            power_limit_w=_first(known.power_limit_w, gpu.power_limit_w),
            temperature_c=_first(known.temperature_c, gpu.temperature_c),
            sm_clock_mhz=_first(known.sm_clock_mhz, gpu.sm_clock_mhz),
            sm_clock_max_mhz=_first(known.sm_clock_max_mhz, gpu.sm_clock_max_mhz),
            throttle=tuple(sorted(set(known.throttle) | set(gpu.throttle))),
            hardware_throttle_since_s=_first(
                known.hardware_throttle_since_s, gpu.hardware_throttle_since_s
            ),
            ecc_dbe_volatile=_first(known.ecc_dbe_volatile, gpu.ecc_dbe_volatile),
            retirement_pending=known.retirement_pending or gpu.retirement_pending,
            remap_failed=known.remap_failed or gpu.remap_failed,
            xids=tuple(sorted(set(known.xids) | set(gpu.xids), key=lambda e: e[1])),
            pids=tuple(sorted(set(known.pids) | set(gpu.pids))),
            lost=known.lost or gpu.lost,
        )
    return list(merged.values())


def _first(a: float | None, b: float | None) -> float | None:
    return a if a is not None else b


def lost_replicas(replica_gpus: Sequence[ReplicaGpu]) -> float:
    """Replicas' worth of capacity lost: per replica 1 - the share of its worst GPU."""
    shares: dict[str, float] = {}
    for item in replica_gpus:
        shares[item.replica_id] = min(shares.get(item.replica_id, 1.0), item.share)
    return sum(1.0 - share for share in shares.values())
