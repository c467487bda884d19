"""Stage 8: fail static. What may stop a change the earlier stages asked for.

- Missing or stale inputs (older than `max_metric_age_s`, or anything the sensor knows of
  gone stale) hold the target: scale-up only on fresh evidence, scale-down never.
- Partial inputs (a metrics endpoint down or reading NaN within the rate window) are lower
  bounds: they may scale up, never down.
- After a start or an outage, no scale-down until a full `downscale_delay_s` of fresh data
  has been seen (`fresh_since_s` restarts after every gap).
- While the error budget burns (the SLO guard) or a latency SLO is breached, no scale-down.
- An optional cooldown after each action (not while the SLO is breached).
"""

from __future__ import annotations

from autoscalerd.config import DeploymentConfig
from autoscalerd.model import Reason


def downscale_blocker(
    fresh: bool,
    fresh_since_s: float | None,
    guarded: bool,
    cfg: DeploymentConfig,
    now_s: float,
    partial: bool = False,
) -> Reason | None:
    if guarded:
        return Reason.SLO_BREACH
    if partial:
        return Reason.PARTIAL_DATA
    if not fresh:
        return Reason.STALE_DATA
    if fresh_since_s is None or now_s - fresh_since_s < cfg.autoscaling.downscale_delay_s:
        return Reason.WARMUP
    return None


def cooling_down(
    last_action_at_s: float | None, cfg: DeploymentConfig, now_s: float, guarded: bool
) -> bool:
    if cfg.cooldown_s <= 0 or last_action_at_s is None or guarded:
        return False
    return now_s - last_action_at_s < cfg.cooldown_s
