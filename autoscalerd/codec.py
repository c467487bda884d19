"""Frozen dataclasses to JSON and back, field by field, with every value checked.

The state file's format (state.py) is this codec over DeploymentState and its parts:
never pickle (a state file must not be able to run code), and a value that does not fit
its field's type (a string for a count, NaN, a number near the float limit) is an error
naming its path, so that damage is found at load and not by the first decision made
from it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

# Nothing autoscalerd saves comes near this magnitude: beyond it, a number is damage.
MAX_MAGNITUDE = 1e15


class CodecError(ValueError):
    """A value does not fit its field: one line, the path first."""


def to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def from_json(kind: Any, value: Any, where: str) -> Any:
    """`value` (parsed JSON) as an instance of the type `kind`; CodecError naming the path."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        problems = []
        for option in options:
            if option is type(None):
                continue
            try:
                return from_json(option, value, where)
            except CodecError as exc:
                problems.append(str(exc))
        raise CodecError(problems[0] if problems else f"{where or 'top level'}: unexpected null")
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise CodecError(f"{where or 'top level'}: expected an object")
        hints = typing.get_type_hints(kind)
        known = {f.name for f in dataclasses.fields(kind)}
        unknown = set(value) - known
        if unknown:
            raise CodecError(f"{_join(where, sorted(unknown)[0])}: unknown field")
        values = {
            name: from_json(hints[name], item, _join(where, name)) for name, item in value.items()
        }
        try:
            return typing.cast(Any, kind)(**values)
        except TypeError as exc:  # a required field missing
            raise CodecError(f"{where or 'top level'}: {exc}") from None
    if origin is tuple:
        args = typing.get_args(kind)
        if not isinstance(value, list):
            raise CodecError(f"{where}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise CodecError(f"{where}: expected {len(args)} items")
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(from_json(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
    if origin is dict:
        _, item_kind = typing.get_args(kind)
        if not isinstance(value, dict):
            raise CodecError(f"{where}: expected an object")
        return {k: from_json(item_kind, v, _join(where, k)) for k, v in value.items()}
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CodecError(f"{where}: expected a number")
        try:
            number = float(value)
        except OverflowError:
            raise CodecError(f"{where}: number out of range") from None
        if not math.isfinite(number) or abs(number) > MAX_MAGNITUDE:
            # Nothing the daemon saves is NaN, infinite or near the float limit: such a
            # value is damage, and would poison every decision made from it.
            raise CodecError(f"{where}: not a finite number in range")
        return number
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CodecError(f"{where}: expected an integer")
        if abs(value) > MAX_MAGNITUDE:
            raise CodecError(f"{where}: number out of range")
        return value
    if kind is bool or kind is str:
        if not isinstance(value, kind):
            raise CodecError(f"{where}: expected {kind.__name__}")
        return value
    raise CodecError(f"{where}: cannot read a {kind!r}")


def _join(where: str, name: str) -> str:
    return f"{where}.{_name(name)}" if where else _name(name)


def _name(name: str) -> str:
    """A field or key as an error names it: escaped when it would break the line (a
    newline in a key), cut when too long to read."""
    if name.isprintable() and len(name) <= _NAME_SHOWN:
        return name
    shown = ascii(name[:_NAME_SHOWN])
    return shown if len(name) <= _NAME_SHOWN else f"{shown}... ({len(name)} characters)"


_NAME_SHOWN = 80
