"""The `log` actuator: records each target change as a log event and applies nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoscalerd import logs
from autoscalerd.act.base import Actuation, ActuationResult, ActuatorContext


class LogActuator:
    name = "log"

    def __init__(self, settings: Mapping[str, Any], context: ActuatorContext) -> None:
        unknown = set(settings) - {"level"}
        if unknown:
            raise ValueError(
                f"unknown setting(s) {sorted(unknown)}; the log actuator takes 'level'"
            )
        self._level = str(settings.get("level", "info"))
        self._applied: dict[str, int] = {}
        self._log = logs.get("autoscalerd.actuator.log")

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        results = []
        for actuation in actuations:
            decision = actuation.decision
            skipped = self._applied.get(decision.deployment) == decision.target_replicas
            if not skipped:
                self._applied[decision.deployment] = decision.target_replicas
                getattr(self._log, self._level)(
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
