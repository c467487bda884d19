"""Stage 5: the SLO guard, on the part of latency that replicas can fix.

A request's TTFT is its wait (router queue + engine queue) plus its own prefill. More
replicas shorten the wait, never the prefill: a 60,000-token prompt that takes 4 s to
prefill misses a 1 s TTFT SLO on an idle cluster. So the guard counts as bad only the
misses replicas could have avoided: the waits in the queue-wait histogram (vLLM's queue
time; Serve's router fulfilment time as a floor) over their budget; where only TTFT is
known, TTFT minus the request's own prefill (`controllable_misses`). Never raw TTFT.
Where the queue-wait histogram and the prompt mix are both known, each wait is held
against its own request's budget, TTFT less its prefill (`late_waits`): the quantity the
sizing predicts. Where only TTFT is known, TTFT misses
less the prompts too long for the SLO; read from two histograms, a long-prompt mix near
the limit makes that count misses the interpolation inside a prompt bucket puts there,
which is why the waits come first.

Those counts make an error budget: with attainment target A, a share ε = 1 − A of the
requests that can meet the SLO may be bad (the hopeless prompts are in neither count).
Burn rate = bad share / ε over two windows (exponentially weighted,
`burn_fast_window_s` and `burn_slow_window_s`, 5 min and 1 h by default, as SRE practice
pages on). While the fast window burns above 1, no scale-down.

The same counts calibrate the replica model. Each tick the sizing's queueing formulas
predict the share of requests that should be over the budget at the replicas actually
running; observed bad / predicted bad is the model's calibration, over each window, and
the one used is what both agree on (the nearer 1 when both lean the same way, else 1: as
a page waits for both burn windows, the headroom moves on a persistent error of the
model, not on one clump's misses, which leave the fast window within minutes; but a
relaxation the slow window's evidence carries gives way to the fast window's reading
only as the fast window's evidence grows, in full once it has tested the model, so a
fast window that has seen and predicted few misses leaves it standing, `_relaxed`)
(only over ticks where the model predicts less than `_SATURATED` of requests late: in an
overload, both sides are near 1 and say nothing about the tail at a working count; the
caller leaves out ticks where the measured bursts do not fit the running count too, by
passing no prediction: those misses are the clumps', which the sizing's burst term sizes)
(with a few pseudo-events on each side, so that it starts at 1 and moves only on
evidence). The sizing then aims at ε / calibration: a model that predicts 4 % where 0.5 %
is seen (heavy-tailed prompts behind a least-loaded router) is trusted for the shape of
the tail in R but not for its level, and a model that misses bursts it cannot see gets
the headroom the observations ask for. The calibration is bounded to [1/16, 16]; at a
bound the model and reality disagree by more than the model can be trusted for, and the
decision says so (`model_mismatch`) and does not scale down on the model's word.
Pure: `update(state, histogram, ...) -> (state, verdict)`.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autoscalerd.decide import prompt_budgets
from autoscalerd.decide.forgetting import Sums

if TYPE_CHECKING:
    from autoscalerd.model import Histogram

CALIBRATION_MIN = 1.0 / 16.0
CALIBRATION_MAX = 16.0
# Pseudo-events on both sides of the calibration: it moves once a few bad requests were
# predicted or seen, not on the first one.
_PSEUDO_BAD = 3.0
# Standard deviations of the misses seen added to them in the calibration: the sizing aims
# at what the evidence allows at one sigma, not at its point estimate, so a model right on
# average does not land half its hours over the budget.
_SIGMAS_SEEN = 1.0
# Requests a window must hold before its burn rate counts: below, one bad request in a
# quiet hour would read as a fire.
_MIN_REQUESTS = 20.0
# A predicted share over the budget above this is an overload: not evidence for the tail.
_SATURATED = 0.5
# Budgets each piece of a prompt bucket (prompt_budgets.PIECES to a bucket) has its mean
# share of late waits taken over (midpoint rule).
_BUDGET_POINTS = 3


@dataclass(frozen=True, slots=True)
class GuardState:
    # (requests, bad requests), forgotten over each window.
    fast: Sums = field(default_factory=lambda: Sums((0.0, 0.0)))
    slow: Sums = field(default_factory=lambda: Sums((0.0, 0.0)))
    # (bad requests seen, bad requests the model predicted at the replicas running), over
    # the slow window, on the ticks the model's prediction was a tail, not an overload.
    calibrating: Sums = field(default_factory=lambda: Sums((0.0, 0.0)))
    # The same over the fast window: a calibration both windows agree on is the one used.
    calibrating_fast: Sums = field(default_factory=lambda: Sums((0.0, 0.0)))
    # The sum of each tick's bad count squared, over each window: how clumped the misses
    # are (Kish's effective sample size, (Σ bad)² / Σ bad²).
    clumped: Sums = field(default_factory=lambda: Sums((0.0,)))
    clumped_fast: Sums = field(default_factory=lambda: Sums((0.0,)))
    # (time, replicas running) of the ticks over the fast window whose misses burnt the
    # budget (a bad share above ε): the counts shown to be too few.
    burnt: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    burn_fast: float | None
    burn_slow: float | None
    calibration: float  # observed bad / predicted bad; the sizing aims at ε / this
    mismatch: bool  # the calibration is at a bound
    blocks_scale_down: bool
    # The most replicas running on a tick whose misses burnt the budget, over the fast
    # window (None: none known): a scale-down the burn blocks may still go to one more.
    burnt_replicas: float | None = None


def wait_budget_s(
    queue_wait_s: float | None, ttft_s: float | None, prefill_mean_s: float | None
) -> float | None:
    """The wait a request may spend queued: the configured one, else TTFT less prefill."""
    if queue_wait_s is not None:
        return queue_wait_s
    if ttft_s is None:
        return None
    return max(ttft_s - (prefill_mean_s or 0.0), 0.5 * ttft_s)


def controllable_misses(
    ttfts: Histogram | None,
    prompts: Histogram | None,
    ttft_s: float | None,
    prefill_tokens_per_s: float | None,
) -> tuple[float, float] | None:
    """(attainable requests, misses replicas could have avoided) this tick: the prompts
    whose prefill alone takes longer than the SLO are neither misses nor in the count,
    as no number of replicas can make them meet it. None without the inputs."""
    if ttfts is None or prompts is None or ttft_s is None or not prefill_tokens_per_s:
        return None
    if not (ttfts.sane and prompts.sane) or ttfts.total <= 0:
        return None
    missed = ttfts.count_above(ttft_s)
    hopeless = prompts.count_above(ttft_s * prefill_tokens_per_s)
    attainable = max(0.0, ttfts.total - hopeless)
    return attainable, min(attainable, max(0.0, missed - hopeless))


def late_waits(
    waits: Histogram | None,
    prompt_mix: tuple[tuple[float, float, float], ...],
    ttft_s: float | None,
    prefill_tokens_per_s: float | None,
) -> tuple[float, float] | None:
    """(attainable requests, requests whose wait made them miss the TTFT SLO) this tick,
    from the queue-wait histogram and the prompt mix (lower, upper tokens, share): a
    request of prefill s misses when its wait exceeds ttft − s.

    The two are not joint, so a request's wait is taken as independent of its own prompt
    (a FIFO queue's is). The mix is the replica model's, pooled over minutes, not this
    tick's prompt histogram: both histograms are filled when a request's prefill ends, so
    a long prompt lands a prefill after the congestion it waited in, among the tick's
    other requests, and a tick's join pairs long waits with short prompts. On a
    long-prompt conversation trace the tick's join counted three quarters of the misses
    the clients saw; the pooled mix counts them (README, "The guard's miss count").
    Each bucket's budgets are averaged over the bucket: the same quantity the sizing
    predicts. Prompts whose prefill alone exceeds the SLO are in neither count. None
    without the inputs."""
    if waits is None or not prompt_mix or ttft_s is None or not prefill_tokens_per_s:
        return None
    if not waits.sane or waits.total <= 0:
        return None
    attainable = late = 0.0
    count_above = _count_above(waits)
    for part, low_s, high_s in prompt_budgets.attainable_budgets(
        prompt_mix, ttft_s, prefill_tokens_per_s
    ):
        attainable += part
        # The mean share of waits over budgets from low_s to high_s (midpoint rule).
        shares = [
            count_above(low_s + (high_s - low_s) * (k + 0.5) / _BUDGET_POINTS)
            for k in range(_BUDGET_POINTS)
        ]
        late += part * sum(shares) / _BUDGET_POINTS
    return attainable * waits.total, min(attainable * waits.total, late)


def _count_above(waits: Histogram) -> Callable[[float], float]:
    """`waits.count_above`, read many times over (the guard reads a hundred budgets a
    tick): where the bounds ascend, the bucket that holds the limit is found by bisection
    and the buckets below it are skipped; the sum is the histogram's own, term by term."""
    bounds = waits.bounds_s
    if any(upper <= lower for lower, upper in itertools.pairwise(bounds)) or (
        bounds and bounds[0] <= 0.0
    ):
        return waits.count_above
    counts = waits.counts

    def count_above(limit_s: float) -> float:
        index = bisect.bisect_right(bounds, limit_s) if limit_s > 0.0 else 0
        lower_s = bounds[index - 1] if index > 0 else 0.0
        above = 0.0
        if lower_s >= limit_s:
            above += counts[index]
        elif index >= len(bounds):
            above += counts[index] * 1.0  # the +Inf bucket
        else:
            upper_s = bounds[index]
            above += counts[index] * ((upper_s - limit_s) / (upper_s - lower_s))
        for count in counts[index + 1 :]:
            above += count
        return above

    return count_above


def waits_over_budget(
    waits: Histogram | None, budget_s: float | None
) -> tuple[float, float] | None:
    """(requests, waits over the budget) this tick, from the queue-wait histogram."""
    if waits is None or budget_s is None or not waits.sane or waits.total <= 0:
        return None
    return waits.total, waits.count_above(budget_s)


def at_least(
    counts: tuple[float, float] | None, other: tuple[float, float] | None
) -> tuple[float, float] | None:
    """Two counts of the same requests' misses by different evidence: the larger of each."""
    if counts is None or other is None:
        return counts if other is None else other
    return max(counts[0], other[0]), max(counts[1], other[1])


def update(
    state: GuardState,
    counts: tuple[float, float] | None,
    predicted_share: float | None,
    share: float,
    fast_window_s: float,
    slow_window_s: float,
    now_s: float,
    running_replicas: float | None = None,
) -> tuple[GuardState, GuardVerdict]:
    """Fold in this tick's (requests, bad requests) and the model's predicted bad share;
    `running_replicas`, the count that served them (None: unknown)."""
    fast, slow = state.fast, state.slow
    calibrating, calibrating_fast = state.calibrating, state.calibrating_fast
    clumped, clumped_fast = state.clumped, state.clumped_fast
    burnt = tuple(entry for entry in state.burnt if now_s - entry[0] <= fast_window_s)
    if counts is not None:
        total, bad = counts
        if running_replicas is not None and total > 0 and bad / total > share:
            burnt = (*burnt, (now_s, running_replicas))
        fast = fast.add(now_s, fast_window_s, total, bad)
        slow = slow.add(now_s, slow_window_s, total, bad)
        if predicted_share is not None and predicted_share < _SATURATED:
            predicted = total * predicted_share
            calibrating = calibrating.add(now_s, slow_window_s, bad, predicted)
            calibrating_fast = calibrating_fast.add(now_s, fast_window_s, bad, predicted)
            clumped = clumped.add(now_s, slow_window_s, bad * bad)
            clumped_fast = clumped_fast.add(now_s, fast_window_s, bad * bad)
    slow_now = slow.decayed(now_s, slow_window_s)
    # A window with no request counted for its whole length burns nothing now (as a
    # sliding window's 0/0): the forgotten sums keep their ratio when nothing comes, and
    # would hold a scale-down for several windows after the traffic stopped.
    burn_fast = (
        _burn(fast.decayed(now_s, fast_window_s), share)
        if _recent(fast, now_s, fast_window_s)
        else None
    )
    burn_slow = _burn(slow_now, share) if _recent(slow, now_s, slow_window_s) else None
    slow_window = calibrating.decayed(now_s, slow_window_s)
    slow_squares = clumped.decayed(now_s, slow_window_s)
    slow_ratio = _ratio(slow_window, slow_squares)
    fast_window = calibrating_fast.decayed(now_s, fast_window_s)
    fast_squares = clumped_fast.decayed(now_s, fast_window_s)
    fast_ratio = _ratio(fast_window, fast_squares)
    if slow_ratio < 1.0 and _tested(slow_window, slow_squares):
        # A relaxation the slow window's evidence carries: the fast window has its say
        # as its evidence grows (`_relaxed`).
        raw = _relaxed(slow_ratio, fast_ratio, _say(fast_window, fast_squares))
    else:
        raw = _agreed(slow_ratio, fast_ratio)
    calibration = min(CALIBRATION_MAX, max(CALIBRATION_MIN, raw))
    verdict = GuardVerdict(
        burn_fast=burn_fast,
        burn_slow=burn_slow,
        calibration=calibration,
        mismatch=raw <= CALIBRATION_MIN or raw >= CALIBRATION_MAX,
        blocks_scale_down=burn_fast is not None and burn_fast > 1.0,
        burnt_replicas=max((running for _, running in burnt), default=None),
    )
    return (
        GuardState(
            fast=fast,
            slow=slow,
            calibrating=calibrating,
            calibrating_fast=calibrating_fast,
            clumped=clumped,
            clumped_fast=clumped_fast,
            burnt=burnt,
        ),
        verdict,
    )


def _ratio(window: tuple[float, ...], squares: tuple[float, ...]) -> float:
    """Bad requests seen over bad requests predicted, with pseudo-events on both sides.

    Misses come in clumps (a burst makes a dozen late in a second), and a clump is one
    piece of evidence, not a dozen: the pseudo-events are counted in the misses' mean
    clump size, Σ bad² / Σ bad per tick (so the seen side weighs as its effective
    sample size, (Σ bad)² / Σ bad², against them). Misses one at a time weigh as before.
    The misses seen count at one standard deviation over their number (√(clump · seen),
    their clumps Poisson): an upper bound of what the evidence says, so a calibration of a
    few dozen misses leans to more replicas by what it does not know.
    """
    seen, predicted = window
    clump = _clump(window, squares)
    pseudo = _PSEUDO_BAD * clump
    return (seen + _SIGMAS_SEEN * math.sqrt(clump * seen) + pseudo) / (predicted + pseudo)


def _clump(window: tuple[float, ...], squares: tuple[float, ...]) -> float:
    """The misses' mean clump size per tick, Σ bad² / Σ bad (1 without misses)."""
    seen = window[0]
    return max(1.0, squares[0] / seen) if seen > 0 else 1.0


def _tested(window: tuple[float, ...], squares: tuple[float, ...]) -> bool:
    """Whether a window has put the model to the test: its misses seen and predicted
    outweigh the pseudo-events its ratio is drawn to 1 with. At a count so ample that the
    model predicts no miss and none comes, a window tests nothing, and its ratio near 1
    is the pseudo-events', not evidence that the model is right."""
    return _weight(window, squares) >= 0.5


def _weight(window: tuple[float, ...], squares: tuple[float, ...]) -> float:
    """The share of a window's ratio that is evidence rather than pseudo-events: misses
    seen and predicted over those plus the pseudo-events (½ where the two weigh alike)."""
    seen, predicted = window
    evidence = seen + predicted
    pseudo = _PSEUDO_BAD * _clump(window, squares)
    return evidence / (evidence + pseudo)


def _say(window: tuple[float, ...], squares: tuple[float, ...]) -> float:
    """How much say the fast window has over a relaxation: in proportion to its share of
    evidence w (`_weight`), all of it from w = ½, where it counts as having tested the
    model (`_tested`): min(1, 2w)."""
    return min(1.0, 2.0 * _weight(window, squares))


def _relaxed(slow: float, fast: float, say: float) -> float:
    """A relaxation (`slow` < 1, on evidence that tested the model) as the fast window
    allows: slow^(1 − s) · fast^s, the fast window's reading held within [slow, 1] and
    `say` its say (`_say`). A fast window more relaxed than the slow one adds nothing (the
    nearer 1 of two leaning the same way, as `_agreed`); one that reads a tightening pulls
    toward 1, never past it (a tightening needs both windows); one that has seen little
    says little, and one that has tested the model has its full say.

    Where the fast window went from no say (fewer misses seen and predicted than its
    pseudo-events) to its full say at once, the count was a limit cycle, because what the
    fast window has seen depends on the count: at a count ample enough that it predicts
    no miss, the relaxation stood and scaled down; at the lower count the fast window was
    tested at once, its reading still mostly its pseudo-events (halfway to 1), and scaled
    back up. On the 2024 week with a replica that takes 10 minutes to start, that was
    9 to 16 replicas and back every 12 minutes, at 1.9x static peak's cost; with the say
    growing as the evidence does, the count settles (benchmarks/backtest_matrix.py,
    HISTORY.md)."""
    held = min(1.0, max(slow, fast))
    return float(slow ** (1.0 - say) * held**say)


def _agreed(slow: float, fast: float) -> float:
    """The calibration both windows agree on: the one nearer 1 when both lean the same
    way, 1 when they disagree. As a page waits for both burn windows, the headroom moves
    on a persistent error of the model, not on one clump's misses (which leave the fast
    window within minutes) nor on an hour-old one the fast window no longer sees.

    A relaxation (the slow window under 1, on evidence that tested the model) is not
    decided here but by `_relaxed`, which lets the fast window move it only as its own
    evidence grows: it was built from misses the model predicted and
    that did not come, which only a count tight enough for the model to predict misses
    can test. Were the fast window's ratio taken whatever it holds, it would undo itself:
    once the traffic falls, the count kept is ample, predicts no miss, and the fast
    window's pseudo-events pull the calibration back to 1, which
    sizes for the full tail again and keeps the count ample (the held-out Azure 2024
    window at 138 h, 8B: 5-6 replicas at 80 requests/s, then 7-8 at 30/s). A tightening
    was built from misses that came; a fast window without them ends it, tested or not,
    as before (held for the slow window's hour instead, Azure 2023 at 405B cost 7 % more
    for no more requests within the SLO)."""
    if slow > 1.0 and fast > 1.0:
        return min(slow, fast)
    if slow < 1.0 and fast < 1.0:
        return max(slow, fast)
    return 1.0


def _recent(sums: Sums, now_s: float, window_s: float) -> bool:
    return sums.updated_at_s is not None and now_s - sums.updated_at_s <= window_s


def _burn(window: tuple[float, ...], share: float) -> float | None:
    requests, bad = window
    if requests < _MIN_REQUESTS or share <= 0:
        return None
    return (bad / requests) / share
