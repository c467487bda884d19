"""Shadow recording for --dry-run: every decision is kept and reported, nothing is actuated."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from autoscalerd.act.base import Actuation, ActuationResult


class ShadowActuator:
    name = "shadow"

    def __init__(self, replaced: Sequence[str] = (), keep: int = 1000) -> None:
        self.replaced = tuple(replaced)
        self.recorded: deque[tuple[float, str, int]] = deque(maxlen=keep)
        self._last: dict[str, int] = {}

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        results = []
        for actuation in actuations:
            decision = actuation.decision
            changed = self._last.get(decision.deployment) != decision.target_replicas
            self._last[decision.deployment] = decision.target_replicas
            if changed:
                self.recorded.append(
                    (decision.decided_at_s, decision.deployment, decision.target_replicas)
                )
            results.append(
                ActuationResult(
                    deployment=decision.deployment,
                    actuator=self.name,
                    ok=True,
                    applied_replicas=decision.target_replicas,
                    skipped=not changed,
                    message="dry run: not actuated",
                )
            )
        return results

    async def close(self) -> None:
        return None
