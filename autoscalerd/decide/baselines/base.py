"""The seam every policy in a backtest fills: one Observation in, one target out.

autoscalerd's own decision core and the peers it is compared with (Ray Serve's default,
Kubernetes' HPA, Knative's KPA, a queue threshold) all read the same sensor-like
Observations and return the replica count they want; the simulator applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autoscalerd.model import Observation


class Policy(Protocol):
    """A stateful policy. `step` is called once per tick, with the tick's time."""

    name: str

    def step(self, obs: Observation, now_s: float) -> int: ...


@dataclass(frozen=True, slots=True)
class Bounds:
    """The min/max replica bounds every policy in one backtest shares."""

    min_replicas: int
    max_replicas: int

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"bounds must satisfy 0 <= min_replicas <= max_replicas "
                f"(got {self.min_replicas}, {self.max_replicas})"
            )

    def clip(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


def value(obs: Observation, name: str, default: float = 0.0) -> float:
    """A field's value, or `default` when the sensor did not report it."""
    reading = getattr(obs, name)
    return default if reading is None else float(reading.value)
