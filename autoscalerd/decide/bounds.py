"""Stage 7: the bounds, and the rules of zero.

[min_replicas, max_replicas] always hold (an operator lowering max_replicas is obeyed even
on stale data). To zero only when min_replicas is 0 and no request arrived for
`downscale_to_zero_delay_s` (Ray's default: `downscale_delay_s`); the first request at
zero gets a replica at once, bypassing every delay.
"""

from __future__ import annotations

from autoscalerd.config import AutoscalingConfig
from autoscalerd.model import Reason


def apply_bounds(wanted: int, cfg: AutoscalingConfig) -> tuple[int, tuple[Reason, ...]]:
    if wanted < cfg.min_replicas:
        return cfg.min_replicas, (Reason.BOUNDED_MIN,)
    if wanted > cfg.max_replicas:
        return cfg.max_replicas, (Reason.BOUNDED_MAX,)
    return wanted, ()


def floor(cfg: AutoscalingConfig, quiet_since_s: float, now_s: float) -> int:
    """The lowest recommendation allowed: one replica unless scale-to-zero is due."""
    if cfg.min_replicas > 0:
        return cfg.min_replicas
    zero_delay_s = (
        cfg.downscale_to_zero_delay_s
        if cfg.downscale_to_zero_delay_s is not None
        else cfg.downscale_delay_s
    )
    return 0 if now_s - quiet_since_s >= zero_delay_s else 1
