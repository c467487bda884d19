"""The actuator seam: plugins that apply decisions to the world.

An actuator is a plugin: a class that a package registers under the entry point group
`autoscalerd.actuators` and that the registry builds as `cls(settings, ActuatorContext)`.
`Actuator` is what it provides and `ActuationResult` what it answers, with the words of
`ERROR_KINDS`. README.md, "Writing a sensor or actuator", has a complete example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from autoscalerd.model import Decision
from autoscalerd.sense.base import DeploymentInfo

if TYPE_CHECKING:
    from autoscalerd.config import Config

# The words of ActuationResult.error_kind. The loop treats them alike (the target did not
# land); they name the cause for the operator, in logs, /v1/status and
# `autoscalerd_actuation_errors_total{kind=...}`.
ERROR_KINDS = (
    "not_found",  # the platform has no such deployment (Serve: 404)
    "not_enabled",  # it takes no external scaler (Serve: 412, no external_scaler_enabled)
    "bad_request",  # the request was refused as it stands (Serve: 400, a name it cannot use)
    "unavailable",  # the platform cannot answer now (503, connection refused): transient
    "auth",  # credentials missing or refused (401, 403)
    "timeout",  # no answer in time; also the loop's word when apply() overran its budget
    "conflict",  # someone else set the target and the actuator leaves it to them
    "error",  # anything else; also the loop's word when apply() raised
)


@dataclass(frozen=True, slots=True)
class Actuation:
    """One deployment's decision as handed to actuators."""

    decision: Decision
    info: DeploymentInfo | None
    # Replicas the forecast's upper bound asks for over the node lead time (headroom).
    headroom_replicas: int = 0


@dataclass(frozen=True, slots=True)
class ActuationResult:
    """What an actuator did with one Actuation."""

    deployment: str
    actuator: str
    # True when the target is in force or accepted by the platform.
    ok: bool
    # The target now in force, which the loop records as confirmed; None if unknown.
    applied_replicas: int | None = None
    # None when ok; else one of ERROR_KINDS.
    error_kind: str | None = None
    # One line: what happened, and on failure how to fix it. No secrets.
    message: str = ""
    skipped: bool = False  # idempotent no-op: nothing to change
    conflict: bool = False  # someone else changed the target since we last set it


@dataclass(frozen=True, slots=True)
class ActuatorContext:
    """What a plugin may need from the daemon at construction."""

    config: Config
    # True for an actuator that must change nothing. `autoscalerd run --dry-run` builds no
    # actuator at all (shadow recording replaces every one), so a built actuator sees False.
    dry_run: bool = False


@runtime_checkable
class Actuator(Protocol):
    """Applies targets to the world: a scale API, a cluster autoscaler, a log.

    Construction, by the registry: `cls(settings, context)`. `settings` is the actuator's
    entry under `actuators:` without its `type` key; `context` is an `ActuatorContext`
    (the whole validated config, for `cluster` and `tick_s`). Settings are validated as a
    sensor's are (see `autoscalerd.sense.base.Sensor`): `plugin_settings(Model, settings)`
    in the constructor, and the class attribute `settings_model` for `check-config`. A
    `ConfigError`, `ValueError`, `TypeError` or `KeyError` from the constructor makes the
    daemon exit 2 with its line. The constructor runs on the event loop before the first
    tick: keep it cheap, and connect in the first `apply()`.

    The registry checks what it built against this protocol (`isinstance`, `async def`
    methods, a non-empty `name`): an actuator that lacks a member is a one-line config
    error at start-up, not a failure at the first tick.
    """

    # The actuator's label in logs, ActuationResult.actuator, /v1/status and the
    # `actuator` label of the actuation metrics.
    name: str

    async def apply(self, actuations: Sequence[Actuation]) -> Sequence[ActuationResult]:
        """Bring each deployment to `actuation.decision.target_replicas`.

        Called once a tick, every configured actuator at once, with one Actuation per
        managed deployment that is not paused (none: no call). A deployment arrives every
        tick, changed or not, so apply is idempotent: a target already in force (the one
        last set here, or what `info.platform_target_replicas` shows) is answered
        `ok=True, skipped=True, applied_replicas=target` without touching the platform.
        When `info.platform_epoch` changes the platform has restarted and nothing set
        before is in force: set it again.

        Time budget: the loop waits at most max(2 s, 0.8 * tick_s) for the whole call,
        every deployment and retry included; then it is cancelled and each deployment of
        the call fails with "timeout". Retry transient failures (with backoff) within the
        budget, never across ticks: the next tick calls again. Act on the deployments
        concurrently where each needs a request of its own.

        Answer one ActuationResult per actuation, `deployment` as the decision names it
        and `actuator=self.name`:
        - `ok=True`: the target is set or accepted; `applied_replicas` is the target now
          in force.
        - `ok=False`: the target did not land; `error_kind` is one of ERROR_KINDS and
          `message` one line with the cause and the fix, no secrets. The loop logs it once
          per change and takes the next step from what runs (the platform's reading, else
          the last confirmed target), not from the target that did not land.
        - `conflict=True`: someone else changed the target since this actuator set it.
          Counted and shown; `ok=True` if it set its own again, `ok=False` with
          "conflict" if it leaves the deployment alone.

        Never raise: a raise fails every deployment of the call with "error" and the
        exception's text, which says less than a result would.
        """
        ...

    async def close(self) -> None:
        """Release connections, tasks and files. Called once at shutdown, perhaps with no
        `apply()` before it; the daemon waits at most `loop.CLOSE_TIMEOUT_S` (3 s), then
        abandons it and logs `close_failed`."""
        ...


class ActuatorFactory(Protocol):
    """What an `autoscalerd.actuators` entry point names: usually the actuator class."""

    def __call__(self, settings: Mapping[str, Any], context: ActuatorContext) -> Actuator: ...
