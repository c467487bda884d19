"""GPU health: the model (pure), the nvml sensor against a pynvml-compatible fake, the
decision's seam, and the real daemon replacing a replica whose GPU fell off the bus."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscalerd.config import Config
from autoscalerd.decide import gpu_health, policy
from autoscalerd.decide.gpu_health import GpuReading, ReplicaGpu, ReplicaPlacement
from autoscalerd.model import Observation, Reading, Reason
from autoscalerd.sense.nvml import NvmlSensor
from tests.daemon import Daemon, free_port
from tests.faults.fake_ray import NAME, FakeRay
from tests.helpers import REPO

FAKE = "autoscalerd.emulator.fake_nvml"


def gpu(**changes: Any) -> GpuReading:
    return GpuReading(uuid="GPU-a", at_s=100.0, pids=(7,), **changes)


# ---------------------------------------------------------------- the health model


@pytest.mark.parametrize(
    ("reading", "state", "share", "words"),
    [
        (gpu(), "healthy", 1.0, ""),
        (gpu(sm_util_ratio=1.0, memory_util_ratio=1.0), "healthy", 1.0, ""),
        (gpu(xids=((79, 90.0),)), "failed", 0.0, "XID 79: GPU has fallen off the bus"),
        (gpu(xids=((48, 90.0),)), "failed", 0.0, "double-bit ECC"),
        (gpu(ecc_dbe_volatile=2.0), "failed", 0.0, "double-bit ECC"),
        (gpu(lost="GPU is lost"), "failed", 0.0, "not answering"),
        (gpu(xids=((94, 90.0),)), "degraded", 0.5, "contained ECC"),
        (gpu(xids=((13, 90.0),)), "degraded", 0.5, "process is lost"),
        (
            gpu(
                throttle=("hw_slowdown",),
                hardware_throttle_since_s=60.0,
                sm_clock_mhz=990.0,
                sm_clock_max_mhz=1980.0,
            ),
            "degraded",
            0.5,
            "hw_slowdown for 40 s",
        ),
        # Not sustained yet, or a software cap: capacity as measured elsewhere.
        (gpu(throttle=("hw_thermal",), hardware_throttle_since_s=95.0), "healthy", 1.0, ""),
        (gpu(throttle=("sw_power_cap",), hardware_throttle_since_s=None), "healthy", 1.0, ""),
        (gpu(retirement_pending=True), "degraded", 1.0, "pending reset"),
    ],
)
def test_health_follows_the_xid_catalogue_and_the_clocks(
    reading: GpuReading, state: str, share: float, words: str
) -> None:
    health = gpu_health.assess(reading, 100.0, throttle_sustain_s=30.0)
    assert (health.state, health.share) == (state, share)
    assert words in health.reason


def test_gpus_join_replicas_by_process_on_the_same_node() -> None:
    replicas = [
        ReplicaPlacement("r1", 7, "10.0.0.1"),  # this host
        ReplicaPlacement("r2", 7, "10.0.0.2"),  # same pid, another node
        ReplicaPlacement("r3", 9, "10.0.0.2"),
    ]
    gpus = [
        GpuReading("GPU-local", 100.0, pids=(7,), xids=((79, 99.0),)),  # NVML, this host
        GpuReading("GPU-remote", 100.0, source="ray", node_ip="10.0.0.2", pids=(9,)),
        GpuReading("GPU-idle", 100.0, pids=(4242,)),
    ]
    attributed, unattributed = gpu_health.attribute(
        gpus, replicas, frozenset({"10.0.0.1"}), 100.0, 30.0
    )
    assert [(g.replica_id, g.gpu_uuid, g.state) for g in attributed] == [
        ("r1", "GPU-local", "failed"),
        ("r3", "GPU-remote", "healthy"),
    ]
    assert [h.uuid for h in unattributed] == ["GPU-idle"]
    # A tensor-parallel replica has its worst GPU's share; replicas add up.
    rows = [
        ReplicaGpu("r1", "a", None, "degraded", "", 0.6, "nvml"),
        ReplicaGpu("r1", "b", None, "healthy", "", 1.0, "nvml"),
        ReplicaGpu("r2", "c", None, "failed", "", 0.0, "nvml"),
    ]
    assert gpu_health.lost_replicas(rows) == pytest.approx(1.4)


# ---------------------------------------------------------------- the decision's seam


def deployment() -> Any:
    cfg = Config.model_validate(
        {
            "deployments": [
                {
                    "name": NAME,
                    "autoscaling": {"max_replicas": 40, "upscale_delay_s": 30},
                    "capacity": {
                        "sizing": "utilization",
                        "service_rate_per_replica": 10,
                        "target_utilization": 1.0,
                    },
                    "forecast": {"enabled": False},
                }
            ]
        }
    )
    return cfg.deployment(NAME)


def observe(second: float, lost: float | None, rows: tuple[ReplicaGpu, ...] = ()) -> Observation:
    return Observation(
        NAME,
        second,
        arrival_rate_per_s=Reading(95.0, second),
        gpu_lost_replicas=Reading(lost, second) if lost is not None else None,
        gpu_replicas=rows,
    )


def test_a_failed_gpu_adds_its_replica_at_once_and_utilisation_never_scales() -> None:
    dep = deployment()
    state = policy.initial_state(dep, 0.0, 10)
    busy = (ReplicaGpu("r1", "GPU-a", None, "healthy", "", 1.0, "nvml"),)
    for second in range(1, 60):
        decision, state = policy.decide(observe(second, 0.0, busy), state, dep, float(second))
    assert decision.target_replicas == 10  # a GPU at 100 % utilisation is no reason
    failed = (ReplicaGpu("r1", "GPU-a", None, "failed", "XID 79: fallen off", 0.0, "nvml"),)
    decision, state = policy.decide(observe(60, 1.0, failed), state, dep, 60.0)
    # The upscale delay is 30 s; lost capacity is not a load fluctuation.
    assert decision.target_replicas == 11
    assert Reason.GPU_FAILED in decision.reasons
    assert decision.gpu_replicas == (("r1", "GPU-a", "failed", "XID 79: fallen off"),)
    # Kept while the failed replica is there, and while the GPU reading is stale.
    decision, state = policy.decide(observe(61, 1.0, failed), state, dep, 61.0)
    assert decision.target_replicas == 11
    stale = Observation(
        NAME, 200.0, arrival_rate_per_s=Reading(95.0, 200.0), gpu_lost_replicas=Reading(1.0, 61.0)
    )
    decision, state = policy.decide(stale, state, dep, 200.0)
    assert decision.target_replicas == 11


# ---------------------------------------------------------------- the sensor


def script(path: Path, gpus: list[dict[str, Any]], xids: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps({"gpus": gpus, "xids": list(xids)}))
    os.replace(temp, path)


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("AUTOSCALERD_FAKE_NVML", str(path))
    return path


async def test_the_sensor_reads_every_fact_and_hears_xids(fake_nvml: Path) -> None:
    script(
        fake_nvml,
        [
            {
                "uuid": "GPU-0",
                "name": "NVIDIA H200",
                "util": 87,
                "mem_util": 40,
                "mem_used": 70 * 2**30,
                "mem_total": 141 * 2**30,
                "power_mw": 450_000,
                "limit_mw": 700_000,
                "temp": 61,
                "clock": 990,
                "clock_max": 1980,
                "reasons": 0x8 | 0x4,
                "dbe": 0,
                "remapped": [0, 0, 1, 0],
                "pids": [41000],
            }
        ],
    )
    sensor = NvmlSensor({"library": FAKE, "event_wait_ms": 20}, Config())
    try:
        [reading] = (await sensor.sense(10.0)).gpus
        assert reading.uuid == "GPU-0" and reading.name == "NVIDIA H200"
        assert (reading.sm_util_ratio, reading.memory_util_ratio) == (0.87, 0.40)
        assert reading.memory_total_bytes == 141 * 2**30 and reading.power_w == 450.0
        assert reading.power_limit_w == 700.0 and reading.temperature_c == 61.0
        assert reading.throttle == ("sw_power_cap", "hw_slowdown")
        assert reading.hardware_throttle_since_s == 10.0
        assert reading.retirement_pending is True and reading.remap_failed is False
        assert reading.pids == (41000,) and reading.xids == ()
        script(
            fake_nvml,
            [{"uuid": "GPU-0", "pids": [41000]}],
            [{"id": 1, "gpu": "GPU-0", "xid": 79}],
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            [reading] = (await sensor.sense(11.0)).gpus
            if reading.xids:
                break
            await asyncio.sleep(0.05)
        assert [xid for xid, _ in reading.xids] == [79]
        assert reading.hardware_throttle_since_s is None  # the slowdown ended
        # The XID stays with the GPU while the process it hit is there; a replacement
        # (another pid) clears it.
        script(
            fake_nvml, [{"uuid": "GPU-0", "pids": [41999]}], [{"id": 1, "gpu": "GPU-0", "xid": 79}]
        )
        [reading] = (await sensor.sense(12.0)).gpus
        assert reading.xids == ()
    finally:
        await sensor.close()


async def test_without_nvml_one_line_and_no_gpus(
    fake_nvml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml.write_text(json.dumps({"gpus": [], "no_driver": True}))
    for settings in ({"library": FAKE}, {"library": "no_such_nvml_module"}):
        sensor = NvmlSensor(settings, Config())
        try:
            for second in range(3):
                result = await sensor.sense(float(second))
                assert result.gpus == () and result.error is None
        finally:
            await sensor.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if "nvml_unavailable" in line]
    assert len(lines) == 2, lines


# ---------------------------------------------------------------- the real daemon


@pytest.fixture
def fake_ray() -> Iterator[FakeRay]:
    fake = FakeRay(nodes=1, replicas=10, rate_per_s=95.0).start()
    yield fake
    fake.stop()


def test_an_xid_79_on_a_replicas_gpu_adds_a_replica_within_a_tick(
    tmp_path: Path, fake_ray: FakeRay, cli_env: dict[str, str]
) -> None:
    nvml = tmp_path / "nvml.json"
    gpus = [{"uuid": f"GPU-{i}", "pids": [fake_ray.first_pid + i]} for i in range(10)]
    script(nvml, gpus)
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tick_s": 0.5,
                "cluster": {
                    "dashboard_url": fake_ray.dashboard_url,
                    "token_file": str(tmp_path / "none"),
                },
                "discovery": {"enabled": False},
                "http": {"addr": f"127.0.0.1:{port}"},
                "sensors": [
                    {"type": "ray_serve", "metrics_interval_s": 0.5, "rate_window_s": 1.0},
                    {"type": "nvml", "library": FAKE, "event_wait_ms": 50},
                ],
                "actuators": [{"type": "ray_serve"}],
                "deployments": [
                    {
                        "name": NAME,
                        "autoscaling": {
                            "max_replicas": 40,
                            "upscale_delay_s": 30,
                            "downscale_delay_s": 30,
                            "look_back_period_s": 1,
                        },
                        "capacity": {
                            "sizing": "utilization",
                            "service_rate_per_replica": 10,
                            "target_utilization": 1.0,
                        },
                        "replica_model": {"learn": False},
                        "forecast": {"enabled": False},
                        "max_metric_age_s": 1.5,
                    }
                ],
            }
        )
    )
    env = {**cli_env, "AUTOSCALERD_FAKE_NVML": str(nvml), "PYTHONPATH": str(REPO)}
    daemon = Daemon(config, port, env)
    try:
        daemon.wait_event("nvml_started")
        daemon.wait_event("deployment_managed")
        time.sleep(2.0)
        assert fake_ray.scale_targets() == []  # steady at 10
        script(nvml, gpus, [{"id": 1, "gpu": "GPU-3", "xid": 79}])
        heard = time.monotonic()
        daemon.wait_event("gpu_xid")
        daemon.wait_until(lambda: 11 in fake_ray.scale_targets(), "a scale-up to 11", 5.0)
        assert time.monotonic() - heard < 2.0  # within a tick of the XID's arrival
        status = daemon.wait_http("/v1/status")
        [failed] = [g for g in status["deployments"][NAME]["gpus"] if g["state"] != "healthy"]
        assert failed["gpu"] == "GPU-3" and failed["replica"] == "r3"
        assert "XID 79" in failed["reason"]
        assert "gpu_failed" in status["deployments"][NAME]["last_decision"]["reasons"]
        cost = status["deployments"][NAME]["cost"]
        assert cost["replica_hours"] > 0 and cost["static_peak_replicas"] >= 10
        _, metrics = daemon.get("/metrics")
        assert 'autoscalerd_gpus{application="llm",deployment="chat",state="failed"} 1.0' in metrics
        assert 'autoscalerd_gpu_lost_replicas{application="llm",deployment="chat"} 1.0' in metrics
    finally:
        daemon.close()


def test_remote_gpus_from_rays_node_series_and_dcgm_exporter() -> None:
    from autoscalerd.sense import gpu_series
    from autoscalerd.sense.prometheus import parse

    node = 'ip="10.0.0.2",GpuIndex="0",GpuDeviceName="NVIDIA H200",GpuUuid="GPU-r0"'
    ray_text = (
        f'ray_node_gpus_utilization{{{node},SessionName="s"}} 97.0\n'
        f"ray_node_gram_used{{{node}}} 120000.0\n"
        f"ray_node_gram_available{{{node}}} 20000.0\n"
        f"ray_node_gpu_power_milliwatts{{{node}}} 450000.0\n"
        f'ray_component_gpu_memory_mb{{{node},pid="5150",Component="ray::ServeReplica"}} 9e4\n'
        f'ray_component_gpu_memory_mb{{{node},pid="6000",Component="ray::Idle"}} 0.0\n'
    )
    dcgm = 'gpu="0",UUID="GPU-r0",device="nvidia0",modelName="NVIDIA H200",Hostname="w1"'
    dcgm_text = (
        f"DCGM_FI_DEV_XID_ERRORS{{{dcgm}}} 79\n"
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{dcgm}}} 0\n"
        f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{dcgm}}} 8\n"
        f"DCGM_FI_DEV_SM_CLOCK{{{dcgm}}} 1200\n"
        f"DCGM_FI_DEV_GPU_TEMP{{{dcgm}}} NaN\n"
    )
    track = gpu_series.GpuTrack()
    [ray] = track.update(
        gpu_series.readings_from(
            parse(ray_text, gpu_series.GPU_FAMILIES), "http://10.0.0.2:8080/metrics", 50.0
        )
    )
    assert (ray.node_ip, ray.sm_util_ratio, ray.pids) == ("10.0.0.2", 0.97, (5150,))
    assert ray.memory_total_bytes == 140000 * 2**20 and ray.power_w == 450.0
    [dcgm_gpu] = track.update(
        gpu_series.readings_from(
            parse(dcgm_text, gpu_series.GPU_FAMILIES), "http://10.0.0.2:9400/metrics", 50.0
        )
    )
    assert dcgm_gpu.temperature_c is None  # NaN is unknown, never zero
    assert dcgm_gpu.throttle == ("hw_slowdown",) and dcgm_gpu.xids == ((79, 50.0),)
    # The XID code seen again later is the same event, dated when first seen.
    [again] = track.update(
        gpu_series.readings_from(
            parse(dcgm_text, gpu_series.GPU_FAMILIES), "http://10.0.0.2:9400/metrics", 60.0
        )
    )
    assert again.xids == ((79, 50.0),) and again.hardware_throttle_since_s == 50.0
    # Ray's series name the process, DCGM's the fault: joined on the GPU's uuid.
    attributed, _ = gpu_health.attribute(
        [ray, again],
        [ReplicaPlacement("r9", 5150, "10.0.0.2")],
        frozenset({"10.0.0.1"}),
        60.0,
        30.0,
    )
    [row] = attributed
    assert (row.replica_id, row.state, row.source) == ("r9", "failed", "ray+dcgm")
    assert "XID 79" in row.reason


def test_the_cost_meter_integrates_what_runs_against_static_peak() -> None:
    from autoscalerd.cost import CostMeter

    meter = CostMeter()
    for second, running in ((0, 2), (3600, 4), (5400, None), (7200, 2)):
        meter.update(float(second), running, 4.0)
    report = meter.report()
    # 2 replicas for 1 h, then 4 for 1 h (the unknown reading holds the 4).
    assert report["replica_hours"] == 6.0 and report["gpu_hours"] == 24.0
    assert report["static_peak_replica_hours"] == 8.0 and report["static_peak_gpu_hours"] == 32.0
    assert report["saved_ratio"] == 0.25


async def test_a_failed_replica_is_stopped_once_rate_limited_when_opted_in() -> None:
    from autoscalerd_plugins.gpu_replace import ReplicaReplacer

    from autoscalerd.act.base import Actuation
    from autoscalerd.model import Decision
    from autoscalerd.sense.base import DeploymentInfo

    killed: list[str] = []
    replacer = ReplicaReplacer(killed.append, every_s=300.0)
    info = DeploymentInfo(
        name=NAME,
        replicas=(
            ReplicaPlacement("r1", 7, "10.0.0.1", actor_name="SERVE_REPLICA::llm#chat#r1"),
            ReplicaPlacement("r2", 8, "10.0.0.1", actor_name="SERVE_REPLICA::llm#chat#r2"),
        ),
    )

    def actuation(rows: tuple[tuple[str, str, str, str], ...]) -> Actuation:
        return Actuation(Decision(NAME, 0.0, 11, 10, (), gpu_replicas=rows), info)

    degraded = (("r2", "GPU-b", "degraded", "hw_slowdown"),)
    assert await replacer.replace_failed(actuation(degraded), 0.0) is None
    failed = (("r1", "GPU-a", "failed", "XID 79"), ("r2", "GPU-b", "failed", "XID 48"))
    done = await replacer.replace_failed(actuation(failed), 10.0)
    assert done is not None and "stopped r1" in done
    assert await replacer.replace_failed(actuation(failed), 20.0) is None  # rate-limited
    assert await replacer.replace_failed(actuation(failed), 400.0) is not None
    assert killed == ["SERVE_REPLICA::llm#chat#r1", "SERVE_REPLICA::llm#chat#r2"]
    replacer.close()
