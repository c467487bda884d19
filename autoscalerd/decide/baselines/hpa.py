"""The Kubernetes HorizontalPodAutoscaler (autoscaling/v2) on ongoing requests per replica.

Follows `pkg/controller/podautoscaler`: the replica calculator's `calcPlainMetricReplicas`
(usage ratio against an average-value target, a tolerance, and the rule for pods without
metrics), then `stabilizeRecommendationWithBehaviors` and
`convertDesiredReplicasWithBehaviorRate` with the default behaviour: scale-down
stabilisation over 300 s using the highest recommendation, scale-up at most
max(100 %, 4 pods) per 15 s, scale-down at most 100 % per 15 s. The controller syncs
every 15 s.

Mapping to a Ray Serve deployment: a replica that is still starting is a pod whose metrics
endpoint is not up yet (a "missing" pod), and `spec.replicas` is the platform's target.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from autoscalerd.decide.baselines.base import Bounds, value
from autoscalerd.model import Observation


@dataclass(frozen=True, slots=True)
class HpaSettings:
    target_ongoing_requests: float = 12.0  # the metric's target averageValue per pod
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_up_stabilization_s: float = 0.0
    scale_down_stabilization_s: float = 300.0
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0
    scale_down_period_s: float = 15.0


class HpaPolicy:
    name = "hpa"

    def __init__(self, bounds: Bounds, initial_replicas: int, settings: HpaSettings) -> None:
        self._bounds = bounds
        self._settings = settings
        self._target = bounds.clip(initial_replicas)
        self._last_sync_s: float | None = None
        self._recommendations: deque[tuple[float, int]] = deque()
        self._scale_up_events: deque[tuple[float, int]] = deque()
        self._scale_down_events: deque[tuple[float, int]] = deque()

    def step(self, obs: Observation, now_s: float) -> int:
        s = self._settings
        if self._last_sync_s is not None and now_s - self._last_sync_s < s.sync_period_s - 1e-9:
            return self._target
        if self._last_sync_s is None and s.scale_down_stabilization_s > 0:
            # maybeInitScaleDownStabilizationWindow: a fresh controller remembers the
            # current size, so it does not scale down on its first look.
            self._recommendations.append((now_s, self._target))
        self._last_sync_s = now_s
        current = self._target
        desired = self._replica_count(obs, current)
        if desired is None:
            return current
        stabilized = self._stabilize(current, desired, now_s)
        final = self._limit_rate(current, stabilized, now_s)
        if final != current:
            events = self._scale_up_events if final > current else self._scale_down_events
            events.append((now_s, abs(final - current)))
        self._target = final
        return final

    def _replica_count(self, obs: Observation, current: int) -> int | None:
        """calcPlainMetricReplicas with AverageValue target; None when no pod has metrics."""
        s = self._settings
        ready = int(value(obs, "running_replicas"))
        missing = int(value(obs, "starting_replicas"))
        if ready <= 0 or obs.ongoing_requests is None:
            return None  # "did not receive metrics for targeted pods": hold
        total = value(obs, "ongoing_requests")
        usage_ratio = (total / ready) / s.target_ongoing_requests
        if missing == 0:
            if abs(1.0 - usage_ratio) <= s.tolerance:
                return current
            return math.ceil(usage_ratio * ready)
        # Missing pods count as using the target on a scale-down, nothing on a scale-up.
        filled = total + (missing * s.target_ongoing_requests if usage_ratio < 1.0 else 0.0)
        pods = ready + missing
        new_ratio = (filled / pods) / s.target_ongoing_requests
        if (
            abs(1.0 - new_ratio) <= s.tolerance
            or (usage_ratio > 1.0 and new_ratio < 1.0)
            or (usage_ratio < 1.0 and new_ratio > 1.0)
        ):
            return current
        replicas = math.ceil(new_ratio * pods)
        if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
            return current
        return replicas

    def _stabilize(self, current: int, desired: int, now_s: float) -> int:
        """stabilizeRecommendationWithBehaviors: up to the window's min, down to its max."""
        s = self._settings
        up_cutoff_s = now_s - s.scale_up_stabilization_s
        down_cutoff_s = now_s - s.scale_down_stabilization_s
        up = down = desired
        for at_s, recommendation in self._recommendations:
            if at_s > up_cutoff_s:
                up = min(up, recommendation)
            if at_s > down_cutoff_s:
                down = max(down, recommendation)
        oldest_s = min(up_cutoff_s, down_cutoff_s)
        while self._recommendations and self._recommendations[0][0] <= oldest_s:
            self._recommendations.popleft()
        self._recommendations.append((now_s, desired))
        recommendation = current
        if recommendation < up:
            recommendation = up
        if recommendation > down:
            recommendation = down
        return recommendation

    def _limit_rate(self, current: int, desired: int, now_s: float) -> int:
        """convertDesiredReplicasWithBehaviorRate with selectPolicy Max, and the bounds."""
        s = self._settings
        bounds = self._bounds
        if desired > current:
            start = (
                current
                - _changed_within(self._scale_up_events, now_s, s.scale_up_period_s)
                + _changed_within(self._scale_down_events, now_s, s.scale_up_period_s)
            )
            limit = max(start + s.scale_up_pods, math.ceil(start * (1 + s.scale_up_percent / 100)))
            return min(desired, bounds.max_replicas, max(limit, current))
        if desired < current:
            start = (
                current
                - _changed_within(self._scale_up_events, now_s, s.scale_down_period_s)
                + _changed_within(self._scale_down_events, now_s, s.scale_down_period_s)
            )
            limit = int(start * (1 - s.scale_down_percent / 100))
            return max(desired, bounds.min_replicas, min(limit, current))
        return bounds.clip(desired)


def _changed_within(events: deque[tuple[float, int]], now_s: float, period_s: float) -> int:
    """getReplicasChangePerPeriod: replicas added (or removed) within the last period."""
    cutoff_s = now_s - period_s
    while events and events[0][0] <= cutoff_s - 3600.0:
        events.popleft()  # far older than any period: forget
    return sum(change for at_s, change in events if at_s > cutoff_s)
