"""Plugin discovery: sensors and actuators come from entry points, never imported by name.

What a plugin must provide is `autoscalerd.sense.base.Sensor` or
`autoscalerd.act.base.Actuator`; the registry builds each one named in the config and
checks it against that protocol, so that a plugin which does not fit is a one-line config
error at start-up (exit 2), not a failure at the first tick.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Protocol, cast, runtime_checkable

from pydantic import BaseModel

from autoscalerd import extras
from autoscalerd.act.base import Actuator, ActuatorContext
from autoscalerd.config import Config, ConfigError, PluginConfig, plugin_settings
from autoscalerd.sense.base import Sensor

ACTUATOR_GROUP = "autoscalerd.actuators"
SENSOR_GROUP = "autoscalerd.sensors"
# The protocol a plugin of each group is checked against, and what it is called in errors.
_CONTRACTS: dict[str, tuple[type, str]] = {
    SENSOR_GROUP: (Sensor, "a sensor"),
    ACTUATOR_GROUP: (Actuator, "an actuator"),
}


@runtime_checkable
class DeclaresExtra(Protocol):
    """A plugin class that needs one of autoscalerd's extras (`requires_extra = "ray"`):
    without it installed, check-config and the start-up say which to install, rather than
    every actuation failing with an ImportError."""

    requires_extra: str


@runtime_checkable
class DeclaresSettings(Protocol):
    """A plugin class that names its settings model (a pydantic model, best with
    `extra="forbid"`), so that `check-config` validates its settings without building it:
    no connection, no thread. Optional: a plugin without one has its settings checked when
    the daemon builds it."""

    settings_model: type[BaseModel]


def available(group: str) -> list[str]:
    return sorted({ep.name for ep in entry_points(group=group)})


def factory(group: str, name: str, where: str) -> Callable[..., object]:
    """The class or callable registered as `name` in `group`; ConfigError if there is none."""
    matches = [ep for ep in entry_points(group=group) if ep.name == name]
    if not matches:
        raise ConfigError([f"{where}.type: unknown plugin {name!r}; {_unknown_hint(group, name)}"])
    try:
        loaded = matches[0].load()
    except Exception as exc:  # a broken third-party plugin must not crash with a traceback
        raise ConfigError(
            [
                f"{where}.type: plugin {name!r} failed to load ({type(exc).__name__}: {exc}); "
                "reinstall it or remove it from the config"
            ]
        ) from None
    if not callable(loaded):
        raise ConfigError([f"{where}.type: plugin {name!r} names {loaded!r}, not a class; {_FIX}"])
    return loaded


def _unknown_hint(group: str, name: str) -> str:
    """A near miss of an installed plugin's name, else what is installed."""
    installed = available(group)
    close = difflib.get_close_matches(name, installed, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    known = ", ".join(installed) or "none"
    return f"installed: {known} (a third-party plugin must be installed in this environment)"


def _lacking_extra(cls: object, name: str, where: str) -> str | None:
    """The line for a plugin whose declared extra is not installed, else None."""
    if not isinstance(cls, DeclaresExtra):
        return None
    extra = cls.requires_extra
    if not isinstance(extra, str) or extra not in extras.EXTRAS or not extras.missing(extra):
        return None
    return (
        f"{where}.type: plugin {name!r} needs the {extra!r} extra, which is not installed "
        f"here: pip install 'autoscalerd[{extra}]'"
    )


def check_plugins(config: Config) -> list[str]:
    """Every sensor and actuator the config names, checked without building it
    (`check_settings`): one line per problem, each with its YAML path."""
    problems: list[str] = []
    if config.gpu.replace_failed and extras.missing("ray"):
        problems.append(
            "gpu.replace_failed: stopping a failed replica needs the 'ray' extra, which is "
            "not installed here: pip install 'autoscalerd[ray]' (or set it to false)"
        )
    for group, plugins, where in (
        (SENSOR_GROUP, config.sensors, "sensors"),
        (ACTUATOR_GROUP, config.actuators, "actuators"),
    ):
        for index, plugin in enumerate(plugins):
            try:
                problems.extend(check_settings(group, plugin, f"{where}[{index}]"))
            except ConfigError as exc:
                problems.extend(exc.problems)
    return problems


def check_settings(group: str, plugin: PluginConfig, where: str) -> list[str]:
    """A plugin checked without building it (no connection, no thread): one line per
    problem. Its class must have the protocol's methods, as `async def` (its data
    attributes, such as `name`, may be set by its constructor, so they are checked once
    built). Its settings are checked if it declares `settings_model` (DeclaresSettings);
    other plugins' settings are checked when the daemon builds them."""
    cls = factory(group, plugin.type, where)
    if isinstance(cls, type):
        misfit = _misfit(cls, group, plugin.type, where, methods_only=True)
        if misfit is not None:
            return [misfit]
    lacking = _lacking_extra(cls, plugin.type, where)
    if lacking is not None:
        return [lacking]
    if not isinstance(cls, DeclaresSettings):
        return []
    model = cls.settings_model
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return [
            f"{where}.type: plugin {plugin.type!r}: settings_model is {model!r}, "
            f"not a pydantic model; {_FIX}"
        ]
    try:
        plugin_settings(model, plugin.settings)
    except ConfigError as exc:
        # Each line starts with the setting's path in the block: `timeout_s: ...` reads
        # `sensors[0].timeout_s: ...`; a problem of the whole block, `sensors[0]: ...`.
        return [
            f"{where}: {line.removeprefix('(settings): ')}"
            if line.startswith("(settings)")
            else f"{where}.{line}"
            for line in exc.problems
        ]
    return []


def build_sensors(config: Config) -> list[Sensor]:
    sensors: list[Sensor] = []
    for index, plugin in enumerate(config.sensors):
        where = f"sensors[{index}]"
        built = _construct(SENSOR_GROUP, plugin, where, config)
        _require_fit(built, SENSOR_GROUP, plugin.type, where)
        sensors.append(cast(Sensor, built))
    return sensors


def build_actuators(config: Config, context: ActuatorContext) -> list[Actuator]:
    actuators: list[Actuator] = []
    for index, plugin in enumerate(config.actuators):
        where = f"actuators[{index}]"
        built = _construct(ACTUATOR_GROUP, plugin, where, context)
        _require_fit(built, ACTUATOR_GROUP, plugin.type, where)
        actuators.append(cast(Actuator, built))
    return actuators


def _construct(group: str, plugin: PluginConfig, where: str, second: object) -> object:
    cls = factory(group, plugin.type, where)
    lacking = _lacking_extra(cls, plugin.type, where)
    if lacking is not None:
        raise ConfigError([lacking])
    try:
        return cls(plugin.settings, second)
    except ConfigError as exc:
        raise ConfigError([f"{where}: {line}" for line in exc.problems]) from None
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError([f"{where}: bad settings for {plugin.type!r}: {exc}"]) from None


# ------------------------------------------------------------------ the protocol check

_FIX = "the plugin must be fixed (README.md: Writing a sensor or actuator)"


def _members(protocol: type) -> tuple[list[str], list[str]]:
    """The data attributes and the methods a Protocol declares, its bases' included."""
    attributes: list[str] = []
    methods: list[str] = []
    for base in protocol.__mro__:
        if base is Protocol or not base.__dict__.get("_is_protocol", False):
            continue
        attributes += [a for a in inspect.get_annotations(base) if a not in attributes]
        methods += [
            m
            for m, value in base.__dict__.items()
            if inspect.isfunction(value) and not m.startswith("_") and m not in methods
        ]
    return attributes, methods


def _misfit(
    candidate: object, group: str, plugin: str, where: str, *, methods_only: bool = False
) -> str | None:
    """Why a plugin (built, or its class) does not fit its group's protocol, or None: a
    member missing (isinstance on the runtime-checkable Protocol), a method that is not
    `async def`, a name that is not a non-empty string."""
    protocol, word = _CONTRACTS[group]
    attributes, methods = _members(protocol)
    wanted = methods if methods_only else [*attributes, *methods]
    missing = [m for m in wanted if not hasattr(candidate, m)]
    if missing or not (methods_only or isinstance(candidate, protocol)):
        lacks = ", ".join(missing) or "a member of the protocol"
        return f"{where}.type: plugin {plugin!r} is not {word}: it lacks {lacks}; {_FIX}"
    # The methods as defined on the class: a bound method or a wrapper would hide them.
    sync = [
        m for m in methods if not inspect.iscoroutinefunction(inspect.getattr_static(candidate, m))
    ]
    if sync:
        return (
            f"{where}.type: plugin {plugin!r} is not {word}: "
            f"{', '.join(sync)} must be `async def`; {_FIX}"
        )
    if not methods_only:
        name = cast(Sensor | Actuator, candidate).name
        if not isinstance(name, str) or not name:
            return (
                f"{where}.type: plugin {plugin!r}: its name is {name!r}, "
                f"not a non-empty string; {_FIX}"
            )
    return None


def _require_fit(built: object, group: str, plugin: str, where: str) -> None:
    misfit = _misfit(built, group, plugin, where)
    if misfit is not None:
        raise ConfigError([misfit])
