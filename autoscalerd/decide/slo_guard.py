"""Stage 5: the SLO guard, on the part of latency that replicas can fix.

A request's TTFT is its wait (router queue + engine queue) plus its own prefill. More
replicas shorten the wait, never the prefill: a 60,000-token prompt that takes 4 s to
prefill misses a 1 s TTFT SLO on an idle cluster. So the guard counts a request as bad
when its *wait* exceeded the wait budget, read from the queue-wait histogram (vLLM's
queue time, Serve's router fulfilment time), never from raw TTFT.

Those counts make an error budget: with attainment target A, a share ε = 1 − A of
requests may be bad. Burn rate = bad share / ε over two windows (exponentially weighted,
`burn_fast_window_s` and `burn_slow_window_s`, 5 min and 1 h by default, as SRE practice
pages on). The guard turns them into the sizing's headroom, a factor on the tail share
the sizing aims at, bounded to [1/16, 2] and moved at most once per lead time (the time a
change takes to show):

- both windows burning faster than the budget allows (fast > 2, slow > 1): tighten, the
  tail share is halved;
- both well under (fast and slow < 0.5): relax by 25 %, back towards what the model
  alone asks, and beyond it up to 2x where the model is measured conservative.

While the fast window burns above 1 the guard also blocks scale-down.
Pure: `update(state, histogram, ...) -> (state, verdict)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autoscalerd.decide.forgetting import Sums

if TYPE_CHECKING:
    from autoscalerd.model import Histogram

HEADROOM_MIN = 1.0 / 16.0
HEADROOM_MAX = 2.0
_TIGHTEN = 0.5
_RELAX = 1.25
# Requests a window must hold before its burn rate counts: below, one bad request in a
# quiet hour would read as a fire.
_MIN_REQUESTS = 20.0


@dataclass(frozen=True, slots=True)
class GuardState:
    # (requests, bad requests), forgotten over each window.
    fast: Sums = field(default_factory=lambda: Sums((0.0, 0.0)))
    slow: Sums = field(default_factory=lambda: Sums((0.0, 0.0)))
    # Multiplies the tail share the sizing aims at; < 1 is more headroom.
    tail_factor: float = 1.0
    adjusted_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    burn_fast: float | None
    burn_slow: float | None
    tail_factor: float
    adjusted: str | None  # "tighten" / "relax" when the factor moved this tick
    blocks_scale_down: bool


def wait_budget_s(
    queue_wait_s: float | None, ttft_s: float | None, prefill_mean_s: float | None
) -> float | None:
    """The wait a request may spend queued: the configured one, else TTFT less prefill."""
    if queue_wait_s is not None:
        return queue_wait_s
    if ttft_s is None:
        return None
    return max(ttft_s - (prefill_mean_s or 0.0), 0.5 * ttft_s)


def update(
    state: GuardState,
    waits: Histogram | None,
    budget_s: float | None,
    share: float,
    fast_window_s: float,
    slow_window_s: float,
    lead_time_s: float,
    now_s: float,
) -> tuple[GuardState, GuardVerdict]:
    fast, slow = state.fast, state.slow
    if waits is not None and budget_s is not None and waits.total > 0:
        bad = waits.count_above(budget_s)
        fast = fast.add(now_s, fast_window_s, waits.total, bad)
        slow = slow.add(now_s, slow_window_s, waits.total, bad)
    burn_fast = _burn(fast.decayed(now_s, fast_window_s), share)
    burn_slow = _burn(slow.decayed(now_s, slow_window_s), share)
    factor = state.tail_factor
    adjusted: str | None = None
    due = state.adjusted_at_s is None or now_s - state.adjusted_at_s >= max(lead_time_s, 1.0)
    if due and burn_fast is not None and burn_slow is not None:
        if burn_fast > 2.0 and burn_slow > 1.0 and factor > HEADROOM_MIN:
            factor, adjusted = max(HEADROOM_MIN, factor * _TIGHTEN), "tighten"
        elif burn_fast < 0.5 and burn_slow < 0.5 and factor < HEADROOM_MAX:
            factor, adjusted = min(HEADROOM_MAX, factor * _RELAX), "relax"
    next_state = GuardState(
        fast=fast,
        slow=slow,
        tail_factor=factor,
        adjusted_at_s=now_s if adjusted else state.adjusted_at_s,
    )
    verdict = GuardVerdict(
        burn_fast=burn_fast,
        burn_slow=burn_slow,
        tail_factor=factor,
        adjusted=adjusted,
        blocks_scale_down=burn_fast is not None and burn_fast > 1.0,
    )
    return next_state, verdict


def _burn(window: tuple[float, ...], share: float) -> float | None:
    requests, bad = window
    if requests < _MIN_REQUESTS or share <= 0:
        return None
    return (bad / requests) / share
