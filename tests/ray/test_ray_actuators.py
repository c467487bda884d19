"""The ray_serve and ray_autoscaler actuators against the real cluster."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest
from autoscalerd_plugins.ray_autoscaler import RayAutoscalerActuator, merged_bundles
from autoscalerd_plugins.ray_serve import RayServeActuator

from autoscalerd.act.base import Actuation, ActuatorContext
from autoscalerd.emulator.cluster import LocalCluster
from autoscalerd.model import Decision, Reading
from autoscalerd.sense.base import DeploymentInfo
from tests.ray.ray_helpers import (
    LLM,
    PLAIN,
    cluster_config,
    free_port,
    scale,
    target_replicas,
    wait_for,
)


def actuation(
    name: str,
    target: int,
    platform: int | None = None,
    resources: Mapping[str, float] | None = None,
    headroom: int = 0,
) -> Actuation:
    app, dep = name.split("/", 1)
    decision = Decision(
        deployment=name,
        decided_at_s=time.time(),
        target_replicas=target,
        previous_replicas=platform if platform is not None else target,
        reasons=(),
    )
    info = DeploymentInfo(
        name=name,
        app=app,
        deployment=dep,
        resources_per_replica=dict(resources or {}),
        platform_target_replicas=(
            Reading(float(platform), time.time()) if platform is not None else None
        ),
    )
    return Actuation(decision=decision, info=info, headroom_replicas=headroom)


def serve_actuator(
    cluster: LocalCluster, url: str | None = None, **settings: object
) -> RayServeActuator:
    return RayServeActuator(settings, ActuatorContext(config=cluster_config(cluster, url)))


async def test_scales_and_is_idempotent(llm_at_one: LocalCluster) -> None:
    actuator = serve_actuator(llm_at_one)
    try:
        [result] = await actuator.apply([actuation(LLM, 2, platform=1)])
        assert result.ok and result.applied_replicas == 2 and not result.skipped, result
        assert target_replicas(llm_at_one, LLM) == 2
        calls = actuator.calls
        # Same target again, the platform (read after our call) agreeing: no request.
        [again] = await actuator.apply([actuation(LLM, 2, platform=2)])
        [unknown] = await actuator.apply([actuation(LLM, 2)])
        assert again.ok and again.skipped and unknown.skipped
        assert actuator.calls == calls
        # The platform already at the target: nothing to send, even the first time.
        fresh = serve_actuator(llm_at_one)
        [noop] = await fresh.apply([actuation(LLM, 2, platform=2)])
        assert noop.skipped and fresh.calls == 0
        await fresh.close()
    finally:
        await actuator.close()


async def test_not_enabled_app_is_a_clear_412_and_others_still_scale(
    llm_at_one: LocalCluster,
) -> None:
    actuator = serve_actuator(llm_at_one)
    try:
        plain, llm = await actuator.apply(
            [actuation(PLAIN, 2, platform=1), actuation(LLM, 2, platform=1)]
        )
        assert not plain.ok and plain.error_kind == "not_enabled"
        assert "412" in plain.message and "external_scaler_enabled" in plain.message
        assert "\n" not in plain.message
        assert llm.ok and llm.applied_replicas == 2
        assert target_replicas(llm_at_one, PLAIN) == 1
        # A rejection is not re-sent every tick for the same target.
        calls = actuator.calls
        [repeat] = await actuator.apply([actuation(PLAIN, 2, platform=1)])
        assert repeat.error_kind == "not_enabled" and actuator.calls == calls
    finally:
        await actuator.close()


async def test_unknown_deployment_is_404(ray_cluster: LocalCluster) -> None:
    actuator = serve_actuator(ray_cluster)
    try:
        [result] = await actuator.apply([actuation("llm/NoSuchDeployment", 1)])
        [app] = await actuator.apply([actuation("nosuchapp/LlmReplica", 1)])
    finally:
        await actuator.close()
    assert result.error_kind == "not_found" and "404" in result.message
    assert app.error_kind == "not_found"


@pytest.mark.parametrize("token", ["wrong-token", None])
async def test_token_problems_are_auth_errors(
    ray_cluster: LocalCluster, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    config = cluster_config(ray_cluster, token=token, token_file="/nonexistent/token")
    actuator = RayServeActuator({}, ActuatorContext(config=config))
    try:
        [result] = await actuator.apply([actuation(LLM, 3, platform=1)])
    finally:
        await actuator.close()
    assert not result.ok and result.error_kind == "auth"
    assert ("403" if token else "401") in result.message
    assert "wrong-token" not in result.message and ray_cluster.token not in result.message
    assert actuator.calls == 1, "an auth error is not retried"


async def test_dead_port_retries_with_backoff_then_reports(ray_cluster: LocalCluster) -> None:
    actuator = serve_actuator(
        ray_cluster, f"http://127.0.0.1:{free_port()}", max_attempts=3, deadline_s=1.5
    )
    started = time.monotonic()
    try:
        [result] = await actuator.apply([actuation(LLM, 2, platform=1)])
    finally:
        await actuator.close()
    elapsed_s = time.monotonic() - started
    assert result.error_kind == "unavailable" and "connection refused" in result.message
    assert actuator.calls == 3
    assert 0.1 < elapsed_s < 2.0, "backed off between attempts, within the deadline"


async def test_ownership_conflict_is_reported(llm_at_one: LocalCluster) -> None:
    actuator = serve_actuator(llm_at_one)
    pausing = serve_actuator(llm_at_one, on_conflict="pause")
    try:
        [first] = await actuator.apply([actuation(LLM, 2, platform=1)])
        assert first.ok
        scale(llm_at_one, LLM, 3, wait_s=0)  # someone else
        # What the sensor reads next: 3, after our call.
        [result] = await actuator.apply([actuation(LLM, 2, platform=3)])
        assert result.ok and result.conflict
        assert "someone else" in result.message and "autoscalerd set 2" in result.message
        assert target_replicas(llm_at_one, LLM) == 2, "reasserted, and said so"

        [mine] = await pausing.apply([actuation(LLM, 2, platform=2)])
        scale(llm_at_one, LLM, 3, wait_s=0)
        calls = pausing.calls
        [paused] = await pausing.apply([actuation(LLM, 2, platform=3)])
        assert not paused.ok and paused.conflict and paused.error_kind == "conflict"
        assert pausing.calls == calls and target_replicas(llm_at_one, LLM) == 3
        assert mine.skipped
    finally:
        await actuator.close()
        await pausing.close()


def test_bundles_merge_every_deployment_and_respect_the_gpu_budget() -> None:
    needs = {
        "b/chat": (2, {"GPU": 1.0, "CPU": 0.0}),
        "a/code": (1, {"GPU": 2.0, "CPU": 4.0}),
        "c/cpu-only": (3, {}),
    }
    assert merged_bundles(needs) == [
        {"GPU": 2.0, "CPU": 4.0},
        {"GPU": 1.0},
        {"GPU": 1.0},
    ]
    assert merged_bundles(needs, max_gpus=3) == [{"GPU": 2.0, "CPU": 4.0}, {"GPU": 1.0}]


async def test_node_actuator_brings_gpu_nodes_and_lets_them_go(llm_at_one: LocalCluster) -> None:
    """Headroom alone (no replica asks yet) must make Ray's autoscaler add GPU nodes."""
    config = cluster_config(llm_at_one)
    actuator = RayAutoscalerActuator({"call_timeout_s": 30}, ActuatorContext(config=config))
    gpu = {"GPU": 1.0}
    try:
        # Start from the one GPU node llm's single replica needs (earlier tests may leave
        # idle nodes that Ray's autoscaler has not yet removed).
        wait_for(lambda: llm_at_one.gpu_nodes() == 1, 120, 1.0, "a single GPU node")
        [result] = await actuator.apply([actuation("headroom/test", 0, resources=gpu, headroom=3)])
        assert result.ok and result.applied_replicas == 3, result
        wait_for(lambda: llm_at_one.gpu_nodes() >= 3, 90, 1.0, "three GPU nodes")
        [same] = await actuator.apply([actuation("headroom/test", 0, resources=gpu, headroom=3)])
        assert same.skipped
        [cleared] = await actuator.apply([actuation("headroom/test", 0, resources=gpu)])
        assert cleared.ok and not cleared.skipped
        wait_for(lambda: llm_at_one.gpu_nodes() == 1, 120, 1.0, "headroom GPU nodes gone")
    finally:
        await actuator.close()
