"""Holt-Winters forecaster of the arrival rate (interface; implementation pending in this file).

Pure: every function takes the time it needs as an argument and returns new values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FittedModel:
    method: str  # "holt_winters" | "holt" | "ewma"


@dataclass(frozen=True, slots=True)
class ForecasterState:
    bucket_start_s: float | None = None
    history: tuple[float, ...] = ()
    model: FittedModel | None = None


@dataclass(frozen=True, slots=True)
class Forecast:
    point_per_s: float
    upper_per_s: float
    method: str
