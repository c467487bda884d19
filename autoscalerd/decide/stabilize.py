"""The knobs that turn a raw recommendation into a calm target, one visible function each.

Order matters and is the order a reader needs: smoothing (`stabilize.ema_weight`), delay
windows (`upscale_delay_s`, `downscale_delay_s`), Ray's scaling factors (a gain on the
delta, as in Ray), the step caps (`stabilize.max_step_up_ratio`,
`min_step_down_ratio`), then bounds. Each takes the current target and returns a count
plus the reasons it applied. The delays decide whether the count moves; the factors and
the caps, how far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autoscalerd.config import AutoscalingConfig, StabilizeConfig
from autoscalerd.decide import ray_compat
from autoscalerd.decide.capacity import tail
from autoscalerd.model import Reason

# Ticks jitter; a window counts as covered when its oldest sample is within this share of
# a tick of the window's start.
_COVERAGE_SLACK = 0.5


def smooth(raw_replicas: int, previous: float | None, smoothing_factor: float) -> float:
    """EMA: R_s = α·R_raw + (1−α)·R_s(t−1). Starts at the first raw value."""
    if previous is None:
        return float(raw_replicas)
    return smoothing_factor * raw_replicas + (1.0 - smoothing_factor) * previous


def apply_delays(
    current: int,
    recommendations: Sequence[tuple[float, int, int]],
    now_s: float,
    cfg: AutoscalingConfig,
    tick_s: float,
) -> tuple[int, tuple[Reason, ...]]:
    """Scale up to the minimum over `upscale_delay_s`, down to the maximum over `downscale_delay_s`.

    `recommendations` holds (time, up, down) triples, oldest first, including this tick's:
    `up` sized from the short rate, `down` from the sustained rate. A window must be
    covered by samples: after a start or an outage, missing history holds the target
    rather than counting as agreement.
    """
    _, latest_up, latest_down = recommendations[-1]
    if latest_up > current:
        in_window = _covering(recommendations, now_s, cfg.upscale_delay_s, tick_s)
        if in_window is None:
            return current, (Reason.UPSCALE_DELAYED,)
        wanted = min(up for _, up, _ in in_window)
        if wanted <= current:
            return current, (Reason.UPSCALE_DELAYED,)
        return wanted, ()
    if latest_down < current:
        in_window = _covering(recommendations, now_s, cfg.downscale_delay_s, tick_s)
        if in_window is None:
            return current, (Reason.DOWNSCALE_DELAYED,)
        wanted = max(down for _, _, down in in_window)
        if wanted >= current:
            return current, (Reason.DOWNSCALE_DELAYED,)
        return wanted, ()
    return current, ()


def _covering(
    recommendations: Sequence[tuple[float, int, int]], now_s: float, window_s: float, tick_s: float
) -> list[tuple[float, int, int]] | None:
    if window_s <= 0:
        return [recommendations[-1]]
    start_s = now_s - window_s
    if recommendations[0][0] > start_s + _COVERAGE_SLACK * tick_s:
        return None
    return list(tail(recommendations, start_s - 1e-9))


def scale_by_factors(
    current: int, wanted: int, cfg: AutoscalingConfig
) -> tuple[int, tuple[Reason, ...]]:
    """Ray's `upscaling_factor` / `downscaling_factor`, as Ray 2.60 means them: a gain on
    the delta, ceil(current + factor·(wanted − current)), the deprecated
    `upscale_smoothing_factor` / `downscale_smoothing_factor` and `smoothing_factor` as
    their fallbacks (default 1: the whole way), and Ray's one-down rule when a decrease
    rounds back to the current count. Ray's own arithmetic (`ray_compat`), applied to the
    count the delays let through. From zero there is nothing to scale (the activation
    path starts replicas at once)."""
    if wanted == current or current <= 0:
        return wanted, ()
    scaled, notes = ray_compat.apply_scaling_factors(float(wanted), current, _knobs(cfg))
    return scaled, ((Reason.STEP_LIMITED,) if notes else ())


def effective_factors(cfg: AutoscalingConfig) -> tuple[float, float]:
    """Ray's (upscaling, downscaling) factors after its fallbacks."""
    knobs = _knobs(cfg)
    return knobs.effective_upscaling_factor, knobs.effective_downscaling_factor


def _knobs(cfg: AutoscalingConfig) -> ray_compat.RayKnobs:
    # Only the factor fields: the rest of Ray's knobs (bounds, delays) are not used here.
    return ray_compat.RayKnobs(
        upscaling_factor=cfg.upscaling_factor,
        downscaling_factor=cfg.downscaling_factor,
        smoothing_factor=cfg.smoothing_factor,
        upscale_smoothing_factor=cfg.upscale_smoothing_factor,
        downscale_smoothing_factor=cfg.downscale_smoothing_factor,
    )


def limit_step(current: int, wanted: int, cfg: StabilizeConfig) -> tuple[int, tuple[Reason, ...]]:
    """At most ⌈current·max_step_up_ratio⌉ up, at least ⌊current·min_step_down_ratio⌋ down.

    Either way a step may always move by one replica, so small deployments are not stuck.
    """
    if wanted > current and cfg.max_step_up_ratio is not None:
        ceiling = max(current + 1, math.ceil(current * cfg.max_step_up_ratio))
        if wanted > ceiling:
            return ceiling, (Reason.STEP_CAPPED,)
    if wanted < current and cfg.min_step_down_ratio is not None:
        floor = min(current - 1, math.floor(current * cfg.min_step_down_ratio))
        if wanted < floor:
            return floor, (Reason.STEP_CAPPED,)
    return wanted, ()
