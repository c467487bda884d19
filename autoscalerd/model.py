"""The values that flow through the loop: Observation in, Decision out, DeploymentState kept.

All are frozen dataclasses. pydantic stays at the config boundary.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import Any

from autoscalerd.decide.burstiness import BurstState
from autoscalerd.decide.gpu_health import ReplicaGpu
from autoscalerd.decide.ray_compat import RayPolicyState
from autoscalerd.decide.replica_model import ReplicaModelState
from autoscalerd.decide.slo_guard import GuardState
from autoscalerd.forecast.holt_winters import ForecasterState


@dataclass(frozen=True, slots=True)
class Reading:
    """One sensed value and the (clock) time it describes."""

    value: float
    at_s: float

    def age_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.at_s)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Counts per bucket over one interval (not cumulative), +Inf last, and when it ended.

    `bounds_s` are the buckets' upper bounds: seconds, or tokens for a prompt histogram.
    """

    bounds_s: tuple[float, ...]
    counts: tuple[float, ...]
    at_s: float

    def age_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.at_s)

    @property
    def total(self) -> float:
        return float(sum(self.counts))

    @property
    def sane(self) -> bool:
        """One count per bucket and +Inf, each finite and ≥ 0: else the reading is no data."""
        return len(self.counts) == len(self.bounds_s) + 1 and all(
            math.isfinite(c) and c >= 0 for c in self.counts
        )

    def count_above(self, limit_s: float) -> float:
        """Requests above `limit_s`, interpolating linearly inside the bucket that holds it."""
        above = 0.0
        lower_s = 0.0
        for index, count in enumerate(self.counts):
            upper_s = self.bounds_s[index] if index < len(self.bounds_s) else math.inf
            if lower_s >= limit_s:
                above += count
            elif upper_s > limit_s:
                share = 1.0 if math.isinf(upper_s) else (upper_s - limit_s) / (upper_s - lower_s)
                above += count * share
            lower_s = upper_s
        return above


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
    # The lowest share of metrics endpoints that answered cleanly over the rate windows:
    # below 1 the load readings are lower bounds (scale up on them, never down).
    metrics_coverage_ratio: Reading | None = None
    # User-visible latency (p99 over the look-back window).
    ttft_p99_s: Reading | None = None
    e2e_p99_s: Reading | None = None
    queue_wait_p99_s: Reading | None = None
    # Capacity derating inputs.
    kv_cache_usage_ratio: Reading | None = None
    # Replicas' worth of capacity lost to GPU faults (a failed replica counts 1, a degraded
    # one 1 - its share), and the GPUs behind it, joined by the loop (decide/gpu_health.py).
    gpu_lost_replicas: Reading | None = None
    gpu_replicas: tuple[ReplicaGpu, ...] = ()
    # The replica model's inputs (vLLM's counters and histograms where exported; Serve
    # reports max_ongoing_requests). Rates are over the last tick, means over look-back.
    max_ongoing_requests: Reading | None = None  # slots per replica
    prompt_token_rate_per_s: Reading | None = None  # prompt tokens prefilled per s
    output_token_rate_per_s: Reading | None = None  # output tokens produced per s
    prefill_seconds_per_s: Reading | None = None  # prefill time spent per s (sum of histogram)
    prefilled_request_rate_per_s: Reading | None = None  # requests whose prefill ended, per s
    prompt_tokens_sq_mean: Reading | None = None  # E[prompt tokens²], from the histogram
    tpot_mean_s: Reading | None = None  # mean time per output token
    decode_batch_mean: Reading | None = None  # requests decoding per running replica
    # Requests whose wait (router queue + engine queue) ended in the last tick, by bucket.
    queue_wait_histogram: Histogram | None = None
    # Requests whose first token came out in the last tick, by TTFT bucket (vLLM's
    # time_to_first_token_seconds), and whose prefill ended, by prompt length in tokens
    # (request_prompt_tokens): TTFT misses less the prompts too long for the SLO are the
    # misses that replicas can fix.
    ttft_histogram: Histogram | None = None
    prompt_tokens_histogram: Histogram | None = None
    # Serve's router wait alone (request_router_fulfillment_time), where the TTFT above is
    # the engine's and does not include it.
    router_wait_histogram: Histogram | None = None

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

    CAPACITY = "capacity"  # the replica model's sizing drove the raw count
    CONCURRENCY = "concurrency"  # Ray Serve's ongoing/target rule drove the raw count
    BURST = "burst"  # the measured burstiness at the SLO's time scale set the count
    SURGE_RELEASED = "surge_released"  # a surge that stopped recurring no longer counts
    HEADROOM_TIGHTENED = "headroom_tightened"  # more bad requests seen than the model said
    HEADROOM_RELAXED = "headroom_relaxed"  # fewer bad requests seen than the model said
    RAY_COMPATIBLE = "ray_compatible"  # decided by Ray Serve's default policy, exactly
    MODEL_MISMATCH = "model_mismatch"  # observed and predicted waits disagree beyond bounds
    BACKLOG = "backlog"  # queued requests added replicas
    FORECAST_LEADS = "forecast_leads"  # the forecast set λ_target, ≥ 1 request/lead time over it
    SLO_BREACH = "slo_breach"  # a latency or queue SLO was exceeded
    UPSCALE_DELAYED = "upscale_delayed"  # wants more, waiting out upscale_delay_s
    DOWNSCALE_DELAYED = "downscale_delayed"  # wants fewer, waiting out downscale_delay_s
    STEP_LIMITED = "step_limited"  # Ray's upscaling_factor / downscaling_factor scaled the step
    STEP_CAPPED = "step_capped"  # stabilize.max_step_up_ratio / min_step_down_ratio capped it
    COOLDOWN = "cooldown"  # an action happened less than cooldown_s ago
    BOUNDED_MIN = "bounded_min"
    BOUNDED_MAX = "bounded_max"
    SCALE_TO_ZERO = "scale_to_zero"
    ACTIVATE_FROM_ZERO = "activate_from_zero"
    STALE_DATA = "stale_data"  # inputs missing or older than max_metric_age_s: hold
    GPU_FAILED = "gpu_failed"  # a replica's GPU failed: its capacity is replaced at once
    GPU_DEGRADED = "gpu_degraded"  # a replica's GPU is slowed: counted at its measured share
    PARTIAL_DATA = "partial_data"  # some metrics endpoints missing: lower bounds, no scale-down
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
    # The scale-down evidence's rate: the mean over the downscale delay's window.
    arrival_rate_down_per_s: float | None = None
    arrival_rate_forecast_per_s: float | None = None
    arrival_rate_upper_per_s: float | None = None
    arrival_rate_target_per_s: float | None = None
    forecast_method: str | None = None
    service_rate_per_replica_per_s: float | None = None
    ongoing_requests: float | None = None
    queued_requests: float | None = None
    # The queue projected to when replicas asked for now can serve (the backlog term's Q).
    backlog_at_landing_requests: float | None = None
    replicas_capacity: int | None = None
    replicas_concurrency: int | None = None
    replicas_raw: int | None = None  # from the short rate: the scale-up evidence
    replicas_sustained: int | None = None  # from the look-back mean: the scale-down evidence
    replicas_smoothed: float | None = None
    replicas_stabilized: int | None = None
    slo_breached: tuple[str, ...] = ()
    # The sizing: which condition bound, what it predicts, and on what evidence.
    sizing_binding: str | None = None
    predicted_wait_tail: float | None = None  # share of requests over the wait budget
    peak_to_mean: float | None = None  # arrivals per tick at the attainment quantile
    # Clumps the sizing held capacity for: (window_s, requests in the window) at the quantile.
    clumps: tuple[tuple[float, float], ...] = ()
    wait_budget_s: float | None = None
    tail_share: float | None = None  # ε the sizing aimed at (error budget x headroom)
    burn_rate_fast: float | None = None
    burn_rate_slow: float | None = None
    # The lowest count the SLO guard let a scale-down reach this tick (None: no limit).
    slo_floor_replicas: int | None = None
    model_calibration: float | None = None  # observed / predicted bad; sizing aims at ε / it
    # (name, value, samples, age_s or None for a prior) per replica-model parameter.
    replica_model: tuple[tuple[str, float, int, float | None], ...] = ()
    # GPU faults: replicas' worth of capacity lost, and (replica, GPU, state, reason).
    gpu_lost_replicas: float | None = None
    gpu_replicas: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def changed(self) -> bool:
        return self.target_replicas != self.previous_replicas

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "reasons":
                value = [r.value for r in value]
            elif f.name == "replica_model":
                value = {
                    name: {
                        "value": round(v, 6),
                        "samples": n,
                        "age_s": None if age is None else round(age, 3),
                    }
                    for name, v, n, age in value
                }
            elif f.name == "clumps":
                value = [{"window_s": w, "requests": round(n, 3)} for w, n in value]
            elif f.name == "gpu_replicas":
                value = [
                    {"replica": r, "gpu": g, "state": state, "reason": why}
                    for r, g, state, why in value
                ]
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
    # EMA of the raw recommendation (stabilize.ema_weight).
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
    forecaster: ForecasterState = field(default_factory=ForecasterState)
    replica_model: ReplicaModelState = field(default_factory=ReplicaModelState)
    burst: BurstState = field(default_factory=BurstState)
    guard: GuardState = field(default_factory=GuardState)
    # The Ray-compatible mode: Ray's delay timer, and (time, ongoing + queued) samples
    # over look_back_period_s, which Ray's controller averages before its policy sees them.
    ray_policy: RayPolicyState = field(default_factory=RayPolicyState)
    ray_samples: tuple[tuple[float, float], ...] = ()
    # Replicas added for capacity lost to GPU faults (added at once, not delayed).
    gpu_extra_replicas: int = 0
    # Seconds between this deployment's decisions, as they usually come (a pause is not
    # one): a gap in the ticks is one much longer than this.
    tick_interval_s: float | None = None
    # (running replicas, since when): the count the platform last reported running and the
    # time it was first seen at that count; None for "since before the first sighting".
    running_seen: tuple[float, float | None] | None = None

    def with_(self, **changes: Any) -> DeploymentState:
        from dataclasses import replace

        return replace(self, **changes)
