"""Emulated GPUs behind a pynvml-compatible module, for `autoscalerd demo
--inject-gpu-fault` and the tests (the nvml sensor's `library:` setting points at it).

The GPUs, their readings and the XID events come from a JSON script named by
$AUTOSCALERD_FAKE_NVML, re-read on every call, so that the demo or a test changes what
the "driver" says while the sensor runs. Only what the sensor calls is here.

Script: {"gpus": [{"uuid", "name", "util", "mem_util", "mem_used", "mem_total",
"power_mw", "limit_mw", "temp", "clock", "clock_max", "reasons", "dbe",
"retired_pending", "remapped": [corr, unc, pending, failed], "pids", "lost"}],
"xids": [{"id", "gpu", "xid"}], "no_driver": false}
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 0x8

_delivered: set[Any] = set()
_lock = threading.Lock()


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class _Utilization:
    gpu: float
    memory: float


@dataclass
class _Memory:
    used: float
    total: float


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int = 0


@dataclass
class _Event:
    device: _Handle
    eventType: int
    eventData: int
    timeStamp: int = 0


def _script() -> dict[str, Any]:
    path = os.environ.get("AUTOSCALERD_FAKE_NVML", "")
    if not path:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    with open(path) as file:
        script: dict[str, Any] = json.load(file)
    if script.get("no_driver"):
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    return script


def _gpu(handle: _Handle) -> dict[str, Any]:
    gpus = _script()["gpus"]
    gpu: dict[str, Any] = gpus[handle.index]
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


def nvmlInit() -> None:
    _script()


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return len(_script()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    return _Handle(index)


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return str(_script()["gpus"][handle.index]["uuid"])


def nvmlDeviceGetName(handle: _Handle) -> str:
    return str(_script()["gpus"][handle.index].get("name", "Fake GPU"))


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> _Utilization:
    gpu = _gpu(handle)
    return _Utilization(gpu.get("util", 0), gpu.get("mem_util", 0))


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> _Memory:
    gpu = _gpu(handle)
    return _Memory(gpu.get("mem_used", 0), gpu.get("mem_total", 80 * 2**30))


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    return int(_gpu(handle).get("power_mw", 300_000))


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    return int(_gpu(handle).get("limit_mw", 700_000))


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    return int(_gpu(handle).get("temp", 50))


def nvmlDeviceGetClockInfo(handle: _Handle, clock: int) -> int:
    return int(_gpu(handle).get("clock", 1980))


def nvmlDeviceGetMaxClockInfo(handle: _Handle, clock: int) -> int:
    return int(_gpu(handle).get("clock_max", 1980))


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    return int(_gpu(handle).get("reasons", 0))


def nvmlDeviceGetTotalEccErrors(handle: _Handle, kind: int, counter: int) -> int:
    return int(_gpu(handle).get("dbe", 0))


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    return int(_gpu(handle).get("retired_pending", 0))


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    corr, unc, pending, failed = _gpu(handle).get("remapped", [0, 0, 0, 0])
    return int(corr), int(unc), int(pending), int(failed)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_Process]:
    return [_Process(int(pid)) for pid in _gpu(handle).get("pids", [])]


def nvmlEventSetCreate() -> object:
    return object()


def nvmlDeviceRegisterEvents(handle: _Handle, kinds: int, events: object) -> None:
    return None


def nvmlEventSetWait(events: object, timeout_ms: int) -> _Event:
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        script = _script()
        uuids = [g["uuid"] for g in script["gpus"]]
        for event in script.get("xids", []):
            with _lock:
                if event["id"] in _delivered or event["gpu"] not in uuids:
                    continue
                _delivered.add(event["id"])
            index = uuids.index(event["gpu"])
            return _Event(_Handle(index), nvmlEventTypeXidCriticalError, int(event["xid"]))
        if time.monotonic() >= deadline:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(0.02)


def nvmlEventSetFree(events: object) -> None:
    return None
