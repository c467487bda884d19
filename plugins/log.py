"""The `log` actuator: records each target change as a log event and applies nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from autoscalerd import logs
from autoscalerd.act.base import Actuation, ActuationResult, ActuatorContext
from autoscalerd.config import plugin_settings


class LogActuatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The level of the `actuate` events.
    level: Literal["debug", "info", "warning", "error"] = "info"


class LogActuator:
    name = "log"
    settings_model = LogActuatorSettings

    def __init__(self, settings: Mapping[str, Any], context: ActuatorContext) -> None:
        self.settings = plugin_settings(LogActuatorSettings, settings)
        self._applied: dict[str, int] = {}
        log = logs.get("autoscalerd.actuator.log")
        self._emit = {
            "debug": log.debug,
            "info": log.info,
            "warning": log.warning,
            "error": log.error,
        }[self.settings.level]

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        results = []
        for actuation in actuations:
            decision = actuation.decision
            skipped = self._applied.get(decision.deployment) == decision.target_replicas
            if not skipped:
                self._applied[decision.deployment] = decision.target_replicas
                self._emit(
                    "actuate",
                    deployment=decision.deployment,
                    target_replicas=decision.target_replicas,
                )
            results.append(
                ActuationResult(
                    deployment=decision.deployment,
                    actuator=self.name,
                    ok=True,
                    applied_replicas=decision.target_replicas,
                    skipped=skipped,
                )
            )
        return results

    async def close(self) -> None:
        return None
