"""The sensor seam: anything that turns the outside world into Observations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from autoscalerd.model import Observation, Reading


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    """What the platform says about a deployment, beyond load: identity and replica shape."""

    name: str  # "app/deployment"
    app: str = ""
    deployment: str = ""
    external_scaler_enabled: bool = True
    max_ongoing_requests: int | None = None
    # Resources one replica asks for, e.g. {"CPU": 1, "GPU": 4}.
    resources_per_replica: Mapping[str, float] = field(default_factory=dict)
    # The platform's current target and when it was read: actuators compare it with what
    # they last set to notice someone else changing it (ownership conflict).
    platform_target_replicas: Reading | None = None
    # True when the sensor reads a real platform (Ray Serve): the daemon then actuates a
    # deployment only once it has read the platform's current target. A replay has no
    # platform to read.
    watches_platform: bool = False
    # Changes when the platform restarts (Ray Serve: the controller's actor id), after
    # which nothing the daemon set there is in force: actuators assert it again.
    platform_epoch: str | None = None


@dataclass(frozen=True, slots=True)
class SenseResult:
    observations: Mapping[str, Observation]
    deployments: Mapping[str, DeploymentInfo]
    # Sensor-level failure (e.g. dashboard unreachable): one line, no secrets.
    error: str | None = None


class Sensor(Protocol):
    name: str

    async def sense(self, now_s: float) -> SenseResult: ...

    async def close(self) -> None: ...
