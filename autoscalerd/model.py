"""The values that flow through the loop: Observation in, Decision out, DeploymentState kept.

All are frozen dataclasses. pydantic stays at the config boundary.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import Any

from autoscalerd.forecast.holt_winters import ForecasterState


@dataclass(frozen=True, slots=True)
class Reading:
    """One sensed value and the (clock) time it describes."""

    value: float
    at_s: float

    def age_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.at_s)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the sensors saw of one deployment in one tick. Every field may be unknown."""

    deployment: str
    sensed_at_s: float
    # Load.
    arrival_rate_per_s: Reading | None = None
    token_rate_per_s: Reading | None = None
    completion_rate_per_s: Reading | None = None
    ongoing_requests: Reading | None = None
    queued_requests: Reading | None = None
    # Replicas as the platform reports them.
    running_replicas: Reading | None = None
    starting_replicas: Reading | None = None
    platform_target_replicas: Reading | None = None
    # User-visible latency (p99 over the look-back window).
    ttft_p99_s: Reading | None = None
    e2e_p99_s: Reading | None = None
    queue_wait_p99_s: Reading | None = None
    # Capacity derating inputs.
    kv_cache_usage_ratio: Reading | None = None
    gpu_health_ratio: Reading | None = None

    def fresh(self, name: str, now_s: float, max_age_s: float) -> float | None:
        """The value of field `name` if it is known, sane and no older than `max_age_s`.

        Garbage (NaN, infinities, negative counts) is no data, never a zero.
        """
        reading: Reading | None = getattr(self, name)
        if reading is None or reading.age_s(now_s) > max_age_s:
            return None
        if not math.isfinite(reading.value) or reading.value < 0:
            return None
        return reading.value

    def known_fields(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Reading):
                out[f.name] = value.value
        return out


class Reason(str, enum.Enum):
    """Machine-readable reason codes. A decision carries every one that applied."""

    CAPACITY = "capacity"  # R_cap (forecast or reactive rate) drove the raw count
    CONCURRENCY = "concurrency"  # Ray Serve's ongoing/target rule drove the raw count
    BACKLOG = "backlog"  # queued requests added replicas
    FORECAST_LEADS = "forecast_leads"  # the forecast, not the observed rate, set λ_target
    SLO_BREACH = "slo_breach"  # a latency or queue SLO was exceeded
    UPSCALE_DELAYED = "upscale_delayed"  # wants more, waiting out upscale_delay_s
    DOWNSCALE_DELAYED = "downscale_delayed"  # wants fewer, waiting out downscale_delay_s
    STEP_LIMITED = "step_limited"  # upscaling_factor / downscaling_factor clipped the step
    COOLDOWN = "cooldown"  # an action happened less than cooldown_s ago
    BOUNDED_MIN = "bounded_min"
    BOUNDED_MAX = "bounded_max"
    SCALE_TO_ZERO = "scale_to_zero"
    ACTIVATE_FROM_ZERO = "activate_from_zero"
    STALE_DATA = "stale_data"  # inputs missing or older than max_metric_age_s: hold
    WARMUP = "warmup"  # not enough fresh history since start to scale down
    STEADY = "steady"  # nothing to change
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    PAUSED = "paused"  # an operator paused this deployment
    OVERRIDE = "override"  # an operator pinned the target


@dataclass(frozen=True, slots=True)
class Decision:
    """The target for one deployment and everything that led to it."""

    deployment: str
    decided_at_s: float
    target_replicas: int
    previous_replicas: int
    reasons: tuple[Reason, ...]
    # Intermediate values; None where the step had no input. Rates are in `load_unit`
    # per second (requests or prompt+output tokens), as configured.
    load_unit: str = "requests"
    arrival_rate_obs_per_s: float | None = None
    arrival_rate_short_per_s: float | None = None
    arrival_rate_forecast_per_s: float | None = None
    arrival_rate_upper_per_s: float | None = None
    arrival_rate_target_per_s: float | None = None
    forecast_method: str | None = None
    service_rate_per_replica_per_s: float | None = None
    ongoing_requests: float | None = None
    queued_requests: float | None = None
    replicas_capacity: int | None = None
    replicas_concurrency: int | None = None
    replicas_raw: int | None = None  # from the short rate: the scale-up evidence
    replicas_sustained: int | None = None  # from the look-back mean: the scale-down evidence
    replicas_smoothed: float | None = None
    replicas_stabilized: int | None = None
    slo_breached: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.target_replicas != self.previous_replicas

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "reasons":
                value = [r.value for r in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, float):
                value = round(value, 4)
            out[f.name] = value
        return out


@dataclass(frozen=True, slots=True)
class DeploymentState:
    """What decide() carries from one tick to the next for one deployment."""

    target_replicas: int
    started_at_s: float
    # EMA of the raw recommendation (smoothing_factor).
    smoothed_replicas: float | None = None
    # (time, scale-up recommendation, scale-down recommendation) over the longest delay
    # window, oldest first.
    recommendations: tuple[tuple[float, int, int], ...] = ()
    # Rate samples (time, arrivals per s) over look_back_period_s, oldest first.
    rate_samples: tuple[tuple[float, float], ...] = ()
    last_action_at_s: float | None = None
    last_decided_at_s: float | None = None
    last_arrival_at_s: float | None = None
    # Since when fresh data has been seen without a gap (restart and outage protection).
    fresh_since_s: float | None = None
    # Learned service rate per replica (requests/s or tokens/s, as configured).
    service_rate_per_s: float | None = None
    forecaster: ForecasterState = field(default_factory=ForecasterState)

    def with_(self, **changes: Any) -> DeploymentState:
        from dataclasses import replace

        return replace(self, **changes)
