"""The optional extras: what the backtest and the demo need beyond the daemon, and the one
line that says which to install when it is missing.

The daemon (`run`, `check-config`, the operator commands) needs only the package's own
dependencies. The backtest and the demo also import pandas, matplotlib, rich and Ray,
installed as `autoscalerd[backtest]` or `autoscalerd[demo]`. Their commands check up
front, so a missing extra is one line and exit 2, not an ImportError (or a missing `ray`
executable) minutes into a run; `for_missing_module` maps an import that fails later (a
lazily imported module of the extra) to the same line.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Extra:
    name: str
    # What needs it, as the message says it: "the backtest".
    needed_by: str
    # Modules checked before the command starts (found, not imported: finding is cheap).
    modules: tuple[str, ...]
    # Every top-level module the extra installs for the command, also those imported
    # only on some paths (matplotlib for --plot, Ray for the ray-serve policy).
    provides: tuple[str, ...]
    # Executables the command runs: next to this Python, else on PATH.
    executables: tuple[str, ...] = ()


_SHARED = ("pandas", "matplotlib", "rich", "ray")
EXTRAS: dict[str, Extra] = {
    # Ray only for the ray-serve policy: a backtest of the others runs without it.
    "backtest": Extra("backtest", "the backtest", ("pandas", "rich", "matplotlib"), _SHARED),
    "demo": Extra("demo", "the demo", _SHARED, _SHARED, executables=("ray",)),
    # Ray's SDK in the daemon: the ray_autoscaler actuator, gpu.replace_failed.
    "ray": Extra("ray", "Ray's SDK", ("ray",), ("ray",)),
}


class MissingExtra(Exception):
    """A command's extra is not installed: one line for stderr, exit 2."""

    def __init__(self, extra: Extra) -> None:
        super().__init__(
            f'{extra.needed_by} needs the "{extra.name}" extra: '
            f"pip install 'autoscalerd[{extra.name}]'"
        )
        self.extra = extra


def module_found(name: str) -> bool:
    """Whether `name` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing; a module set to None
        return False


def executable(name: str) -> str | None:
    """The executable of this environment (a venv's bin/, not activated), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


def require(command: str) -> None:
    """Raise MissingExtra unless what `command`'s extra provides up front is installed."""
    extra = EXTRAS[command]
    if not all(module_found(m) for m in extra.modules) or not all(
        executable(e) for e in extra.executables
    ):
        raise MissingExtra(extra)


def missing(name: str) -> bool:
    """Whether the extra `name` (a key of EXTRAS) lacks one of its up-front modules."""
    extra = EXTRAS[name]
    return not all(module_found(m) for m in extra.modules)


def for_missing_module(command: str | None, exc: ModuleNotFoundError) -> MissingExtra | None:
    """The extra behind a failed import during `command`, or None when it is not one of
    the extra's modules (a broken install, which the caller reports as it is)."""
    extra = EXTRAS.get(command or "")
    top = (exc.name or "").partition(".")[0]
    if extra is None or top not in extra.provides:
        return None
    return MissingExtra(extra)
