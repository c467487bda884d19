"""`mode: ray-compatible`: Ray Serve's default policy, driven from autoscalerd's inputs.

What Ray's controller does before its policy runs, done here: ongoing plus queued
requests over `look_back_period_s`, reduced by `aggregation_function` (the mean of the
tick's samples, or their peak or trough), the running replicas, the previous target.
Then `ray_compat.ray_decide`, which reproduces Ray 2.60 tick for tick. The one rule added
on top is autoscalerd's fail-static: with the request count or the replica count missing
or stale, the target holds (Ray would decide on whatever it last heard), and with partial
metrics (an endpoint down within the window) it may rise but not fall.
"""

from __future__ import annotations

from dataclasses import replace

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide import capacity, outcome, ray_compat
from autoscalerd.model import Decision, DeploymentState, Observation, Reason

# Ray's reason words that autoscalerd's Reason enum spells differently or lacks.
_WORDS = {
    ray_compat.SCALE_FROM_ZERO: Reason.ACTIVATE_FROM_ZERO,
    ray_compat.DOWNSCALE_STUCK_STEP: Reason.STEP_LIMITED,
    ray_compat.FLOORED_AT_ONE: Reason.STEP_LIMITED,
}


def decide_ray_compatible(
    obs: Observation, state: DeploymentState, cfg: DeploymentConfig, now_s: float
) -> tuple[Decision, DeploymentState]:
    max_age_s = cfg.max_metric_age_s
    current = state.target_replicas
    ongoing = obs.fresh("ongoing_requests", now_s, max_age_s)
    queued = obs.fresh("queued_requests", now_s, max_age_s)
    running = obs.fresh("running_replicas", now_s, max_age_s)
    samples = state.ray_samples
    if ongoing is not None:
        samples = (*samples, (now_s, ongoing + (queued or 0.0)))
    # The window is open at its old end: a sample exactly look_back_period_s old has left.
    cutoff_s = now_s - cfg.autoscaling.look_back_period_s
    samples = tuple(sample for sample in samples if sample[0] > cutoff_s)
    next_state = state.with_(ray_samples=samples, last_decided_at_s=now_s)
    base = Decision(
        deployment=obs.deployment,
        decided_at_s=now_s,
        target_replicas=current,
        previous_replicas=current,
        reasons=(),
        ongoing_requests=ongoing,
        queued_requests=queued,
    )
    if ongoing is None or running is None or not samples:
        held = max(cfg.autoscaling.min_replicas, min(cfg.autoscaling.max_replicas, current))
        stale = (Reason.RAY_COMPATIBLE, Reason.STALE_DATA)
        return outcome.finish(held, stale, base, next_state, now_s)
    total = _aggregate([value for _, value in samples], cfg.autoscaling.aggregation_function)
    knobs = ray_compat.RayKnobs.from_autoscaling(cfg.autoscaling)
    target, ray_state, words = ray_compat.ray_decide(
        total, queued or 0.0, int(running), current, knobs, state.ray_policy, now_s
    )
    reasons: list[Reason] = [Reason.RAY_COMPATIBLE, Reason.CONCURRENCY]
    for word in words:
        reason = _WORDS.get(word)
        if reason is None and word in Reason._value2member_map_:
            reason = Reason(word)
        if reason is not None:
            reasons.append(reason)
    replicas_concurrency = capacity.replicas_for_concurrency(
        total, cfg.autoscaling.target_ongoing_requests
    )
    base = replace(base, replicas_concurrency=replicas_concurrency, replicas_raw=target)
    coverage = obs.metrics_coverage_ratio
    if target < current and coverage is not None and not (coverage.value >= 1.0):
        # The counts are lower bounds: what Ray would do on them is not safe to do.
        target = current
        reasons.append(Reason.PARTIAL_DATA)
    return outcome.finish(target, reasons, base, next_state.with_(ray_policy=ray_state), now_s)


def _aggregate(values: list[float], function: str) -> float:
    """Ray's `aggregation_function` over the look-back window's samples (one a tick)."""
    if function == "max":
        return max(values)
    if function == "min":
        return min(values)
    return sum(values) / len(values)
