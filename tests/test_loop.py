"""The control loop: one failing sensor, deployment or actuator never stops the others."""

from __future__ import annotations

from collections.abc import Sequence

from autoscalerd.act.base import Actuation, ActuationResult
from autoscalerd.clock import VirtualClock
from autoscalerd.config import Config
from autoscalerd.loop import Controller, merge_observations
from autoscalerd.model import Histogram, Observation, Reading, Reason
from autoscalerd.sense.base import DeploymentInfo, SenseResult


class StaticSensor:
    """Reports a fixed arrival rate per deployment (a rate of None: a broken deployment)."""

    name = "static"

    def __init__(self, rates_per_s: dict[str, float | None]) -> None:
        self.rates_per_s = rates_per_s

    async def sense(self, now_s: float) -> SenseResult:
        observations = {}
        for name, rate in self.rates_per_s.items():
            value = Reading(rate, now_s) if rate is not None else Reading(float("nan"), now_s)
            observations[name] = Observation(
                deployment=name, sensed_at_s=now_s, arrival_rate_per_s=value
            )
        return SenseResult(
            observations=observations,
            deployments={n: DeploymentInfo(name=n) for n in self.rates_per_s},
        )

    async def close(self) -> None:
        return None


class BrokenSensor:
    name = "broken"

    async def sense(self, now_s: float) -> SenseResult:
        raise ConnectionError("dashboard unreachable")

    async def close(self) -> None:
        return None


class RecordingActuator:
    def __init__(self, name: str, fail_for: str | None = None, crash: bool = False) -> None:
        self.name = name
        self.fail_for = fail_for
        self.crash = crash
        self.applied: dict[str, int] = {}

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        if self.crash:
            raise RuntimeError("plugin bug")
        results = []
        for actuation in actuations:
            name = actuation.decision.deployment
            if name == self.fail_for:
                results.append(
                    ActuationResult(
                        name, self.name, ok=False, error_kind="not_found", message="404"
                    )
                )
                continue
            self.applied[name] = actuation.decision.target_replicas
            results.append(
                ActuationResult(name, self.name, ok=True, applied_replicas=self.applied[name])
            )
        return results

    async def close(self) -> None:
        return None


def config() -> Config:
    return Config.model_validate(
        {
            "defaults": {
                "autoscaling": {"min_replicas": 1, "max_replicas": 50, "upscale_delay_s": 0},
                "capacity": {
                    "sizing": "utilization",
                    "service_rate_per_replica": 10,
                    "target_utilization": 1.0,
                },
                "forecast": {"enabled": False},
            },
            "http": {"enabled": False},
        }
    )


async def test_failures_stay_with_their_deployment_sensor_and_actuator() -> None:
    sensor = StaticSensor({"app/good": 95.0, "app/other": 42.0, "app/nan": None})
    good = RecordingActuator("good", fail_for="app/other")
    crashing = RecordingActuator("crashing", crash=True)
    controller = Controller(config(), [sensor, BrokenSensor()], [good, crashing], VirtualClock(0.0))
    for tick in range(1, 4):
        report = await controller.tick(float(tick))
    assert report.sensor_errors == {"broken": "ConnectionError: dashboard unreachable"}
    assert good.applied["app/good"] == 10
    assert good.applied["app/nan"] == 1  # NaN is no data: held, not crashed
    nan_decision = controller.deployments["app/nan"].last_decision
    assert nan_decision is not None and Reason.STALE_DATA in nan_decision.reasons
    assert "app/other" not in good.applied
    other = controller.deployments["app/other"]
    assert other.last_decision is not None and other.last_decision.target_replicas == 5
    assert other.last_error is not None and "not_found" in other.last_error
    kinds = {(r.actuator, r.deployment): r.error_kind for r in report.results if not r.ok}
    assert kinds[("crashing", "app/good")] == "error"
    assert controller.ticks_completed == 3


async def test_discovery_adds_deployments_unless_turned_off() -> None:
    sensor = StaticSensor({"app/a": 5.0})
    off = config().model_copy(
        update={"discovery": config().discovery.model_copy(update={"enabled": False})}
    )
    controller = Controller(off, [sensor], [], VirtualClock(0.0))
    await controller.tick(1.0)
    assert controller.deployments == {}
    controller = Controller(config(), [sensor], [], VirtualClock(0.0))
    await controller.tick(1.0)
    assert list(controller.deployments) == ["app/a"]


def test_merge_takes_the_freshest_reading_per_field() -> None:
    older = Observation(
        "d", 10.0, arrival_rate_per_s=Reading(1.0, 5.0), ongoing_requests=Reading(3.0, 9.0)
    )
    newer = Observation("d", 10.0, arrival_rate_per_s=Reading(2.0, 8.0))
    merged = merge_observations("d", 10.0, [older, newer])
    assert merged.arrival_rate_per_s == Reading(2.0, 8.0)
    assert merged.ongoing_requests == Reading(3.0, 9.0)


def test_merge_keeps_the_ticks_histograms() -> None:
    """The SLO guard counts misses and the replica model learns the prompt mix from a
    tick's histograms: the daemon's merge of its sensors must pass them to decide()."""
    waits = Histogram((0.1, 1.0), (5.0, 2.0, 1.0), 9.0)
    ttfts_old = Histogram((0.5, 1.0), (1.0, 1.0, 1.0), 4.0)
    ttfts_new = Histogram((0.5, 1.0), (7.0, 0.0, 0.0), 9.5)
    prompts = Histogram((100.0, 1000.0), (3.0, 4.0, 0.0), 9.0)
    one = Observation("d", 10.0, queue_wait_histogram=waits, ttft_histogram=ttfts_old)
    other = Observation("d", 10.0, ttft_histogram=ttfts_new, prompt_tokens_histogram=prompts)
    merged = merge_observations("d", 10.0, [one, other])
    assert merged.queue_wait_histogram == waits
    assert merged.ttft_histogram == ttfts_new  # the fresher of the two
    assert merged.prompt_tokens_histogram == prompts
    assert merged.router_wait_histogram is None
