"""The simulated cluster: continuous-batching LLM replicas behind a FIFO router.

Request-level and discrete-event, in virtual time (ARCHITECTURE.md §Simulator):

- A replica holds up to `max_ongoing_requests` requests. Prefill is compute-bound, so a
  replica runs one at a time, first come first served: a request's prefill starts when it
  is admitted or when the previous prefill ends, whichever is later, and takes
  `prompt_tokens / prefill_tokens_per_s`. The first token is out when prefill ends:
  TTFT = queue wait + prefill, where the wait covers the router queue and the replica's
  own prefill queue.
- Then the request joins the decode batch and produces `output_tokens` tokens. With b
  requests decoding, every one of them gets a token each `tpot(b) = tpot_base·(1 +
  slope·(b−1))` seconds. e2e = TTFT + decode time.
- Requests wait FIFO at the router while every ready replica is full; the router sends
  each request to the ready replica with the fewest ongoing requests (the lowest index
  on a tie).
- A new replica costs from the moment it is requested and serves after `cold_start_s`.
  A removed replica stops taking requests, finishes the ones it has, then stops costing.
  Removal takes replicas still starting first (newest first), then the least loaded.

Decode uses virtual time, as in processor sharing: all requests in a batch advance at the
same rate, so a replica keeps one counter V of tokens produced per request and a heap of
the V at which each request finishes. A change of batch size changes only the rate, so
each request costs O(log batch) however many tokens it produces. Replicas' next events
sit in one heap, so an event costs O(log replicas). The simulator runs at 150,000-200,000
requests per second (benchmarks/backtest_speed.py).

Hot loops keep state in local variables and plain lists on purpose (profiled: attribute
lookups and calls were most of the cost): this file is the inner loop of every backtest.
`tests/test_cluster_sim.py` checks it against hand-worked cases.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from heapq import heappop, heappush

import numpy as np

from autoscalerd.sim.traces import RequestBatch

# Histogram bucket upper bounds (seconds) of vLLM's time_to_first_token_seconds and
# e2e_request_latency_seconds: the simulated sensor sees latency only as a real one would,
# through bucket counts.
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# Bucket bounds of vLLM's request_prompt_tokens histogram (1-2-5 steps): the simulated
# sensor learns the prompt mix's second moment from these counts, as a real one must.
PROMPT_TOKEN_BUCKETS: tuple[float, ...] = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000,
    100_000, 200_000, 500_000, 1_000_000,
)  # fmt: skip

_INF = math.inf
# `loads` entry of a slot the router must not pick (starting, draining or empty).
_NOT_ROUTABLE = 1 << 30


@dataclass(frozen=True, slots=True)
class ReplicaModel:
    """One replica of a 70B-class model on 4 GPUs, by default (issue 3's reference)."""

    max_ongoing_requests: int = 32
    prefill_tokens_per_s: float = 16_000.0
    tpot_batch1_s: float = 0.030  # time per output token with one request decoding
    tpot_full_batch_s: float = 0.060  # ... with max_ongoing_requests decoding
    cold_start_s: float = 90.0
    gpus_per_replica: int = 4

    def __post_init__(self) -> None:
        if self.max_ongoing_requests < 1:
            raise ValueError("max_ongoing_requests must be >= 1")
        if self.prefill_tokens_per_s <= 0 or self.tpot_batch1_s <= 0:
            raise ValueError("prefill_tokens_per_s and tpot_batch1_s must be > 0")
        if self.tpot_full_batch_s < self.tpot_batch1_s:
            raise ValueError("tpot_full_batch_s must be >= tpot_batch1_s")
        if self.cold_start_s < 0 or self.gpus_per_replica < 1:
            raise ValueError("cold_start_s must be >= 0 and gpus_per_replica >= 1")

    @property
    def tpot_slope(self) -> float:
        """The linear rise of tpot per extra request in the batch, relative to tpot_base."""
        if self.max_ongoing_requests == 1:
            return 0.0
        return (self.tpot_full_batch_s / self.tpot_batch1_s - 1.0) / (self.max_ongoing_requests - 1)

    def tpot_s(self, batch: int) -> float:
        return self.tpot_batch1_s * (1.0 + self.tpot_slope * (max(1, batch) - 1))

    @property
    def decode_tokens_per_s(self) -> float:
        """Output tokens per second with a full batch: the most decode can give."""
        return self.max_ongoing_requests / self.tpot_s(self.max_ongoing_requests)

    def service_rate_per_s(self, mean_prompt_tokens: float, mean_output_tokens: float) -> float:
        """μ: requests per second one replica sustains at full load, for a token mix.

        Two limits, and the tighter one holds: the prefill engine (one prefill at a time)
        serves prefill_tokens_per_s / prompt tokens; the batch serves max_ongoing_requests
        requests, each holding its slot for its prefill plus its decode at full batch.
        For the Azure code traces (2,048 prompt, 28 output tokens) that is
        min(16,000 / 2,048, 32 / (0.128 + 28 · 0.060)) = min(7.8, 17.7) = 7.8 requests/s:
        prefill-bound.
        """
        prefill_s = mean_prompt_tokens / self.prefill_tokens_per_s
        by_prefill = _INF if prefill_s <= 0 else 1.0 / prefill_s
        slot_s = prefill_s + mean_output_tokens * self.tpot_s(self.max_ongoing_requests)
        by_batch = _INF if slot_s <= 0 else self.max_ongoing_requests / slot_s
        return min(by_prefill, by_batch)

    def work_s(self, prompt_tokens: float, output_tokens: float) -> float:
        """Replica-seconds no schedule can go below for this much work.

        A replica-second gives at most prefill_tokens_per_s prefill and, alongside it, at
        most decode_tokens_per_s output tokens; the scarcer resource sets the bound.
        """
        return max(
            prompt_tokens / self.prefill_tokens_per_s, output_tokens / self.decode_tokens_per_s
        )


# Named replica models for `autoscalerd backtest --replica-model`; every parameter can
# still be overridden one by one.
REPLICA_PRESETS: dict[str, ReplicaModel] = {
    # A 70B-class model on 4 GPUs (the default).
    "70b-4gpu": ReplicaModel(),
    # An 8B-class model on one GPU: more slots, faster prefill and decode, short start.
    "8b-1gpu": ReplicaModel(
        max_ongoing_requests=64,
        prefill_tokens_per_s=40_000.0,
        tpot_batch1_s=0.010,
        tpot_full_batch_s=0.025,
        cold_start_s=30.0,
        gpus_per_replica=1,
    ),
    # A 32B-class model on 2 GPUs with a slow start (weights pulled and loaded, graphs
    # captured): held out of development, to check the decisions on a replica model
    # they were not developed on.
    "32b-2gpu": ReplicaModel(
        max_ongoing_requests=48,
        prefill_tokens_per_s=28_000.0,
        tpot_batch1_s=0.018,
        tpot_full_batch_s=0.040,
        cold_start_s=180.0,
        gpus_per_replica=2,
    ),
    # A 405B-class model on 8 GPUs: prefill slow against a 1 s SLO (a 6,000-token prompt
    # takes all of it), few slots, a 4-minute start. Held out too: it puts the sizing
    # where a prompt's own prefill leaves most of the budget spent.
    "405b-8gpu": ReplicaModel(
        max_ongoing_requests=16,
        prefill_tokens_per_s=6_000.0,
        tpot_batch1_s=0.040,
        tpot_full_batch_s=0.100,
        cold_start_s=240.0,
        gpus_per_replica=8,
    ),
}

_EMPTY, _STARTING, _READY, _DRAINING = -1, 0, 1, 2


@dataclass(frozen=True, slots=True)
class Gauges:
    """What the platform would report right now."""

    running_replicas: int  # ready and taking requests
    starting_replicas: int
    draining_replicas: int
    target_replicas: int
    ongoing_requests: int  # at replicas, draining ones included
    queued_requests: int  # at the router
    decoding_requests: int = 0  # past their first token, at replicas


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative counters since the start, as a Prometheus scrape would return them.

    Output tokens are counted when their request completes (a real server counts each
    token as it is produced: the difference is one request's decode time).
    """

    arrivals: int
    completions: int
    prompt_tokens: int  # prefilled
    output_tokens: int
    prefilled: int  # requests whose prefill ended
    prefill_s: float  # time spent in prefill, summed over requests
    decode_s: float  # time from first token to last, summed over completed requests
    # Requests per PROMPT_TOKEN_BUCKETS bucket (+Inf last).
    prompt_token_buckets: tuple[int, ...]
    # Requests per bucket (+Inf last); each count only grows, like a Prometheus histogram.
    ttft_buckets: tuple[int, ...]  # per TTFT_BUCKETS_S bucket
    e2e_buckets: tuple[int, ...]  # per E2E_BUCKETS_S bucket, +Inf last
    queue_wait_buckets: tuple[int, ...]  # per TTFT_BUCKETS_S bucket, +Inf last


@dataclass(frozen=True, slots=True)
class RequestRecords:
    """Per-request results, in completion order (float32: a week of requests fits)."""

    arrival_s: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    tpot_s: np.ndarray  # NaN for requests with no output token after the first

    def __len__(self) -> int:
        return int(self.arrival_s.size)


class Cluster:
    """One deployment's replicas and router, advanced by arrivals and by the clock.

    Replica state is kept column-wise, one list per field indexed by slot, so the event
    loop in `_feed` reads it without attribute lookups. A slot is reused after its
    replica stops.
    """

    def __init__(
        self,
        model: ReplicaModel,
        initial_replicas: int = 0,
        now_s: float = 0.0,
        record_dtype: type[np.floating] = np.float32,
    ) -> None:
        self.model = model
        # float32 keeps a week of per-request results in memory; tests ask for float64.
        self._record_dtype = record_dtype
        self._tpot_by_batch = [model.tpot_s(b) for b in range(model.max_ongoing_requests + 1)]
        # Per slot.
        self._state: list[int] = []
        self._requested_at_s: list[float] = []
        self._ongoing: list[int] = []
        self._loads: list[int] = []  # ongoing for ready replicas; _NOT_ROUTABLE otherwise
        self._next_s: list[float] = []  # the slot's next event; inf when none
        # (time, slot) of every next event ever set, a heap. An entry is current while
        # next_s[slot] still equals its time; stale ones are skipped when they surface.
        self._events: list[tuple[float, int]] = []
        self._prefill_free_s: list[float] = []
        # (prefill end, arrival, queue wait, prompt tokens, output tokens), FIFO.
        self._joins: list[deque[tuple[float, float, float, int, int]]] = []
        # (V at which it finishes, arrival, ttft, output tokens): a heap per slot.
        self._decoding: list[list[tuple[float, float, float, int]]] = []
        self._v: list[float] = []  # tokens produced per decoding request so far
        self._v_at_s: list[float] = []  # when V was last brought up to date
        self._tpot_s: list[float] = []  # time per output token at the current batch size
        self._free_slots: list[int] = []
        self._live_replicas = 0  # starting or ready: what counts toward the target
        self._queue: deque[tuple[float, int, int]] = deque()
        self.target_replicas = 0
        self.now_s = now_s
        # Totals.
        self.replica_seconds = 0.0
        self.scale_actions = 0
        self.max_queue = 0
        self.arrived = 0
        self.completed = 0
        self._prompt_tokens = 0
        self._output_tokens = 0
        self._prefilled = 0
        self._prefill_s = 0.0
        self._decode_s = 0.0
        self._prompt_buckets = [0] * (len(PROMPT_TOKEN_BUCKETS) + 1)
        self._ttft_buckets = [0] * (len(TTFT_BUCKETS_S) + 1)
        self._e2e_buckets = [0] * (len(E2E_BUCKETS_S) + 1)
        self._wait_buckets = [0] * (len(TTFT_BUCKETS_S) + 1)
        # Per-request records: lists, flushed to float32 arrays in blocks.
        self._rec_arrival: list[float] = []
        self._rec_ttft: list[float] = []
        self._rec_done: list[float] = []
        self._rec_output: list[int] = []
        self._blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        if initial_replicas:
            # Warm: the initial replicas are ready at once.
            self.set_target(initial_replicas, now_s)
            for slot in range(len(self._state)):
                self._next_s[slot] = now_s
                heappush(self._events, (now_s, slot))
            self.advance(now_s)
            self.scale_actions = 0

    # ------------------------------------------------------------ what the sensors read

    def gauges(self) -> Gauges:
        state = self._state
        return Gauges(
            running_replicas=state.count(_READY),
            starting_replicas=state.count(_STARTING),
            draining_replicas=state.count(_DRAINING),
            target_replicas=self.target_replicas,
            ongoing_requests=sum(self._ongoing),
            queued_requests=len(self._queue),
            decoding_requests=sum(len(heap) for heap in self._decoding),
        )

    def ongoing_per_replica(self) -> list[int]:
        """Requests at each replica that exists, by slot."""
        return [n for n, s in zip(self._ongoing, self._state, strict=True) if s != _EMPTY]

    def replicas_costing(self) -> int:
        return len(self._state) - self._state.count(_EMPTY)

    def counters(self) -> Counters:
        return Counters(
            arrivals=self.arrived,
            completions=self.completed,
            prompt_tokens=self._prompt_tokens,
            output_tokens=self._output_tokens,
            prefilled=self._prefilled,
            prefill_s=self._prefill_s,
            decode_s=self._decode_s,
            prompt_token_buckets=tuple(self._prompt_buckets),
            ttft_buckets=tuple(self._ttft_buckets),
            e2e_buckets=tuple(self._e2e_buckets),
            queue_wait_buckets=tuple(self._wait_buckets),
        )

    def records(self) -> RequestRecords:
        self._flush_records()
        if not self._blocks:
            empty = np.empty(0, self._record_dtype)
            return RequestRecords(empty, empty, empty, empty)
        return RequestRecords(*(np.concatenate(parts) for parts in zip(*self._blocks, strict=True)))

    @property
    def in_flight(self) -> int:
        """Requests queued or at a replica."""
        return self.arrived - self.completed

    # ------------------------------------------------------------ driving the simulation

    def run(
        self,
        batches: Iterable[RequestBatch],
        tick_s: float,
        end_s: float,
        on_tick: Callable[[float], None],
        drain_limit_s: float = 6 * 3600.0,
        on_batch: Callable[[int], None] | None = None,
    ) -> float:
        """Feed every request, calling `on_tick(now)` every `tick_s` of virtual time.

        Ticks run through `end_s` and then, while requests remain, up to `drain_limit_s`
        longer. Returns the time the simulation stopped; replica-seconds count up to it.
        An arrival at the instant of a tick comes after the tick.
        """
        tick = 1
        next_tick_s = tick_s
        for batch in batches:
            times = batch.arrival_s.tolist()
            prompts = batch.prompt_tokens.tolist()
            outputs = batch.output_tokens.tolist()
            position = 0
            while position < len(times):
                stop = bisect_left(times, next_tick_s, position)
                if stop == len(times):
                    # The rest of the batch arrives before the tick; the next batch may too.
                    self._feed(times, prompts, outputs, position, stop, times[-1])
                    break
                self._feed(times, prompts, outputs, position, stop, next_tick_s)
                position = stop
                on_tick(next_tick_s)
                tick += 1
                next_tick_s = tick * tick_s
            if on_batch is not None:
                on_batch(len(times))
        stop_s = end_s + drain_limit_s
        while next_tick_s <= end_s or (self.in_flight and next_tick_s <= stop_s):
            self.advance(next_tick_s)
            on_tick(next_tick_s)
            tick += 1
            next_tick_s = tick * tick_s
        last_s = max(end_s, self.now_s)
        for slot, state in enumerate(self._state):
            if state != _EMPTY:
                self._stop(slot, last_s)
        self._flush_records()
        return last_s

    def advance(self, now_s: float) -> None:
        """Process every replica event up to and including `now_s`."""
        self._feed([], [], [], 0, 0, now_s)

    def set_target(self, target: int, now_s: float) -> None:
        """Apply a target replica count: start replicas, or retire some."""
        target = max(0, int(target))
        if target != self.target_replicas:
            self.scale_actions += 1
        self.target_replicas = target
        if target == self._live_replicas:
            return
        state = self._state
        live = [slot for slot, s in enumerate(state) if s in (_STARTING, _READY)]
        if target > len(live):
            for _ in range(target - len(live)):
                self._start_replica(now_s)
            return
        surplus = len(live) - target
        if surplus <= 0:
            return
        # Starting replicas go first (newest first): they serve no one yet. Then the
        # least loaded ready ones, which drain.
        starting = sorted(
            (slot for slot in live if state[slot] == _STARTING),
            key=lambda slot: -self._requested_at_s[slot],
        )
        ready = sorted(
            (slot for slot in live if state[slot] == _READY),
            key=lambda slot: (self._ongoing[slot], -slot),
        )
        for slot in (starting + ready)[:surplus]:
            if state[slot] == _STARTING or self._ongoing[slot] == 0:
                self._stop(slot, now_s)
            else:
                state[slot] = _DRAINING
                self._loads[slot] = _NOT_ROUTABLE
                self._live_replicas -= 1

    # ------------------------------------------------------------ internals

    def _start_replica(self, now_s: float) -> None:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = len(self._state)
            for column in (
                self._state,
                self._requested_at_s,
                self._ongoing,
                self._loads,
                self._next_s,
                self._prefill_free_s,
                self._v,
                self._v_at_s,
                self._tpot_s,
            ):
                column.append(0)
            self._joins.append(deque())
            self._decoding.append([])
        self._state[slot] = _STARTING
        self._live_replicas += 1
        self._requested_at_s[slot] = now_s
        self._ongoing[slot] = 0
        self._loads[slot] = _NOT_ROUTABLE
        self._next_s[slot] = now_s + self.model.cold_start_s
        heappush(self._events, (self._next_s[slot], slot))
        self._prefill_free_s[slot] = 0.0
        self._v[slot] = 0.0
        self._v_at_s[slot] = now_s
        self._tpot_s[slot] = self._tpot_by_batch[0]

    def _stop(self, slot: int, now_s: float) -> None:
        self.replica_seconds += now_s - self._requested_at_s[slot]
        if self._state[slot] != _DRAINING:
            self._live_replicas -= 1
        self._state[slot] = _EMPTY
        self._loads[slot] = _NOT_ROUTABLE
        self._next_s[slot] = _INF
        self._free_slots.append(slot)

    def _feed(
        self,
        times: list[float],
        prompts: list[int],
        outputs: list[int],
        start: int,
        stop: int,
        until_s: float,
    ) -> None:
        """Route arrivals [start, stop) and process replica events before each, then every
        event up to `until_s`. The simulator's inner loop: everything hot is a local."""
        state = self._state
        ongoing = self._ongoing
        loads = self._loads
        next_s = self._next_s
        prefill_free_s = self._prefill_free_s
        joins = self._joins
        decoding = self._decoding
        v = self._v
        v_at_s = self._v_at_s
        tpot_s = self._tpot_s
        tpot_by_batch = self._tpot_by_batch
        queue = self._queue
        max_ongoing = self.model.max_ongoing_requests
        inv_prefill = 1.0 / self.model.prefill_tokens_per_s
        ttft_buckets = self._ttft_buckets
        wait_buckets = self._wait_buckets
        e2e_buckets = self._e2e_buckets
        rec_arrival = self._rec_arrival
        rec_ttft = self._rec_ttft
        rec_done = self._rec_done
        rec_output = self._rec_output
        prompt_tokens = output_tokens = completions = prefilled = 0
        prefill_s = decode_s = 0.0
        prompt_buckets = self._prompt_buckets
        events = self._events

        for position in range(start, stop + 1):
            # Past the last arrival, run the events up to `until_s`.
            at_s = times[position] if position < stop else until_s
            while events and events[0][0] <= at_s:
                now_s, slot = heappop(events)
                if next_s[slot] != now_s:
                    continue  # superseded
                status = state[slot]
                if status == _STARTING:
                    self._ready(slot, now_s)
                    continue
                heap = decoding[slot]
                batch = len(heap)
                vv = v[slot]
                if batch:
                    vv += (now_s - v_at_s[slot]) / tpot_s[slot]
                v_at_s[slot] = now_s
                waiting = joins[slot]
                if waiting and waiting[0][0] <= now_s:
                    # Prefill done: first token out, the request joins the decode batch.
                    _, arrival_s, wait_s, prompt, output = waiting.popleft()
                    ttft_s = now_s - arrival_s
                    prompt_tokens += prompt
                    prefilled += 1
                    prefill_s += prompt * inv_prefill
                    prompt_buckets[bisect_left(PROMPT_TOKEN_BUCKETS, prompt)] += 1
                    ttft_buckets[bisect_left(TTFT_BUCKETS_S, ttft_s)] += 1
                    wait_buckets[bisect_left(TTFT_BUCKETS_S, wait_s)] += 1
                    v[slot] = vv
                    if output > 0:
                        heappush(heap, (vv + output, arrival_s, ttft_s, output))
                        tpot_s[slot] = tpot_by_batch[batch + 1]
                    else:
                        # Nothing to decode: done at the first token.
                        heappush(heap, (vv, arrival_s, ttft_s, 0))
                        tpot_s[slot] = tpot_by_batch[batch + 1]
                else:
                    # A request finishes decoding. Snap V to its finish: the event time
                    # was computed for exactly this V, and rounding must not leave the
                    # next request a hair short of its own.
                    finish_v, arrival_s, ttft_s, output = heappop(heap)
                    v[slot] = finish_v
                    tpot_s[slot] = tpot_by_batch[batch - 1]
                    completions += 1
                    output_tokens += output
                    decode_s += now_s - arrival_s - ttft_s
                    e2e_buckets[bisect_left(E2E_BUCKETS_S, now_s - arrival_s)] += 1
                    rec_arrival.append(arrival_s)
                    rec_ttft.append(ttft_s)
                    rec_done.append(now_s)
                    rec_output.append(output)
                    ongoing[slot] -= 1
                    if status == _READY:
                        if queue:
                            # The freed slot goes to the head of the router queue.
                            arrival_q, prompt_q, output_q = queue.popleft()
                            free_s = prefill_free_s[slot]
                            begin_s = free_s if free_s > now_s else now_s
                            end_s = begin_s + prompt_q * inv_prefill
                            prefill_free_s[slot] = end_s
                            waiting.append(
                                (end_s, arrival_q, begin_s - arrival_q, prompt_q, output_q)
                            )
                            ongoing[slot] += 1
                        else:
                            loads[slot] -= 1
                    elif ongoing[slot] == 0:
                        self._stop(slot, now_s)
                        continue
                following_s = waiting[0][0] if waiting else _INF
                if heap:
                    done_s = now_s + (heap[0][0] - v[slot]) * tpot_s[slot]
                    if done_s < following_s:
                        following_s = done_s
                next_s[slot] = following_s
                if following_s < _INF:
                    heappush(events, (following_s, slot))
            if position == stop:
                break
            # Route the arrival.
            prompt = prompts[position]
            output = outputs[position]
            lightest = min(loads) if loads else _NOT_ROUTABLE
            if lightest >= max_ongoing or queue:
                queue.append((at_s, prompt, output))
                if len(queue) > self.max_queue:
                    self.max_queue = len(queue)
                continue
            slot = loads.index(lightest)
            free_s = prefill_free_s[slot]
            begin_s = free_s if free_s > at_s else at_s
            end_s = begin_s + prompt * inv_prefill
            prefill_free_s[slot] = end_s
            joins[slot].append((end_s, at_s, begin_s - at_s, prompt, output))
            ongoing[slot] += 1
            loads[slot] = lightest + 1
            if end_s < next_s[slot]:
                next_s[slot] = end_s
                heappush(events, (end_s, slot))

        self.now_s = until_s
        self.arrived += stop - start
        self.completed += completions
        self._prompt_tokens += prompt_tokens
        self._output_tokens += output_tokens
        self._prefilled += prefilled
        self._prefill_s += prefill_s
        self._decode_s += decode_s
        if len(rec_arrival) >= 1 << 20:
            self._flush_records()

    def _ready(self, slot: int, now_s: float) -> None:
        """A replica finished its cold start: it takes requests, first from the queue."""
        self._state[slot] = _READY
        self._v_at_s[slot] = now_s
        self._loads[slot] = 0
        self._next_s[slot] = _INF
        queue = self._queue
        inv_prefill = 1.0 / self.model.prefill_tokens_per_s
        max_ongoing = self.model.max_ongoing_requests
        while queue and self._loads[slot] < max_ongoing:
            arrival_s, prompt, output = queue.popleft()
            begin_s = max(self._prefill_free_s[slot], now_s)
            end_s = begin_s + prompt * inv_prefill
            self._prefill_free_s[slot] = end_s
            self._joins[slot].append((end_s, arrival_s, begin_s - arrival_s, prompt, output))
            self._ongoing[slot] += 1
            self._loads[slot] += 1
        if self._joins[slot]:
            self._next_s[slot] = self._joins[slot][0][0]
            heappush(self._events, (self._next_s[slot], slot))

    def _flush_records(self) -> None:
        """Turn the per-request lists into float32 arrays (e2e and tpot in float64 first:
        a week's timestamps need the precision, their differences do not)."""
        if not self._rec_arrival:
            return
        arrival_s = np.asarray(self._rec_arrival, np.float64)
        ttft_s = np.asarray(self._rec_ttft, np.float64)
        e2e_s = np.asarray(self._rec_done, np.float64) - arrival_s
        output = np.asarray(self._rec_output, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot_s = np.where(output > 0, (e2e_s - ttft_s) / output, np.nan)
        dtype = self._record_dtype
        self._blocks.append(
            (
                arrival_s.astype(dtype),
                ttft_s.astype(dtype),
                e2e_s.astype(dtype),
                tpot_s.astype(dtype),
            )
        )
        # Clear in place: `_feed` holds references to these lists.
        self._rec_arrival.clear()
        self._rec_ttft.clear()
        self._rec_done.clear()
        self._rec_output.clear()
