"""Stage 4: the smallest replica count for which the replica model predicts the SLO holds.

A request meets its TTFT SLO when its wait (router queue, then the replica's prefill
queue) stays within the wait budget; the sizing asks that the share of requests waiting
longer stay below ε = 1 − attainment target (times the guard's headroom). Four
conditions, each from first principles, and the count is the smallest R meeting all:

1. **Prefill queue** (per replica, λ/R requests/s, one prefill at a time): an M/G/1
   queue. Pollaczek-Khinchine gives the mean wait E[W] = λ_r·E[S²] / (2(1 − ρ)) with
   S = prompt / prefill_tokens_per_s, ρ = λ_r·E[S]; the wait is positive with
   probability ρ and then close to exponential with mean E[W]/ρ, so
   P(W > t) ≈ ρ·exp(−ρ·t / E[W]). E[S²] comes from the prompt-length histogram: long
   prompts block short ones, and this is where a long-context mix pays for it. Serve's
   router sends a request to the least-loaded replica, so it meets a busy prefill engine
   only when no replica is empty: the tail is multiplied by P(N ≥ R), N ~ Poisson(λ·T)
   the requests in the system (M/G/∞, T the slot time at the batch this load gives).
   Sparse long-prompt traffic spread over many replicas queues far less than R
   independent M/G/1 queues would say. The same router caps what a long prefill holds
   up: the stuck replica draws new requests only as the ones it was decoding finish
   (over their decode time T_d), so each prefill of S delays T_d·(1 − e^(−(S−t)/T_d))
   worth of arrivals past t, not (S − t) (`_captured_share`; measured against the
   simulator by benchmarks/model_vs_simulator.py).
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
   to how clumped it was measured to be. Clumps of several ticks are measured in
   requests per window (burstiness.py): the requests of a window of w seconds at the
   quantile, spread over R replicas, must be prefilled within w plus the wait budget
   (the last of them waits for the work that arrived before it in the window), and find
   slots within that time. This holds the capacity that on-off traffic's clumps need
   through the lulls between them.

4. **The local rate** (`rate_mix`): conditions 1 and 2 take Poisson arrivals at one
   rate. Traffic that clumps at the scale of seconds sends a replica a few requests at
   once, one of them a long prompt, and the waits behind it are in neither a queue at
   the mean rate nor a fluid bound on the clump. So the late share is also averaged over
   the rate each request arrived at, read over a window about as long as the prefill
   queue's memory (burstiness.rate_mix, 8 s), with the steady formulas at each rate; the
   larger of the two is the prediction. On the Azure 2023 code trace this lands within
   about 1.6x of the simulator at every count where more than 0.5 % are late, on three
   replica presets, where the mean rate reads none late (benchmarks/rate_mixture.py).

The wait tail is Σ weight·exp(−rate·t) (conditions 1 and 2). With the prompt mix and the
TTFT SLO, each request has its own budget: a prompt of prefill s misses when its wait
exceeds ttft − s, and prompts whose prefill alone exceeds the SLO are not counted (no
count of replicas helps them). The predicted late share averages the tail over the
prompt histogram's buckets; without a mix, every request gets the wait budget.

The arrival rate is the forecast's upper bound over the lead time (the caller's choice);
everything else is the learned model. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from statistics import NormalDist

from autoscalerd.decide import capacity, prompt_budgets
from autoscalerd.decide.replica_model import ReplicaView

_NORMAL = NormalDist()
# Points per prompt bucket where the captured share averages over the mix (midpoint rule).
_MIX_POINTS = 4


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
    # The TTFT SLO: with the model's prompt mix, each request's own wait budget is the
    # SLO less its own prefill; None (or no mix): every request gets `wait_budget_s`.
    ttft_s: float | None = None
    # Clumps of several ticks, (window_s, requests at the quantile), from burstiness.
    clumps: tuple[tuple[float, float], ...] = ()
    # The local arrival rate as requests arrived, ((rate per s, share), ...) highest
    # first, from burstiness.rate_mix: the late share is also averaged over it.
    rate_mix: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Sizing:
    replicas: int
    # Which condition set the count: prefill, slots, burst (or "idle" at zero load).
    binding: str
    predicted_wait_tail: float  # predicted share of requests over the wait budget at `replicas`
    prefill_utilization: float | None
    slot_utilization: float


@dataclass(frozen=True, slots=True)
class WaitTail:
    """P(wait > t) ≈ Σ weight·exp(−rate·t): the prefill queue's term and the slots' term."""

    terms: tuple[tuple[float, float], ...]  # (weight, rate per s)

    def above(self, wait_s: float) -> float:
        return min(1.0, sum(w * math.exp(-r * wait_s) for w, r in self.terms))

    def above_uniform(self, low_s: float, high_s: float) -> float:
        """The mean of above(t) for t uniform in [low_s, high_s]."""
        if high_s <= low_s:
            return self.above(low_s)
        width = high_s - low_s
        total = 0.0
        for weight, rate in self.terms:
            if rate * width < 1e-9:
                total += weight * math.exp(-rate * low_s)
            else:
                total += (
                    weight * (math.exp(-rate * low_s) - math.exp(-rate * high_s)) / (rate * width)
                )
        return min(1.0, total)


def predicted_tail(
    model: ReplicaView, inputs: SizingInputs, replicas: int
) -> tuple[float, float | None, float, bool]:
    """(share of requests late for a reason replicas fix, prefill ρ, slot utilisation,
    burst fits) at `replicas`."""
    return _predicted_at(model, inputs, replicas, inputs.arrival_rate_per_s)


@dataclass(frozen=True, slots=True)
class SteadyQueue:
    """Conditions 1 and 2 at one rate and count: the wait tail, or None where the prefill
    engines or the slots cannot keep up (every request waits without bound)."""

    tail: WaitTail | None
    rho: float | None  # the prefill engines' utilisation; None without a prefill model
    utilization: float  # the slots'
    servers: int
    offered: float  # λ·E[slot time], in slots
    slot_s: float


def steady_queue(
    model: ReplicaView, lam: float, replicas: int, factor: float, budget_s: float
) -> SteadyQueue:
    """The steady formulas' wait tail at arrival rate `lam` over `replicas`, Poisson
    arrivals and no bursts: the prefill queue's term and the slots' term."""
    terms: list[tuple[float, float]] = []
    prefill_wait_s = 0.0
    rho: float | None = None
    servers = replicas * model.slots
    queue = _prefill_queue(model, lam, replicas, factor)
    if queue is not None:
        rho, mg1_wait_s, occupied = queue
        if rho >= 1.0:
            return SteadyQueue(None, rho, 1.0, servers, math.inf, math.inf)
        if rho > 0:
            prefill_wait_s = occupied * mg1_wait_s
            captured = _captured_share(model, lam, replicas, factor, budget_s)
            terms.append((occupied * rho * captured, rho / mg1_wait_s))
    slot_s = (model.slot_time_s + prefill_wait_s) / factor
    offered = lam * slot_s
    utilization = offered / servers if servers else 1.0
    if offered > 0:
        if offered >= servers:
            return SteadyQueue(None, rho, utilization, servers, offered, slot_s)
        beta = (servers - offered) / math.sqrt(offered)
        terms.append((_halfin_whitt(beta), (servers - offered) / slot_s))
    return SteadyQueue(WaitTail(tuple(terms)), rho, utilization, servers, offered, slot_s)


def _predicted_at(
    model: ReplicaView, inputs: SizingInputs, replicas: int, lam: float
) -> tuple[float, float | None, float, bool]:
    """predicted_tail with the arrival rate `lam` in place of the inputs' (the mixture
    asks at each of its rates, without a copy of the inputs for each)."""
    budget_s = inputs.wait_budget_s
    factor = max(1e-3, inputs.capacity_factor)
    steady = steady_queue(model, lam, replicas, factor, budget_s)
    tail, rho, servers, offered, slot_s = (
        steady.tail, steady.rho, steady.servers, steady.offered, steady.slot_s
    )  # fmt: skip
    if tail is None:
        return 1.0, rho, steady.utilization, False
    late = _late_share(tail, model, inputs, factor)
    level_per_s = lam if inputs.level_per_s is None else inputs.level_per_s
    # Bursts: one tick's requests at the peak-to-mean ratio, then each clump window's.
    tick_requests = inputs.peak_to_mean * level_per_s * inputs.tick_s
    spans = [(tick_requests, inputs.tick_s + budget_s)]
    spans += [(requests, window_s + budget_s) for window_s, requests in inputs.clumps]
    fits = all(
        _fits(requests, span_s, replicas, model, factor, servers, offered, slot_s)
        for requests, span_s in spans
    )
    if inputs.rate_mix:
        late = max(late, _mixture_late(model, inputs, replicas))
    return late, rho, steady.utilization, fits


# Where the mixture stops: the groups left could add at most this share of the target.
_MIXTURE_NEGLIGIBLE = 0.01


def _mixture_late(model: ReplicaView, inputs: SizingInputs, replicas: int) -> float:
    """The late share averaged over the local arrival rate: the steady formulas at each
    rate of `inputs.rate_mix`, weighted by the share of requests that arrived at it (a
    locally stationary queue), highest rate first, until the groups left could not add
    `_MIXTURE_NEGLIGIBLE` of the target (the late share falls with the rate)."""
    steady = replace(inputs, peak_to_mean=0.0, clumps=(), rate_mix=())
    late = 0.0
    left = 1.0
    for rate_per_s, share in inputs.rate_mix:
        here = _predicted_at(model, steady, replicas, rate_per_s)[0]
        late += share * here
        left -= share
        if here * left < _MIXTURE_NEGLIGIBLE * inputs.tail_share:
            break
    return min(1.0, late)


def _captured_share(
    model: ReplicaView, arrival_rate_per_s: float, replicas: int, factor: float, wait_s: float
) -> float:
    """The share of the waits past `wait_s` behind a long prefill that the router still
    sends there, with several replicas to choose from.

    A request waits past t when it reaches a replica whose prefill engine has more than t
    of work left: at light load λ_r·E[(S − t)+] of requests (the M/G/1 tail's origin).
    With random routing, requests keep arriving behind a long prefill for all of it. Serve's
    router sends each request to the replica with the fewest ongoing requests: the stuck
    replica's count stays level with the others' only as its decoding requests finish and
    are replaced, so it draws about the requests it was decoding, over their remaining
    decode time T_d, and then no more. A prefill of length S then holds up requests for
    T_d·(1 − exp(−(S − t)+ / T_d)) of its time, not (S − t)+. The share is the ratio of the
    two expectations over the prompt mix; 1 with one replica (nowhere else to go), without
    a prompt mix, or where no prompt outlasts t.
    """
    speed = model.prefill_tokens_per_s
    if replicas < 2 or speed is None or not model.prompt_mix or model.prefill_s is None:
        return 1.0
    speed *= factor
    decode_s = (
        _slot_time_at_load_s(model, arrival_rate_per_s, replicas) - model.prefill_s
    ) / factor
    if decode_s <= 0:
        return 1.0
    excess = 0.0
    held = 0.0
    for tokens, weight in _mix_points(model.prompt_mix):
        over_s = tokens / speed - wait_s
        if over_s <= 0:
            continue
        excess += weight * over_s
        held += weight * decode_s * -math.expm1(-over_s / decode_s)
    if excess <= 0:
        return 1.0
    return min(1.0, held / excess)


@lru_cache(maxsize=64)
def _mix_points(
    prompt_mix: tuple[tuple[float, float, float], ...],
) -> tuple[tuple[float, float], ...]:
    """The prompt mix as (tokens, share) points: `_MIX_POINTS` midpoints per bucket, the
    unbounded bucket at its lower edge. Cached: the sizing asks for the same mix often."""
    points: list[tuple[float, float]] = []
    for low, high, share in prompt_mix:
        if math.isinf(high):
            points.append((low, share))
            continue
        points += [
            (low + (high - low) * (k + 0.5) / _MIX_POINTS, share / _MIX_POINTS)
            for k in range(_MIX_POINTS)
        ]
    return tuple(points)


def _fits(
    requests: float,
    span_s: float,
    replicas: int,
    model: ReplicaView,
    factor: float,
    servers: int,
    offered: float,
    slot_s: float,
) -> bool:
    """Whether `requests` arriving within `span_s` are prefilled in it by the replicas
    (one prefill at a time each, the router spreading them) and find a slot in it.

    The slots a span offers, in expectation, with slot times exponential about their mean
    (the renewal count): each slot the steady load leaves free takes a request at once,
    and every slot, free or busy, frees `span_s / slot_s` times over the span (a busy
    slot's remaining time has the same mean as a whole one: memoryless). So
    `(servers − offered) + servers·turns`. A fixed slot time offers no fewer (a free slot
    serves 1 + ⌊turns⌋, a busy one at least ⌊turns⌋)."""
    if model.prefill_s is not None and requests / replicas * model.prefill_s / factor > span_s:
        return False
    turns = span_s / slot_s if slot_s > 0 else math.inf
    available = (servers - offered) + servers * turns
    return requests <= available


def _late_share(tail: WaitTail, model: ReplicaView, inputs: SizingInputs, factor: float) -> float:
    """The share of the attainable requests whose wait makes them miss the TTFT SLO.

    With the prompt mix, a request of prefill s misses when its wait exceeds ttft − s;
    prompts whose prefill alone exceeds the SLO are lost whatever the count: they are
    neither late nor counted, so the share is of the requests that can meet the SLO (the
    error budget the guard burns is of those too). Within a bucket, lengths are taken as
    uniform (the histogram's own interpolation). Without it, every request is given
    `wait_budget_s`.
    """
    ttft_s = inputs.ttft_s
    speed = model.prefill_tokens_per_s
    if ttft_s is None or speed is None or not model.prompt_mix:
        return tail.above(inputs.wait_budget_s)
    late = 0.0
    attainable = 0.0
    budgets = prompt_budgets.attainable_budgets(model.prompt_mix, ttft_s, speed * factor)
    if len(tail.terms) == 2:
        attainable, late = _late_two_terms(tail.terms, budgets)
    else:
        for part, low_s, high_s in budgets:
            attainable += part
            late += part * tail.above_uniform(low_s, high_s)
    if attainable <= 0.0:
        return 0.0  # every prompt takes longer than the SLO to prefill: no count helps
    return min(1.0, late / attainable)


def _late_two_terms(
    terms: tuple[tuple[float, float], ...], budgets: tuple[tuple[float, float, float], ...]
) -> tuple[float, float]:
    """(attainable share, late share) over the budget pieces for the usual tail of two
    terms (prefill queue and slots): `WaitTail.above_uniform` for each piece, written out
    with the same arithmetic, and each piece's upper edge, the lower edge of the piece
    before it, taken from that piece's exponentials. Most of a decision's time is here
    (benchmarks/backtest_speed.py)."""
    exp = math.exp
    (w1, r1), (w2, r2) = terms
    attainable = late = 0.0
    edge_s = math.nan
    edge1 = edge2 = 0.0
    for part, low_s, high_s in budgets:
        attainable += part
        low1 = exp(-r1 * low_s)
        low2 = exp(-r2 * low_s)
        if high_s <= low_s:
            total = w1 * low1 + w2 * low2
        else:
            width = high_s - low_s
            if high_s == edge_s:
                high1, high2 = edge1, edge2
            else:
                high1, high2 = exp(-r1 * high_s), exp(-r2 * high_s)
            span1 = r1 * width
            span2 = r2 * width
            first = w1 * low1 if span1 < 1e-9 else w1 * (low1 - high1) / span1
            second = w2 * low2 if span2 < 1e-9 else w2 * (low2 - high2) / span2
            total = first + second
        edge_s, edge1, edge2 = low_s, low1, low2
        late += part * (total if total < 1.0 else 1.0)
    return attainable, late


def size(
    model: ReplicaView, inputs: SizingInputs, max_replicas: int, near: int | None = None
) -> Sizing:
    """The smallest count in [1, max_replicas] meeting every condition; max_replicas if none.

    The conditions only loosen as replicas are added, so the answer is where they start to
    hold. `near` (the count the last tick sized, where known) is where the search starts:
    from one tick to the next the answer moves by a replica or none, and two evaluations
    settle it (`near` holds, one fewer does not) where a bisection over the whole range
    takes seven. The answer does not depend on `near`."""
    if inputs.arrival_rate_per_s <= 0:
        return Sizing(0, "idle", 0.0, 0.0 if model.prefill_s is not None else None, 0.0)

    steady = replace(inputs, rate_mix=())
    # predicted_tail at each count asked, where `ok` found it whole (the answer's record).
    seen: dict[int, tuple[float, float | None, float, bool]] = {}

    def ok(replicas: int) -> bool:
        # The mixture only adds to the late share: a count the rest rules out is out.
        tail, rho, utilization, fits = predicted_tail(model, steady, replicas)
        if not (fits and tail <= inputs.tail_share):
            return False
        # predicted_tail with the mix is the larger of this and the mixture's share.
        if inputs.rate_mix:
            tail = max(tail, _mixture_late(model, inputs, replicas))
        seen[replicas] = (tail, rho, utilization, fits)
        return tail <= inputs.tail_share

    high = max(1, max_replicas)
    low = 1
    if near is not None and 1 <= near <= high:
        # Gallop from `near` (steps of 1, 1, 2, 4, ...: the usual move is one replica) to
        # a bracket [low, high]: `high` holds and every count below `low` does not.
        if ok(near):
            high = near
            for step in _gallop():
                if high - step < low:
                    break
                if not ok(high - step):
                    low = high - step + 1
                    break
                high -= step
        elif near == high:
            return _beyond(model, inputs, high, ok, seen)
        else:
            low = near + 1
            for step in _gallop():
                if low + step - 1 >= high:
                    if not ok(high):
                        return _beyond(model, inputs, high, ok, seen)
                    break
                if ok(low + step - 1):
                    high = low + step - 1
                    break
                low += step
    elif not ok(high):
        return _beyond(model, inputs, high, ok, seen)
    while low < high:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid + 1
    return _sizing(model, inputs, low, low, seen.get(low))


def _gallop() -> Iterator[int]:
    yield 1
    step = 1
    while True:
        yield step
        step *= 2


def _beyond(
    model: ReplicaView,
    inputs: SizingInputs,
    high: int,
    ok: Callable[[int], bool],
    seen: dict[int, tuple[float, float | None, float, bool]],
) -> Sizing:
    """`high` (the bound) when no count within it holds: where it would hold, found for
    the record within 4x, names the binding condition."""
    limit = high
    while limit < 4 * high and not ok(limit):
        limit *= 2
    return _sizing(model, inputs, high, limit, seen.get(high))


def by_utilization(
    arrival_rate_per_s: float, service_rate_per_s: float, target_utilization: float
) -> Sizing:
    """⌈λ / (ρ·μ)⌉: the classic rule (`capacity.sizing: utilization`), kept to compare."""
    replicas = capacity.replicas_for_rate(
        arrival_rate_per_s, service_rate_per_s, target_utilization
    )
    served_per_s = max(1, replicas) * service_rate_per_s
    utilization = arrival_rate_per_s / served_per_s if served_per_s > 0 else math.inf
    return Sizing(max(0, replicas), "utilization", math.nan, None, utilization)


def _sizing(
    model: ReplicaView,
    inputs: SizingInputs,
    replicas: int,
    probe: int,
    known: tuple[float, float | None, float, bool] | None = None,
) -> Sizing:
    tail, rho, utilization, _ = known or predicted_tail(model, inputs, replicas)
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
    no_burst = replace(inputs, peak_to_mean=0.0, clumps=(), rate_mix=())
    tail, rho, utilization, fits = predicted_tail(model, no_burst, below)
    if fits and tail <= inputs.tail_share:
        return "burst"
    if rho is not None and rho >= utilization:
        return "prefill"
    return "slots"


def _slot_time_at_load_s(model: ReplicaView, arrival_rate_per_s: float, replicas: int) -> float:
    """How long a request holds a slot with the decode batch that this load gives each
    replica (Little's law, b = λ·T(b)/R, solved exactly), not a full one."""
    if model.prefill_s is None:
        return model.slot_time_s
    return model.slot_time_at_batch_s(_batch_at_load(model, arrival_rate_per_s / replicas))


def _batch_at_load(model: ReplicaView, per_replica_per_s: float) -> float:
    """The decode batch b solving b = λ_r·T(b) with T(b) = prefill + output·(a + s·(b − 1)):
    exactly, as tpot is linear in b (a full batch where the load asks for more than the
    slots)."""
    output = model.output_tokens_mean
    below = 1.0 - per_replica_per_s * output * model.tpot_slope_s
    if below <= 0:
        return float(model.slots)
    solved = per_replica_per_s * (
        (model.prefill_s or 0.0) + output * (model.tpot_batch1_s - model.tpot_slope_s)
    )
    return min(float(model.slots), max(1.0, solved / below))


def slot_time_under_load_s(
    model: ReplicaView, arrival_rate_per_s: float, replicas: float
) -> float | None:
    """What the model predicts a request holds a slot for at this load: its prefill wait
    (the M/G/1 queue behind the least-loaded router), prefill and decode at the batch this
    load gives. None without token timing (nothing to predict from) or at an overload
    (no steady state to predict)."""
    count = round(replicas)
    queue = _prefill_queue(model, arrival_rate_per_s, count, 1.0) if count >= 1 else None
    if queue is None or queue[0] >= 1.0:
        return None
    _, mg1_wait_s, occupied = queue
    batch = _batch_at_load(model, arrival_rate_per_s / count)
    return model.slot_time_at_batch_s(batch) + occupied * mg1_wait_s


def _prefill_queue(
    model: ReplicaView, arrival_rate_per_s: float, replicas: int, factor: float
) -> tuple[float, float, float] | None:
    """(ρ, M/G/1 mean wait, share of arrivals that meet a busy prefill engine) per replica
    at λ/R; None without token timing. Past ρ = 1 the wait is infinite."""
    prefill_s = model.prefill_s
    if prefill_s is None or prefill_s <= 0 or model.prefill_tokens_per_s is None:
        return None
    per_replica = arrival_rate_per_s / replicas
    rho = per_replica * prefill_s / factor
    if rho >= 1.0:
        return rho, math.inf, 1.0
    if rho <= 0:
        return rho, 0.0, 0.0
    second_s2 = model.prompt_tokens_sq_mean / (model.prefill_tokens_per_s * factor) ** 2
    mg1_wait_s = per_replica * second_s2 / (2.0 * (1.0 - rho))
    # The least-loaded router sends a request to an empty replica while there is one; it
    # meets a busy prefill engine only when every replica holds a request.
    occupied = _poisson_at_least(
        arrival_rate_per_s
        * (_slot_time_at_load_s(model, arrival_rate_per_s, replicas) + mg1_wait_s)
        / factor,
        replicas,
    )
    return rho, mg1_wait_s, occupied


@lru_cache(maxsize=1024)
def _poisson_at_least(mean: float, count: int) -> float:
    """P(N ≥ count) for N ~ Poisson(mean): the requests in the system (M/G/∞) when the
    slots are far from full, which is when an empty replica can exist at all."""
    if count <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    spread = 10.0 * math.sqrt(mean) + 10.0
    if count > mean + spread:
        return 0.0  # beyond 10 standard deviations (and 10 counts): below 1e-12
    if count < mean - spread:
        return 1.0
    log_mean = math.log(mean)
    logs = [k * log_mean - mean - math.lgamma(k + 1) for k in range(count)]
    top = max(logs)
    below = math.exp(top) * sum(math.exp(x - top) for x in logs)
    return min(1.0, max(0.0, 1.0 - below))


def _halfin_whitt(beta: float) -> float:
    """Probability of waiting with β = (N − a)/√a spare servers (Halfin & Whitt, 1981)."""
    if beta <= 0:
        return 1.0
    if beta > 8.0:
        return 0.0
    return 1.0 / (1.0 + beta * _NORMAL.cdf(beta) / _NORMAL.pdf(beta))
