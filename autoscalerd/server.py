"""The HTTP API, served by aiohttp in the daemon's own event loop.

    GET  /metrics                              Prometheus exposition (autoscalerd_*)
    GET  /healthz                              200 while ticks complete, else 503
    GET  /readyz                               200 once ticking on fresh inputs, else 503
    GET  /v1/status                            every deployment: config, inputs, decision
    GET  /v1/decisions?deployment=&limit=&changed=   recent decisions (bounded ring)
    POST /v1/deployments/{name}/pause          {"reason": R, "by": B, "ttl_s": T}: hold the target
    POST /v1/deployments/{name}/resume         {"reason": R, "by": B}: end a pause or override
    POST /v1/deployments/{name}/override       {"replicas": N, "reason": R, "by": B, "ttl_s": T}

Deployment names contain a slash ("app/deployment"); the name is everything between
`/v1/deployments/` and the action, so `/v1/deployments/llm/chat/pause` pauses "llm/chat".
A percent-encoded slash (`llm%2Fchat`) works too.

Every pause, resume and override is recorded: who (the body's "by", else http.token_label),
why (the body's "reason", required), when, and until when (an override without ttl_s
ends after http.override_default_ttl_s; a pause without one lasts until resume). The
newest instruction wins: a pause ends an override and an override ends a pause. The record
is logged, shown in /v1/status and saved with the state.

The POST endpoints change what the daemon does, so they take `Authorization: Bearer
<token>` (http.token, else the environment variable named by http.token_env): 401
without it, 403 when wrong, and 403 for everyone while no token is configured. With
http.require_token_for_reads the GET endpoints under /v1/ and /metrics take it too;
/healthz and /readyz stay open for probes, which cannot send one. Every error is a JSON
body `{"error": "..."}` with a 4xx status; a bug is a 500 with a JSON body and a log
event, never a traceback on the wire.

Input no well-behaved client sends (bytes that are not UTF-8, JSON nested past what the
parser takes, a wrong token, a malformed HTTP request) is rejected with a 4xx and logged
at most once a minute per client address, so that it cannot flood the log. A malformed
request line or header is answered by aiohttp itself (400, text/plain).
"""

from __future__ import annotations

import contextlib
import difflib
import hmac
import json
import logging
import math
import os
import time
import unicodedata
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import http_exceptions, web

from autoscalerd import __version__, audit, logs
from autoscalerd.audit import OperatorAction
from autoscalerd.loop import Controller, DeploymentRuntime, TickReport
from autoscalerd.metrics import Metrics
from autoscalerd.model import Decision, Reason
from autoscalerd.state import StateKeeper

# Decisions kept per deployment for /v1/decisions: about 17 minutes at a 1 s tick.
DECISIONS_KEPT = 1000
DEFAULT_DECISIONS_LIMIT = 100
# /healthz allows 3 tick periods, but never less than this much wall time: scheduler jitter
# on a busy host must not flap health when a replay runs many ticks per second.
MIN_HEALTH_WINDOW_S = 1.0
# A pause or an override lasts at most a week; an override without ttl_s lasts
# http.override_default_ttl_s, a pause without one until resume.
MAX_OVERRIDE_TTL_S = 7 * 24 * 3600.0
# An operator's name and reason: one line each, short enough for a log line and a table.
MAX_BY_CHARS = 64
MAX_REASON_CHARS = 300
OVERRIDE_EXAMPLE = '{"replicas": 4, "ttl_s": 600, "reason": "load test"}'
EXAMPLES = {
    "pause": '{"reason": "incident 4711: hold during the failover", "ttl_s": 1800}',
    "resume": '{"reason": "failover done"}',
    "override": OVERRIDE_EXAMPLE,
}
# Time given to open connections at shutdown.
SHUTDOWN_TIMEOUT_S = 1.0
# The largest request body read: an override is a few dozen bytes.
MAX_BODY_BYTES = 64 * 1024
# Rejected requests are logged at most this often per client address...
REJECTION_LOG_INTERVAL_S = 60.0
# ... for this many addresses at once; beyond them, new addresses share one line a minute.
REJECTION_LOG_PEERS = 10_000
REDACTED = "[redacted]"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        rejected: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        # Input no well-behaved client sends: logged, at most once a minute per client.
        self.rejected = rejected


class RejectionLog:
    """Rejected requests in the log: one line per client address per interval, which
    counts the rejections left out since the last, so that garbage cannot flood the log."""

    def __init__(
        self,
        interval_s: float = REJECTION_LOG_INTERVAL_S,
        max_peers: int = REJECTION_LOG_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.max_peers = max_peers
        self.clock = clock
        # Address -> (when its last line was logged, rejections since, not logged).
        self._peers: dict[str, tuple[float, int]] = {}

    def note(
        self,
        peer: str | None,
        status: int,
        reason: str,
        level: str = "warning",
        event: str = "http_rejected",
        **fields: Any,
    ) -> bool:
        """Log this rejection unless `peer` had a line within the interval; True if logged."""
        now_s = self.clock()
        key = peer or "unknown"
        if key not in self._peers and len(self._peers) >= self.max_peers:
            self._peers = {k: v for k, v in self._peers.items() if now_s - v[0] < self.interval_s}
            if len(self._peers) >= self.max_peers:
                key = "other addresses"
        logged_s, suppressed = self._peers.get(key, (-math.inf, 0))
        if now_s - logged_s < self.interval_s:
            self._peers[key] = (logged_s, suppressed + 1)
            return False
        self._peers[key] = (now_s, 0)
        getattr(logs.get("autoscalerd.server"), level)(
            event, peer=key, status=status, reason=reason, suppressed=suppressed, **fields
        )
        return True


class _ProtocolLog(logging.Handler):
    """aiohttp's own reports (a malformed request, an error outside the handlers) as
    rate-limited one-line events, instead of a traceback on stderr."""

    def __init__(self, rejections: RejectionLog) -> None:
        super().__init__(logging.INFO)  # aiohttp's debug chatter stays out
        self.rejections = rejections

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        # "Error handling request from %s", request.remote
        peer = str(record.args[0]) if isinstance(record.args, tuple) and record.args else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            reason = " ".join(str(exc.message).split())[:160] or type(exc).__name__
            self.rejections.note(peer, exc.code or 400, f"malformed request: {reason}")
        else:
            error = f"{type(exc).__name__}: {exc}" if exc else record.getMessage()
            reason = " ".join(error.split())[:300]
            self.rejections.note(peer, 500, reason, level="error", event="http_internal_error")


def _protocol_logger(rejections: RejectionLog) -> logging.Logger:
    # Not registered with logging.getLogger: private to this server, nothing propagates
    # to the root logger, whose last-resort handler prints tracebacks on stderr.
    logger = logging.Logger("autoscalerd.server.aiohttp", logging.INFO)
    logger.addHandler(_ProtocolLog(rejections))
    return logger


@dataclass(frozen=True, slots=True)
class HealthRule:
    """When the loop counts as alive: a tick completed within 3 tick periods (wall time)."""

    speed: float | None = None  # replay: trace seconds per wall second; None: real time

    def window_s(self, tick_s: float) -> float:
        period_s = tick_s / self.speed if self.speed else tick_s
        return max(3.0 * period_s, MIN_HEALTH_WINDOW_S)

    def check(self, controller: Controller) -> tuple[bool, float, float]:
        """(healthy, seconds since the last completed tick or the start, the window)."""
        since_s = controller.last_tick_monotonic_s or controller.started_monotonic_s
        age_s = time.monotonic() - since_s
        window_s = self.window_s(controller.config.tick_s)
        return age_s <= window_s, age_s, window_s


class DecisionLog:
    """The Controller listener keeping each deployment's recent decisions."""

    def __init__(self, kept: int = DECISIONS_KEPT) -> None:
        self.kept = kept
        self.by_deployment: dict[str, deque[Decision]] = {}

    def __call__(self, controller: Controller, report: TickReport) -> None:
        for decision in report.decisions:
            ring = self.by_deployment.get(decision.deployment)
            if ring is None:
                ring = self.by_deployment[decision.deployment] = deque(maxlen=self.kept)
            ring.append(decision)

    def recent(self, deployment: str | None, limit: int, changed_only: bool) -> list[Decision]:
        """The latest `limit` decisions, oldest first."""
        if deployment is not None:
            pool = list(self.by_deployment.get(deployment, ()))
        else:
            pool = sorted(
                (d for ring in self.by_deployment.values() for d in ring),
                key=lambda d: d.decided_at_s,
            )
        if changed_only:
            pool = [d for d in pool if d.changed]
        return pool[-limit:] if limit else []


CONTROLLER = web.AppKey("controller", Controller)
METRICS = web.AppKey("metrics", Metrics)
DECISIONS = web.AppKey("decisions", DecisionLog)
HEALTH = web.AppKey("health", HealthRule)
STATE_KEEPER = web.AppKey("state_keeper", StateKeeper)
REJECTIONS = web.AppKey("rejections", RejectionLog)


def create_app(
    controller: Controller,
    metrics: Metrics,
    health: HealthRule,
    state_keeper: StateKeeper | None = None,
) -> web.Application:
    app = web.Application(middlewares=[_json_errors, _read_token], client_max_size=MAX_BODY_BYTES)
    app[CONTROLLER] = controller
    app[METRICS] = metrics
    app[DECISIONS] = DecisionLog()
    app[HEALTH] = health
    app[REJECTIONS] = RejectionLog()
    if state_keeper is not None:
        app[STATE_KEEPER] = state_keeper
    app.cleanup_ctx.append(_decision_log)
    app.add_routes(
        [
            web.get("/metrics", get_metrics),
            web.get("/healthz", get_healthz),
            web.get("/readyz", get_readyz),
            web.get("/v1/status", get_status),
            web.get("/v1/decisions", get_decisions),
            web.post("/v1/deployments/{name:.+}/pause", post_pause),
            web.post("/v1/deployments/{name:.+}/resume", post_resume),
            web.post("/v1/deployments/{name:.+}/override", post_override),
        ]
    )
    return app


async def start(app: web.Application, addr: str) -> web.AppRunner:
    """Listen on HOST:PORT ("[::1]:8270" for IPv6). Raises OSError with a one-line reason."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    runner = web.AppRunner(
        app,
        access_log=None,
        logger=_protocol_logger(app[REJECTIONS]),
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, int(port), shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(
            exc.errno,
            f"http.addr {addr}: cannot listen ({exc.strerror or exc}); "
            "free the port or pick another with --http-addr",
        ) from None
    return runner


async def _decision_log(app: web.Application) -> AsyncIterator[None]:
    """Record decisions only while the app runs; detach at shutdown."""
    controller, log = app[CONTROLLER], app[DECISIONS]
    controller.listeners.append(log)
    yield
    if log in controller.listeners:
        controller.listeners.remove(log)


# ---------------------------------------------------------------- read-only endpoints


async def get_metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    return web.Response(
        body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


async def get_healthz(request: web.Request) -> web.Response:
    controller = request.app[CONTROLLER]
    healthy, age_s, window_s = request.app[HEALTH].check(controller)
    body = {
        "status": "ok" if healthy else "stalled",
        "ticks_completed": controller.ticks_completed,
        "seconds_since_tick": round(age_s, 3),
        "window_s": round(window_s, 3),
    }
    return _json(body, 200 if healthy else 503)


async def get_readyz(request: web.Request) -> web.Response:
    controller = request.app[CONTROLLER]
    problems = _not_ready(request.app, controller)
    body = {"status": "ready" if not problems else "not ready", "problems": problems}
    return _json(_redacted(body, _secrets(controller)), 200 if not problems else 503)


def _not_ready(app: web.Application, controller: Controller) -> list[str]:
    problems = []
    if controller.stopping:
        problems.append("stopping")
    if controller.ticks_completed == 0:
        problems.append("no tick completed yet")
    elif not app[HEALTH].check(controller)[0]:
        problems.append("no tick completed within 3 tick periods")
    problems.extend(
        f"sensor {name}: {error}" for name, error in sorted(controller.sensor_errors.items())
    )
    for name, runtime in sorted(controller.deployments.items()):
        decision = runtime.last_decision
        if decision is not None and Reason.STALE_DATA in decision.reasons:
            problems.append(f"deployment {name}: inputs missing or stale")
    problems.extend(
        f"deployment {name}: waiting ({why})" for name, why in sorted(controller.waiting.items())
    )
    return problems


async def get_status(request: web.Request) -> web.Response:
    app = request.app
    controller = app[CONTROLLER]
    healthy = app[HEALTH].check(controller)[0]
    body = {
        "version": __version__,
        "dry_run": controller.dry_run,
        "now_s": controller.clock.now_s(),
        "tick_s": controller.config.tick_s,
        "ticks_completed": controller.ticks_completed,
        "last_tick_at_s": controller.last_tick_at_s,
        "healthy": healthy,
        "ready": not _not_ready(app, controller),
        "sensors": {
            getattr(s, "name", type(s).__name__): {
                "ok": getattr(s, "name", "") not in controller.sensor_errors,
                "error": controller.sensor_errors.get(getattr(s, "name", "")),
            }
            for s in controller.sensors
        },
        "actuators": [getattr(a, "name", type(a).__name__) for a in controller.actuators],
        "deployments": {
            name: _deployment_status(runtime, controller.clock.now_s())
            for name, runtime in sorted(controller.deployments.items())
        },
        # Named or discovered, not managed yet: nothing is actuated before the platform's
        # current target has been read.
        "waiting": dict(sorted(controller.waiting.items())),
        # GPUs seen but on no known replica's process.
        "gpus_unattributed": [
            {"gpu": h.uuid, "state": h.state, "reason": h.reason or None}
            for h in sorted(controller.unattributed_gpus.values(), key=lambda h: h.uuid)
        ],
    }
    # Errors quote what a sensor or actuator was answered, and an answer may echo a token.
    return _json(_redacted(body, _secrets(controller)))


def _deployment_status(runtime: DeploymentRuntime, now_s: float) -> dict[str, Any]:
    cfg = runtime.config
    obs = runtime.last_observation
    return {
        "config": cfg.model_dump(mode="json"),
        "paused": runtime.paused,
        "override": _override(runtime, now_s),
        # The pause or override in force: who, why, since, until; and the last actions.
        "operator": _operator(runtime, now_s),
        "operator_history": [action.as_dict() for action in runtime.operator_history],
        "target_replicas": runtime.state.target_replicas,
        "applied_replicas": runtime.applied_replicas,
        "last_error": runtime.last_error,
        # Each replica's GPUs with their health (the nvml sensor, the nodes' GPU series).
        "gpus": [
            {
                "replica": g.replica_id,
                "gpu": g.gpu_uuid,
                "node_ip": g.node_ip,
                "state": g.state,
                "reason": g.reason or None,
                "capacity_share": round(g.share, 3),
                "source": g.source,
            }
            for g in (obs.gpu_replicas if obs is not None else ())
        ],
        # Replica- and GPU-hours used so far against static provisioning at the peak seen.
        "cost": runtime.cost.report(),
        # Someone else changing the target autoscalerd set (ownership conflicts).
        "conflicts": {
            "count": runtime.conflicts,
            "last": runtime.last_conflict,
            "age_s": None
            if runtime.last_conflict_at_s is None
            else round(max(0.0, now_s - runtime.last_conflict_at_s), 3),
        },
        "last_observation": None
        if obs is None
        else {
            "sensed_at_s": obs.sensed_at_s,
            "inputs": {
                name: {"value": value, "age_s": getattr(obs, name).age_s(now_s)}
                for name, value in obs.known_fields().items()
            },
        },
        "last_decision": runtime.last_decision.as_dict() if runtime.last_decision else None,
    }


def _override(runtime: DeploymentRuntime, now_s: float) -> dict[str, Any] | None:
    if runtime.override_replicas is None:
        return None
    until_s = runtime.override_until_s
    return {
        "replicas": runtime.override_replicas,
        "until_s": until_s,
        "remaining_s": None if until_s is None else max(0.0, until_s - now_s),
    }


def _operator(runtime: DeploymentRuntime, now_s: float) -> dict[str, Any] | None:
    """The pause or override in force with its record; by and reason are null for one
    restored from a state file written before they were kept."""
    if runtime.override_replicas is not None:
        kind, until_s = "override", runtime.override_until_s
    elif runtime.paused:
        kind, until_s = "pause", runtime.paused_until_s
    else:
        return None
    record = runtime.operator_action
    if record is not None and record.action != kind:
        record = None
    return {
        "action": kind,
        "replicas": runtime.override_replicas,
        "by": record.by if record else None,
        "reason": record.reason if record else None,
        "since_s": record.at_s if record else None,
        "until_s": until_s,
        "remaining_s": None if until_s is None else max(0.0, until_s - now_s),
    }


async def get_decisions(request: web.Request) -> web.Response:
    query = request.rel_url.query
    unknown = sorted(set(query) - {"deployment", "limit", "changed"})
    if unknown:
        raise ApiError(400, _unknown("parameter", unknown[0], ("deployment", "limit", "changed")))
    log = request.app[DECISIONS]
    deployment = query.get("deployment") or None
    if deployment is not None:
        _runtime(request.app[CONTROLLER], deployment)  # 404 for a name never managed
    limit_text = query.get("limit", str(DEFAULT_DECISIONS_LIMIT))
    try:
        limit = int(limit_text)
    except ValueError:
        raise ApiError(400, f"limit: must be an integer, got {limit_text!r}") from None
    if not 1 <= limit <= log.kept:
        raise ApiError(400, f"limit: must be within [1, {log.kept}], got {limit}")
    changed_text = query.get("changed", "false").lower()
    if changed_text not in {"true", "false", "1", "0"}:
        raise ApiError(400, f"changed: must be true or false, got {changed_text!r}")
    decisions = log.recent(deployment, limit, changed_text in {"true", "1"})
    return _json({"count": len(decisions), "decisions": [d.as_dict() for d in decisions]})


# ---------------------------------------------------------------- operator endpoints


async def post_pause(request: web.Request) -> web.Response:
    runtime = _authorized_runtime(request)
    asked = parse_operator(await _optional_body(request, EXAMPLES["pause"]), "pause")
    now_s = request.app[CONTROLLER].clock.now_s()
    until_s = None if asked.ttl_s is None else now_s + asked.ttl_s
    runtime.paused, runtime.paused_until_s = True, until_s
    runtime.override_replicas = runtime.override_until_s = None  # the newest instruction wins
    return _operator_changed(request, runtime, "pause", asked, now_s, until_s)


async def post_resume(request: web.Request) -> web.Response:
    runtime = _authorized_runtime(request)
    asked = parse_operator(await _optional_body(request, EXAMPLES["resume"]), "resume")
    now_s = request.app[CONTROLLER].clock.now_s()
    runtime.paused, runtime.paused_until_s = False, None
    runtime.override_replicas = runtime.override_until_s = None
    return _operator_changed(request, runtime, "resume", asked, now_s, None)


async def post_override(request: web.Request) -> web.Response:
    runtime = _authorized_runtime(request)
    body = json_body(await request.read(), OVERRIDE_EXAMPLE)  # 413 past the limit
    replicas, ttl_s = parse_override(body)
    asked = parse_operator(body, "override")
    controller = request.app[CONTROLLER]
    bounds = runtime.config.autoscaling
    runtime.override_replicas = min(max(replicas, bounds.min_replicas), bounds.max_replicas)
    now_s = controller.clock.now_s()
    if ttl_s is None:
        ttl_s = controller.config.http.override_default_ttl_s
    until_s = now_s + ttl_s
    runtime.override_until_s = until_s
    runtime.paused, runtime.paused_until_s = False, None  # the newest instruction wins
    return _operator_changed(request, runtime, "override", asked, now_s, until_s, replicas)


def parse_override(body: dict[str, Any]) -> tuple[int, float | None]:
    """(replicas, ttl_s) from an override's JSON object; ApiError (400) for anything else.
    Its by and reason are parse_operator's."""
    unknown = sorted(set(body) - set(OPERATOR_FIELDS["override"]))
    if unknown:
        raise ApiError(400, _unknown("field", unknown[0], OPERATOR_FIELDS["override"]))
    if "replicas" not in body:
        raise ApiError(400, f"replicas: required, e.g. {OVERRIDE_EXAMPLE}")
    replicas = body["replicas"]
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise ApiError(400, f"replicas: must be an integer, got {_shown(replicas)}")
    if replicas < 0:
        raise ApiError(400, f"replicas: must be >= 0, got {_shown(replicas)}")
    return replicas, _ttl_s(body.get("ttl_s"))


def _ttl_s(ttl_s: Any) -> float | None:
    # The range alone refuses NaN and infinity; math.isfinite would overflow on a huge int.
    if ttl_s is not None and (
        isinstance(ttl_s, bool)
        or not isinstance(ttl_s, int | float)
        or not 0 < ttl_s <= MAX_OVERRIDE_TTL_S
    ):
        raise ApiError(
            400, f"ttl_s: must be a number of seconds in (0, {MAX_OVERRIDE_TTL_S:.0f}] or null"
        )
    return None if ttl_s is None else float(ttl_s)


@dataclass(frozen=True, slots=True)
class OperatorRequest:
    """Who asks, why, and for how long (seconds on the daemon's clock; None: the default)."""

    by: str | None
    reason: str
    ttl_s: float | None


OPERATOR_FIELDS = {
    "pause": ("reason", "by", "ttl_s"),
    "resume": ("reason", "by"),
    "override": ("replicas", "ttl_s", "reason", "by"),
}


def parse_operator(body: dict[str, Any], action: str) -> OperatorRequest:
    """The by, reason and ttl_s of a pause, resume or override body; ApiError (400) for a
    missing reason, an unknown field or a value that is not one short line."""
    allowed = OPERATOR_FIELDS[action]
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ApiError(400, _unknown("field", unknown[0], allowed))
    reason = _line(body, "reason", MAX_REASON_CHARS)
    if reason is None:
        raise ApiError(400, f"reason: required; say why in the body, e.g. {EXAMPLES[action]}")
    return OperatorRequest(
        by=_line(body, "by", MAX_BY_CHARS),
        reason=reason,
        ttl_s=_ttl_s(body.get("ttl_s")) if "ttl_s" in allowed else None,
    )


def _line(body: dict[str, Any], name: str, max_chars: int) -> str | None:
    """A body's text field as one trimmed line; None when absent, null or blank."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{name}: must be a string, got {_shown(value)}")
    text = value.strip()
    if len(text) > max_chars:
        raise ApiError(400, f"{name}: at most {max_chars} characters, got {len(text)}")
    # Control characters would break the log's lines; lone surrogates its encoding.
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in text):
        raise ApiError(400, f"{name}: must be one line of printable text")
    return text or None


def _shown(value: Any) -> str:
    """A JSON value for a message, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _authorized_runtime(request: web.Request) -> DeploymentRuntime:
    controller = request.app[CONTROLLER]
    _authorize(request, controller)
    return _runtime(controller, request.match_info["name"])


def _token(controller: Controller) -> str | None:
    http = controller.config.http
    return http.token or os.environ.get(http.token_env, "").strip() or None


def _authorize(request: web.Request, controller: Controller, reads: bool = False) -> None:
    http = controller.config.http
    token = _token(controller)
    if token is None:
        fix = f"set http.token in the config or ${http.token_env} in the environment"
        if reads:
            raise ApiError(
                403,
                f"reads need a token (http.require_token_for_reads) and none is configured; {fix}",
            )
        raise ApiError(403, f"write endpoints are disabled: no token configured; {fix}")
    check_bearer(request.headers.get("Authorization", ""), token)


def check_bearer(authorization: str, token: str) -> None:
    """An Authorization header's value against the token: ApiError 401 without a Bearer
    token, 403 with another; any string, even one holding the surrogates that aiohttp
    decodes bytes that are not UTF-8 to."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(
            401,
            "authorization required: send 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": 'Bearer realm="autoscalerd"'},
        )
    # Constant time, on bytes: a str compare_digest rejects non-ASCII with a TypeError.
    # surrogatepass never fails, and its bytes for a surrogate are never valid UTF-8, so
    # they match no token.
    sent = given.strip().encode("utf-8", "surrogatepass")
    if not hmac.compare_digest(sent, token.encode("utf-8", "surrogatepass")):
        raise ApiError(403, "wrong token", rejected=True)


def _secrets(controller: Controller) -> list[str]:
    """The tokens this daemon holds: its own and the Ray dashboard's."""
    found = [_token(controller)]
    with contextlib.suppress(OSError, ValueError):  # an unreadable token file hides nothing
        found.append(controller.config.cluster.resolve_token())
    return [secret for secret in found if secret]


def _redacted(value: Any, secrets: list[str]) -> Any:
    """`value` with every secret in its strings replaced."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: _redacted(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v, secrets) for v in value]
    return value


def _runtime(controller: Controller, name: str) -> DeploymentRuntime:
    runtime = controller.deployments.get(name)
    if runtime is None:
        managed = ", ".join(sorted(controller.deployments)[:20]) or "none yet"
        raise ApiError(404, f"deployment {name!r} is not managed; managed: {managed}")
    return runtime


async def _optional_body(request: web.Request, example: str) -> dict[str, Any]:
    """A body that may be empty (then {}), else a JSON object."""
    raw = await request.read()  # 413 past the limit
    return json_body(raw, example) if raw.strip() else {}


def json_body(raw: bytes, example: str = OVERRIDE_EXAMPLE) -> dict[str, Any]:
    """A request body as a JSON object; ApiError (400) for any other bytes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, f"body: not UTF-8 (byte {exc.start}); send JSON encoded as UTF-8", rejected=True
        ) from None
    try:
        body = json.loads(text) if text.strip() else None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"body: malformed JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:
        raise ApiError(
            400, f"body: JSON nested too deeply; send one object, e.g. {example}", rejected=True
        ) from None
    except ValueError:  # an integer of more digits than Python converts
        raise ApiError(
            400, "body: a number too long to be a replica count", rejected=True
        ) from None
    if not isinstance(body, dict):
        raise ApiError(400, f"body: must be a JSON object, e.g. {example}")
    return body


def _operator_changed(
    request: web.Request,
    runtime: DeploymentRuntime,
    action: str,
    asked: OperatorRequest,
    now_s: float,
    until_s: float | None,
    requested: int | None = None,
) -> web.Response:
    """Record a pause, resume or override in the trail and the log, and have it saved."""
    controller = request.app[CONTROLLER]
    secrets = _secrets(controller)  # a token pasted into a reason is not kept
    record = OperatorAction(
        action=action,
        by=_redacted(asked.by or controller.config.http.token_label, secrets),
        reason=_redacted(asked.reason, secrets),
        at_s=now_s,
        until_s=until_s,
        replicas=runtime.override_replicas if action == "override" else None,
    )
    runtime.operator_action = record if action != "resume" else None
    runtime.operator_history = audit.appended(runtime.operator_history, record)
    extra = {} if requested is None else {"replicas": record.replicas, "requested": requested}
    logs.get("autoscalerd.server").info(
        f"operator_{action}",
        deployment=runtime.name,
        by=record.by,
        reason=record.reason,
        until_s=until_s,
        peer=request.remote,
        **extra,
    )
    keeper = request.app.get(STATE_KEEPER)
    if keeper is not None:
        keeper.request_save()
    body = {
        "deployment": runtime.name,
        "paused": runtime.paused,
        "override": _override(runtime, now_s),
        "operator": _operator(runtime, now_s),
        "recorded": record.as_dict(),
    }
    return _json(body)


# ---------------------------------------------------------------- JSON and errors


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    rejections = request.app[REJECTIONS]
    try:
        return await handler(request)
    except ApiError as exc:
        if exc.rejected:
            rejections.note(request.remote, exc.status, exc.message, path=request.path)
        return _json({"error": exc.message}, exc.status, exc.headers)
    except web.HTTPException as exc:  # no route (404), wrong method (405), too large (413)
        if exc.status < 400:
            raise
        message = f"{exc.reason.lower()}: {request.method} {request.path}"
        if exc.status == 413:
            message += f"; a body is at most {MAX_BODY_BYTES} bytes"
            rejections.note(request.remote, exc.status, message)
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return _json({"error": message}, exc.status, headers)
    except Exception as exc:
        # A bug, though a client may trigger it: logged like a rejection, once a minute.
        rejections.note(
            request.remote,
            500,
            " ".join(f"{type(exc).__name__}: {exc}".split())[:300],
            level="error",
            event="http_internal_error",
            path=request.path,
        )
        return _json({"error": "internal error; see the autoscalerd log"}, 500)


# Probes cannot send a token: these stay open whatever http.require_token_for_reads says.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


@web.middleware
async def _read_token(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """With http.require_token_for_reads, every path but the probes' takes the token:
    GET /v1/... and /metrics, and unknown paths too, so that they reveal nothing."""
    controller = request.app[CONTROLLER]
    if controller.config.http.require_token_for_reads and request.path not in OPEN_PATHS:
        _authorize(request, controller, reads=True)
    return await handler(request)


def _unknown(what: str, name: str, known: tuple[str, ...] | list[str]) -> str:
    """An unknown key, named only when it is a near miss of a known one: a client's body
    is not echoed into errors and logs (it may hold a secret pasted in the wrong place)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    if close and len(name) <= 40:
        return f"unknown {what} {name!r}; did you mean {close[0]!r}?"
    return f"unknown {what}; known: {', '.join(known)}"


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    text = json.dumps(_finite(body), allow_nan=False)
    return web.json_response(text=text, status=status, headers=headers)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: an unknown value is null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
