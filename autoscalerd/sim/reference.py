"""The reference points of every backtest, from the demand profile of the trace.

- work bound: total service demand over one replica's capacity, in replica-seconds. No
  schedule can serve the trace for less, whatever its latency.
- oracle: knows the work arriving in every bucket ahead of time and asks for the replicas
  that work needs at `utilization`, `cold_start_s` ahead, so they are ready when it lands.
- static peak: the oracle's largest count, held all the time (provisioning for the peak).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from autoscalerd.sim.cluster import ReplicaModel
from autoscalerd.sim.traces import RequestBatch


@dataclass(frozen=True)
class DemandProfile:
    """A trace's arrivals and tokens per bucket of `bucket_s` seconds."""

    bucket_s: float
    duration_s: float
    arrivals: np.ndarray  # requests per bucket
    prompt_tokens: np.ndarray  # per bucket
    output_tokens: np.ndarray  # per bucket

    @property
    def requests(self) -> int:
        return int(self.arrivals.sum())

    @property
    def mean_prompt_tokens(self) -> float:
        return float(self.prompt_tokens.sum()) / max(1, self.requests)

    @property
    def mean_output_tokens(self) -> float:
        return float(self.output_tokens.sum()) / max(1, self.requests)

    def arrival_rate_per_s(self) -> np.ndarray:
        return self.arrivals / self.bucket_s


def profile(
    batches: Iterable[RequestBatch], bucket_s: float, duration_s: float | None
) -> DemandProfile:
    """One pass over the trace. `duration_s` None: the trace ends at its last request."""
    arrivals: list[np.ndarray] = []
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    size = 0
    last_s = 0.0

    def grow(array: list[np.ndarray], index: np.ndarray, weights: np.ndarray | None) -> None:
        counts = np.bincount(index, weights=weights, minlength=size)
        if array:
            old = array[0]
            if old.size < counts.size:
                old = np.concatenate((old, np.zeros(counts.size - old.size)))
            counts = old + counts
        array[:] = [counts]

    for batch in batches:
        if not len(batch):
            continue
        index = (batch.arrival_s // bucket_s).astype(np.int64)
        size = max(size, int(index[-1]) + 1)
        last_s = max(last_s, float(batch.arrival_s[-1]))
        grow(arrivals, index, None)
        grow(prompts, index, batch.prompt_tokens.astype(np.float64))
        grow(outputs, index, batch.output_tokens.astype(np.float64))
    end_s = duration_s if duration_s is not None else last_s
    buckets = max(1, math.ceil(end_s / bucket_s), size)

    def padded(array: list[np.ndarray]) -> np.ndarray:
        values = array[0] if array else np.zeros(0)
        return np.concatenate((values, np.zeros(buckets - values.size)))

    return DemandProfile(
        bucket_s=bucket_s,
        duration_s=end_s,
        arrivals=padded(arrivals),
        prompt_tokens=padded(prompts),
        output_tokens=padded(outputs),
    )


def work_bound_replica_seconds(demand: DemandProfile, model: ReplicaModel) -> float:
    return model.work_s(float(demand.prompt_tokens.sum()), float(demand.output_tokens.sum()))


def replicas_needed(demand: DemandProfile, model: ReplicaModel, utilization: float) -> np.ndarray:
    """Replicas each bucket's work needs at `utilization`, bucket by bucket."""
    work_s = np.maximum(
        demand.prompt_tokens / model.prefill_tokens_per_s,
        demand.output_tokens / model.decode_tokens_per_s,
    )
    return np.ceil(work_s / (demand.bucket_s * utilization) - 1e-9).astype(np.int64)


@dataclass(frozen=True)
class OraclePlan:
    """The oracle's target at any time, from buckets of `bucket_s`."""

    bucket_s: float
    targets: np.ndarray  # per bucket: the target to hold during it

    def target_at(self, now_s: float) -> int:
        index = min(int(now_s // self.bucket_s), self.targets.size - 1)
        return int(self.targets[max(0, index)])

    @property
    def peak(self) -> int:
        return int(self.targets.max()) if self.targets.size else 0


def oracle_plan(
    demand: DemandProfile,
    model: ReplicaModel,
    utilization: float,
    lead_s: float,
    min_replicas: int,
    max_replicas: int,
) -> OraclePlan:
    """Hold, during each bucket, the most any bucket until `lead_s` after it needs.

    A replica asked for now is ready `lead_s` later, so the count needed then must be
    asked for now; and one released now cannot be back sooner, so nothing is released
    while the next `lead_s` still needs it.
    """
    needed = replicas_needed(demand, model, utilization)
    ahead = math.ceil(lead_s / demand.bucket_s) + 1
    padded = np.concatenate((needed, np.zeros(ahead, dtype=np.int64)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, ahead + 1)[: needed.size]
    targets = np.clip(windows.max(axis=1), min_replicas, max_replicas)
    return OraclePlan(demand.bucket_s, targets)
