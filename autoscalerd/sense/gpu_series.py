"""GPU facts from the Prometheus endpoints the `ray_serve` sensor already scrapes: the
GPUs on other nodes, which NVML on this host cannot see.

Which source says what (names as Ray 2.60 and NVIDIA's dcgm-exporter export them):

- utilisation: `ray_node_gpus_utilization` (percent); `DCGM_FI_DEV_GPU_UTIL`
- memory used / free: `ray_node_gram_used` / `_available` (MiB); `DCGM_FI_DEV_FB_USED` /
  `_FREE`
- power, temperature: `ray_node_gpu_power_milliwatts`, `ray_node_gpu_temperature_celsius`;
  `DCGM_FI_DEV_POWER_USAGE`, `DCGM_FI_DEV_GPU_TEMP`
- processes on a GPU: `ray_component_gpu_memory_mb` (`pid`, `GpuUuid`); Ray only
- health, dcgm-exporter only: `DCGM_FI_DEV_XID_ERRORS` (the last XID code),
  `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`, `DCGM_FI_DEV_CLOCKS_EVENT_REASONS` (or the older
  `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`), `DCGM_FI_DEV_SM_CLOCK`

Ray's series key a GPU by `ip` and `GpuUuid` (`GpuIndex` too); dcgm-exporter's by `UUID`
(`gpu` is the index, `Hostname` the node's name), on the node whose endpoint answered.
Health (XID, ECC, throttling) therefore needs dcgm-exporter on the GPU nodes, listed in
`cluster.metrics_urls`; without it, remote GPUs have utilisation and memory only, which
never change a decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from autoscalerd.decide.gpu_health import HARDWARE_THROTTLE, GpuReading
from autoscalerd.sense.prometheus import Sample

RAY_FAMILIES = frozenset(
    {
        "ray_node_gpus_utilization",
        "ray_node_gram_used",
        "ray_node_gram_available",
        "ray_node_gpu_power_milliwatts",
        "ray_node_gpu_temperature_celsius",
        "ray_component_gpu_memory_mb",
    }
)
DCGM_FAMILIES = frozenset(
    {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    }
)
GPU_FAMILIES = RAY_FAMILIES | DCGM_FAMILIES
_MIB = 2.0**20
# NVML's clock-event bits, which dcgm-exporter reports as one number.
_BITS = {0x8: "hw_slowdown", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x4: "sw_power_cap"}


@dataclass
class _Building:
    uuid: str
    node_ip: str | None
    source: str
    values: dict[str, float] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)


def readings_from(samples: Iterable[Sample], url: str, at_s: float) -> list[GpuReading]:
    """The GPUs one endpoint's scrape describes (no memory across scrapes: see `GpuTrack`)."""
    host = urlsplit(url).hostname
    gpus: dict[str, _Building] = {}
    for sample in samples:
        value = sample.value
        if not math.isfinite(value) or value < 0:
            continue  # unknown, never zero
        labels = sample.labels
        if sample.name in RAY_FAMILIES:
            uuid = labels.get("GpuUuid")
            if not uuid:
                continue
            gpu = gpus.setdefault(uuid, _Building(uuid, labels.get("ip") or host, "ray"))
            if sample.name == "ray_component_gpu_memory_mb":
                pid = labels.get("pid", "")
                if pid.isdigit() and value > 0:
                    gpu.pids.add(int(pid))
            else:
                gpu.values[sample.name] = value
        elif sample.name in DCGM_FAMILIES:
            uuid = labels.get("UUID")
            if not uuid:
                continue
            gpu = gpus.setdefault(uuid, _Building(uuid, host, "dcgm"))
            gpu.values[sample.name] = value
    return [_reading(gpu, at_s) for gpu in gpus.values()]


def _reading(gpu: _Building, at_s: float) -> GpuReading:
    v = gpu.values
    util = v.get("ray_node_gpus_utilization", v.get("DCGM_FI_DEV_GPU_UTIL"))
    used_mib = v.get("ray_node_gram_used", v.get("DCGM_FI_DEV_FB_USED"))
    free_mib = v.get("ray_node_gram_available", v.get("DCGM_FI_DEV_FB_FREE"))
    power_w = v.get("DCGM_FI_DEV_POWER_USAGE")
    if power_w is None and "ray_node_gpu_power_milliwatts" in v:
        power_w = v["ray_node_gpu_power_milliwatts"] / 1000.0
    reasons = v.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", v.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"))
    throttle = tuple(w for bit, w in _BITS.items() if reasons is not None and int(reasons) & bit)
    xid = v.get("DCGM_FI_DEV_XID_ERRORS")
    return GpuReading(
        uuid=gpu.uuid,
        at_s=at_s,
        source=gpu.source,
        node_ip=gpu.node_ip,
        sm_util_ratio=util / 100.0 if util is not None else None,
        memory_used_bytes=used_mib * _MIB if used_mib is not None else None,
        memory_total_bytes=(used_mib + free_mib) * _MIB
        if used_mib is not None and free_mib is not None
        else None,
        power_w=power_w,
        temperature_c=v.get("ray_node_gpu_temperature_celsius", v.get("DCGM_FI_DEV_GPU_TEMP")),
        sm_clock_mhz=v.get("DCGM_FI_DEV_SM_CLOCK"),
        throttle=throttle,
        ecc_dbe_volatile=v.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
        # dcgm-exporter's XID field holds the last XID code; a code seen is an event.
        xids=((int(xid), at_s),) if xid else (),
        pids=tuple(sorted(gpu.pids)),
    )


class GpuTrack:
    """What a GPU's readings need across scrapes: when an XID code was first seen, when
    hardware throttling began, and the highest SM clock seen (dcgm-exporter does not
    export the maximum)."""

    def __init__(self) -> None:
        self._xid_since: dict[tuple[str, int], float] = {}
        self._throttle_since: dict[str, float] = {}
        self._clock_max: dict[str, float] = {}

    def update(self, readings: Iterable[GpuReading]) -> list[GpuReading]:
        out = []
        for gpu in readings:
            xids = tuple(
                (xid, self._xid_since.setdefault((gpu.uuid, xid), at_s)) for xid, at_s in gpu.xids
            )
            since = None
            if HARDWARE_THROTTLE.intersection(gpu.throttle):
                since = self._throttle_since.setdefault(gpu.uuid, gpu.at_s)
            else:
                self._throttle_since.pop(gpu.uuid, None)
            top = None
            if gpu.sm_clock_mhz is not None:
                top = max(self._clock_max.get(gpu.uuid, 0.0), gpu.sm_clock_mhz)
                self._clock_max[gpu.uuid] = top
            out.append(
                replace(gpu, xids=xids, hardware_throttle_since_s=since, sm_clock_max_mhz=top)
            )
        return out
