"""Plugin discovery: sensors and actuators come from entry points, never imported by name."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from autoscalerd.config import Config, ConfigError, PluginConfig, plugin_settings

ACTUATOR_GROUP = "autoscalerd.actuators"
SENSOR_GROUP = "autoscalerd.sensors"


def available(group: str) -> list[str]:
    return sorted({ep.name for ep in entry_points(group=group)})


def factory(group: str, name: str, where: str) -> Any:
    """The class or callable registered as `name` in `group`; ConfigError if there is none."""
    matches = [ep for ep in entry_points(group=group) if ep.name == name]
    if not matches:
        known = ", ".join(available(group)) or "none installed"
        raise ConfigError([f"{where}.type: unknown plugin {name!r}; installed: {known}"])
    try:
        return matches[0].load()
    except Exception as exc:  # a broken third-party plugin must not crash with a traceback
        raise ConfigError(
            [
                f"{where}.type: plugin {name!r} failed to load ({type(exc).__name__}: {exc}); "
                "reinstall it or remove it from the config"
            ]
        ) from None


def check_settings(group: str, plugin: PluginConfig, where: str) -> list[str]:
    """A plugin's settings checked without building it (no connection, no thread): one
    line per problem. Plugins that declare their settings model as the class attribute
    `settings_model` (a pydantic model) get this from `check-config`; others are checked
    when the daemon builds them."""
    cls = factory(group, plugin.type, where)
    model = getattr(cls, "settings_model", None)
    if model is None:
        return []
    try:
        plugin_settings(model, plugin.settings)
    except ConfigError as exc:
        return [f"{where}.{line}" for line in exc.problems]
    return []


def build_sensors(config: Config) -> list[Any]:
    sensors = []
    for index, plugin in enumerate(config.sensors):
        sensors.append(_construct(SENSOR_GROUP, plugin, f"sensors[{index}]", config))
    return sensors


def build_actuators(config: Config, context: Any) -> list[Any]:
    actuators = []
    for index, plugin in enumerate(config.actuators):
        actuators.append(_construct(ACTUATOR_GROUP, plugin, f"actuators[{index}]", context))
    return actuators


def _construct(group: str, plugin: PluginConfig, where: str, second: Any) -> Any:
    cls = factory(group, plugin.type, where)
    try:
        return cls(plugin.settings, second)
    except ConfigError as exc:
        raise ConfigError([f"{where}: {line}" for line in exc.problems]) from None
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError([f"{where}: bad settings for {plugin.type!r}: {exc}"]) from None
