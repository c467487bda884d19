"""The controller: each tick, sense -> decide -> act for every managed deployment.

The imperative shell around the pure core. Nothing a single sensor, deployment or
actuator does may stop the loop: each failure is logged once per change, counted, and
the rest carry on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from autoscalerd import audit, logs
from autoscalerd import state as saved_state
from autoscalerd.act.base import Actuation, ActuationResult, Actuator
from autoscalerd.clock import Clock
from autoscalerd.config import Config, DeploymentConfig
from autoscalerd.cost import CostMeter
from autoscalerd.decide import gpu_health, policy
from autoscalerd.decide.capacity import replicas_for_rate
from autoscalerd.decide.gpu_health import GpuHealth, GpuReading
from autoscalerd.forecast import holt_winters
from autoscalerd.model import Decision, DeploymentState, Histogram, Observation, Reading, Reason
from autoscalerd.sense.base import DeploymentInfo, SenseResult, Sensor, TraceSensor


@dataclass
class DeploymentRuntime:
    """The shell's view of one deployment: its state plus what the operator set."""

    name: str
    config: DeploymentConfig
    state: DeploymentState
    info: DeploymentInfo | None = None
    last_observation: Observation | None = None
    last_decision: Decision | None = None
    last_error: str | None = None
    paused: bool = False
    paused_until_s: float | None = None  # None: until resume
    override_replicas: int | None = None
    override_until_s: float | None = None
    # The pause or override in force (who, why, since, until), and the last actions.
    operator_action: audit.OperatorAction | None = None
    operator_history: tuple[audit.OperatorAction, ...] = ()
    refit_in_flight: bool = False
    applied_replicas: int | None = None  # the last target an actuator confirmed
    # Replicas the forecast's upper bound adds over the target for the node lead time.
    headroom_replicas: int = 0
    decide_failures: int = 0  # consecutive ticks whose decision raised
    cost: CostMeter = field(default_factory=CostMeter)  # replica- and GPU-hours so far
    # The controller's logger, bound to this deployment once it is adopted.
    log: Any = field(default_factory=lambda: logs.get("autoscalerd.loop"))
    # Someone else changing the target we set: how often, and the last time and word.
    conflicts: int = 0
    last_conflict: str | None = None
    last_conflict_at_s: float | None = None


@dataclass
class TickReport:
    """What one tick did, for listeners (metrics, sd_notify, the demo view)."""

    started_at_s: float
    duration_s: float
    # Every decision of the tick, a paused deployment's too (it is decided, not actuated).
    decisions: list[Decision] = field(default_factory=list)
    results: list[ActuationResult] = field(default_factory=list)
    sensor_errors: dict[str, str] = field(default_factory=dict)
    deployment_errors: dict[str, str] = field(default_factory=dict)


TickListener = Callable[["Controller", TickReport], None]
# (deployment, duration in seconds, or None when the refit failed)
RefitListener = Callable[[str, "float | None"], None]

# On SIGTERM a tick in progress gets this long to finish before it is abandoned, and
# sensors and actuators as long again to close: the daemon exits well within 10 s.
STOP_GRACE_S = 4.0
# A deployment's learning restarts after this many decisions in a row fail.
DECIDE_FAILURES_BEFORE_RESET = 3
CLOSE_TIMEOUT_S = 3.0
# Why a named deployment waits when no sensor has reported it: with every sensor
# answering, it is not on the platform (any other reason: it runs, on an unread target).
NOT_REPORTED = "no sensor has reported it yet"


def merge_observations(name: str, now_s: float, observations: Sequence[Observation]) -> Observation:
    """One Observation from several sensors: for each field, the freshest known reading or
    histogram (a tick's TTFT, prompt and wait histograms are the SLO guard's counts and the
    replica model's prompt mix)."""
    merged: dict[str, Any] = {}
    for obs in observations:
        for f in fields(obs):
            value = getattr(obs, f.name)
            if isinstance(value, Reading | Histogram):
                known = merged.get(f.name)
                if known is None or value.at_s > known.at_s:
                    merged[f.name] = value
    return Observation(deployment=name, sensed_at_s=now_s, **merged)


def _local_ips(extra: Sequence[str]) -> frozenset[str]:
    """This host's addresses: NVML's GPUs are on the replicas whose node_ip is one."""
    found = {"127.0.0.1", "::1", *extra}
    with contextlib.suppress(OSError):
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    # The address of the default route's interface, as Ray picks a node's ip: a UDP
    # "connection" only chooses the source address, it sends nothing.
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("8.8.8.8", 80))
        found.add(probe.getsockname()[0])
    return frozenset(found)


def _unusable(
    obs: Observation, state: DeploymentState, cfg: DeploymentConfig, now_s: float
) -> str | None:
    """Why a restored state cannot be decided on, or None: one trial decision on this
    tick's observation (thrown away), so that state which decodes but is poisoned (a
    zero rate it divides by, a parameter out of its range) is dropped at load, not
    failed on every tick."""
    try:
        decision, _ = policy.decide(obs, state, cfg, now_s)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    if decision.target_replicas < 0:
        return "negative target"
    return None


class Controller:
    def __init__(
        self,
        config: Config,
        sensors: Sequence[Sensor],
        actuators: Sequence[Actuator],
        clock: Clock,
        *,
        inline_refit: bool = False,
        dry_run: bool = False,
    ) -> None:
        self.config = config
        self.sensors = list(sensors)
        self.actuators = list(actuators)
        self.clock = clock
        self.dry_run = dry_run
        # Virtual time replays refit in line (deterministic); real time refits in a process
        # so the statsmodels fit never stalls the event loop.
        self.inline_refit = inline_refit
        self.deployments: dict[str, DeploymentRuntime] = {}
        self.listeners: list[TickListener] = []
        self.refit_listeners: list[RefitListener] = []
        # Saved state not yet adopted: a deployment takes its entry when first seen.
        self.restored: dict[str, saved_state.SavedDeployment] = {}
        self.ticks_completed = 0
        self.started_monotonic_s = time.monotonic()
        self._pending_config: Config | None = None
        self.last_tick_at_s: float | None = None
        self.last_tick_monotonic_s: float | None = None
        self.sensor_errors: dict[str, str] = {}
        self._stop = asyncio.Event()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._log = logs.get("autoscalerd.loop")
        self._reported: dict[tuple[str, str], str] = {}
        self.last_refit_duration_s: float | None = None
        # Deployments named or discovered but not yet adopted, and why: nothing is
        # actuated before the platform's current target has been read.
        self.waiting: dict[str, str] = {}
        # This tick's GPU facts from every sensor, and those no replica was found on.
        self.gpus: list[GpuReading] = []
        self.unattributed_gpus: dict[str, GpuHealth] = {}
        self.local_ips = _local_ips(config.gpu.node_ips)

    # ------------------------------------------------------------------ lifecycle

    def snapshot(self, now_s: float) -> dict[str, saved_state.SavedDeployment]:
        """Every deployment's state and operator settings as plain values, for the state
        file: the managed ones as of `now_s`, plus saved ones not seen since the start
        (carried for CARRY_UNSEEN_S, so a deployment briefly absent keeps its learning)."""
        out: dict[str, saved_state.SavedDeployment] = {}
        for name, saved in self.restored.items():
            if now_s - saved.saved_at_s <= saved_state.CARRY_UNSEEN_S:
                out[name] = saved
        for name, runtime in self.deployments.items():
            out[name] = saved_state.SavedDeployment(
                saved_at_s=now_s,
                state=runtime.state,
                paused=runtime.paused,
                paused_until_s=runtime.paused_until_s,
                override_replicas=runtime.override_replicas,
                override_until_s=runtime.override_until_s,
                applied_replicas=runtime.applied_replicas,
                operator_action=runtime.operator_action,
                operator_history=runtime.operator_history,
            )
        return out

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def finished(self) -> bool:
        """True when every sensor is a finite replay that has run out."""
        return bool(self.sensors) and all(
            isinstance(s, TraceSensor) and s.finished for s in self.sensors
        )

    async def run(self) -> None:
        deadline_s = self.clock.now_s()
        try:
            while not self._stop.is_set():
                if not await self._tick_or_stop(deadline_s):
                    break
                if self.finished():
                    break
                tick_s = self.config.tick_s  # a reload may change it
                deadline_s += tick_s
                now_s = self.clock.now_s()
                if now_s > deadline_s + tick_s:
                    # Overran by more than a tick: skip the missed ticks rather than burst.
                    deadline_s = now_s
                await self._sleep_or_stop(deadline_s)
        finally:
            await self.close()

    async def _tick_or_stop(self, now_s: float) -> bool:
        """Run one tick; on stop, let it finish within STOP_GRACE_S, else abandon it.

        An abandoned tick leaves consistent state: each deployment's decision is made in
        one synchronous step, so cancelling can only cut sensing or actuation short.
        """
        tick = asyncio.ensure_future(self.tick(now_s))
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({tick, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not tick.done():
                await asyncio.wait({tick}, timeout=STOP_GRACE_S)
            if not tick.done():
                tick.cancel()
                await asyncio.gather(tick, return_exceptions=True)
                self._log.warning("tick_abandoned", grace_s=STOP_GRACE_S)
                return False
            tick.result()  # a failure of the loop itself propagates
            return True
        finally:
            stopper.cancel()
            await asyncio.gather(stopper, return_exceptions=True)

    async def _sleep_or_stop(self, deadline_s: float) -> None:
        sleeper = asyncio.ensure_future(self.clock.sleep_until(deadline_s))
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    async def close(self) -> None:
        components: list[Sensor | Actuator] = [*self.sensors, *self.actuators]
        results = await asyncio.gather(
            *(asyncio.wait_for(c.close(), CLOSE_TIMEOUT_S) for c in components),
            return_exceptions=True,
        )
        for component, result in zip(components, results, strict=True):
            if isinstance(result, Exception):
                error = "timed out" if isinstance(result, TimeoutError) else str(result)
                self._log.warning("close_failed", component=component.name, error=error)
        if self._pool is not None:
            # A fit in progress is not worth waiting for at exit (the interpreter would
            # join the worker): end it; the next start refits if still due.
            workers = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for worker in workers:
                worker.terminate()
            self._pool = None

    def reload(self, config: Config) -> None:
        """Apply a new, already validated config; each deployment keeps its state."""
        self.config = config
        for runtime in self.deployments.values():
            runtime.config = config.deployment(runtime.name)

    def stage_reload(self, config: Config) -> None:
        """Apply a new, already validated config at the start of the next tick, so that a
        tick in progress decides with one config throughout."""
        self._pending_config = config

    # ------------------------------------------------------------------ one tick

    async def tick(self, now_s: float) -> TickReport:
        if self._pending_config is not None:
            self.reload(self._pending_config)
            self._pending_config = None
        started = time.monotonic()
        report = TickReport(started_at_s=now_s, duration_s=0.0)
        sensed = await self._sense(now_s, report)
        actuations: list[Actuation] = []
        for name in self._managed(sensed):
            try:
                actuation = self._decide_one(name, sensed, now_s)
            except Exception as exc:  # one deployment's failure must not stop the others
                error = f"{type(exc).__name__}: {exc}"
                report.deployment_errors[name] = error
                self._report_change(("deployment", name), error, "decide_failed")
                failing = self.deployments.get(name)
                if failing is not None:
                    self._heal(failing, now_s, error)
                continue
            if name in self.deployments:
                self.deployments[name].decide_failures = 0
            self._report_change(("deployment", name), "", "decide_recovered")
            runtime = self.deployments.get(name)
            decision = runtime.last_decision if runtime is not None else None
            if decision is not None:
                report.decisions.append(decision)
            if actuation is not None:
                actuations.append(actuation)
        report.results = await self._act(actuations)
        report.duration_s = time.monotonic() - started
        self.ticks_completed += 1
        self.last_tick_at_s = now_s
        self.last_tick_monotonic_s = time.monotonic()
        for listener in self.listeners:
            try:
                listener(self, report)
            except Exception as exc:
                self._log.warning("listener_failed", error=f"{type(exc).__name__}: {exc}")
        return report

    async def _sense(
        self, now_s: float, report: TickReport
    ) -> dict[str, tuple[list[Observation], DeploymentInfo | None]]:
        timeout_s = max(1.0, 0.8 * self.config.tick_s)
        results = await asyncio.gather(
            *(asyncio.wait_for(sensor.sense(now_s), timeout_s) for sensor in self.sensors),
            return_exceptions=True,
        )
        sensed: dict[str, tuple[list[Observation], DeploymentInfo | None]] = {}
        self.gpus = []
        for sensor, result in zip(self.sensors, results, strict=True):
            name = sensor.name
            error: str | None
            if isinstance(result, BaseException):
                error = (
                    "timed out"
                    if isinstance(result, TimeoutError)
                    else f"{type(result).__name__}: {result}"
                )
            else:
                error = (
                    result.error if isinstance(result, SenseResult) else "returned no SenseResult"
                )
            if error:
                report.sensor_errors[name] = error
                self.sensor_errors[name] = error
            else:
                self.sensor_errors.pop(name, None)
            self._report_change(
                ("sensor", name), error or "", "sensor_failed" if error else "sensor_recovered"
            )
            if not isinstance(result, SenseResult):
                continue
            self.gpus.extend(result.gpus)
            for dep_name, info in result.deployments.items():
                observations, _ = sensed.get(dep_name, ([], None))
                sensed[dep_name] = (observations, info)
            for dep_name, obs in result.observations.items():
                observations, known_info = sensed.get(dep_name, ([], None))
                observations.append(obs)
                sensed[dep_name] = (observations, known_info)
        return sensed

    def _managed(
        self, sensed: dict[str, tuple[list[Observation], DeploymentInfo | None]]
    ) -> list[str]:
        names = [d.name for d in self.config.deployments]
        if self.config.discovery.enabled:
            for name, (_, info) in sensed.items():
                if name not in names and (info is None or info.external_scaler_enabled):
                    names.append(name)
        return names

    def _decide_one(
        self,
        name: str,
        sensed: dict[str, tuple[list[Observation], DeploymentInfo | None]],
        now_s: float,
    ) -> Actuation | None:
        observations, info = sensed.get(name, ([], None))
        obs = merge_observations(name, now_s, observations)
        runtime = self.deployments.get(name)
        if runtime is None:
            why = self._not_yet_seen(name, obs, info, now_s)
            if why is not None:
                if self.waiting.get(name) != why:
                    self._log.info("deployment_waiting", deployment=name, reason=why)
                self.waiting[name] = why
                return None
            self.waiting.pop(name, None)
            runtime = self._adopt(name, obs, now_s)
        if info is not None:
            runtime.info = info
        obs = self._with_gpus(obs, runtime.info, now_s)
        runtime.last_observation = obs
        resources = runtime.info.resources_per_replica if runtime.info is not None else {}
        runtime.cost.update(
            now_s,
            obs.fresh("running_replicas", now_s, runtime.config.max_metric_age_s),
            float(resources.get("GPU", 0.0)),
        )
        self._maybe_refit(runtime, now_s)
        decision, runtime.state = policy.decide(obs, runtime.state, runtime.config, now_s)
        decision = self._apply_operator(runtime, decision, now_s)
        runtime.last_decision = decision
        log = runtime.log
        if decision.changed:
            log.info(
                "decision",
                target=decision.target_replicas,
                previous=decision.previous_replicas,
                reasons=[r.value for r in decision.reasons],
                dry_run=self.dry_run,
                **{
                    k: v
                    for k, v in decision.as_dict().items()
                    if k not in {"deployment", "reasons", "target_replicas", "previous_replicas"}
                    and v not in (None, [])
                },
            )
        else:
            log.debug(
                "decision",
                target=decision.target_replicas,
                reasons=[r.value for r in decision.reasons],
            )
        headroom = 0
        if (
            decision.arrival_rate_upper_per_s is not None
            and decision.service_rate_per_replica_per_s
        ):
            headroom = max(
                0,
                replicas_for_rate(
                    decision.arrival_rate_upper_per_s,
                    decision.service_rate_per_replica_per_s,
                    runtime.config.capacity.target_utilization,
                )
                - decision.target_replicas,
            )
        runtime.headroom_replicas = headroom
        if runtime.paused:
            return None
        return Actuation(decision=decision, info=runtime.info, headroom_replicas=headroom)

    def _with_gpus(
        self, obs: Observation, info: DeploymentInfo | None, now_s: float
    ) -> Observation:
        """The deployment's GPUs and the capacity their faults took, joined here (the
        GPUs come from one sensor, the replicas from another)."""
        if not self.gpus:
            return obs
        replicas = info.replicas if info is not None else ()
        attributed, unattributed = gpu_health.attribute(
            self.gpus, replicas, self.local_ips, now_s, self.config.gpu.throttle_sustain_s
        )
        owned = {g.gpu_uuid for g in attributed}
        for health in unattributed:
            self.unattributed_gpus[health.uuid] = health
        for uuid in owned:
            self.unattributed_gpus.pop(uuid, None)
        if not replicas:
            return obs
        ours = {r.replica_id for r in replicas}
        mine = tuple(g for g in attributed if g.replica_id in ours)
        at_s = min((g.at_s for g in self.gpus), default=now_s)
        return replace(
            obs,
            gpu_replicas=mine,
            gpu_lost_replicas=Reading(gpu_health.lost_replicas(mine), at_s),
        )

    def _not_yet_seen(
        self, name: str, obs: Observation, info: DeploymentInfo | None, now_s: float
    ) -> str | None:
        """Why a deployment cannot be adopted yet, or None. Adopting it before the platform
        has been read would start from min_replicas (or a saved target) and could lower
        what runs: a slow first round must delay the start, never scale down."""
        if info is None:
            return NOT_REPORTED
        max_age_s = self.config.deployment(name).max_metric_age_s
        if (
            info.watches_platform
            and obs.fresh("platform_target_replicas", now_s, max_age_s) is None
        ):
            return "the platform's current target has not been read yet"
        return None

    def _adopt(self, name: str, obs: Observation, now_s: float) -> DeploymentRuntime:
        """A deployment seen for the first time: from saved state if there is usable state,
        else starting from what the platform runs."""
        cfg = self.config.deployment(name)
        platform = obs.fresh("platform_target_replicas", now_s, cfg.max_metric_age_s)
        current = int(platform) if platform is not None else None
        saved = self.restored.pop(name, None)
        restored = saved_state.restore(saved, now_s, cfg, current) if saved else None
        if restored is not None:
            problem = _unusable(obs, restored, cfg, now_s)
            if problem is not None:
                self._log.warning(
                    "state_not_restored",
                    deployment=name,
                    reason=f"saved state cannot be decided on ({problem})",
                    action="starting it afresh",
                )
                saved = restored = None
        if saved is not None and restored is not None:
            runtime = DeploymentRuntime(
                name=name,
                config=cfg,
                state=restored,
                paused=saved.paused,
                paused_until_s=saved.paused_until_s,
                override_replicas=saved.override_replicas,
                override_until_s=saved.override_until_s,
                applied_replicas=saved.applied_replicas,
                operator_action=saved.operator_action,
                operator_history=saved.operator_history[-audit.HISTORY_KEPT :],
            )
            self._log.info(
                "state_restored",
                deployment=name,
                replicas=restored.target_replicas,
                saved_replicas=saved.state.target_replicas,
                down_s=round(now_s - saved.saved_at_s, 3),
                # False: no scale-down until downscale_delay_s of fresh data (see state.py).
                fresh_history_kept=restored.fresh_since_s is not None,
                paused=saved.paused,
            )
        else:
            if saved is not None:
                self._log.warning(
                    "state_not_restored",
                    deployment=name,
                    reason="saved later than now on this clock",
                    saved_at_s=saved.saved_at_s,
                )
            runtime = DeploymentRuntime(
                name=name, config=cfg, state=policy.initial_state(cfg, now_s, current)
            )
        runtime.log = self._log.bind(deployment=name)
        self.deployments[name] = runtime
        runtime.log.info("deployment_managed", replicas=runtime.state.target_replicas)
        return runtime

    def _heal(self, runtime: DeploymentRuntime, now_s: float, error: str) -> None:
        """A deployment whose decision fails tick after tick has state that no longer
        fits (damaged, or from a bug): after a few, start its learning afresh from the
        target it holds, so that one bad state cannot leave it unmanaged for good."""
        runtime.decide_failures += 1
        if runtime.decide_failures < DECIDE_FAILURES_BEFORE_RESET:
            return
        target = runtime.state.target_replicas
        runtime.state = policy.initial_state(runtime.config, now_s, target)
        runtime.decide_failures = 0
        runtime.log.warning(
            "state_reset",
            error=error,
            replicas=target,
            action="learning again from the current target",
        )

    def _apply_operator(
        self, runtime: DeploymentRuntime, decision: Decision, now_s: float
    ) -> Decision:
        """Pause and override are the operator's; they sit on top of the policy's decision."""
        self._expire_operator(runtime, now_s)
        if runtime.override_replicas is not None:
            target = runtime.override_replicas
            runtime.state = runtime.state.with_(target_replicas=target)
            return replace(
                decision, target_replicas=target, reasons=(*decision.reasons, Reason.OVERRIDE)
            )
        if runtime.paused:
            # Hold what is running; the policy keeps learning (rates, forecast) meanwhile.
            runtime.state = runtime.state.with_(target_replicas=decision.previous_replicas)
            return replace(
                decision,
                target_replicas=decision.previous_replicas,
                reasons=(*decision.reasons, Reason.PAUSED),
            )
        return decision

    def _expire_operator(self, runtime: DeploymentRuntime, now_s: float) -> None:
        """A pause or override whose until_s has passed on the daemon's clock ends here, in
        the tick, so that it ends on time whether or not anyone is looking; the trail gets
        an "expire" entry and the log a line."""
        ended = []
        until_s = runtime.override_until_s
        if runtime.override_replicas is not None and until_s is not None and now_s >= until_s:
            runtime.override_replicas = runtime.override_until_s = None
            ended.append("override")
        until_s = runtime.paused_until_s
        if runtime.paused and until_s is not None and now_s >= until_s:
            runtime.paused, runtime.paused_until_s = False, None
            ended.append("pause")
        if not ended:
            return
        previous = runtime.operator_action
        reason = " and ".join(ended) + " reached its until_s"
        if previous is not None:
            reason += f" (set by {previous.by}: {previous.reason})"
        record = audit.OperatorAction("expire", audit.EXPIRY_BY, reason[:300], now_s)
        runtime.operator_action = None
        runtime.operator_history = audit.appended(runtime.operator_history, record)
        runtime.log.info("operator_expired", ended=ended, by=record.by, reason=record.reason)

    def _maybe_refit(self, runtime: DeploymentRuntime, now_s: float) -> None:
        cfg = runtime.config
        if not cfg.forecast.enabled or runtime.refit_in_flight:
            return
        if not holt_winters.refit_due(runtime.state.forecaster, now_s, cfg.forecast):
            return
        if self.inline_refit:
            started = time.monotonic()
            model_before = runtime.state.forecaster.model
            runtime.state = policy.refit_forecaster(runtime.state, cfg, now_s)
            fitted = runtime.state.forecaster.model is not model_before
            self._refitted(runtime.name, time.monotonic() - started if fitted else None)
            return
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=1)
        snapshot = runtime.state.forecaster
        runtime.refit_in_flight = True
        started = time.monotonic()
        future = asyncio.get_running_loop().run_in_executor(
            self._pool, holt_winters.fit_state, snapshot, cfg.forecast
        )

        def installed(done: asyncio.Future[holt_winters.FittedModel]) -> None:
            runtime.refit_in_flight = False
            if done.cancelled():  # shutting down
                return
            try:
                model = done.result()
            except Exception as exc:
                runtime.log.warning("refit_failed", error=f"{type(exc).__name__}: {exc}")
                self._refitted(runtime.name, None)
                return
            fitted_at_s = self.clock.now_s()
            runtime.state = runtime.state.with_(
                forecaster=holt_winters.install_fit(runtime.state.forecaster, model, fitted_at_s)
            )
            self.last_refit_duration_s = time.monotonic() - started
            runtime.log.info(
                "refit",
                method=model.method,
                duration_s=round(self.last_refit_duration_s, 3),
            )
            self._refitted(runtime.name, self.last_refit_duration_s)

        future.add_done_callback(installed)

    def _refitted(self, name: str, duration_s: float | None) -> None:
        for listener in self.refit_listeners:
            try:
                listener(name, duration_s)
            except Exception as exc:
                self._log.warning("listener_failed", error=f"{type(exc).__name__}: {exc}")

    async def _act(self, actuations: list[Actuation]) -> list[ActuationResult]:
        if not actuations:
            return []
        timeout_s = max(2.0, 0.8 * self.config.tick_s)
        results = await asyncio.gather(
            *(
                asyncio.wait_for(actuator.apply(actuations), timeout_s)
                for actuator in self.actuators
            ),
            return_exceptions=True,
        )
        out: list[ActuationResult] = []
        failed: set[str] = set()
        for actuator, result in zip(self.actuators, results, strict=True):
            name = actuator.name
            if isinstance(result, BaseException):
                kind = "timeout" if isinstance(result, TimeoutError) else "error"
                message = "timed out" if kind == "timeout" else f"{type(result).__name__}: {result}"
                for actuation in actuations:
                    failed.add(actuation.decision.deployment)
                    out.append(
                        ActuationResult(
                            actuation.decision.deployment,
                            name,
                            ok=False,
                            error_kind=kind,
                            message=message,
                        )
                    )
                self._report_change(("actuator", name), message, "actuator_failed")
                continue
            out.extend(result)
            for item in result:
                if item.conflict:
                    self._conflicted(item)
                key = ("actuation", f"{name}:{item.deployment}")
                self._report_change(
                    key,
                    "" if item.ok else f"{item.error_kind}: {item.message}",
                    "actuation_failed" if not item.ok else "actuation_recovered",
                )
                if item.ok:
                    runtime = self.deployments.get(item.deployment)
                    if runtime is not None and item.applied_replicas is not None:
                        runtime.applied_replicas = item.applied_replicas
                    if runtime is not None and not item.skipped:
                        runtime.last_error = None
                elif not item.ok:
                    failed.add(item.deployment)
                    runtime = self.deployments.get(item.deployment)
                    if runtime is not None:
                        runtime.last_error = f"{name}: {item.error_kind}: {item.message}"
        for deployment in failed:
            self._not_landed(deployment)
        return out

    def _conflicted(self, item: ActuationResult) -> None:
        runtime = self.deployments.get(item.deployment)
        if runtime is None:
            return
        runtime.conflicts += 1
        runtime.last_conflict = f"{item.actuator}: {item.message}" if item.message else None
        runtime.last_conflict_at_s = self.clock.now_s()

    def _not_landed(self, name: str) -> None:
        """A target an actuator could not apply did not land: the next decision steps from
        what runs (the platform's reading, else the last confirmed target), so that steps
        are never compounded on a target that exists only here."""
        runtime = self.deployments.get(name)
        if runtime is None:
            return
        reading = runtime.info.platform_target_replicas if runtime.info is not None else None
        known = reading is not None and math.isfinite(reading.value) and reading.value >= 0
        landed = int(reading.value) if reading is not None and known else runtime.applied_replicas
        if landed is not None and landed != runtime.state.target_replicas:
            runtime.state = runtime.state.with_(target_replicas=landed)

    def _report_change(self, key: tuple[str, str], error: str, event: str) -> None:
        """Log a failure when it starts or changes, and a recovery once: not every tick."""
        previous = self._reported.get(key, "")
        if error == previous:
            return
        self._reported[key] = error
        if error:
            self._log.error(event, source=key[0], name=key[1], error=error)
        elif previous:
            self._log.info(event, source=key[0], name=key[1])
