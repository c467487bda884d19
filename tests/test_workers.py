"""Worker nodes per group (decide/workers.py): hand-counted cases, and the count checked
against Ray's own bin packing (`get_bin_pack_residual`, a pure function of Ray's
autoscaler) on random bundles."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from autoscalerd.clock import VirtualClock
from autoscalerd.config import Config, WorkerGroupConfig
from autoscalerd.decide.workers import bundle_runs, desired_workers, merged_bundles
from autoscalerd.loop import Controller
from autoscalerd.metrics import Metrics
from autoscalerd.model import Observation, Reading
from autoscalerd.sense.base import DeploymentInfo, SenseResult
from autoscalerd.server import HealthRule, create_app

GIB = 2**30


def group(name: str, **resources: float) -> WorkerGroupConfig:
    return WorkerGroupConfig(name=name, resources_per_worker=resources)


def bounded(
    name: str, min_workers: int, max_workers: int | None, **resources: float
) -> WorkerGroupConfig:
    return WorkerGroupConfig(
        name=name, resources_per_worker=resources, min_workers=min_workers, max_workers=max_workers
    )


def test_five_four_gpu_replicas_take_three_eight_gpu_workers() -> None:
    plan = desired_workers({"llm/chat": (5, {"GPU": 4, "CPU": 1})}, [group("gpu", CPU=16, GPU=8)])
    assert plan.workers == {"gpu": 3} and plan.unplaced_replicas == 0


def test_every_resource_of_the_bundle_counts() -> None:
    # 8 GiB per replica on 32 GiB nodes: four per node by memory, though CPUs allow eight.
    needs = {"llm/embed": (9, {"CPU": 1, "memory": 8 * GIB})}
    plan = desired_workers(needs, [group("cpu", CPU=8, memory=32 * GIB)])
    assert plan.workers == {"cpu": 3}


def test_fractional_gpus_fill_a_node_exactly() -> None:
    shape = [group("gpu", GPU=1)]
    assert desired_workers({"a/b": (10, {"GPU": 0.1})}, shape).workers == {"gpu": 1}
    assert desired_workers({"a/b": (11, {"GPU": 0.1})}, shape).workers == {"gpu": 2}


def test_max_workers_caps_a_group_and_the_rest_spills_or_stays_unplaced() -> None:
    needs = {"llm/chat": (5, {"GPU": 4})}
    capped = desired_workers(needs, [bounded("gpu", 0, 2, GPU=8)])
    assert capped.workers == {"gpu": 2} and capped.unplaced_replicas == 1
    # The next group whose shape holds the bundle takes what the first cannot.
    spilled = desired_workers(needs, [bounded("small", 0, 1, GPU=4), group("large", GPU=8)])
    assert spilled.workers == {"small": 1, "large": 2} and spilled.unplaced_replicas == 0


def test_a_bundle_no_shape_holds_is_unplaced() -> None:
    plan = desired_workers({"tpu/app": (2, {"TPU": 4})}, [group("gpu", CPU=16, GPU=8)])
    assert plan.workers == {"gpu": 0} and plan.unplaced_replicas == 2


def test_min_workers_count_and_are_filled_first() -> None:
    needs = {"cpu/app": (3, {"CPU": 1})}
    plan = desired_workers(needs, [group("a", CPU=4), bounded("b", 1, None, CPU=4)])
    assert plan.workers == {"a": 0, "b": 1}
    assert desired_workers({}, [bounded("b", 2, 4, CPU=4)]).workers == {"b": 2}


def test_cpu_replicas_avoid_new_gpu_nodes_but_use_spare_cpus_on_those_counted() -> None:
    groups = [group("gpu", CPU=16, GPU=8), group("cpu", CPU=4)]
    # Alone, CPU replicas open CPU nodes though the GPU group is listed first.
    assert desired_workers({"cpu/app": (3, {"CPU": 2})}, groups).workers == {"gpu": 0, "cpu": 2}
    # With GPU replicas (packed first: more kinds of resource), they fit on the GPU node's
    # spare CPUs, as Ray's autoscaler packs them.
    needs = {"cpu/app": (3, {"CPU": 2}), "llm/chat": (2, {"GPU": 4, "CPU": 1})}
    assert desired_workers(needs, groups).workers == {"gpu": 1, "cpu": 0}


def test_the_gpu_budget_bounds_the_bundles_as_for_the_ray_autoscaler_actuator() -> None:
    needs = {"a/code": (3, {"GPU": 4}), "b/chat": (4, {"GPU": 1})}
    plan = desired_workers(needs, [group("gpu", GPU=8)], max_gpus=9)
    # a/code gets two replicas (8 GPUs), b/chat one (the ninth): two 8-GPU nodes.
    assert plan.workers == {"gpu": 2}
    assert merged_bundles(needs, max_gpus=9) == [{"GPU": 4.0}, {"GPU": 4.0}, {"GPU": 1.0}]


def test_replicas_without_resources_need_no_nodes() -> None:
    plan = desired_workers({"a/b": (4, {}), "c/d": (0, {"CPU": 1})}, [group("cpu", CPU=8)])
    assert plan.workers == {"cpu": 0} and plan.unplaced_replicas == 0


def test_an_amount_that_is_no_number_is_unknown_and_a_tiny_share_no_overflow() -> None:
    needs = {"a/nan": (3, {"GPU": float("nan")}), "b/inf": (2, {"GPU": float("inf")})}
    assert merged_bundles(needs, max_gpus=8) == []
    plan = desired_workers(needs, [group("gpu", GPU=8)])
    assert plan.workers == {"gpu": 0} and plan.unknown == ("a/nan", "b/inf")
    # 5e-324 of a GPU per replica: the budget allows them all, without an OverflowError.
    tiny = {"a/tiny": (10**9, {"GPU": 5e-324, "CPU": 1.0})}
    assert desired_workers(tiny, [group("cpu", CPU=1000, GPU=1)], max_gpus=8).workers == {
        "cpu": 1_000_000
    }


def test_counts_are_cheap_at_any_replica_count() -> None:
    started = time.monotonic()
    needs = {"big/app": (10**12, {"CPU": 1.0}), "small/app": (10**9, {"CPU": 0.001})}
    plan = desired_workers(needs, [group("cpu", CPU=8)])
    # 10**12 CPUs at 8 per node fill 125,000,000,000 nodes; the small replicas take
    # 8,000 per node on 125,000 more.
    assert plan.workers == {"cpu": 125_000_125_000}
    assert time.monotonic() - started < 0.5


def test_runs_expand_to_the_actuators_bundles() -> None:
    needs = {"b/chat": (2, {"GPU": 1.0, "CPU": 0.0}), "a/code": (1, {"GPU": 2.0, "CPU": 4.0})}
    assert bundle_runs(needs) == [({"GPU": 2.0, "CPU": 4.0}, 1), ({"GPU": 1.0}, 2)]
    assert merged_bundles(needs) == [{"GPU": 2.0, "CPU": 4.0}, {"GPU": 1.0}, {"GPU": 1.0}]


def _ray_residual(shape: Mapping[str, float], nodes: int, bundles: list[dict[str, float]]) -> int:
    from ray.autoscaler._private.resource_demand_scheduler import get_bin_pack_residual

    node_resources: list[Any] = [dict(shape) for _ in range(nodes)]
    demands: list[Any] = bundles
    unfulfilled, _ = get_bin_pack_residual(node_resources, demands)
    return len(unfulfilled)


@pytest.mark.parametrize("seed", range(40))
def test_one_group_takes_the_fewest_nodes_rays_first_fit_places_everything_on(
    seed: int,
) -> None:
    """Ray places every bundle a node can hold on our count of nodes and not on one
    fewer: the count is exactly what Ray's first-fit packing needs. Amounts are whole numbers and halves, so
    that Ray's exact arithmetic and ours agree."""
    rng = random.Random(seed)
    shape = {"CPU": float(rng.choice([4, 8, 16])), "GPU": float(rng.choice([1, 2, 4, 8]))}
    needs: dict[str, tuple[int, Mapping[str, float]]] = {}
    for index in range(rng.randint(1, 4)):
        bundle = {"CPU": rng.choice([0.5, 1.0, 2.0, 3.0])}
        if rng.random() < 0.6:
            bundle["GPU"] = rng.choice([0.5, 1.0, 2.0, shape["GPU"]])
        needs[f"app/d{index}"] = (rng.randint(1, 12), bundle)
    bundles = merged_bundles(needs)
    plan = desired_workers(needs, [WorkerGroupConfig(name="g", resources_per_worker=shape)])
    workers = plan.workers["g"]
    # What no node holds (a bundle bigger than the shape) is left over by both.
    assert _ray_residual(shape, workers, bundles) == plan.unplaced_replicas
    if workers:
        assert _ray_residual(shape, workers - 1, bundles) > plan.unplaced_replicas


# ---------------------------------------------------------------- the metric, over HTTP

NAME = "llm/chat"
TOKEN = "t0ken-for-tests"
GPU_REPLICA = {"GPU": 4.0, "CPU": 1.0}


class GpuSensor:
    """One deployment at a fixed rate whose replicas ask for 4 GPUs each; `fail` makes
    the sensor raise, `platform_read` False leaves the platform's target unread."""

    name = "serve"

    def __init__(self) -> None:
        self.fail = False
        self.platform_read = True
        self.resources: dict[str, float] = dict(GPU_REPLICA)

    async def sense(self, now_s: float) -> SenseResult:
        if self.fail:
            raise ConnectionError("dashboard unreachable")
        obs = Observation(NAME, now_s, arrival_rate_per_s=Reading(60.0, now_s))
        if self.platform_read:
            obs = replace(obs, platform_target_replicas=Reading(1.0, now_s))
        info = DeploymentInfo(
            name=NAME,
            resources_per_replica=self.resources,
            watches_platform=True,
            platform_target_replicas=Reading(1.0, now_s) if self.platform_read else None,
        )
        return SenseResult({NAME: obs}, {NAME: info})

    async def close(self) -> None:
        return None


def metric_config(*, forecast: bool, listed: bool = True) -> Config:
    deployment = {
        "name": NAME,
        # At most 4 replicas: the forecast's 60 req/s at 10 per replica asks for 6, and
        # the 2 over the target are the headroom.
        "autoscaling": {"min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 0},
        "capacity": {
            "sizing": "utilization",
            "service_rate_per_replica": 10,
            "target_utilization": 1.0,
        },
        "forecast": {"enabled": forecast, "bucket_s": 1},
    }
    return Config.model_validate(
        {
            "discovery": {"enabled": not listed},
            "http": {"token": TOKEN, "require_token_for_reads": True},
            "cluster": {
                "worker_groups": [
                    {"name": "gpu", "resources_per_worker": {"CPU": 16, "GPU": 8}},
                    {"name": "cpu", "resources_per_worker": {"CPU": 8}, "min_workers": 1},
                ]
            },
            "deployments": [deployment] if listed else [],
            "defaults": {k: v for k, v in deployment.items() if k != "name"},
        }
    )


class Daemon:
    def __init__(self, client: TestClient[Any, Any], controller: Controller) -> None:
        self.client = client
        self.controller = controller
        self.now_s = 0.0

    async def tick(self) -> None:
        self.now_s += 1.0
        self.controller.clock = VirtualClock(self.now_s)
        await self.controller.tick(self.now_s)

    async def workers(self) -> dict[str, float]:
        response = await self.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status == 200
        found = {}
        for line in (await response.text()).splitlines():
            if line.startswith("autoscalerd_desired_workers{"):
                labels, value = line.rsplit(" ", 1)
                found[labels.split('"')[1]] = float(value)
        return found


@contextlib.asynccontextmanager
async def daemon(cfg: Config, sensor: GpuSensor) -> AsyncIterator[Daemon]:
    controller = Controller(cfg, [sensor], [], VirtualClock(0.0), inline_refit=True)
    metrics = Metrics()
    controller.listeners.append(metrics.on_tick)
    async with TestClient(TestServer(create_app(controller, metrics, HealthRule()))) as client:
        yield Daemon(client, controller)


async def test_metrics_show_the_workers_for_the_target_plus_the_forecast_headroom() -> None:
    async with daemon(metric_config(forecast=True), GpuSensor()) as d:
        assert await d.workers() == {}  # before any tick: unknown, not zero
        await d.tick()
        decision = d.controller.deployments[NAME].last_decision
        assert decision is not None and decision.target_replicas == 4
        assert d.controller.deployments[NAME].headroom_replicas == 2
        # 4 + 2 replicas x 4 GPUs = 24 GPUs on 8-GPU nodes: 3; the CPU group keeps its
        # min_workers (each replica's CPU fits on the GPU nodes).
        assert await d.workers() == {"gpu": 3.0, "cpu": 1.0}


async def test_without_a_forecast_the_target_alone_is_packed() -> None:
    async with daemon(metric_config(forecast=False), GpuSensor()) as d:
        await d.tick()
        assert d.controller.deployments[NAME].headroom_replicas == 0
        assert await d.workers() == {"gpu": 2.0, "cpu": 1.0}  # 4 x 4 GPUs on 8-GPU nodes


async def test_partial_inputs_hold_the_count_and_never_lower_it() -> None:
    sensor = GpuSensor()
    # Discovered, not listed: while the sensor fails the deployment is not decided at
    # all, so a count from that tick alone would be the min_workers only.
    async with daemon(metric_config(forecast=False, listed=False), sensor) as d:
        sensor.fail = True
        await d.tick()
        assert await d.workers() == {}  # never complete yet: absent
        sensor.fail = False
        await d.tick()
        assert await d.workers() == {"gpu": 2.0, "cpu": 1.0}
        sensor.fail = True
        await d.tick()
        assert await d.workers() == {"gpu": 2.0, "cpu": 1.0}


async def test_resources_that_are_no_number_hold_the_count() -> None:
    sensor = GpuSensor()
    async with daemon(metric_config(forecast=False), sensor) as d:
        await d.tick()
        assert await d.workers() == {"gpu": 2.0, "cpu": 1.0}
        sensor.resources = {"GPU": float("nan"), "CPU": 1.0}
        await d.tick()
        assert await d.workers() == {"gpu": 2.0, "cpu": 1.0}


async def test_a_deployment_whose_platform_target_is_unread_leaves_the_count_unknown() -> None:
    sensor = GpuSensor()
    sensor.platform_read = False
    async with daemon(metric_config(forecast=False), sensor) as d:
        await d.tick()
        assert NAME in d.controller.waiting
        assert await d.workers() == {}
        sensor.platform_read = True
        await d.tick()
        assert await d.workers() == {"gpu": 2.0, "cpu": 1.0}


async def test_a_reload_without_a_group_removes_its_series() -> None:
    cfg = metric_config(forecast=False)
    async with daemon(cfg, GpuSensor()) as d:
        await d.tick()
        cluster = cfg.cluster.model_copy(update={"worker_groups": cfg.cluster.worker_groups[:1]})
        d.controller.reload(cfg.model_copy(update={"cluster": cluster}))
        await d.tick()
        assert await d.workers() == {"gpu": 2.0}
