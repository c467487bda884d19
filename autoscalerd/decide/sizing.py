"""Stage 4: the smallest replica count for which the replica model predicts the SLO holds.

A request meets its TTFT SLO when its wait (router queue, then the replica's prefill
queue) stays within the wait budget; the sizing asks that the share of requests waiting
longer stay below ε = 1 − attainment target (times the guard's headroom). Three
conditions, each from first principles, and the count is the smallest R meeting all:

1. **Prefill queue** (per replica, λ/R requests/s, one prefill at a time): an M/G/1
   queue. Pollaczek-Khinchine gives the mean wait E[W] = λ_r·E[S²] / (2(1 − ρ)) with
   S = prompt / prefill_tokens_per_s, ρ = λ_r·E[S]; the wait is positive with
   probability ρ and then close to exponential with mean E[W]/ρ, so
   P(W > t) ≈ ρ·exp(−ρ·t / E[W]). E[S²] comes from the prompt-length histogram: long
   prompts block short ones, and this is where a long-context mix pays for it.
2. **Slots** (R·slots servers behind the router, each request holding one for its prefill,
   prefill wait and decode at full batch): square-root staffing in the Halfin-Whitt
   regime. With offered load a = λ·E[slot time] and β = (N − a)/√a, the probability of
   waiting is [1 + β·Φ(β)/φ(β)]⁻¹ and the wait beyond is exponential with rate
   (N − a)/E[slot time]. This is what sizes a decode-bound conversation workload: a
   replica holds all its slots busy and still meets the SLO, where Ray's concurrency rule
   would have sized it at target_ongoing_requests per replica.
3. **Bursts**: the requests of one tick at the measured peak-to-mean ratio, spread over R
   replicas by the router, must be prefilled within the tick plus the wait budget, and
   their slot-seconds must fit in the slots the steady load leaves free over that time.
   Queueing formulas assume arrivals that are Poisson at the level; real traffic
   clumps at the SLO's time scale, and this is the term that pays for it, in proportion
   to how clumped it was measured to be.

The arrival rate is the forecast's upper bound over the lead time (the caller's choice);
everything else is the learned model. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

from autoscalerd.decide.replica_model import ReplicaView

_NORMAL = NormalDist()


@dataclass(frozen=True, slots=True)
class SizingInputs:
    arrival_rate_per_s: float
    peak_to_mean: float  # at the tick scale, at the attainment quantile
    tick_s: float
    wait_budget_s: float
    tail_share: float  # ε: the share of requests allowed to wait past the budget
    capacity_factor: float = 1.0  # < 1 when replicas are derated (KV cache, GPU health)
    # The level the peak-to-mean ratio is relative to (the forecast's upper bound or the
    # smoothed rate, not one tick's rate, which may already be a peak); None: the rate.
    level_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class Sizing:
    replicas: int
    # Which condition set the count: prefill, slots, burst (or "idle" at zero load).
    binding: str
    predicted_wait_tail: float  # predicted share of requests over the wait budget at `replicas`
    prefill_utilization: float | None
    slot_utilization: float


def predicted_tail(
    model: ReplicaView, inputs: SizingInputs, replicas: int
) -> tuple[float, float | None, float, bool]:
    """(P(wait > budget), prefill ρ, slot utilisation, burst fits) at `replicas`."""
    lam = inputs.arrival_rate_per_s
    budget_s = inputs.wait_budget_s
    factor = max(1e-3, inputs.capacity_factor)
    per_replica = lam / replicas
    tail = 0.0
    prefill_wait_s = 0.0
    rho: float | None = None
    prefill_s = model.prefill_s
    if prefill_s is not None and prefill_s > 0:
        mean_s = prefill_s / factor
        assert model.prefill_tokens_per_s is not None
        second_s2 = model.prompt_tokens_sq_mean / (model.prefill_tokens_per_s * factor) ** 2
        rho = per_replica * mean_s
        if rho >= 1.0:
            return 1.0, rho, 1.0, False
        if rho > 0:
            prefill_wait_s = per_replica * second_s2 / (2.0 * (1.0 - rho))
            tail += rho * math.exp(-rho * budget_s / prefill_wait_s)
    slot_s = (model.slot_time_s + prefill_wait_s) / factor
    servers = replicas * model.slots
    offered = lam * slot_s
    utilization = offered / servers if servers else 1.0
    if offered > 0:
        if offered >= servers:
            return 1.0, rho, utilization, False
        beta = (servers - offered) / math.sqrt(offered)
        wait_probability = _halfin_whitt(beta)
        tail += wait_probability * math.exp(-(servers - offered) * budget_s / slot_s)
    # Bursts: one tick's requests at the peak-to-mean ratio.
    level_per_s = lam if inputs.level_per_s is None else inputs.level_per_s
    burst = inputs.peak_to_mean * level_per_s * inputs.tick_s / replicas
    fits = True
    if prefill_s is not None:
        fits = burst * prefill_s / factor <= inputs.tick_s + budget_s
    # Slots: the burst must find a slot within the tick plus the budget: the ones the
    # steady load leaves free (each reused if slots turn over faster than that), plus the
    # busy ones that finish meanwhile.
    window_s = inputs.tick_s + budget_s
    turns = window_s / slot_s if slot_s > 0 else math.inf
    available = (servers - offered) * max(1.0, turns) + offered * min(1.0, turns)
    fits = fits and burst * replicas <= available
    return min(1.0, tail), rho, utilization, fits


def size(model: ReplicaView, inputs: SizingInputs, max_replicas: int) -> Sizing:
    """The smallest count in [1, max_replicas] meeting every condition; max_replicas if none."""
    if inputs.arrival_rate_per_s <= 0:
        return Sizing(0, "idle", 0.0, 0.0 if model.prefill_s is not None else None, 0.0)

    def ok(replicas: int) -> bool:
        tail, _, _, fits = predicted_tail(model, inputs, replicas)
        return fits and tail <= inputs.tail_share

    high = max(1, max_replicas)
    if not ok(high):
        # Beyond the bound: find where it would hold, for the record, within 4x.
        limit = high
        while limit < 4 * high and not ok(limit):
            limit *= 2
        return _sizing(model, inputs, high, limit)
    low = 1
    while low < high:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid + 1
    return _sizing(model, inputs, low, low)


def by_utilization(
    arrival_rate_per_s: float, service_rate_per_s: float, target_utilization: float
) -> Sizing:
    """⌈λ / (ρ·μ)⌉: the classic rule (`capacity.sizing: utilization`), kept to compare."""
    replicas = math.ceil(arrival_rate_per_s / (target_utilization * service_rate_per_s) - 1e-9)
    utilization = arrival_rate_per_s / (max(1, replicas) * service_rate_per_s)
    return Sizing(max(0, replicas), "utilization", math.nan, None, utilization)


def _sizing(model: ReplicaView, inputs: SizingInputs, replicas: int, probe: int) -> Sizing:
    tail, rho, utilization, _ = predicted_tail(model, inputs, replicas)
    return Sizing(
        replicas=replicas,
        binding=_binding(model, inputs, probe),
        predicted_wait_tail=tail,
        prefill_utilization=rho,
        slot_utilization=utilization,
    )


def _binding(model: ReplicaView, inputs: SizingInputs, replicas: int) -> str:
    """Which condition fails one replica below `replicas` (the one that set the count)."""
    if replicas <= 1:
        return "minimum"
    below = replicas - 1
    no_burst = replace(inputs, peak_to_mean=0.0)
    tail, rho, utilization, fits = predicted_tail(model, no_burst, below)
    if fits and tail <= inputs.tail_share:
        return "burst"
    if rho is not None and rho >= utilization:
        return "prefill"
    return "slots"


def _halfin_whitt(beta: float) -> float:
    """Probability of waiting with β = (N − a)/√a spare servers (Halfin & Whitt, 1981)."""
    if beta <= 0:
        return 1.0
    if beta > 8.0:
        return 0.0
    return 1.0 / (1.0 + beta * _NORMAL.cdf(beta) / _NORMAL.pdf(beta))
