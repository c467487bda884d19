"""The last step of every decision, in either mode: the direction, the final values, and
the state's new target (with the time of the action)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autoscalerd.model import Decision, DeploymentState, Reason


def finish(
    target: int,
    reasons: Sequence[Reason],
    base: Decision,
    next_state: DeploymentState,
    now_s: float,
    smoothed: float | None = None,
) -> tuple[Decision, DeploymentState]:
    current = next_state.target_replicas
    if target > current:
        direction = Reason.SCALE_UP
    elif target < current:
        direction = Reason.SCALE_DOWN
    else:
        direction = Reason.STEADY
    decision = replace(
        base,
        target_replicas=target,
        reasons=tuple(dict.fromkeys((*reasons, direction))),
        replicas_smoothed=smoothed,
        replicas_stabilized=target,
    )
    if target != current:
        next_state = next_state.with_(target_replicas=target, last_action_at_s=now_s)
    return decision, next_state
