"""The queue-threshold policy of the seed material's toy simulator.

Each tick: with more than 12 requests queued add a replica, with fewer than 3 remove one,
then wait out a cooldown. Ported step for step, including the order of the cooldown
countdown: the toy sets the cooldown to 3 and counts it down in the same tick, so the
next two ticks hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscalerd.decide.baselines.base import Bounds, value
from autoscalerd.model import Observation


@dataclass(frozen=True, slots=True)
class ThresholdSettings:
    scale_up_queue: int = 12  # queue > this adds a replica
    scale_down_queue: int = 3  # queue < this removes one
    cooldown_ticks: int = 3


class ThresholdPolicy:
    name = "threshold"

    def __init__(self, bounds: Bounds, initial_replicas: int, settings: ThresholdSettings) -> None:
        self._bounds = bounds
        self._settings = settings
        self._target = bounds.clip(initial_replicas)
        self._cooldown_ticks = 0

    def step(self, obs: Observation, now_s: float) -> int:
        # "The queue" is the router's: requests waiting for a replica, which is also
        # ray_serve_deployment_queued_queries, the metric the seed material scales nodes on.
        queued = value(obs, "queued_requests")
        s = self._settings
        if self._cooldown_ticks == 0:
            if queued > s.scale_up_queue and self._target < self._bounds.max_replicas:
                self._target += 1
                self._cooldown_ticks = s.cooldown_ticks
            elif queued < s.scale_down_queue and self._target > self._bounds.min_replicas:
                self._target -= 1
                self._cooldown_ticks = s.cooldown_ticks
        if self._cooldown_ticks > 0:
            self._cooldown_ticks -= 1
        return self._target
