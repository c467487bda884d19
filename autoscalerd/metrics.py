"""autoscalerd's own Prometheus metrics, fed by a Controller tick listener.

Its own CollectorRegistry (not the process-global one), so a test or a second controller
in one process never sees another's series; it also carries prometheus_client's process,
platform and GC collectors. Names: `autoscalerd_` prefix, base units (seconds, per
second), `_total` on counters. Rates are in the deployment's load unit (requests or
tokens), named by the `load_unit` label.

Per-deployment series carry `application` and `deployment` as two labels, as Ray Serve's
own series do (`ray_serve_*{application="llm", deployment="LlmReplica"}`), so a PromQL
join on both works without relabelling. autoscalerd's combined name `app/deployment`
appears only where one key is needed: in logs, the HTTP API and the state file. Label
values are bounded by the configured and discovered deployments, the reason codes and the
actuator, sensor and error-kind names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from autoscalerd import __version__
from autoscalerd.decide.workers import desired_workers
from autoscalerd.loop import NOT_REPORTED
from autoscalerd.model import Decision, Observation, Reading

if TYPE_CHECKING:
    from autoscalerd.loop import Controller, DeploymentRuntime, TickReport

# The labels of a per-deployment series: Ray Serve's two, not autoscalerd's combined name.
_DEPLOYMENT = ["application", "deployment"]

# Ticks are milliseconds when sensors answer at once, up to the sensor timeout otherwise.
TICK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A Holt-Winters fit takes milliseconds (Holt) to tens of seconds (a long seasonal window).
REFIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        # `_created` series double every counter's output for a value nobody graphs.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
        Gauge(
            "autoscalerd_build_info", "autoscalerd version (always 1)", ["version"], registry=r
        ).labels(__version__).set(1)
        per_load = [*_DEPLOYMENT, "load_unit"]
        self.observed_rate = Gauge(
            "autoscalerd_observed_arrival_rate_per_second",
            "Arrival rate over look_back_period_s, in load_unit per second",
            per_load,
            registry=r,
        )
        self.forecast_rate = Gauge(
            "autoscalerd_forecast_arrival_rate_per_second",
            "Forecast arrival rate over the lead time: bound=point (ŷ) or upper (ŷ + z·σ)",
            [*per_load, "bound"],
            registry=r,
        )
        self.service_rate = Gauge(
            "autoscalerd_service_rate_per_replica_per_second",
            "μ: load one replica serves per second (learned, derated), in load_unit",
            per_load,
            registry=r,
        )
        self.current_replicas = Gauge(
            "autoscalerd_current_replicas",
            "Replicas running, as the platform reports them (else the target in force)",
            _DEPLOYMENT,
            registry=r,
        )
        self.desired_replicas = Gauge(
            "autoscalerd_desired_replicas",
            "Target replicas of the latest decision",
            _DEPLOYMENT,
            registry=r,
        )
        self.applied_replicas = Gauge(
            "autoscalerd_applied_replicas",
            "Target replicas an actuator last confirmed",
            _DEPLOYMENT,
            registry=r,
        )
        self.paused = Gauge(
            "autoscalerd_paused",
            "1 while an operator has paused the deployment",
            _DEPLOYMENT,
            registry=r,
        )
        self.override = Gauge(
            "autoscalerd_override_replicas",
            "Replicas pinned by an operator override (absent when none)",
            _DEPLOYMENT,
            registry=r,
        )
        self.decisions = Counter(
            "autoscalerd_decisions_total",
            "Decisions, counted once for each reason code they carry",
            [*_DEPLOYMENT, "reason"],
            registry=r,
        )
        self.actuations = Counter(
            "autoscalerd_actuation_attempts_total",
            "Target changes handed to an actuator (idempotent no-ops excluded)",
            ["actuator", *_DEPLOYMENT],
            registry=r,
        )
        self.actuation_errors = Counter(
            "autoscalerd_actuation_errors_total",
            "Failed actuations by error kind (not_found, unavailable, timeout, ...)",
            ["actuator", *_DEPLOYMENT, "kind"],
            registry=r,
        )
        self.conflicts = Counter(
            "autoscalerd_ownership_conflicts_total",
            "Times someone else changed a target autoscalerd had set (then set again or "
            "left alone, per the actuator's on_conflict)",
            ["actuator", *_DEPLOYMENT],
            registry=r,
        )
        self.burn_rate = Gauge(
            "autoscalerd_slo_burn_rate",
            "The SLO error budget's burn rate over the guard's windows (1: on budget)",
            [*_DEPLOYMENT, "window"],
            registry=r,
        )
        self.max_replicas = Gauge(
            "autoscalerd_max_replicas",
            "The deployment's max_replicas, as configured",
            _DEPLOYMENT,
            registry=r,
        )
        self.gpus = Gauge(
            "autoscalerd_gpus",
            "GPUs attributed to the deployment's replicas, by health",
            [*_DEPLOYMENT, "state"],
            registry=r,
        )
        self.gpu_lost = Gauge(
            "autoscalerd_gpu_lost_replicas",
            "Replicas' worth of capacity lost to GPU faults (failed 1, degraded 1 - share)",
            _DEPLOYMENT,
            registry=r,
        )
        self.cost_used = Gauge(
            "autoscalerd_cost_hours",
            "Replica- and GPU-hours used since the deployment was first seen",
            [*_DEPLOYMENT, "unit"],
            registry=r,
        )
        self.cost_static = Gauge(
            "autoscalerd_cost_static_peak_hours",
            "What static provisioning at the peak running count would have used meanwhile",
            [*_DEPLOYMENT, "unit"],
            registry=r,
        )
        # Per worker group (cluster.worker_groups): label values bounded by the config.
        self.desired_workers = Gauge(
            "autoscalerd_desired_workers",
            "Worker nodes each worker group needs for every deployment's target plus its "
            "forecast headroom, the replicas' resources packed onto the group's node shape "
            "(updated on ticks with complete inputs, held otherwise)",
            ["group"],
            registry=r,
        )
        self._worker_groups: set[str] = set()
        self.sensor_errors = Counter(
            "autoscalerd_sensor_errors_total",
            "Ticks in which a sensor failed or timed out",
            ["sensor"],
            registry=r,
        )
        self.sensor_up = Gauge(
            "autoscalerd_sensor_up",
            "1 when the sensor's last call succeeded",
            ["sensor"],
            registry=r,
        )
        self.input_age = Gauge(
            "autoscalerd_input_age_seconds",
            "Age of each sensed input at the latest tick (staleness)",
            [*_DEPLOYMENT, "input"],
            registry=r,
        )
        self.deployment_errors = Counter(
            "autoscalerd_deployment_errors_total",
            "Ticks in which deciding for a deployment failed",
            _DEPLOYMENT,
            registry=r,
        )
        self.ticks = Counter("autoscalerd_ticks_total", "Completed ticks", registry=r)
        self.tick_duration = Histogram(
            "autoscalerd_tick_duration_seconds",
            "Wall time of one tick: sense, decide, act",
            buckets=TICK_BUCKETS_S,
            registry=r,
        )
        self.refit_duration = Histogram(
            "autoscalerd_forecast_refit_duration_seconds",
            "Wall time of one forecaster refit (statsmodels fit)",
            _DEPLOYMENT,
            buckets=REFIT_BUCKETS_S,
            registry=r,
        )
        self.refit_failures = Counter(
            "autoscalerd_forecast_refit_failures_total",
            "Forecaster refits that failed (the previous model is kept)",
            _DEPLOYMENT,
            registry=r,
        )
        self.reloads = Counter(
            "autoscalerd_config_reloads_total",
            "SIGHUP config reloads: result=applied or rejected (invalid, old config kept)",
            ["result"],
            registry=r,
        )
        self.reload_ok = Gauge(
            "autoscalerd_config_last_reload_successful",
            "1 when the last reload was applied (or none was tried), 0 when it was rejected",
            registry=r,
        )
        self.reload_ok.set(1)
        self.state_saves = Counter(
            "autoscalerd_state_saves_total",
            "Writes of the state file: result=ok or failed",
            ["result"],
            registry=r,
        )
        for result in ("applied", "rejected"):
            self.reloads.labels(result)
        for result in ("ok", "failed"):
            self.state_saves.labels(result)

    # ------------------------------------------------------------------ feeding

    def on_tick(self, controller: Controller, report: TickReport) -> None:
        self.ticks.inc()
        self.tick_duration.observe(report.duration_s)
        for sensor in controller.sensors:
            name = getattr(sensor, "name", type(sensor).__name__)
            failed = name in report.sensor_errors
            self.sensor_up.labels(name).set(0 if failed else 1)
            if failed:
                self.sensor_errors.labels(name).inc()
        for name in report.deployment_errors:
            self.deployment_errors.labels(*_labels(name)).inc()
        for decision in report.decisions:
            for reason in decision.reasons:
                self.decisions.labels(*_labels(decision.deployment), reason.value).inc()
        for result in report.results:
            if result.conflict:
                self.conflicts.labels(result.actuator, *_labels(result.deployment)).inc()
            if result.skipped:
                continue
            self.actuations.labels(result.actuator, *_labels(result.deployment)).inc()
            if not result.ok:
                self.actuation_errors.labels(
                    result.actuator, *_labels(result.deployment), result.error_kind or "error"
                ).inc()
        for name, runtime in controller.deployments.items():
            self._deployment(name, runtime, report.started_at_s)
        self._workers(controller, report)

    def on_refit(self, deployment: str, duration_s: float | None) -> None:
        """A refit finished: its duration, or None when it failed."""
        if duration_s is None:
            self.refit_failures.labels(*_labels(deployment)).inc()
        else:
            self.refit_duration.labels(*_labels(deployment)).observe(duration_s)

    def on_reload(self, applied: bool) -> None:
        self.reloads.labels("applied" if applied else "rejected").inc()
        self.reload_ok.set(1 if applied else 0)

    def on_state_saved(self, ok: bool) -> None:
        self.state_saves.labels("ok" if ok else "failed").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ per worker group

    def _workers(self, controller: Controller, report: TickReport) -> None:
        """autoscalerd_desired_workers from this tick's decisions, on a tick whose inputs are
        complete: every sensor answered, every deployment was decided, none waits for its
        platform's target, and every resource amount is a number. Otherwise the values
        stand as they were (absent before the first such tick): a count from partial data
        would be lower than what runs, and a scaler acting on it would take nodes from
        under running replicas."""
        groups = controller.config.cluster.worker_groups
        if not groups:
            return
        if report.sensor_errors or report.deployment_errors:
            return
        if any(why != NOT_REPORTED for why in controller.waiting.values()):
            return
        needs: dict[str, tuple[int, Mapping[str, float]]] = {}
        for decision in report.decisions:
            runtime = controller.deployments.get(decision.deployment)
            if runtime is None or runtime.info is None:
                continue
            replicas = decision.target_replicas + max(0, runtime.headroom_replicas)
            needs[decision.deployment] = (replicas, runtime.info.resources_per_replica)
        plan = desired_workers(needs, groups, controller.config.cluster.max_gpus)
        if plan.unknown:
            return
        for name, workers in plan.workers.items():
            self.desired_workers.labels(name).set(workers)
        for name in self._worker_groups - set(plan.workers):
            self.desired_workers.remove(name)  # a group a reload took out of the config
        self._worker_groups = set(plan.workers)

    # ------------------------------------------------------------------ per deployment

    def _deployment(self, name: str, runtime: DeploymentRuntime, now_s: float) -> None:
        key = _labels(name)
        decision: Decision | None = runtime.last_decision
        if decision is not None:
            unit = decision.load_unit
            _set(self.observed_rate, (*key, unit), decision.arrival_rate_obs_per_s)
            _set(self.forecast_rate, (*key, unit, "point"), decision.arrival_rate_forecast_per_s)
            _set(self.forecast_rate, (*key, unit, "upper"), decision.arrival_rate_upper_per_s)
            _set(self.service_rate, (*key, unit), decision.service_rate_per_replica_per_s)
            self.desired_replicas.labels(*key).set(decision.target_replicas)
            _set(self.burn_rate, (*key, "fast"), decision.burn_rate_fast)
            _set(self.burn_rate, (*key, "slow"), decision.burn_rate_slow)
        self.max_replicas.labels(*key).set(runtime.config.autoscaling.max_replicas)
        obs: Observation | None = runtime.last_observation
        running = obs.running_replicas if obs is not None else None
        if running is not None:
            self.current_replicas.labels(*key).set(running.value)
        elif decision is not None:
            self.current_replicas.labels(*key).set(decision.previous_replicas)
        _set(self.applied_replicas, key, runtime.applied_replicas)
        self.paused.labels(*key).set(1 if runtime.paused else 0)
        _set(self.override, key, runtime.override_replicas)
        if obs is not None:
            for input_name, reading in _readings(obs):
                self.input_age.labels(*key, input_name).set(reading.age_s(now_s))
            if obs.gpu_lost_replicas is not None:
                self.gpu_lost.labels(*key).set(obs.gpu_lost_replicas.value)
                for state in ("healthy", "degraded", "failed"):
                    count = sum(1 for g in obs.gpu_replicas if g.state == state)
                    self.gpus.labels(*key, state).set(count)
        cost = runtime.cost.report()
        for unit, used, static in (
            ("replica", cost["replica_hours"], cost["static_peak_replica_hours"]),
            ("gpu", cost["gpu_hours"], cost["static_peak_gpu_hours"]),
        ):
            _set(self.cost_used, (*key, unit), used)
            _set(self.cost_static, (*key, unit), static)


def _labels(name: str) -> tuple[str, str]:
    """("app", "deployment") of autoscalerd's "app/deployment"; ("", name) without a "/"."""
    app, slash, deployment = name.partition("/")
    return (app, deployment) if slash else ("", name)


def _set(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    """Set the series, or remove it while the value is unknown (absent, not a false 0)."""
    if value is None:
        with contextlib.suppress(KeyError):  # never set
            gauge.remove(*labels)
        return
    gauge.labels(*labels).set(value)


def _readings(obs: Observation) -> list[tuple[str, Reading]]:
    out: list[tuple[str, Reading]] = []
    for f in fields(obs):
        value = getattr(obs, f.name)
        if isinstance(value, Reading):
            out.append((f.name, value))
    return out
