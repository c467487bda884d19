"""The actuator seam: plugins that apply decisions to the world."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autoscalerd.model import Decision
from autoscalerd.sense.base import DeploymentInfo


@dataclass(frozen=True, slots=True)
class Actuation:
    """One deployment's decision as handed to actuators."""

    decision: Decision
    info: DeploymentInfo | None
    # Replicas the forecast's upper bound asks for over the node lead time (headroom).
    headroom_replicas: int = 0


@dataclass(frozen=True, slots=True)
class ActuationResult:
    deployment: str
    actuator: str
    ok: bool
    applied_replicas: int | None = None
    # None when ok; else a short kind: "not_found", "not_enabled", "bad_request",
    # "unavailable", "auth", "timeout", "conflict", "error".
    error_kind: str | None = None
    message: str = ""
    skipped: bool = False  # idempotent no-op: nothing to change
    conflict: bool = False  # someone else changed the target since we last set it


@dataclass(frozen=True, slots=True)
class ActuatorContext:
    """What a plugin may need from the daemon at construction."""

    config: Any  # autoscalerd.config.Config
    dry_run: bool = False


class Actuator(Protocol):
    name: str

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]: ...

    async def close(self) -> None: ...


class ActuatorFactory(Protocol):
    def __call__(self, settings: Mapping[str, Any], context: ActuatorContext) -> Actuator: ...
