"""No wrong scale-down: the pipeline (Controller + decide + state) under the faults that
used to remove capacity it could not see. Steady load needs 10 replicas, the platform
runs 10; none of these may ever apply fewer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from autoscalerd import state as saved_state
from autoscalerd.act.base import Actuation, ActuationResult
from autoscalerd.clock import VirtualClock
from autoscalerd.config import Config
from autoscalerd.decide import policy
from autoscalerd.loop import Controller
from autoscalerd.model import Observation, Reading, Reason
from autoscalerd.sense.base import DeploymentInfo, SenseResult

NAME = "llm/chat"
RATE_FOR_10 = 95.0  # μ = 10 per replica at ρ = 1: ten replicas


def config(**autoscaling: float) -> Config:
    return Config.model_validate(
        {
            "discovery": {"enabled": False},
            "http": {"enabled": False},
            "deployments": [
                {
                    "name": NAME,
                    "autoscaling": {
                        "min_replicas": 1,
                        "max_replicas": 50,
                        "upscale_delay_s": 0,
                        "downscale_delay_s": 20,
                        "look_back_period_s": 5,
                        **autoscaling,
                    },
                    "capacity": {
                        "sizing": "utilization",
                        "service_rate_per_replica": 10,
                        "target_utilization": 1.0,
                    },
                    "forecast": {"enabled": False},
                    "max_metric_age_s": 5,
                }
            ],
        }
    )


@dataclass
class Platform:
    """A scripted Serve: what it runs, what the sensor says, what the actuator does."""

    replicas: int = 10
    rate_per_s: float = RATE_FOR_10
    answering: bool = True  # False: the sensor's round has not answered yet
    actuator_up: bool = True
    applied: list[int] = field(default_factory=list)


class PlatformSensor:
    name = "platform"

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    async def sense(self, now_s: float) -> SenseResult:
        p = self.platform
        if not p.answering:
            return SenseResult({}, {}, error="no answer yet from the dashboard")
        target = Reading(float(p.replicas), now_s)
        obs = Observation(
            deployment=NAME,
            sensed_at_s=now_s,
            arrival_rate_per_s=Reading(p.rate_per_s, now_s),
            running_replicas=target,
            starting_replicas=Reading(0.0, now_s),
            platform_target_replicas=target,
        )
        info = DeploymentInfo(
            name=NAME, app="llm", deployment="chat", platform_target_replicas=target
        )
        return SenseResult({NAME: obs}, {NAME: info})

    async def close(self) -> None:
        return None


class PlatformActuator:
    name = "platform"

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        out = []
        for actuation in actuations:
            target = actuation.decision.target_replicas
            if not self.platform.actuator_up:
                out.append(ActuationResult(NAME, self.name, ok=False, error_kind="unavailable"))
                continue
            self.platform.applied.append(target)
            self.platform.replicas = target
            out.append(ActuationResult(NAME, self.name, ok=True, applied_replicas=target))
        return out

    async def close(self) -> None:
        return None


def controller(platform: Platform, cfg: Config | None = None) -> Controller:
    return Controller(
        cfg or config(),
        [PlatformSensor(platform)],
        [PlatformActuator(platform)],
        VirtualClock(0.0),
    )


async def test_no_actuation_before_the_platform_target_has_been_seen() -> None:
    platform = Platform()
    daemon = controller(platform)
    platform.answering = False  # a slow first round: the node list takes 2 s
    for tick in range(1, 4):
        await daemon.tick(float(tick))
    assert platform.applied == []
    assert NAME in daemon.waiting
    platform.answering = True
    for tick in range(4, 40):
        await daemon.tick(float(tick))
    assert platform.applied and min(platform.applied) == 10
    assert NAME not in daemon.waiting


async def test_a_restored_state_never_lowers_the_platform_without_a_full_window() -> None:
    # Saved while 5 replicas were enough and the down window said so, one second ago.
    cfg = config()
    dep = cfg.deployment(NAME)
    quiet = policy.initial_state(dep, 0.0, 5)
    for second in range(1, 60):
        obs = Observation(NAME, float(second), arrival_rate_per_s=Reading(45.0, float(second)))
        _, quiet = policy.decide(obs, quiet, dep, float(second))
    assert quiet.target_replicas == 5 and quiet.fresh_since_s is not None
    platform = Platform(replicas=10, rate_per_s=45.0)  # scaled up since, by someone
    daemon = controller(platform, cfg)
    daemon.restored = {NAME: saved_state.SavedDeployment(saved_at_s=59.0, state=quiet)}
    for tick in range(60, 60 + 19):
        await daemon.tick(float(tick))
    assert min(platform.applied, default=10) == 10  # not 5, not before 20 s of fresh data
    decision = daemon.deployments[NAME].last_decision
    assert decision is not None and Reason.WARMUP in decision.reasons


def test_a_gap_in_the_ticks_restarts_the_downscale_window() -> None:
    dep = config().deployment(NAME)
    state = policy.initial_state(dep, 0.0, 10)
    for second in range(1, 40):
        obs = Observation(NAME, float(second), arrival_rate_per_s=Reading(95.0, float(second)))
        decision, state = policy.decide(obs, state, dep, float(second))
    assert decision.target_replicas == 10
    # The process was frozen for 60 s (longer than downscale_delay_s), then one low reading.
    low = Observation(NAME, 100.0, arrival_rate_per_s=Reading(5.0, 100.0))
    decision, state = policy.decide(low, state, dep, 100.0)
    assert decision.target_replicas == 10
    assert Reason.WARMUP in decision.reasons
    # A full window of fresh low readings after the gap does scale down.
    for second in range(101, 125):
        obs = Observation(NAME, float(second), arrival_rate_per_s=Reading(5.0, float(second)))
        decision, state = policy.decide(obs, state, dep, float(second))
    assert decision.target_replicas == 1


async def test_steps_are_not_compounded_on_a_target_that_never_landed() -> None:
    platform = Platform(rate_per_s=195.0)  # needs 20
    platform.actuator_up = False
    # Ray's gain on the delta: ceil(10 + 0.2·(20 − 10)) = 12 from the 10 running.
    daemon = controller(platform, config(upscaling_factor=0.2))
    for tick in range(1, 8):
        await daemon.tick(float(tick))
    decision = daemon.deployments[NAME].last_decision
    assert decision is not None
    # Every tick steps from the 10 that run, never from the 12 that were only asked for.
    assert decision.previous_replicas == 10 and decision.target_replicas == 12
    platform.actuator_up = True
    await daemon.tick(8.0)
    assert platform.applied == [12]


def test_partial_metrics_scale_up_but_never_down() -> None:
    dep = config().deployment(NAME)
    state = policy.initial_state(dep, 0.0, 10)

    def at(second: float, rate: float, coverage: float) -> Observation:
        return Observation(
            NAME,
            second,
            arrival_rate_per_s=Reading(rate, second),
            metrics_coverage_ratio=Reading(coverage, second),
        )

    for second in range(1, 40):
        decision, state = policy.decide(at(second, 95.0, 1.0), state, dep, float(second))
    # One of two nodes is down: half the arrivals are seen, for longer than the window.
    for second in range(40, 80):
        decision, state = policy.decide(at(second, 47.0, 0.5), state, dep, float(second))
        assert decision.target_replicas == 10
    assert Reason.PARTIAL_DATA in decision.reasons
    # A rise seen through the half that answers still scales up.
    decision, state = policy.decide(at(80, 150.0, 0.5), state, dep, 80.0)
    assert decision.target_replicas == 15


async def test_conflicts_and_waiting_deployments_are_surfaced() -> None:
    from autoscalerd.metrics import Metrics
    from autoscalerd.server import _deployment_status

    class Reasserting(PlatformActuator):
        async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
            return [
                ActuationResult(
                    NAME,
                    self.name,
                    ok=True,
                    applied_replicas=a.decision.target_replicas,
                    conflict=True,
                    message="target changed to 5 by someone else; setting it again",
                )
                for a in actuations
            ]

    platform = Platform()
    daemon = Controller(
        config(), [PlatformSensor(platform)], [Reasserting(platform)], VirtualClock(0.0)
    )
    metrics = Metrics()
    daemon.listeners.append(metrics.on_tick)
    platform.answering = False
    await daemon.tick(1.0)
    assert daemon.waiting == {NAME: "no sensor has reported it yet"}
    platform.answering = True
    for tick in range(2, 5):
        await daemon.tick(float(tick))
    runtime = daemon.deployments[NAME]
    status = _deployment_status(runtime, 4.0)["conflicts"]
    assert status["count"] == 3 and "someone else" in status["last"]
    text = metrics.exposition().decode()
    assert (
        'autoscalerd_ownership_conflicts_total{actuator="platform",application="llm",'
        'deployment="chat"} 3.0' in text
    )


async def test_a_deployment_named_dot_dot_never_reaches_another_url() -> None:
    from autoscalerd_plugins.ray_serve import RayServeActuator

    from autoscalerd.act.base import ActuatorContext
    from autoscalerd.model import Decision

    actuator = RayServeActuator({}, ActuatorContext(config=config()))
    try:
        for app, dep in ((".", "chat"), ("llm", ".."), ("..", "..")):
            decision = Decision(f"{app}/{dep}", 1.0, 3, 1, ())
            info = DeploymentInfo(name=f"{app}/{dep}", app=app, deployment=dep)
            [result] = await actuator.apply([Actuation(decision=decision, info=info)])
            assert not result.ok and result.error_kind == "bad_request"
        assert actuator.calls == 0
    finally:
        await actuator.close()


def test_ticks_longer_than_max_metric_age_are_not_gaps() -> None:
    dep = config(downscale_delay_s=120, look_back_period_s=30).deployment(NAME)
    state = policy.initial_state(dep, 0.0, 10)
    decision = None
    for minute in range(1, 8):  # one tick a minute, max_metric_age_s 5
        at = 60.0 * minute
        obs = Observation(NAME, at, arrival_rate_per_s=Reading(5.0, at))
        decision, state = policy.decide(obs, state, dep, at)
    assert decision is not None and decision.target_replicas == 1


@pytest.mark.parametrize("tokens_seconds", [(0.0, 5.0), (1e14, 1e-12), (1e-300, 1e3)])
def test_learned_prefill_of_no_or_absurd_speed_is_bounded(
    tokens_seconds: tuple[float, float],
) -> None:
    from autoscalerd.decide.forgetting import Sums
    from autoscalerd.decide.replica_model import ReplicaModelState

    dep = config().deployment(NAME)
    state = policy.initial_state(dep, 0.0, 3).with_(
        replica_model=ReplicaModelState(prefill=Sums(tokens_seconds, 10, 0.0))
    )
    obs = Observation(
        NAME,
        1.0,
        arrival_rate_per_s=Reading(20.0, 1.0),
        running_replicas=Reading(3.0, 1.0),
        starting_replicas=Reading(0.0, 1.0),
    )
    decision, _ = policy.decide(obs, state, dep, 1.0)
    assert decision.target_replicas >= 1
