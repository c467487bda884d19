"""The `ray_serve` actuator: Ray Serve's external-scaler API on the dashboard.

`POST /api/v1/applications/{app}/deployments/{deployment}/scale` with
`{"target_num_replicas": N}` (Ray >= 2.5x; the app must be deployed with
`external_scaler_enabled: true`). Answers, as Ray 2.60 gives them: 200 accepted (Serve
scales asynchronously), 404 unknown app or deployment, 412 external scaling not enabled
(or the deployment is being deleted), 400 bad body, 503 controller unavailable; 401/403
from the dashboard's token check.

Idempotent: no call when the platform already runs the target, or when it is what we set
and nobody changed it since. 503s, timeouts and refused connections are retried with
exponential backoff and jitter within a deadline that fits the loop's tick; a rejection
(404/412/400) is not re-sent for the same target for `retry_rejected_after_s`.

Ownership: when the platform's target (as the sensor read it after our last call) is not
what we set, someone else changed it. That is reported (a warning and `conflict=True`),
then by default our target is set again; with `on_conflict: pause` the deployment is left
alone for `conflict_pause_s`, or until its target matches ours again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from autoscalerd_plugins.gpu_replace import ReplicaReplacer, ray_kill
from pydantic import BaseModel, ConfigDict, Field
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential_jitter,
)

from autoscalerd import extras, logs
from autoscalerd.act.base import Actuation, ActuationResult, ActuatorContext
from autoscalerd.config import ConfigError, plugin_settings
from autoscalerd.dashboard import (
    TIMEOUT,
    UNAVAILABLE,
    DashboardClient,
    DashboardError,
    Response,
    find_token,
)
from autoscalerd.sense.base import DeploymentInfo

SCALE_PATH = "/api/v1/applications/{app}/deployments/{deployment}/scale"


class RayServeActuatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_attempts: int = Field(3, ge=1)
    backoff_initial_s: float = Field(0.2, gt=0)
    backoff_max_s: float = Field(1.0, gt=0)
    # Everything for one deployment, retries included, within this: the loop gives all
    # actuators max(2, 0.8·tick_s) per tick.
    deadline_s: float = Field(1.5, gt=0)
    retry_rejected_after_s: float = Field(30.0, ge=0)
    on_conflict: Literal["reassert", "pause"] = "reassert"
    conflict_pause_s: float = Field(300.0, ge=0)
    # A platform reading this soon after our call may predate it: showing the target we
    # replaced is then not a conflict.
    stale_read_s: float = Field(5.0, ge=0)
    max_concurrency: int = Field(8, ge=1)


@dataclass(frozen=True, slots=True)
class _Set:
    replicas: int
    previous: int | None  # the platform's target before we set it, if known
    at_s: float


@dataclass(frozen=True, slots=True)
class _Rejected:
    replicas: int
    at_s: float
    result: ActuationResult
    enabled: bool | None  # external_scaler_enabled as the sensor read it then


class _Transient(Exception):
    """A 503: worth another try."""

    def __init__(self, response: Response) -> None:
        super().__init__("HTTP 503")
        self.response = response


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, _Transient):
        return True
    return isinstance(exc, DashboardError) and exc.kind in (UNAVAILABLE, TIMEOUT)


def _settings(settings: Mapping[str, Any]) -> RayServeActuatorSettings:
    return plugin_settings(RayServeActuatorSettings, settings)


class RayServeActuator:
    name = "ray_serve"
    settings_model = RayServeActuatorSettings

    def __init__(
        self,
        settings: Mapping[str, Any],
        context: ActuatorContext,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = _settings(settings)
        cluster = context.config.cluster
        self._wall = wall_clock
        self._client = DashboardClient(
            cluster.dashboard_url,
            lambda: find_token(cluster),
            timeout_s=min(cluster.request_timeout_s, self.settings.deadline_s),
            max_concurrency=self.settings.max_concurrency,
        )
        self._dashboard_url = cluster.dashboard_url
        self._last_set: dict[str, _Set] = {}
        self._rejected: dict[str, _Rejected] = {}
        self._paused_until: dict[str, float] = {}
        self._conflicts_reported: dict[str, int] = {}
        self._epochs: dict[str, str] = {}
        self._log = logs.get("autoscalerd.actuator.ray_serve")
        gpu = context.config.gpu
        if gpu.replace_failed and not context.dry_run and extras.missing("ray"):
            raise ConfigError(
                [
                    "gpu.replace_failed: stopping a failed replica needs the 'ray' extra, "
                    "which is not installed here: pip install 'autoscalerd[ray]' "
                    "(or set it to false)"
                ]
            )
        self._replacer = (
            ReplicaReplacer(ray_kill(cluster.address), gpu.replace_every_s)
            if gpu.replace_failed and not context.dry_run
            else None
        )
        self.calls = 0  # scale requests sent, retries included

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        results = await asyncio.gather(*(self._apply_one(a) for a in actuations))
        if self._replacer is None:
            return results
        out = []
        for actuation, result in zip(actuations, results, strict=True):
            done = await self._replacer.replace_failed(actuation, self._wall())
            if done and result.ok:
                result = dataclasses.replace(
                    result, message="; ".join(m for m in (result.message, done) if m)
                )
            out.append(result)
        return out

    async def close(self) -> None:
        if self._replacer is not None:
            self._replacer.close()
        await self._client.close()

    # ------------------------------------------------------------------ one deployment

    async def _apply_one(self, actuation: Actuation) -> ActuationResult:
        decision = actuation.decision
        name = decision.deployment
        target = decision.target_replicas
        info = actuation.info
        now_s = self._wall()
        if info is not None and info.app and info.deployment:
            app, deployment = info.app, info.deployment
        elif "/" in name:
            app, deployment = name.split("/", 1)
        else:
            return self._result(
                name,
                error_kind="bad_request",
                message=f"{name}: name must be 'app/deployment' as Ray Serve names it",
            )
        if app in (".", "..") or deployment in (".", ".."):
            # Percent-encoding leaves dots alone: the path would name another endpoint.
            return self._result(
                name,
                error_kind="bad_request",
                message=f"{name}: '.' and '..' cannot be scaled through the dashboard's URLs",
            )
        reading = info.platform_target_replicas if info is not None else None
        known = reading is not None and math.isfinite(reading.value) and reading.value >= 0
        platform = int(reading.value) if reading is not None and known else None
        platform_at_s = reading.at_s if reading is not None and known else None
        self._notice_restart(name, info)
        rejected = self._rejected.get(name)
        if (
            rejected is not None
            and info is not None
            and rejected.enabled is False
            and info.external_scaler_enabled
        ):
            # Redeployed with external_scaler_enabled: try again now, not in 30 s.
            self._log.info("external_scaler_enabled", deployment=name)
            del self._rejected[name]

        conflict_message = self._conflict(name, platform, platform_at_s)
        if conflict_message and self.settings.on_conflict == "pause":
            self._paused_until[name] = now_s + self.settings.conflict_pause_s
            self._last_set.pop(name, None)
        paused_until = self._paused_until.get(name)
        if paused_until is not None:
            if now_s < paused_until and platform != target:
                return self._result(
                    name,
                    error_kind="conflict",
                    conflict=True,
                    message=conflict_message
                    or f"{name}: left alone after a conflicting change, "
                    f"for {paused_until - now_s:.0f} s more",
                )
            del self._paused_until[name]

        if conflict_message is None:
            last = self._last_set.get(name)
            if last is not None and not self._read_after(last, platform_at_s):
                platform = None  # read before our last call: says nothing about now
            if platform == target:
                # Already there (our doing or not): nothing to send; remember it as ours.
                if last is None or last.replicas != target:
                    self._last_set[name] = _Set(target, None, platform_at_s or now_s)
                return self._result(name, applied=target, skipped=True)
            if last is not None and last.replicas == target:
                # We set it and no later reading says otherwise.
                return self._result(name, applied=target, skipped=True)
        rejected = self._rejected.get(name)
        if (
            rejected is not None
            and rejected.replicas == target
            and now_s - rejected.at_s < self.settings.retry_rejected_after_s
        ):
            return rejected.result

        try:
            response = await asyncio.wait_for(
                self._post(app, deployment, target), self.settings.deadline_s
            )
        except (TimeoutError, asyncio.TimeoutError):
            return self._result(
                name,
                error_kind=TIMEOUT,
                message=f"{name}: no answer from {self._dashboard_url} "
                f"within {self.settings.deadline_s:g} s",
            )
        except DashboardError as exc:
            return self._result(name, error_kind=exc.kind, message=f"{name}: {exc}")
        except _Transient as exc:
            return self._result(
                name,
                error_kind=UNAVAILABLE,
                message=f"{name}: Serve controller unavailable (503) after "
                f"{self.settings.max_attempts} attempts: {_detail(exc.response)}",
            )
        enabled = info.external_scaler_enabled if info is not None else None
        return self._answered(name, app, target, platform, response, conflict_message, enabled)

    def _notice_restart(self, name: str, info: DeploymentInfo | None) -> None:
        """A new platform epoch (the Serve controller restarted with the head): nothing
        set before is in force, and a target it reset to is no one's choice. Forget what
        was set, paused for and rejected, so that the target is asserted again now."""
        epoch = info.platform_epoch if info is not None else None
        if epoch is None:
            return
        before = self._epochs.get(name)
        self._epochs[name] = epoch
        if before is None or before == epoch:
            return
        self._log.warning("platform_restarted", deployment=name, action="setting the target again")
        self._last_set.pop(name, None)
        self._paused_until.pop(name, None)
        self._rejected.pop(name, None)
        self._conflicts_reported.pop(name, None)

    def _read_after(self, last: _Set, platform_at_s: float | None) -> bool:
        return platform_at_s is not None and platform_at_s > last.at_s

    def _conflict(self, name: str, platform: int | None, platform_at_s: float | None) -> str | None:
        """A message when the platform's target, read after our last call, is not ours."""
        last = self._last_set.get(name)
        if last is None or platform is None or platform == last.replicas:
            self._conflicts_reported.pop(name, None)
            return None
        if not self._read_after(last, platform_at_s):
            return None
        assert platform_at_s is not None
        if platform == last.previous and platform_at_s - last.at_s < self.settings.stale_read_s:
            return None  # most likely read before our call took effect
        message = (
            f"{name}: target changed to {platform} by someone else "
            f"(autoscalerd set {last.replicas}); "
            + ("setting it again" if self.settings.on_conflict == "reassert" else "leaving it")
        )
        if self._conflicts_reported.get(name) != platform:
            self._conflicts_reported[name] = platform
            self._log.warning(
                "ownership_conflict",
                deployment=name,
                platform_target=platform,
                ours=last.replicas,
                action=self.settings.on_conflict,
            )
        return message

    async def _post(self, app: str, deployment: str, target: int) -> Response:
        path = SCALE_PATH.format(app=quote(app, safe=""), deployment=quote(deployment, safe=""))
        initial_s = self.settings.backoff_initial_s
        retrying = AsyncRetrying(
            # Stop before a wait would overrun the deadline, rather than be cut off mid-wait.
            stop=stop_after_attempt(self.settings.max_attempts)
            | stop_before_delay(self.settings.deadline_s),
            wait=wait_exponential_jitter(
                multiplier=initial_s, max=self.settings.backoff_max_s, jitter=initial_s
            ),
            retry=retry_if_exception(_transient),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                self.calls += 1
                response = await self._client.post_json(path, {"target_num_replicas": target})
                if response.status == 503:
                    raise _Transient(response)
                return response
        raise AssertionError("unreachable: tenacity reraises the last failure")

    def _answered(
        self,
        name: str,
        app: str,
        target: int,
        platform: int | None,
        response: Response,
        conflict_message: str | None,
        enabled: bool | None = None,
    ) -> ActuationResult:
        status = response.status
        if status == 200:
            self._rejected.pop(name, None)
            self._last_set[name] = _Set(target, platform, self._wall())
            return self._result(
                name,
                applied=target,
                conflict=conflict_message is not None,
                message=conflict_message or "",
            )
        detail = _detail(response)
        if status == 404:
            kind = "not_found"
            message = (
                f"{name}: no such application or deployment on {self._dashboard_url} (404); "
                "use the 'app/deployment' names Serve shows (`serve status`)"
            )
        elif status == 412:
            kind = "not_enabled"
            message = (
                f"{name}: application {app!r} is not deployed with external_scaler_enabled "
                "(412); redeploy it with `external_scaler_enabled: true` and no "
                "autoscaling_config, or stop listing it"
            )
        elif status == 400:
            kind = "bad_request"
            message = f"{name}: scale request for {target} replicas rejected (400): {detail}"
        else:
            return self._result(
                name, error_kind="error", message=f"{name}: HTTP {status}: {detail}"
            )
        result = self._result(name, error_kind=kind, message=message)
        self._rejected[name] = _Rejected(target, self._wall(), result, enabled)
        return result

    def _result(
        self,
        name: str,
        *,
        applied: int | None = None,
        error_kind: str | None = None,
        message: str = "",
        skipped: bool = False,
        conflict: bool = False,
    ) -> ActuationResult:
        return ActuationResult(
            deployment=name,
            actuator=self.name,
            ok=error_kind is None,
            applied_replicas=applied,
            error_kind=error_kind,
            message=message,
            skipped=skipped,
            conflict=conflict,
        )


def _detail(response: Response) -> str:
    body = response.body
    text = body.get("error", body) if isinstance(body, dict) else body
    return " ".join(str(text or "").split())[:200]
