"""Burstiness of arrivals at the SLO's time scale, measured online.

The forecast gives the level of the arrival rate over minutes; the SLO is lost in the
seconds when requests arrive in clumps. What sizing needs is the peak-to-mean ratio of
arrivals per tick that the attainment target must ride through: the ratio r such that
requests arriving in ticks with count/mean above r are at most a share ε of all
requests. The ratio is a shape, so it carries over to the level the forecast predicts.

Each tick's count is divided by the level around it and added, weighted by its
requests, to a histogram of log-spaced ratio bins whose counts are forgotten
exponentially over `MEMORY_S`. The level is the larger of two: the mean of the 64 ticks
centred on the tick (so the tick is classified half a window late) and the smoothed rate
(an EWMA over `level_memory_s`, the forecast's bucket width: the level the forecast
predicts, which remembers the traffic before a lull). Against the smoothed rate alone,
which lags a change of level, the onset of a flash crowd read as a burst of the new level
over the old (ratios of 20-60 for a minute), and the sizing multiplied that ratio by the
new level; the centred mean reads the step as the step it is. A Poisson stream of 30
requests/s reads about 1.4 at ε = 1 %; the Azure 2023 code trace, with 73 % of its
seconds empty, reads 15-25.
Clumps are measured in absolute terms as well, at several time scales: for windows of
1, 2, 4, ... 64 ticks, the requests that arrived in the window ending at each tick, in a
histogram (log-spaced counts, weighted by the tick's requests, forgotten over
`MEMORY_S`) whose quantile is the clump that all but a share ε of requests arrive in or
below. A ratio over the level carries a clump over to a higher or lower tide, but
on-off traffic (a batch job, a tool firing a few hundred requests after minutes of
quiet) clumps alike whatever the level was before: in a lull the level decays and the
ratio alone would release the replicas the next clump needs. The absolute clumps hold
what the last hour's clumps needed (the cold start is longer than a clump: a replica
started when it arrives is too late for it), with the quantile read from an exponential
tail fitted above the median (an hour holds few clumps; the next may be the largest).
The sizing asks that a clump's prefill fit in its window plus the wait budget (a fluid
bound: the last request of a window waits for the work that arrived in it), so it
catches clumps longer than one tick too.

A surge is held only while it recurs. The histograms weigh what the last hour's requests
met, which is the share of future requests that will meet it only if it happens again: a
one-off crowd (six minutes at up to 12x the level on WorldCup98, 16 % of a six-hour
window's requests) read as a share of the hour held its replicas for four hours after
it, through traffic a tenth of its size. So each window also records, for counts in
groups a factor of two wide, the first and the last sighting of a count at least that
large (one episode as long as each sighting comes within the histograms' memory of the
one before) and the start of its last run (sightings within a lead time of each other).
A run shorter than the lead time is a clump no replica started when it came could have
served: it counts as before, for as long as the histograms remember it, however rarely
it came. A longer run is a surge that the forecast and the backlog follow as it comes;
once it is over, its bins count for twice the episode's span (at most an hour's) after
its last sighting, at least a lead time. What has recurred over a span is expected to
recur for about as long again (the median remaining life of what has lasted a time is
that time); twice covers a next occurrence up to one span plus jitter away. So a one-off
crowd is let go two of its own lengths after it ends, and a daily tide's surges are not
held between them. A state file written before the record existed holds its histograms
as one hour-long episode.

The same per-window histograms, divided by their windows, give the local arrival rate as
each request arrived (`rate_mix`): the distribution the sizing averages its queueing
formulas over. Its window is about the prefill queue's memory at the loads where requests
start to miss, E[S](1 + C²)/(2(1 − ρ)²) for ρ 0.6-0.8: a few seconds for sub-second
prefills (8 s: each second's clump read as a steady rate overstates the waits, a minute
averages the clumps away; benchmarks/rate_mixture.py measures 2, 8 and 32 s).

Pure: `observe(state, ...) -> state`, `peak_to_mean(state, ...) -> float`, and of the
clump histograms as a tick reads them, `read_clumps(state, ...) -> windows`:
`clumps(windows, ...) -> ((window_s, requests), ...)`, `rate_mix(windows, ...) ->
((rate_per_s, share), ...)`, `released(windows, ...) -> bool`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from autoscalerd.decide.forgetting import Sums

# Ratio bins: 1.25^k for k = 0..40 covers 1 to about 7,500; below 1 is one bin.
_BIN_BASE = 1.25
BINS = 41  # ratio bins of the burst weights (the state file checks their count)
# How long the burst shape is remembered.
MEMORY_S = 3600.0
# Requests the histogram must hold before its quantile is used; until then, Poisson.
MIN_REQUESTS = 50.0
# Clump windows, in ticks, and the count bins of each: ≤ 1, then 1.1^k up to about 10^6
# (finer than the ratio's: a busy Poisson window is a few percent wide).
CLUMP_TICKS = (1, 2, 4, 8, 16, 32, 64)
# The ratio's window: the tick classified is in its middle (read half a window late).
RATIO_WINDOW_TICKS = CLUMP_TICKS[-1]
COUNT_BINS = 150
_COUNT_BASE = 1.1
# The window the sizing reads the local arrival rate over (its rate mixture): about the
# memory of a prefill queue at the loads where requests start to miss.
MIXTURE_WINDOW_S = 8.0
# Count bins are merged into groups this factor wide for the mixture (fewer evaluations).
_MIXTURE_GROUP = 1.5
# Episodes are recorded for counts in groups this factor wide: ≤ 1, then 2^k up to 2^20.
_EPISODE_BASE = 2.0
EPISODE_GROUPS = 21
# An episode of one run is held this many times its span after its last sighting.
_HOLD_SPANS = 2.0


# One count group's record, seconds: (first sighting of its episode, last sighting, start
# of its last run, longest gap between two of its runs). The gap is 0 until a second run;
# a record saved before gaps were kept has three items and reads as 0.
Episode = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class BurstState:
    level_per_s: float | None = None
    # Requests per ratio bin, forgotten over MEMORY_S; None until the first request.
    weights: Sums | None = None
    # The last max(CLUMP_TICKS) ticks' arrival counts, oldest first.
    recent: tuple[float, ...] = ()
    # Per clump window (CLUMP_TICKS): requests per count bin of the window they ended,
    # forgotten over MEMORY_S; None until the window has a request.
    clump_weights: tuple[Sums | None, ...] = ()
    # Per clump window: per episode group up to the largest count seen, the Episode of
    # sightings of a count at least the group's lower edge.
    episodes: tuple[tuple[Episode, ...], ...] = ()


def observe(
    state: BurstState,
    arrivals: float,
    tick_s: float,
    now_s: float,
    level_memory_s: float,
    lead_s: float,
) -> BurstState:
    """Fold one tick's arrival count in; the level adapts over `level_memory_s`; clumps
    seen within `lead_s` of each other are one run (`_seen`)."""
    rate_per_s = arrivals / tick_s if tick_s > 0 else 0.0
    level = state.level_per_s
    if level is None:
        level = rate_per_s
    else:
        alpha = 1.0 - math.exp(-tick_s / level_memory_s)
        level = level + alpha * (rate_per_s - level)
    recent = (*state.recent, max(0.0, arrivals))[-CLUMP_TICKS[-1] :]
    weights = state.weights
    # The tick in the middle of the last RATIO_WINDOW_TICKS over the larger of two levels:
    # their mean (a window centred on the tick, so the onset of a higher level reads as
    # the step it is, about 2, not as a burst of the new level over the old) and the
    # smoothed level (which remembers the traffic before a lull).
    if len(recent) >= RATIO_WINDOW_TICKS:
        window = recent[-RATIO_WINDOW_TICKS:]
        middle = window[RATIO_WINDOW_TICKS // 2 - 1]
        mean = max(sum(window) / RATIO_WINDOW_TICKS, level * tick_s)
        if middle > 0 and mean > 0:
            deltas = [0.0] * BINS
            deltas[_bin(middle / mean)] = middle
            weights = (weights or Sums((0.0,) * BINS)).add(now_s, MEMORY_S, *deltas)
    clump_weights = list(state.clump_weights) + [None] * (
        len(CLUMP_TICKS) - len(state.clump_weights)
    )
    episodes = list(state.episodes) + [()] * (len(CLUMP_TICKS) - len(state.episodes))
    if arrivals > 0:
        for index, ticks in enumerate(CLUMP_TICKS):
            if len(recent) < ticks:
                break
            count = sum(recent[-ticks:])
            deltas = [0.0] * COUNT_BINS
            deltas[_count_bin(count)] = arrivals
            sums = clump_weights[index]
            if sums is not None and not episodes[index]:
                # A histogram from before the record: one episode over the last hour.
                hour = (now_s - MEMORY_S, now_s, now_s - MEMORY_S, 0.0)
                episodes[index] = (hour,) * EPISODE_GROUPS
            episodes[index] = _seen(episodes[index], _episode_group(count), now_s, lead_s)
            sums = sums or Sums((0.0,) * COUNT_BINS)
            clump_weights[index] = sums.add(now_s, MEMORY_S, *deltas)
    return BurstState(
        level_per_s=level,
        weights=weights,
        recent=recent,
        clump_weights=tuple(clump_weights),
        episodes=tuple(episodes),
    )


def _seen(
    record: tuple[Episode, ...], group: int, now_s: float, lead_s: float
) -> tuple[Episode, ...]:
    """`record` after a count in episode group `group` at `now_s`: every group up to it
    was seen (a count is at least as large as each smaller group's edge). A group last
    seen longer ago than the histograms remember starts a new episode; one seen within it
    recurs, and its episode spans both sightings. Sightings within `lead_s` of each other
    are one run: a surge that capacity could not have left and come back for. A new run
    within the episode records the gap before it when that is the longest yet."""
    groups = list(record) + [(now_s, now_s, now_s, 0.0)] * (group + 1 - len(record))
    for g in range(group + 1):
        first_s, last_s, run_s = groups[g][:3]
        gap_s = now_s - last_s
        if gap_s > MEMORY_S:
            groups[g] = (now_s, now_s, now_s, 0.0)
        elif gap_s > lead_s:
            groups[g] = (first_s, now_s, now_s, max(_longest_gap_s(groups[g]), gap_s))
        else:
            groups[g] = (first_s, now_s, run_s, _longest_gap_s(groups[g]))
    return tuple(groups)


def _longest_gap_s(episode: Episode) -> float:
    return episode[3] if len(episode) > 3 else 0.0


def _live(episode: Episode, now_s: float, lead_s: float) -> bool:
    """Whether a group's bins count at `now_s`. A last run shorter than `lead_s` is a
    clump no replica started when it came could serve: held while the histograms
    remember it. A longer one, a surge the forecast and the backlog follow as it comes:
    held, after its last sighting, as long as the longest gap between the episode's runs
    (a surge that recurs is expected back within the pauses it has shown; past them, the
    episode has ended for longer than it ever paused), or twice the episode's span (at
    most the histograms' memory) when it has had one run; at least `lead_s`."""
    first_s, last_s, run_s = episode[:3]
    if last_s - run_s < lead_s:
        return True
    gap_s = _longest_gap_s(episode)
    span_s = min(MEMORY_S, last_s - first_s)
    hold_s = min(MEMORY_S, gap_s) if gap_s > 0 else _HOLD_SPANS * span_s
    return now_s - last_s <= max(lead_s, hold_s)


def _live_weights(
    weights: tuple[float, ...],
    record: tuple[Episode, ...] | None,
    now_s: float,
    lead_s: float,
) -> tuple[float, ...]:
    """The histogram's weights with the bins of lapsed episodes at zero; as they are
    without a record (a state from before it). A group counts only while every smaller
    one does: a window of 32 requests is also a window of 16, so a clump seen within a
    surge lapses with the surge, and the live bins never hold large counts without the
    smaller ones that came with them (which would raise the quantile as a surge lapses)."""
    if not record:
        return weights
    kept = [0.0] * len(weights)
    for group, start, stop in _GROUP_BINS:
        if not (group < len(record) and _live(record[group], now_s, lead_s)):
            break
        kept[start:stop] = weights[start:stop]
    return tuple(kept)


def _episode_group(count: float) -> int:
    if count <= 1.0:
        return 0
    return min(EPISODE_GROUPS - 1, 1 + int(math.log(count) / math.log(_EPISODE_BASE)))


def peak_to_mean(
    state: BurstState, share: float, rate_per_s: float, tick_s: float, now_s: float
) -> float:
    """The ratio that all but `share` of requests arrive at or below (≥ 1).

    Until enough requests have been seen, the Poisson value at `rate_per_s`.
    """
    weights = state.weights.decayed(now_s, MEMORY_S) if state.weights is not None else ()
    total = sum(weights)
    if total < MIN_REQUESTS:
        return _poisson_ratio(share, rate_per_s * tick_s)
    above = 0.0
    for index in range(len(weights) - 1, -1, -1):
        above += weights[index]
        if above / total > share:
            return max(1.0, _upper(index))
    return 1.0


@dataclass(frozen=True, slots=True)
class ClumpWindow:
    """One clump window's histogram as a tick reads it (`read_clumps`)."""

    ticks: int  # the window, in ticks
    remembered: float  # the requests its histogram remembers
    weights: tuple[float, ...]  # per count bin, the bins of lapsed episodes at zero
    total: float  # the live weights' sum
    # The exponential tail's fit to the live weights (`_tail_fit`); None below
    # MIN_REQUESTS, where the window is not read.
    fit: tuple[float, float, float, float] | None


def read_clumps(state: BurstState, now_s: float, lead_s: float) -> tuple[ClumpWindow, ...]:
    """The clump histograms at `now_s`, each window's lapsed episodes left out: read once
    a tick for `clumps`, `released` and `rate_mix`, which each ask of every window."""
    found: list[ClumpWindow] = []
    for index, (ticks, sums) in enumerate(zip(CLUMP_TICKS, state.clump_weights, strict=False)):
        if sums is None:
            continue
        remembered = sums.decayed(now_s, MEMORY_S)
        weights = _live_weights(remembered, _record(state, index), now_s, lead_s)
        total = sum(weights)
        fit = _tail_fit(weights, total) if total >= MIN_REQUESTS else None
        found.append(ClumpWindow(ticks, sum(remembered), weights, total, fit))
    return tuple(found)


def clumps(
    windows: tuple[ClumpWindow, ...], share: float, tick_s: float
) -> tuple[tuple[float, float], ...]:
    """(window_s, requests): per clump window that has seen MIN_REQUESTS in live
    episodes, the requests in a window that all but `share` of those requests arrive in
    one at most as large as."""
    return tuple(
        (window.ticks * tick_s, _clump_quantile(window.weights, share, window.total, window.fit))
        for window in windows
        if window.fit is not None
    )


def released(windows: tuple[ClumpWindow, ...], share: float) -> bool:
    """Whether a surge let go (`_live`) holds more than `share` of some clump window's
    remembered requests: the clumps read at that share are smaller than the histograms
    alone would say, because the surge is over (the decision's `surge_released`)."""
    for window in windows:
        total = window.remembered
        if total >= MIN_REQUESTS and total - window.total > share * total:
            return True
    return False


def rate_mix(windows: tuple[ClumpWindow, ...], tick_s: float) -> tuple[tuple[float, float], ...]:
    """((rate per s, share of requests), ...), highest rate first: the arrival rate over
    the clump window nearest MIXTURE_WINDOW_S as each request arrived, over the last hour
    in live episodes; () until that window has seen MIN_REQUESTS in them."""
    if tick_s <= 0:
        return ()
    index = min(
        range(len(CLUMP_TICKS)),
        key=lambda i: abs(math.log(CLUMP_TICKS[i] * tick_s / MIXTURE_WINDOW_S)),
    )
    window = next((w for w in windows if w.ticks == CLUMP_TICKS[index]), None)
    if window is None or window.total < MIN_REQUESTS:
        return ()
    weights, total = window.weights, window.total
    window_s = CLUMP_TICKS[index] * tick_s
    groups: dict[int, list[float]] = {}
    for bin_index, weight in enumerate(weights):
        if weight <= 0:
            continue
        requests = _count_middle(bin_index)
        group = groups.setdefault(int(math.log(requests) / math.log(_MIXTURE_GROUP)), [0.0, 0.0])
        group[0] += weight
        group[1] += weight * requests
    return tuple(
        (requests / weight / window_s, weight / total)
        for weight, requests in (groups[key] for key in sorted(groups, reverse=True))
    )


def _record(state: BurstState, index: int) -> tuple[Episode, ...] | None:
    return state.episodes[index] if index < len(state.episodes) else None


def _count_middle(index: int) -> float:
    """The geometric middle of count bin `index` (bin 0 holds counts up to 1)."""
    if index == 0:
        return 1.0
    return math.sqrt(_count_upper(index - 1) * _count_upper(index))


def _count_quantile(weights: tuple[float, ...], allowed: float) -> float:
    """The count above which `allowed` of the weight lies, log-interpolated in its bin."""
    above = 0.0
    for index in range(len(weights) - 1, -1, -1):
        weight = weights[index]
        if above + weight > allowed and weight > 0:
            if index == 0:
                return 1.0
            low, high = math.log(_count_upper(index - 1)), math.log(_count_upper(index))
            inside = (allowed - above) / weight  # the share of this bin above the count
            return math.exp(high - inside * (high - low))
        above += weight
    return 1.0


def _clump_quantile(
    weights: tuple[float, ...],
    share: float,
    total: float | None = None,
    fit: tuple[float, float, float, float] | None = None,
) -> float:
    """The clump with `share` of the weight above it: the histogram's own quantile, or
    where its tail extrapolates to when that is larger.

    An hour holds a handful of clumps, and the largest so far is what a plain quantile
    at 1 % reads: the next may be larger (on the Azure 2023 code trace, the fourth is 60 %
    larger than the three before it). Peaks over a threshold: above u, the upper edge of
    the bin holding the weighted median, the counts are taken as exponential with the
    mean excess e measured from u to each higher bin's middle, so the quantile is
    u + e·ln(P(C > u) / share) (a generalised Pareto tail of shape 0). The mean excess is
    taken at one standard error over its estimate, e·(1 + 1/√n) with n the windows above
    u (each bin's weight over its count): from a handful of clumps the tail's scale is
    known to a factor, and the next clump is sized for what the evidence allows, as the
    calibration counts the misses seen at one sigma. Counts no wider than a few bins
    (Poisson at a busy level) read within a bin of their quantile.

    `total` and `fit` are the weights' sum and `_tail_fit`, where already known.
    """
    if total is None:
        total = sum(weights)
    plain = _count_quantile(weights, share * total)
    threshold, over, excess, windows = fit or _tail_fit(weights, total)
    if over <= 0 or share * total >= over:
        return plain
    mean_excess = excess / over * (1.0 + 1.0 / math.sqrt(max(1.0, windows)))
    return max(plain, threshold + mean_excess * math.log(over / (share * total)))


def _tail_fit(weights: tuple[float, ...], total: float) -> tuple[float, float, float, float]:
    """(u, the weight above u, its excess over u, the windows above u) of
    `_clump_quantile`'s exponential tail: what it reads of the weights at any share."""
    below = 0.0
    median_bin = 0
    for index, weight in enumerate(weights):
        below += weight
        if below >= 0.5 * total:
            median_bin = index
            break
    threshold = _count_upper(median_bin)
    over = 0.0
    excess = 0.0
    windows = 0.0
    for index in range(median_bin + 1, len(weights)):
        weight = weights[index]
        if weight > 0:
            over += weight
            middle = _count_middle(index)
            excess += weight * (middle - threshold)
            windows += weight / middle
    return threshold, over, excess, windows


def _count_bin(count: float) -> int:
    if count <= 1.0:
        return 0
    return min(COUNT_BINS - 1, 1 + int(math.log(count) / math.log(_COUNT_BASE)))


def _bin(ratio: float) -> int:
    if ratio <= 1.0:
        return 0
    return min(BINS - 1, 1 + int(math.log(ratio) / math.log(_BIN_BASE)))


def _count_upper(index: int) -> float:
    """The upper edge of count bin `index`."""
    return _COUNT_BASE**index


def _upper(index: int) -> float:
    """The upper edge of bin `index`."""
    return _BIN_BASE**index


def _poisson_ratio(share: float, mean_count: float) -> float:
    """Normal approximation of a Poisson count's upper quantile, over its mean."""
    if mean_count <= 0:
        return 1.0
    z = _normal_quantile(1.0 - share)
    return 1.0 + z / math.sqrt(mean_count) + 1.0 / mean_count


@lru_cache(maxsize=64)
def _normal_quantile(p: float) -> float:
    # Strictly inside (0, 1): a share that rounds to 0 or 1 is the quantile's limit.
    return NormalDist().inv_cdf(min(1.0 - 1e-15, max(1e-15, p)))


# The episode group of each count bin: of its lower edge, the largest group every count
# in the bin is a sighting of (a count marks each group up to its own). Of its middle, a
# bin straddling a group's edge was read as the upper group, which counts under the edge
# never mark, and the largest clumps of a window were dropped as never seen.
_BIN_GROUP = tuple(
    _episode_group(_count_upper(index - 1) if index > 0 else 1.0) for index in range(COUNT_BINS)
)
# (group, first bin, bin after the last) of each group that has bins: they run in order.
_GROUP_BINS = tuple(
    (group, _BIN_GROUP.index(group), COUNT_BINS - _BIN_GROUP[::-1].index(group))
    for group in sorted(set(_BIN_GROUP))
)
