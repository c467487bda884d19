"""The sensor seam: anything that turns the outside world into Observations.

A sensor is a plugin: a class that a package registers under the entry point group
`autoscalerd.sensors` and that the registry builds as `cls(settings, config)`. `Sensor`
is what every sensor provides; a sensor that replays a recorded trace also provides
`TraceSensor`, which puts the daemon on a virtual clock. README.md, "Writing a sensor or
actuator", has a complete example.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from autoscalerd.decide.gpu_health import GpuReading, ReplicaPlacement
from autoscalerd.model import Observation, Reading

if TYPE_CHECKING:
    from autoscalerd.config import Config


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    """What the platform says about a deployment, beyond load: identity and replica shape."""

    name: str  # "app/deployment"
    app: str = ""
    deployment: str = ""
    external_scaler_enabled: bool = True
    max_ongoing_requests: int | None = None
    # Resources one replica asks for, e.g. {"CPU": 1, "GPU": 4}.
    resources_per_replica: Mapping[str, float] = field(default_factory=dict)
    # The platform's current target and when it was read: actuators compare it with what
    # they last set to notice someone else changing it (ownership conflict).
    platform_target_replicas: Reading | None = None
    # True when the sensor reads a real platform (Ray Serve): the daemon then actuates a
    # deployment only once it has read the platform's current target. A replay has no
    # platform to read.
    watches_platform: bool = False
    # Changes when the platform restarts (Ray Serve: the controller's actor id), after
    # which nothing the daemon set there is in force: actuators assert it again.
    platform_epoch: str | None = None
    # The replicas and where they run (process id, node), to attribute GPUs to them.
    replicas: tuple[ReplicaPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class SenseResult:
    observations: Mapping[str, Observation]
    deployments: Mapping[str, DeploymentInfo]
    # Sensor-level failure (e.g. dashboard unreachable): one line, no secrets.
    error: str | None = None
    # GPU facts (NVML on this host, the nodes' GPU series for the others); the loop joins
    # them to replicas through DeploymentInfo.replicas.
    gpus: tuple[GpuReading, ...] = ()


@runtime_checkable
class Sensor(Protocol):
    """Turns one source (an API, a metrics endpoint, a trace) into Observations, once a tick.

    Construction, by the registry: `cls(settings, config)`. `settings` is the sensor's
    entry under `sensors:` without its `type` key; `config` is the whole validated
    `autoscalerd.config.Config` (`tick_s`, `cluster`, the deployments). Validate the
    settings with `autoscalerd.config.plugin_settings(Model, settings)`, a pydantic model
    with `extra="forbid"`, so that a mistake is one line naming the key; a `ConfigError`,
    `ValueError`, `TypeError` or `KeyError` from the constructor makes the daemon exit 2
    with that line. Declare the model as the class attribute `settings_model` as well, and
    `check-config` validates the settings without building the sensor
    (`autoscalerd.act.registry.DeclaresSettings`). The constructor runs on the event loop
    before the first tick: keep it cheap, and connect in the first `sense()`.

    The registry checks what it built against this protocol (`isinstance`, `async def`
    methods, a non-empty `name`): a sensor that lacks a member is a one-line config error
    at start-up, not a failure at the first tick.
    """

    # The sensor's label in logs, /v1/status and `autoscalerd_sensor_up{sensor=...}`.
    # Failures are tracked by it, so two configured sensors need two names.
    name: str

    async def sense(self, now_s: float) -> SenseResult:
        """What the source shows now, for every deployment it knows.

        Called once a tick with the daemon's clock (virtual under a replay): time-stamp
        each `Reading` with the time it describes, on that clock, not `time.time()`.

        Time budget: the loop calls every sensor at once and waits at most
        max(1 s, 0.8 * tick_s) for each; one still running then is cancelled and counts as
        failed ("timed out") for that tick. A slow source belongs in a background task
        that keeps the latest reading, which `sense()` returns at once (as `ray_serve`
        does).

        Never raise: a failure is `SenseResult({}, {}, error="...")`, one line saying what
        failed and where, with no secrets. A raise becomes the same error anyway, with
        the exception's text. `error` marks the sensor failed for the tick (logged once per
        change, counted in `autoscalerd_sensor_errors_total`); whatever is returned beside
        it is still used, so a partial result keeps what was read.

        Missing is never zero: a field that could not be read stays None, and a deployment
        whose inputs are missing or older than `max_metric_age_s` holds its target. Where
        several sensors report one field, the freshest Reading wins.

        `deployments` names each deployment the sensor knows, observed this tick or not:
        the daemon adopts a deployment only once a sensor has reported its DeploymentInfo
        (with `discovery.enabled`, every reported one with `external_scaler_enabled`), and
        with `watches_platform` only once `platform_target_replicas` has been read.
        """
        ...

    async def close(self) -> None:
        """Release connections, tasks and files. Called once at shutdown, perhaps with no
        `sense()` before it; the daemon waits at most `loop.CLOSE_TIMEOUT_S` (3 s), then
        abandons it and logs `close_failed`."""
        ...


@runtime_checkable
class TraceSensor(Sensor, Protocol):
    """A sensor that replays a recorded trace instead of watching a live platform.

    When every configured sensor is one, `autoscalerd run` runs on a virtual clock from the
    earliest `start_s` (as fast as possible, or `--speed N`) and stops once every one is
    `finished`. With a live sensor beside it the clock is real and the daemon runs until
    it is stopped.
    """

    # The trace time of the first request, in the clock's seconds (epoch seconds).
    start_s: float
    # True once the trace is exhausted: nothing later will be reported.
    finished: bool


class SensorFactory(Protocol):
    """What an `autoscalerd.sensors` entry point names: usually the sensor class."""

    def __call__(self, settings: Mapping[str, Any], config: Config) -> Sensor: ...
