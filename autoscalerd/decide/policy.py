"""The decision: (Observation, DeploymentState, config, now) -> (Decision, DeploymentState).

Pure. The daemon, the backtest and the tests all call `decide`. The steps below follow
ARCHITECTURE.md §Decide in order; each records what it saw in the Decision so any target
can be explained from the log alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide import capacity, stabilize
from autoscalerd.forecast import holt_winters
from autoscalerd.model import Decision, DeploymentState, Observation, Reason

_Number = TypeVar("_Number", int, float)


def initial_state(
    cfg: DeploymentConfig, now_s: float, current_replicas: int | None
) -> DeploymentState:
    """State for a deployment seen for the first time: start from what the platform runs."""
    a = cfg.autoscaling
    if current_replicas is None:
        current_replicas = a.initial_replicas if a.initial_replicas is not None else a.min_replicas
    return DeploymentState(target_replicas=current_replicas, started_at_s=now_s)


def refit_forecaster(
    state: DeploymentState, cfg: DeploymentConfig, now_s: float
) -> DeploymentState:
    """Refit the forecaster inline when due. The daemon runs the fit off the loop."""
    if not cfg.forecast.enabled or not holt_winters.refit_due(
        state.forecaster, now_s, cfg.forecast
    ):
        return state
    model = holt_winters.fit_state(state.forecaster, cfg.forecast)
    return state.with_(forecaster=holt_winters.install_fit(state.forecaster, model, now_s))


@dataclass(frozen=True, slots=True)
class _Inputs:
    """The fresh inputs of one tick, in the configured load unit."""

    load_rate_per_s: float | None  # requests/s or tokens/s
    arrival_rate_per_s: float | None  # requests/s, for activation and scale-to-zero
    ongoing: float | None
    queued: float | None
    tokens_per_request: float | None
    stale: tuple[str, ...]  # inputs the sensor knows of but that are too old


def _fresh_inputs(obs: Observation, cfg: DeploymentConfig, now_s: float) -> _Inputs:
    max_age_s = cfg.max_metric_age_s
    arrivals = obs.fresh("arrival_rate_per_s", now_s, max_age_s)
    tokens = obs.fresh("token_rate_per_s", now_s, max_age_s)
    ongoing = obs.fresh("ongoing_requests", now_s, max_age_s)
    queued = obs.fresh("queued_requests", now_s, max_age_s)
    # The platform's view counts too: fresh load next to a stale replica count is not a
    # picture to scale down on.
    stale = tuple(
        name
        for name in (
            "arrival_rate_per_s",
            "token_rate_per_s",
            "ongoing_requests",
            "queued_requests",
            "running_replicas",
            "platform_target_replicas",
        )
        if getattr(obs, name) is not None and obs.fresh(name, now_s, max_age_s) is None
    )
    tokens_per_request = tokens / arrivals if tokens is not None and arrivals else None
    load = tokens if cfg.capacity.load_unit == "tokens" else arrivals
    return _Inputs(load, arrivals, ongoing, queued, tokens_per_request, stale)


def decide(
    obs: Observation, state: DeploymentState, cfg: DeploymentConfig, now_s: float
) -> tuple[Decision, DeploymentState]:
    a = cfg.autoscaling
    current = state.target_replicas
    interval_s = now_s - state.last_decided_at_s if state.last_decided_at_s is not None else None
    tick_s = interval_s if interval_s is not None and interval_s > 0 else 1.0
    inputs = _fresh_inputs(obs, cfg, now_s)
    reasons: list[Reason] = []

    # 1. Rates. Missing input is a gap in the window, never a zero.
    rate_samples = state.rate_samples
    if inputs.load_rate_per_s is not None:
        rate_samples = (*rate_samples, (now_s, inputs.load_rate_per_s))
    rate_samples = capacity.window(
        rate_samples, now_s, max(a.look_back_period_s, cfg.capacity.reactive_window_s)
    )
    # Two views of the rate: the short one reacts (scale-up evidence), the look-back mean is
    # what load sustains (scale-down evidence). Up takes the minimum over upscale_delay_s of
    # the short view, down the maximum over downscale_delay_s of the sustained view.
    rate_obs = capacity.mean_rate(rate_samples, now_s, a.look_back_period_s)
    rate_short = capacity.mean_rate(rate_samples, now_s, cfg.capacity.reactive_window_s)
    if inputs.load_rate_per_s is None:
        # The window's older samples were fresh once; sizing on them now would act on stale data.
        rate_obs = rate_short = None
    last_arrival_at_s = state.last_arrival_at_s
    if (inputs.arrival_rate_per_s or 0.0) > 0 or (inputs.ongoing or 0.0) + (
        inputs.queued or 0.0
    ) > 0:
        last_arrival_at_s = now_s

    # Fresh data is what allows scaling down: the primary input must be fresh and nothing the
    # sensor knows of may be stale. `fresh_since_s` restarts after every gap.
    fresh = inputs.load_rate_per_s is not None and not inputs.stale
    fresh_since_s = (
        (state.fresh_since_s if state.fresh_since_s is not None else now_s) if fresh else None
    )

    # 2. Service rate μ per replica, learned while saturated, derated under pressure.
    service_rate_per_s = _service_rate(obs, state, cfg, inputs, now_s)
    effective_rate_per_s = service_rate_per_s * capacity.derate(
        obs.fresh("kv_cache_usage_ratio", now_s, cfg.max_metric_age_s),
        obs.fresh("gpu_health_ratio", now_s, cfg.max_metric_age_s),
        cfg.capacity.kv_cache_derate_above,
    )

    # 3. Forecast over the lead time: replica cold start plus actuation delay.
    forecaster = state.forecaster
    prediction: holt_winters.Forecast | None = None
    if cfg.forecast.enabled:
        if inputs.load_rate_per_s is not None:
            forecaster = holt_winters.observe(
                forecaster, inputs.load_rate_per_s, tick_s, now_s, cfg.forecast
            )
        lead_time_s = cfg.capacity.cold_start_s + cfg.capacity.actuation_delay_s
        prediction = holt_winters.forecast(forecaster, lead_time_s, now_s, cfg.forecast)

    # 4. Capacity: the larger of the forecast's upper bound and the observed rate.
    upper_per_s = prediction.upper_per_s if prediction is not None else None
    rate_target = _max_known(upper_per_s, rate_short)
    rate_sustained = _max_known(upper_per_s, rate_obs)
    if upper_per_s is not None and upper_per_s > (rate_short or 0.0):
        reasons.append(Reason.FORECAST_LEADS)
    backlog_replicas = 0
    if inputs.queued:
        per_request = inputs.tokens_per_request or 1.0
        backlog_load = inputs.queued * (per_request if cfg.capacity.load_unit == "tokens" else 1.0)
        backlog_replicas = capacity.replicas_for_backlog(
            backlog_load, effective_rate_per_s, cfg.capacity.drain_s
        )
        if backlog_replicas:
            reasons.append(Reason.BACKLOG)

    def for_rate(rate_per_s: float | None) -> int | None:
        if rate_per_s is None:
            return None
        utilised = capacity.replicas_for_rate(
            rate_per_s, effective_rate_per_s, cfg.capacity.target_utilization
        )
        return utilised + backlog_replicas

    replicas_capacity = for_rate(rate_target)
    replicas_concurrency: int | None = None
    if inputs.ongoing is not None or inputs.queued is not None:
        replicas_concurrency = capacity.replicas_for_concurrency(
            (inputs.ongoing or 0.0) + (inputs.queued or 0.0), a.target_ongoing_requests
        )
    replicas_raw = _max_known(replicas_capacity, replicas_concurrency)
    replicas_sustained = _max_known(for_rate(rate_sustained), replicas_concurrency)
    if replicas_raw is not None:
        reasons.append(
            Reason.CAPACITY
            if replicas_capacity is not None and replicas_capacity >= (replicas_concurrency or 0)
            else Reason.CONCURRENCY
        )

    # 5. SLO guard: what users feel wins over every estimate. Breach: at least one step up,
    # and nothing below the current count.
    # One step per landing: while replicas asked for earlier are still starting, the p99
    # cannot have improved yet, and adding a step every tick would walk to max_replicas.
    breached = _slo_breaches(obs, cfg, now_s)
    if breached:
        reasons.append(Reason.SLO_BREACH)
        running = obs.fresh("running_replicas", now_s, cfg.max_metric_age_s)
        landing = running is not None and running < current
        floor = current if landing else current + 1
        replicas_raw = max(replicas_raw if replicas_raw is not None else 0, floor)
        replicas_sustained = max(replicas_sustained or 0, current)

    base = Decision(
        deployment=obs.deployment,
        target_replicas=current,
        reasons=(),
        decided_at_s=now_s,
        previous_replicas=current,
        load_unit=cfg.capacity.load_unit,
        arrival_rate_obs_per_s=rate_obs,
        arrival_rate_short_per_s=rate_short,
        arrival_rate_forecast_per_s=prediction.point_per_s if prediction else None,
        arrival_rate_upper_per_s=prediction.upper_per_s if prediction else None,
        arrival_rate_target_per_s=rate_target,
        forecast_method=prediction.method if prediction else None,
        service_rate_per_replica_per_s=effective_rate_per_s,
        ongoing_requests=inputs.ongoing,
        queued_requests=inputs.queued,
        replicas_capacity=replicas_capacity,
        replicas_concurrency=replicas_concurrency,
        replicas_raw=replicas_raw,
        replicas_sustained=replicas_sustained,
        slo_breached=breached,
    )
    next_state = state.with_(
        rate_samples=rate_samples,
        last_arrival_at_s=last_arrival_at_s,
        fresh_since_s=fresh_since_s,
        service_rate_per_s=service_rate_per_s,
        forecaster=forecaster,
        last_decided_at_s=now_s,
    )

    # 8 (first, because it short-circuits). Fail static: nothing fresh to act on -> hold,
    # except that the configured bounds always hold (an operator lowering max_replicas).
    if replicas_raw is None:
        target, bound_reasons = stabilize.apply_bounds(current, a)
        return _finish(
            target, [Reason.STALE_DATA, *bound_reasons], base, next_state, now_s, current
        )

    # 7b. Activation from zero: the first request gets a replica at once, bypassing delays.
    if current == 0 and replicas_raw > 0:
        target, _ = stabilize.apply_bounds(max(1, replicas_raw), a)
        target = max(1, target)
        reasons.append(Reason.ACTIVATE_FROM_ZERO)
        return _finish(target, reasons, base, next_state, now_s, float(replicas_raw))

    # 6. Stabilise: EMA, then the windowed delays, then the step limits.
    smoothed = stabilize.smooth(replicas_raw, state.smoothed_replicas, a.smoothing_factor)
    floor = _floor(cfg, last_arrival_at_s, state, now_s)
    recommendation = max(capacity.ceil_replicas(smoothed), floor)
    # Scale-down evidence: the sustained view, but never below what the scale-up evidence
    # held over upscale_delay_s (a burst that earned replicas keeps them for the window).
    held_up = min(
        [up for _, up, _ in capacity.tail(state.recommendations, now_s - a.upscale_delay_s)]
        + [recommendation]
    )
    sustained = max(
        replicas_sustained if replicas_sustained is not None else recommendation, floor, held_up
    )
    horizon_s = max(a.upscale_delay_s, a.downscale_delay_s) + 2 * tick_s
    recommendations = capacity.window(
        (*state.recommendations, (now_s, recommendation, sustained)), now_s, horizon_s
    )
    next_state = next_state.with_(smoothed_replicas=smoothed, recommendations=recommendations)

    if breached and recommendation > current:
        # The SLO is already broken: waiting out upscale_delay_s would only prolong it.
        wanted, delay_reasons = recommendation, tuple[Reason, ...]()
    else:
        wanted, delay_reasons = stabilize.apply_delays(current, recommendations, now_s, a, tick_s)
    reasons.extend(delay_reasons)

    if wanted < current:
        blocker = _downscale_blocker(fresh, fresh_since_s, breached, cfg, now_s)
        if blocker is not None:
            reasons.append(blocker)
            wanted = current
    if wanted != current and _cooling_down(state, cfg, now_s, breached):
        reasons.append(Reason.COOLDOWN)
        wanted = current

    wanted, step_reasons = stabilize.limit_step(current, wanted, a)
    reasons.extend(step_reasons)

    # 7. Bounds, and scale to zero only after downscale_to_zero_delay_s without a request.
    if wanted == 0 and current > 0:
        reasons.append(Reason.SCALE_TO_ZERO)
    target, bound_reasons = stabilize.apply_bounds(wanted, a)
    reasons.extend(bound_reasons)
    return _finish(target, reasons, base, next_state, now_s, smoothed)


def _max_known(*values: _Number | None) -> _Number | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _finish(
    target: int,
    reasons: list[Reason],
    base: Decision,
    next_state: DeploymentState,
    now_s: float,
    smoothed: float,
) -> tuple[Decision, DeploymentState]:
    current = next_state.target_replicas
    if target > current:
        reasons.append(Reason.SCALE_UP)
    elif target < current:
        reasons.append(Reason.SCALE_DOWN)
    else:
        reasons.append(Reason.STEADY)
    decision = replace(
        base,
        target_replicas=target,
        reasons=tuple(dict.fromkeys(reasons)),
        replicas_smoothed=smoothed,
        replicas_stabilized=target,
    )
    if target != current:
        next_state = next_state.with_(target_replicas=target, last_action_at_s=now_s)
    return decision, next_state


def _service_rate(
    obs: Observation, state: DeploymentState, cfg: DeploymentConfig, inputs: _Inputs, now_s: float
) -> float:
    prior_per_s = cfg.capacity.service_rate_per_replica
    learned = state.service_rate_per_s if state.service_rate_per_s is not None else prior_per_s
    if not cfg.capacity.learn_service_rate:
        return prior_per_s
    completions = obs.fresh("completion_rate_per_s", now_s, cfg.max_metric_age_s)
    running = obs.fresh("running_replicas", now_s, cfg.max_metric_age_s)
    saturated = (inputs.queued or 0.0) > 0
    if completions is None or not running or not saturated or completions <= 0:
        return learned
    if cfg.capacity.load_unit == "tokens":
        if inputs.tokens_per_request is None:
            return learned
        completions *= inputs.tokens_per_request
    return capacity.learn_service_rate(learned, prior_per_s, completions, running)


def _slo_breaches(obs: Observation, cfg: DeploymentConfig, now_s: float) -> tuple[str, ...]:
    slo = cfg.slo
    checks = (
        ("ttft_p99_s", slo.ttft_p99_s),
        ("e2e_p99_s", slo.e2e_p99_s),
        ("queue_wait_p99_s", slo.queue_wait_s),
    )
    breached = []
    for name, limit_s in checks:
        observed_s = obs.fresh(name, now_s, cfg.max_metric_age_s)
        if limit_s is not None and observed_s is not None and observed_s > limit_s:
            breached.append(name)
    return tuple(breached)


def _floor(
    cfg: DeploymentConfig, last_arrival_at_s: float | None, state: DeploymentState, now_s: float
) -> int:
    """The lowest recommendation allowed: one replica unless scale-to-zero is due."""
    a = cfg.autoscaling
    if a.min_replicas > 0:
        return a.min_replicas
    zero_delay_s = (
        a.downscale_to_zero_delay_s
        if a.downscale_to_zero_delay_s is not None
        else a.downscale_delay_s
    )
    quiet_since_s = last_arrival_at_s if last_arrival_at_s is not None else state.started_at_s
    return 0 if now_s - quiet_since_s >= zero_delay_s else 1


def _downscale_blocker(
    fresh: bool,
    fresh_since_s: float | None,
    breached: tuple[str, ...],
    cfg: DeploymentConfig,
    now_s: float,
) -> Reason | None:
    if breached:
        return Reason.SLO_BREACH
    if not fresh:
        return Reason.STALE_DATA
    # After a start or an outage: a full downscale_delay_s of fresh data before any scale-down.
    if fresh_since_s is None or now_s - fresh_since_s < cfg.autoscaling.downscale_delay_s:
        return Reason.WARMUP
    return None


def _cooling_down(
    state: DeploymentState, cfg: DeploymentConfig, now_s: float, breached: tuple[str, ...]
) -> bool:
    if cfg.cooldown_s <= 0 or state.last_action_at_s is None or breached:
        return False
    return now_s - state.last_action_at_s < cfg.cooldown_s
