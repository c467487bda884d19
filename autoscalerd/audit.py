"""The operator's audit trail: who paused, resumed or overrode a deployment, why, when,
and until when. Kept with the deployment, shown in /v1/status and saved with the state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Actions kept per deployment: enough to see the last incident's sequence of steps.
HISTORY_KEPT = 10
# Who ends a pause or an override whose time is up.
EXPIRY_BY = "autoscalerd"


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """One pause, resume, override, or the expiry of one. Times are on the daemon's clock
    (trace time under replay)."""

    action: str  # "pause", "resume", "override" or "expire"
    by: str  # the name the client gave, else the token's label
    reason: str
    at_s: float
    until_s: float | None = None  # when a pause or override ends by itself; None: at resume
    replicas: int | None = None  # an override's target, after clipping to the bounds

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "by": self.by,
            "reason": self.reason,
            "at_s": self.at_s,
            "until_s": self.until_s,
            "replicas": self.replicas,
        }


def appended(
    history: tuple[OperatorAction, ...], action: OperatorAction
) -> tuple[OperatorAction, ...]:
    """`history` with `action` last, cut to the newest HISTORY_KEPT."""
    return (*history, action)[-HISTORY_KEPT:]
