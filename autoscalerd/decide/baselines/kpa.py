"""Knative's Pod Autoscaler (KPA), concurrency mode.

Follows `pkg/autoscaler/scaling/autoscaler.go` `Scale`: average concurrency over a 60 s
stable window and a 6 s panic window; desired pods = ⌈concurrency / target⌉ for each,
kept within [⌊ready / max_scale_down_rate⌋, ⌈ready · max_scale_up_rate⌉]; panic starts
when the panic-window count reaches 200 % of the ready pods and ends once a stable window
has passed without crossing it; while panicking the count never goes down. The decider
ticks every 2 s.

Concurrency is what Knative's queue-proxy and activator see: requests at replicas plus
requests waiting for one (ongoing + queued), sampled every tick.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from autoscalerd.decide.baselines.base import Bounds, value
from autoscalerd.model import Observation


@dataclass(frozen=True, slots=True)
class KpaSettings:
    # Per-pod concurrency target: the same set point as Ray Serve's target_ongoing_requests.
    target_concurrency: float = 12.0
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0  # 200 %
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    tick_interval_s: float = 2.0


class KpaPolicy:
    name = "kpa"

    def __init__(self, bounds: Bounds, initial_replicas: int, settings: KpaSettings) -> None:
        self._bounds = bounds
        self._settings = settings
        self._target = bounds.clip(initial_replicas)
        self._samples: deque[tuple[float, float]] = deque()
        self._last_tick_s: float | None = None
        self._panic_since_s: float | None = None
        self._max_panic_pods = 0

    def step(self, obs: Observation, now_s: float) -> int:
        s = self._settings
        if obs.ongoing_requests is not None or obs.queued_requests is not None:
            concurrency = value(obs, "ongoing_requests") + value(obs, "queued_requests")
            self._samples.append((now_s, concurrency))
        while self._samples and self._samples[0][0] <= now_s - s.stable_window_s:
            self._samples.popleft()
        if self._last_tick_s is not None and now_s - self._last_tick_s < s.tick_interval_s - 1e-9:
            return self._target
        self._last_tick_s = now_s
        if not self._samples:
            return self._target  # no data: no decision
        stable = _mean(c for _, c in self._samples)
        panic = _mean(c for at_s, c in self._samples if at_s > now_s - s.panic_window_s)

        ready = max(1.0, value(obs, "running_replicas"))
        max_up = math.ceil(s.max_scale_up_rate * ready)
        max_down = math.floor(ready / s.max_scale_down_rate)
        stable_pods = math.ceil(stable / s.target_concurrency)
        panic_pods = math.ceil(panic / s.target_concurrency)
        desired_stable = int(min(max(stable_pods, max_down), max_up))
        desired_panic = int(min(max(panic_pods, max_down), max_up))

        over_threshold = panic_pods / ready >= s.panic_threshold
        if over_threshold:
            self._panic_since_s = now_s  # start, or extend, panicking
        elif self._panic_since_s is not None and now_s > self._panic_since_s + s.stable_window_s:
            self._panic_since_s = None
            self._max_panic_pods = 0

        desired = desired_stable
        if self._panic_since_s is not None:
            # Provision for the larger of the two, and never scale down while panicking.
            desired = max(desired, desired_panic)
            self._max_panic_pods = max(self._max_panic_pods, desired)
            desired = self._max_panic_pods
        self._target = self._bounds.clip(desired)
        return self._target


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0
