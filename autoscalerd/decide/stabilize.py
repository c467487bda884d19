"""The knobs that turn a raw recommendation into a calm target, one visible function each.

Order matters and is the order a reader needs: smoothing, delay windows, step limits,
bounds. Each takes the current target and returns a count plus the reasons it applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autoscalerd.config import AutoscalingConfig
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


def limit_step(current: int, wanted: int, cfg: AutoscalingConfig) -> tuple[int, tuple[Reason, ...]]:
    """At most ⌈current·upscaling_factor⌉ up, at least ⌊current·downscaling_factor⌋ down.

    Either way a step may always move by one replica, so small deployments are not stuck.
    """
    if wanted > current and cfg.upscaling_factor is not None:
        ceiling = max(current + 1, math.ceil(current * cfg.upscaling_factor))
        if wanted > ceiling:
            return ceiling, (Reason.STEP_LIMITED,)
    if wanted < current and cfg.downscaling_factor is not None:
        floor = min(current - 1, math.floor(current * cfg.downscaling_factor))
        if wanted < floor:
            return floor, (Reason.STEP_LIMITED,)
    return wanted, ()
