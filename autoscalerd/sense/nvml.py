"""The `nvml` sensor: this host's GPUs through NVML (`pynvml`, from nvidia-ml-py).

Per GPU: SM and memory utilisation, memory used and total, power draw and limit,
temperature, SM clock and its maximum, clock-event (throttle) reasons, volatile
double-bit ECC count, pending page retirement and row remapping (and remap failures),
the compute processes on it, and XID events, read by an `nvmlEventSet` listener on its
own thread. It reports GPU facts only (`SenseResult.gpus`); the loop joins them to Serve
replicas by process id and `decide/gpu_health.py` turns them into capacity.

NVML is initialised once, on a worker thread, and device handles are cached; every call
runs on that thread and `sense()` waits for it at most `call_timeout_s` (a wedged driver
makes readings older, never the loop slower). A missing library, driver or GPU is one
log line, and the sensor then reports no GPUs (unknown): it never fails the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autoscalerd import logs
from autoscalerd.config import Config, plugin_settings
from autoscalerd.decide.gpu_health import HARDWARE_THROTTLE, GpuReading
from autoscalerd.sense.base import SenseResult


class NvmlSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # The module that speaks NVML: pynvml (nvidia-ml-py); a compatible fake in tests.
    library: str = "pynvml"
    # How long sense() waits for one round of NVML calls.
    call_timeout_s: float = Field(0.5, gt=0)
    # The XID listener waits this long per nvmlEventSetWait, so it stops promptly.
    event_wait_ms: int = Field(500, ge=1)
    # A drain XID is kept while any process that was on the GPU then is still there; at
    # most this long either way.
    xid_memory_s: float = Field(3600.0, gt=0)


# Clock-event reason bits (NVML's nvmlClocksEventReason*; the same values as the older
# nvmlClocksThrottleReason*).
_REASONS = {
    0x0000000000000001: "idle",
    0x0000000000000002: "applications_clocks",
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000010: "sync_boost",
    0x0000000000000020: "sw_thermal",
    0x0000000000000040: "hw_thermal",
    0x0000000000000080: "hw_power_brake",
    0x0000000000000100: "display_clocks",
}


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    name: str
    xids: list[tuple[int, float, frozenset[int]]] = field(default_factory=list)
    throttle_since_s: float | None = None
    last: GpuReading | None = None


class NvmlSensor:
    name = "nvml"
    settings_model = NvmlSettings

    def __init__(self, settings: Mapping[str, Any], config: Config) -> None:
        self.settings = plugin_settings(NvmlSettings, settings)
        self._log = logs.get("autoscalerd.sensor.nvml")
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="nvml"
        )
        self._nvml: Any = None
        self._gpus: list[_Gpu] = []
        self._lock = threading.Lock()
        self._unavailable: str | None = None
        self._started = False
        self._round: concurrent.futures.Future[list[GpuReading]] | None = None
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._reported: dict[str, str] = {}

    # ------------------------------------------------------------------ Sensor protocol

    async def sense(self, now_s: float) -> SenseResult:
        try:
            return await self._sense(now_s)
        except Exception as exc:  # a sensor never raises into the loop
            self._report("sense", f"{type(exc).__name__}: {exc}")
            return SenseResult({}, {}, gpus=self._last())

    async def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, self._listener.join, 2 * self.settings.event_wait_ms / 1000
            )
        if self._nvml is not None and self._started:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    asyncio.wrap_future(self._executor.submit(self._nvml.nvmlShutdown)), 1.0
                )
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _sense(self, now_s: float) -> SenseResult:
        if not self._started:
            self._started = True
            started = self._executor.submit(self._start)
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.wrap_future(started), 5.0)
        if self._unavailable is not None or not self._gpus:
            return SenseResult({}, {})
        if self._round is None or self._round.done():
            self._round = self._executor.submit(self._read_all, now_s)
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(self._round)), self.settings.call_timeout_s
            )
        if self._round.done() and self._round.exception() is not None:
            error = self._round.exception()
            self._report("read", f"{type(error).__name__}: {error}")
        return SenseResult({}, {}, gpus=self._last())

    def _last(self) -> tuple[GpuReading, ...]:
        with self._lock:
            return tuple(g.last for g in self._gpus if g.last is not None)

    # ------------------------------------------------------------------ on the worker thread

    def _start(self) -> None:
        try:
            nvml = importlib.import_module(self.settings.library)
        except ImportError as exc:
            self._unavailable = f"{self.settings.library} not importable ({exc})"
            self._log.warning(
                "nvml_unavailable",
                reason=self._unavailable,
                hint="install nvidia-ml-py, or remove the nvml sensor; GPUs read as unknown",
            )
            return
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
            gpus = []
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(
                    _Gpu(
                        index,
                        handle,
                        _text(nvml.nvmlDeviceGetUUID(handle)),
                        _text(nvml.nvmlDeviceGetName(handle)),
                    )
                )
        except Exception as exc:
            self._unavailable = f"NVML did not start ({_nvml_error(exc)})"
            self._log.warning(
                "nvml_unavailable",
                reason=self._unavailable,
                hint="no NVIDIA driver or GPU on this host; GPUs read as unknown",
            )
            return
        self._nvml = nvml
        with self._lock:
            self._gpus = gpus
        self._log.info("nvml_started", gpus=[g.uuid for g in gpus])
        self._listener = threading.Thread(target=self._listen, name="nvml-xid", daemon=True)
        self._listener.start()

    def _read_all(self, now_s: float) -> list[GpuReading]:
        out = []
        for gpu in list(self._gpus):
            reading = self._read(gpu, now_s)
            with self._lock:
                gpu.last = reading
            out.append(reading)
        return out

    def _read(self, gpu: _Gpu, now_s: float) -> GpuReading:
        nvml, handle = self._nvml, gpu.handle

        def call(name: str, *args: Any) -> Any:
            function = getattr(nvml, name, None)
            if function is None:
                return None
            try:
                return function(handle, *args)
            except Exception as exc:
                if _lost(nvml, exc):
                    raise _Lost(_nvml_error(exc)) from None
                return None  # not supported on this GPU: unknown

        try:
            utilization = call("nvmlDeviceGetUtilizationRates")
            memory = call("nvmlDeviceGetMemoryInfo")
            power_mw = call("nvmlDeviceGetPowerUsage")
            limit_mw = call("nvmlDeviceGetEnforcedPowerLimit")
            temperature = call("nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
            clock = call("nvmlDeviceGetClockInfo", getattr(nvml, "NVML_CLOCK_SM", 1))
            clock_max = call("nvmlDeviceGetMaxClockInfo", getattr(nvml, "NVML_CLOCK_SM", 1))
            reasons = call("nvmlDeviceGetCurrentClocksEventReasons")
            if reasons is None:
                reasons = call("nvmlDeviceGetCurrentClocksThrottleReasons")
            dbe = call(
                "nvmlDeviceGetTotalEccErrors",
                getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                getattr(nvml, "NVML_VOLATILE_ECC", 0),
            )
            retired = call("nvmlDeviceGetRetiredPagesPendingStatus")
            remapped = call("nvmlDeviceGetRemappedRows")
            processes = call("nvmlDeviceGetComputeRunningProcesses") or []
        except _Lost as lost:
            return GpuReading(
                gpu.uuid,
                now_s,
                index=gpu.index,
                name=gpu.name,
                xids=self._xids(gpu, ()),
                lost=str(lost),
            )
        throttle = tuple(
            word for bit, word in _REASONS.items() if reasons is not None and int(reasons) & bit
        )
        if HARDWARE_THROTTLE.intersection(throttle):
            if gpu.throttle_since_s is None:
                gpu.throttle_since_s = now_s
        else:
            gpu.throttle_since_s = None
        pids = tuple(sorted({int(p.pid) for p in processes if getattr(p, "pid", None)}))
        remap_pending = remap_failed = None
        if isinstance(remapped, tuple) and len(remapped) >= 4:
            remap_pending, remap_failed = bool(remapped[2]), bool(remapped[3])
        retirement = None if retired is None else bool(retired)
        if remap_pending is not None:
            retirement = bool(retirement) or remap_pending
        return GpuReading(
            uuid=gpu.uuid,
            at_s=now_s,
            source="nvml",
            index=gpu.index,
            name=gpu.name,
            sm_util_ratio=_ratio(getattr(utilization, "gpu", None)),
            memory_util_ratio=_ratio(getattr(utilization, "memory", None)),
            memory_used_bytes=_number(getattr(memory, "used", None)),
            memory_total_bytes=_number(getattr(memory, "total", None)),
            power_w=_scaled(power_mw, 1e-3),
            power_limit_w=_scaled(limit_mw, 1e-3),
            temperature_c=_number(temperature),
            sm_clock_mhz=_number(clock),
            sm_clock_max_mhz=_number(clock_max),
            throttle=throttle,
            hardware_throttle_since_s=gpu.throttle_since_s,
            ecc_dbe_volatile=_number(dbe),
            retirement_pending=retirement,
            remap_failed=remap_failed,
            xids=self._xids(gpu, pids),
            pids=pids,
        )

    def _xids(self, gpu: _Gpu, pids: tuple[int, ...]) -> tuple[tuple[int, float], ...]:
        """The XIDs that still matter: those whose processes are still on the GPU (the
        replica they hit has not been replaced), within xid_memory_s."""
        now = time.time()
        with self._lock:
            kept = [
                (xid, at_s, then)
                for xid, at_s, then in gpu.xids
                if now - at_s <= self.settings.xid_memory_s
                and (not then or not pids or then & set(pids))
            ]
            gpu.xids = kept
            return tuple((xid, at_s) for xid, at_s, _ in kept)

    def _listen(self) -> None:
        """XID events, on their own thread: nvmlEventSetWait blocks."""
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
            kind = getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8)
            for each in self._gpus:
                with contextlib.suppress(Exception):
                    nvml.nvmlDeviceRegisterEvents(each.handle, kind, events)
        except Exception as exc:
            self._report("events", f"XID events unavailable ({_nvml_error(exc)})")
            return
        by_handle = {id(g.handle): g for g in self._gpus}
        by_uuid = {g.uuid: g for g in self._gpus}
        while not self._stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(events, self.settings.event_wait_ms)
            except Exception as exc:
                if _timeout(nvml, exc):
                    continue
                self._report("events", f"XID listener stopped ({_nvml_error(exc)})")
                return
            gpu: _Gpu | None = by_handle.get(id(getattr(event, "device", None)))
            if gpu is None:
                with contextlib.suppress(Exception):
                    gpu = by_uuid.get(_text(nvml.nvmlDeviceGetUUID(event.device)))
            if gpu is None:
                continue
            xid = int(getattr(event, "eventData", 0))
            on_gpu = frozenset(gpu.last.pids) if gpu.last is not None else frozenset()
            with self._lock:
                gpu.xids.append((xid, time.time(), on_gpu))
            self._log.warning("gpu_xid", gpu=gpu.uuid, index=gpu.index, xid=xid)
        with contextlib.suppress(Exception):
            nvml.nvmlEventSetFree(events)

    def _report(self, what: str, error: str) -> None:
        if self._reported.get(what) != error:
            self._reported[what] = error
            self._log.warning("sensor_problem", part=what, error=error)


class _Lost(Exception):
    """The GPU stopped answering (fallen off the bus, lost)."""


def _lost(nvml: Any, exc: BaseException) -> bool:
    code = getattr(exc, "value", None)
    return code is not None and code == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)


def _timeout(nvml: Any, exc: BaseException) -> bool:
    code = getattr(exc, "value", None)
    return code is not None and code == getattr(nvml, "NVML_ERROR_TIMEOUT", 10)


def _nvml_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:160]
    return text or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") and number >= 0 else None


def _ratio(percent: Any) -> float | None:
    number = _number(percent)
    return None if number is None else number / 100.0


def _scaled(value: Any, factor: float) -> float | None:
    number = _number(value)
    return None if number is None else number * factor
