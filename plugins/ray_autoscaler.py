"""The `ray_autoscaler` actuator: size the Ray cluster for every deployment's target.

Each tick it turns every deployment's target replicas (plus, optionally, the replicas
the forecast's upper bound asks for over the node lead time) times that deployment's
per-replica resources (from the Serve API) into one merged
`ray.autoscaler.sdk.request_resources(bundles=[...])`: a call replaces the previous
request, so one request must hold the whole cluster's need. Nodes take minutes to start
and replicas seconds, so asking ahead is what makes a forecast useful.

The Ray client is blocking and `ray.init` can wait a long time for an unreachable GCS:
both run on a worker thread; `apply()` waits at most `call_timeout_s` and leaves a slow
call running in the background. `ray.init` happens only when this actuator is configured,
on first use, as a driver of the cluster at `cluster.address`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autoscalerd import logs
from autoscalerd.act.base import Actuation, ActuationResult, ActuatorContext
from autoscalerd.config import plugin_settings
from autoscalerd.dashboard import find_token
from autoscalerd.decide.workers import Bundle, merged_bundles


class RayAutoscalerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # ray.init(address=...); default: cluster.address.
    address: str | None = None
    # Ask for the forecast's headroom replicas too (the loop computes them per deployment).
    include_headroom: bool = True
    # A deployment not seen for this long drops out of the request.
    forget_after_s: float = Field(300.0, gt=0)
    # How long apply() waits for the Ray call; a slower call finishes in the background.
    call_timeout_s: float = Field(1.5, gt=0)
    # After a failed connection, wait this long before trying again.
    reconnect_after_s: float = Field(10.0, ge=0)
    # On shutdown, withdraw the request, so nodes kept only for headroom can go.
    clear_on_close: bool = True
    # Send the same request again this often: a head restart loses it, and a restart
    # is not always visible (the Serve controller's id changing is re-sent at once).
    reassert_every_s: float = Field(60.0, gt=0)


@dataclass(frozen=True, slots=True)
class _Need:
    replicas: int
    resources: Mapping[str, float]
    seen_at_s: float


def _settings(settings: Mapping[str, Any]) -> RayAutoscalerSettings:
    return plugin_settings(RayAutoscalerSettings, settings)


class RayAutoscalerActuator:
    name = "ray_autoscaler"
    settings_model = RayAutoscalerSettings
    requires_extra = "ray"  # Ray's SDK: request_resources

    def __init__(
        self,
        settings: Mapping[str, Any],
        context: ActuatorContext,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = _settings(settings)
        self._cluster = context.config.cluster
        self._address = self.settings.address or self._cluster.address
        self._wall = wall_clock
        self._needs: dict[str, _Need] = {}
        self._requested: list[Bundle] | None = None
        self._requested_at_s: float | None = None
        self._epoch: str | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="ray_autoscaler"
        )
        self._in_flight: concurrent.futures.Future[list[Bundle]] | None = None
        self._connected = False
        self._failed_at_s: float | None = None
        self._last_error = ""
        self._log = logs.get("autoscalerd.actuator.ray_autoscaler").bind(address=self._address)

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        now_s = self._wall()
        self._notice_restart(actuations, now_s)
        for actuation in actuations:
            info = actuation.info
            if info is None or not info.resources_per_replica:
                continue
            replicas = actuation.decision.target_replicas
            if self.settings.include_headroom:
                replicas += max(0, actuation.headroom_replicas)
            self._needs[actuation.decision.deployment] = _Need(
                replicas, dict(info.resources_per_replica), now_s
            )
        forget_s = self.settings.forget_after_s
        for name in [n for n, need in self._needs.items() if now_s - need.seen_at_s > forget_s]:
            del self._needs[name]
        bundles = merged_bundles(
            {n: (need.replicas, need.resources) for n, need in self._needs.items()},
            self._cluster.max_gpus,
        )
        before = self._requested
        error = await self._request(bundles, now_s)
        results = []
        for actuation in actuations:
            name = actuation.decision.deployment
            need = self._needs.get(name)
            if error is not None:
                kind, message = error
                results.append(
                    ActuationResult(name, self.name, ok=False, error_kind=kind, message=message)
                )
            elif need is None:
                results.append(
                    ActuationResult(
                        name,
                        self.name,
                        ok=True,
                        skipped=True,
                        message="no per-replica resources known; nothing to request",
                    )
                )
            else:
                results.append(
                    ActuationResult(
                        name,
                        self.name,
                        ok=True,
                        applied_replicas=need.replicas,
                        skipped=bundles == before,
                    )
                )
        return results

    def _notice_restart(self, actuations: Sequence[Actuation], now_s: float) -> None:
        """Forget what was requested when the platform restarted (a new Serve controller)
        or when the request is due again: `request_resources` is idempotent, and a request
        the restarted head lost would otherwise never be sent again."""
        epochs = {a.info.platform_epoch for a in actuations if a.info and a.info.platform_epoch}
        restarted = False
        if epochs and self._epoch not in epochs:
            restarted = self._epoch is not None
            self._epoch = min(epochs)
        due = (
            self._requested_at_s is not None
            and now_s - self._requested_at_s >= self.settings.reassert_every_s
        )
        if restarted or due:
            if restarted:
                self._log.warning("platform_restarted", action="requesting resources again")
            self._requested = None

    async def _request(self, bundles: list[Bundle], now_s: float) -> tuple[str, str] | None:
        """Send `bundles` unless already requested; an (error kind, message) on failure."""
        if self._in_flight is not None and not self._in_flight.done():
            return ("timeout", f"still waiting for Ray at {self._address} (previous call)")
        if self._in_flight is not None:
            finished, self._in_flight = self._in_flight, None
            self._collect(finished)
        if bundles == self._requested:
            return None
        if (
            not self._connected
            and self._failed_at_s is not None
            and now_s - self._failed_at_s < self.settings.reconnect_after_s
        ):
            return ("unavailable", self._last_error)
        self._in_flight = self._executor.submit(self._send, bundles)
        try:
            await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(self._in_flight)), self.settings.call_timeout_s
            )
        except (TimeoutError, asyncio.TimeoutError):
            return ("timeout", f"Ray at {self._address} slow to answer; the request continues")
        except Exception:
            pass  # collected below, with the same one-line message as a background failure
        finished, self._in_flight = self._in_flight, None
        return self._collect(finished)

    def _collect(self, done: concurrent.futures.Future[list[Bundle]]) -> tuple[str, str] | None:
        try:
            sent = done.result()
        except Exception as exc:
            self._connected = False
            self._failed_at_s = self._wall()
            message = (
                f"cannot request resources from Ray at {self._address} "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                "check cluster.address and that this host can reach the GCS"
            )
            if message != self._last_error:
                self._log.warning("request_resources_failed", error=message)
            self._last_error = message
            return ("unavailable", message)
        if self._requested != sent:
            self._log.info(
                "request_resources",
                bundles=len(sent),
                gpus=math.fsum(b.get("GPU", 0.0) for b in sent),
                cpus=math.fsum(b.get("CPU", 0.0) for b in sent),
            )
        self._requested = sent
        self._requested_at_s = self._wall()
        self._last_error = ""
        return None

    def _send(self, bundles: list[Bundle]) -> list[Bundle]:
        """On the worker thread: connect once, then replace the cluster's request."""
        if not self._connected:
            _export_token(find_token(self._cluster).token)
        import ray
        from ray.autoscaler.sdk import request_resources

        if not self._connected:
            ray.init(
                address=self._address,
                logging_level=logging.WARNING,
                log_to_driver=False,
                configure_logging=False,
                ignore_reinit_error=True,
            )
            self._connected = True
        request_resources(bundles=bundles)
        return bundles

    async def close(self) -> None:
        if self._in_flight is not None:
            self._in_flight.cancel()
        if self._connected:
            clear = self.settings.clear_on_close and bool(self._requested)
            loop = asyncio.get_running_loop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(loop.run_in_executor(self._executor, _shutdown, clear), 5.0)
            self._connected = False
        self._executor.shutdown(wait=False, cancel_futures=True)


def _export_token(token: str | None) -> None:
    """Hand the dashboard's token to Ray's driver, which reads it from the environment.

    A driver given an explicit address sends a token only in token mode. Ray reads both
    variables when it loads its config, so a Ray imported earlier is told to reload.
    """
    if not token:
        return
    if not os.environ.get("RAY_AUTH_TOKEN"):
        os.environ["RAY_AUTH_TOKEN"] = token
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if "ray" in sys.modules:
        with contextlib.suppress(Exception):  # private API: best effort
            raylet: Any = importlib.import_module("ray._raylet")
            raylet.Config.initialize("")
            raylet.AuthenticationTokenLoader.instance().reset_cache()


def _shutdown(clear: bool) -> None:
    import ray
    from ray.autoscaler.sdk import request_resources

    if clear:
        request_resources(bundles=[])
    ray.shutdown()
