"""Ray Serve's default autoscaling policy, run by Ray's own code.

Not a re-implementation: each tick builds the `AutoscalingContext` Ray's controller would
build and calls `replica_queue_length_autoscaling_policy` wrapped by
`_apply_autoscaling_config` (the scaling factors and the upscale/downscale delays),
exactly as `ray.serve._private.autoscaling_state` does, then clips to the bounds as its
`apply_bounds` does. The policy state dict Ray returns is carried to the next tick.

Ray's delay logic measures elapsed time with `time.time()`. The backtest runs in virtual
time, so for the length of each call the module's `time` global is swapped for one that
reads the simulated clock; nothing else in Ray is touched.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autoscalerd.decide.baselines.base import Bounds, value
from autoscalerd.model import Observation


@dataclass(frozen=True, slots=True)
class RayServeSettings:
    """The production `autoscaling_config` of the seed material (min/max come from Bounds).

    `max_ongoing_requests: 32` belongs to the deployment, not to the policy: the simulated
    replicas enforce it.
    """

    target_ongoing_requests: float = 12.0
    upscale_delay_s: float = 3.0
    downscale_delay_s: float = 300.0
    upscaling_factor: float = 2.0
    downscaling_factor: float = 0.5
    look_back_period_s: float = 30.0
    aggregation_function: str = "mean"


class SimulatedTime:
    """Stands in for the `time` module: `time()` and `monotonic()` read the virtual clock."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def time(self) -> float:
        return self.now_s

    def monotonic(self) -> float:
        return self.now_s

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@contextlib.contextmanager
def simulated_time(module: ModuleType, now_s: float) -> Iterator[SimulatedTime]:
    """Make `module`'s `time.time()` return `now_s` until the block ends.

    The backtest is single-threaded, and the swap lasts one policy call.
    """
    real = getattr(module, "time")  # noqa: B009  (a module global, not an attribute we know)
    clock = SimulatedTime(now_s)
    setattr(module, "time", clock)  # noqa: B010
    try:
        yield clock
    finally:
        setattr(module, "time", real)  # noqa: B010


class RayServePolicy:
    name = "ray-serve"

    def __init__(
        self,
        bounds: Bounds,
        initial_replicas: int,
        settings: RayServeSettings,
        deployment: str = "llm/backtest",
    ) -> None:
        # Imported here: importing Ray takes seconds, and only this policy needs it.
        from ray.serve import autoscaling_policy
        from ray.serve._private.common import DeploymentID, TimeStampedValue
        from ray.serve._private.metrics_utils import aggregate_timeseries
        from ray.serve.config import AggregationFunction, AutoscalingConfig, AutoscalingContext

        self._module = autoscaling_policy
        self._stamped = TimeStampedValue
        self._aggregate_timeseries = aggregate_timeseries
        self._aggregation = AggregationFunction
        self._context_type = AutoscalingContext
        self._bounds = bounds
        self._settings = settings
        app, _, name = deployment.rpartition("/")
        self._deployment_id = DeploymentID(name=name or deployment, app_name=app or "default")
        self._config = AutoscalingConfig(
            min_replicas=bounds.min_replicas,
            max_replicas=bounds.max_replicas,
            initial_replicas=bounds.clip(initial_replicas),
            target_ongoing_requests=settings.target_ongoing_requests,
            upscale_delay_s=settings.upscale_delay_s,
            downscale_delay_s=settings.downscale_delay_s,
            upscaling_factor=settings.upscaling_factor,
            downscaling_factor=settings.downscaling_factor,
            look_back_period_s=settings.look_back_period_s,
            aggregation_function=settings.aggregation_function,
        )
        # What AutoscalingState.update_deployment installs for the default policy.
        self._policy = autoscaling_policy._apply_autoscaling_config(
            autoscaling_policy.replica_queue_length_autoscaling_policy
        )
        self._policy_state: dict[str, Any] = {}
        self._target = bounds.clip(initial_replicas)
        # (time, ongoing + queued, queued) samples over look_back_period_s: Ray averages
        # the replicas' and handles' reports over that window before the policy sees them.
        self._samples: deque[tuple[float, float, float]] = deque()
        self._last_scale_up_s: float | None = None
        self._last_scale_down_s: float | None = None

    def _aggregate(self, samples: list[tuple[float, float]]) -> float:
        """The look-back window's samples reduced as Ray's controller reduces them: the
        mean of the tick's samples (Ray's time-weighted mean of a series sampled once a
        tick), or Ray's own `aggregate_timeseries` for `max` and `min`."""
        if self._config.aggregation_function == self._aggregation.MEAN:
            return sum(v for _, v in samples) / len(samples)
        series = [self._stamped(at_s, v) for at_s, v in samples]
        # Ray's validator has made the field an AggregationFunction already.
        function = self._aggregation(self._config.aggregation_function)
        reduced = self._aggregate_timeseries(series, function)
        return 0.0 if reduced is None else float(reduced)

    def step(self, obs: Observation, now_s: float) -> int:
        queued = value(obs, "queued_requests")
        total = value(obs, "ongoing_requests") + queued
        samples = self._samples
        samples.append((now_s, total, queued))
        while samples[0][0] <= now_s - self._settings.look_back_period_s:
            samples.popleft()
        total_mean = self._aggregate([(s[0], s[1]) for s in samples])
        queued_mean = self._aggregate([(s[0], s[2]) for s in samples])
        target = int(value(obs, "platform_target_replicas", self._target))
        context = self._context_type(
            deployment_id=self._deployment_id,
            deployment_name=self._deployment_id.name,
            app_name=self._deployment_id.app_name,
            current_num_replicas=int(value(obs, "running_replicas")),
            target_num_replicas=target,
            running_replicas=[],
            total_num_requests=total_mean,
            total_queued_requests=queued_mean,
            aggregated_metrics={},
            raw_metrics={},
            capacity_adjusted_min_replicas=self._bounds.min_replicas,
            capacity_adjusted_max_replicas=self._bounds.max_replicas,
            policy_state=dict(self._policy_state),
            last_scale_up_time=self._last_scale_up_s,
            last_scale_down_time=self._last_scale_down_s,
            current_time=now_s,
            config=self._config,
        )
        with simulated_time(self._module, now_s):
            decision, self._policy_state = self._policy(context)
        if isinstance(decision, float):
            decision = math.ceil(decision)
        decision = self._bounds.clip(int(decision))
        if decision > target:
            self._last_scale_up_s = now_s
        elif decision < target:
            self._last_scale_down_s = now_s
        self._target = decision
        return decision
