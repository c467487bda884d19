"""Stage 1: the fresh inputs of one tick and the arrival rate in its two views.

The short view (the last tick, or `reactive_window_s`) is the scale-up evidence; the mean
over `look_back_period_s` is the scale-down evidence. Missing input is a gap in the
window, never a zero, and a tick without a fresh rate has no rate at all: the window's
older samples were fresh once, and sizing on them now would act on stale data. The run
of fresh data that allows a scale-down (`fresh_since_s`) restarts after any gap: in the
inputs, or in the ticks themselves (a paused process, a clock step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, pstdev

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide import capacity
from autoscalerd.model import DeploymentState, Observation

# What the platform reports must be fresh too: fresh load next to a stale replica count is
# not a picture to scale down on.
_WATCHED = (
    "arrival_rate_per_s",
    "ongoing_requests",
    "queued_requests",
    "running_replicas",
    "platform_target_replicas",
)


@dataclass(frozen=True, slots=True)
class Rates:
    arrival_rate_per_s: float | None  # this tick
    rate_obs_per_s: float | None  # mean over look_back_period_s
    rate_short_per_s: float | None  # mean over reactive_window_s (0: this tick)
    # The scale-down evidence: the look-back mean less the noise in its excess (_down_rate).
    rate_down_per_s: float | None
    ongoing: float | None
    queued: float | None
    stale: tuple[str, ...]  # inputs the sensor knows of but that are too old
    # Some metrics endpoints did not answer (or answered NaN) within the window: the
    # rates are lower bounds, evidence to scale up on, never down.
    partial: bool
    tick_interval_s: float | None  # the usual seconds between decisions
    fresh: bool  # the primary input is fresh, complete, and nothing watched is stale
    fresh_since_s: float | None
    last_arrival_at_s: float | None
    rate_samples: tuple[tuple[float, float], ...]


def observe(obs: Observation, state: DeploymentState, cfg: DeploymentConfig, now_s: float) -> Rates:
    a = cfg.autoscaling
    max_age_s = cfg.max_metric_age_s
    arrivals = obs.fresh("arrival_rate_per_s", now_s, max_age_s)
    ongoing = obs.fresh("ongoing_requests", now_s, max_age_s)
    queued = obs.fresh("queued_requests", now_s, max_age_s)
    stale = tuple(
        name
        for name in _WATCHED
        if getattr(obs, name) is not None and obs.fresh(name, now_s, max_age_s) is None
    )
    samples = state.rate_samples
    if arrivals is not None:
        samples = (*samples, (now_s, arrivals))
    samples = capacity.window(
        samples,
        now_s,
        max(a.look_back_period_s, a.downscale_delay_s, cfg.capacity.reactive_window_s),
    )
    rate_obs = capacity.mean_rate(samples, now_s, a.look_back_period_s)
    rate_short = capacity.mean_rate(samples, now_s, cfg.capacity.reactive_window_s)
    rate_down = _down_rate(samples, now_s, a.look_back_period_s, a.downscale_delay_s)
    if arrivals is None:
        rate_obs = rate_short = rate_down = None
    last_arrival_at_s = state.last_arrival_at_s
    if (arrivals or 0.0) > 0 or (ongoing or 0.0) + (queued or 0.0) > 0:
        last_arrival_at_s = now_s
    coverage = obs.fresh("metrics_coverage_ratio", now_s, max_age_s)
    partial = obs.metrics_coverage_ratio is not None and (coverage is None or coverage < 1.0)
    fresh = arrivals is not None and not stale and not partial
    # A gap in the ticks themselves (the process paused, the clock stepped) longer than data
    # stays fresh is an outage too: nothing was watched meanwhile, so the run restarts.
    # (Longer than three ticks too: a tick longer than max_metric_age_s is no gap.)
    interval_s = now_s - state.last_decided_at_s if state.last_decided_at_s is not None else None
    usual_s = state.tick_interval_s or 0.0
    # The first interval sets the usual one; only later ones can be gaps.
    gap = bool(usual_s) and interval_s is not None and interval_s > max(max_age_s, 3.0 * usual_s)
    if interval_s is not None and interval_s > 0 and not gap:
        usual_s = interval_s
    since_s = state.fresh_since_s if not gap else None
    fresh_since_s = (since_s if since_s is not None else now_s) if fresh else None
    return Rates(
        arrival_rate_per_s=arrivals,
        rate_obs_per_s=rate_obs,
        rate_short_per_s=rate_short,
        rate_down_per_s=rate_down,
        ongoing=ongoing,
        queued=queued,
        stale=stale,
        partial=partial,
        tick_interval_s=usual_s or None,
        fresh=fresh,
        fresh_since_s=fresh_since_s,
        last_arrival_at_s=last_arrival_at_s,
        rate_samples=samples,
    )


def _down_rate(
    samples: Sequence[tuple[float, float]], now_s: float, look_back_s: float, window_s: float
) -> float | None:
    """The rate a scale-down is sized for: the look-back mean, its excess over the mean of
    the downscale window less what noise explains.

    A scale-down goes to the most any tick of its window asked for, and each tick asks
    for its look-back mean: on steady traffic that is the largest of n = window ÷
    look-back noisy means, about √(2·ln n) standard errors above the level (2.1 for Ray's
    30 s in 300 s), paid in replicas all day. So the excess of a look-back mean over the
    window's mean counts only beyond √(2·ln n) standard errors (the per-tick rates'
    spread over the window, over √ticks in the look-back). A mean at or below the
    window's is taken as it is: a fall in load is released as the window allows, never
    sooner; a rise keeps what noise cannot explain, and the scale-up evidence sees it
    whole.
    """
    recent = [rate for _, rate in capacity.tail(samples, now_s - look_back_s)]
    if not recent:
        return None
    rate = fmean(recent)
    spanning = [rate for _, rate in capacity.tail(samples, now_s - window_s)]
    level = fmean(spanning)
    if rate <= level or len(spanning) <= len(recent):
        return rate
    windows = len(spanning) / len(recent)
    noise = pstdev(spanning) / math.sqrt(len(recent))
    return max(level, rate - math.sqrt(2.0 * math.log(windows)) * noise)
