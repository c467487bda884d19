"""Prometheus text: parse the families we need, turn counters into deltas, histograms into p99.

Counters and histograms are cumulative and reset when the process that owns them restarts;
series come and go with replicas and nodes. What the sensors need is how much happened in
a window, so this module keeps, per series, the last value seen and adds up only what grew
(a drop is a reset: the new value is what grew since). Those per-series increments feed
`Accumulator`s, whose history answers "how much in the last W seconds".
"""

from __future__ import annotations

import bisect
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Suffixes a sample name adds to its family name.
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")

Labels = tuple[tuple[str, str], ...]


class MetricsParseError(ValueError):
    """The text is not Prometheus exposition format."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str  # the sample's own name, e.g. "x_bucket", "x_total"
    labels: Mapping[str, str]
    value: float


def family_of(sample_name: str, families: frozenset[str]) -> str | None:
    """The family in `families` that `sample_name` belongs to, if any."""
    if sample_name in families:
        return sample_name
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in families:
            return sample_name[: -len(suffix)]
    return None


def _line_name(line: str) -> str:
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") else ""
    end = len(line)
    for stop in ("{", " "):
        index = line.find(stop)
        if index != -1:
            end = min(end, index)
    return line[:end]


# The shape of an exposition line that is not a comment: a metric name, optional labels,
# a value. Checked (in C, by `re`) on the lines the parser does not see.
_SAMPLE_LINE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?[ \t]+\S")


def parse(text: str, families: Iterable[str]) -> list[Sample]:
    """The samples of the named families in `text`.

    Lines of other families are dropped before parsing: a Ray node exports thousands of
    series and the parser is pure Python, so filtering first is what keeps a scrape cheap.
    The dropped lines must still look like exposition lines: an error page or a truncated
    answer is no scrape at all (Prometheus rejects such a scrape whole, too), not an
    endpoint that happens to have no Serve series.
    """
    wanted = frozenset(families)
    kept: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if family_of(_line_name(line), wanted):
            kept.append(line)
        elif (
            line
            and not line.startswith("#")
            and not line.isspace()
            and _SAMPLE_LINE.match(line) is None
        ):
            raise MetricsParseError(f"line {number}: not an exposition line")
    try:
        parsed = list(text_string_to_metric_families("\n".join(kept) + "\n"))
    # OverflowError: a timestamp of hundreds of digits, which the parser divides by 1000.
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MetricsParseError(first_line) from None
    samples: list[Sample] = []
    for family in parsed:
        for item in family.samples:
            samples.append(Sample(item.name, item.labels, _float(item.value)))
    return samples


def _float(value: float) -> float:
    """A sample's value as a float. The parser reads integers as ints, and one beyond
    float's range is ±Inf, which the readers below take as unknown."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def label_key(labels: Mapping[str, str], drop: Iterable[str] = ()) -> Labels:
    skip = set(drop)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in skip))


class CounterDeltas:
    """Per-series increments of cumulative values (counters, histogram buckets).

    `advance(key, value, count)` returns how much the series grew since it was last seen;
    a drop means its owner restarted and counts from zero again, and a series seen for the
    first time grew from zero. With `count=False` the value is only recorded: for the
    first scrape of an endpoint, or the first after a gap, whose growth happened before
    or between our looks and must not read as a burst now; a series missing from the
    previous round is recorded the same way when it comes back. A NaN, infinite or negative
    value is unknown: None, the last good value kept (its growth counts once the series
    reads again), never a zero.
    """

    def __init__(self) -> None:
        self._last: dict[object, float] = {}
        self._seen_round: dict[object, int] = {}
        self._round = 0

    def advance(self, key: object, value: float, count: bool) -> float | None:
        if not math.isfinite(value) or value < 0:
            return None
        seen_round = self._seen_round.get(key)
        self._seen_round[key] = self._round
        previous = self._last.get(key)
        self._last[key] = value
        if not count:
            return 0.0
        if previous is not None and seen_round is not None and seen_round < self._round - 1:
            # Back after missing rounds: what it grew meanwhile is not this round's growth.
            return 0.0
        if previous is None or value < previous:
            return value
        return value - previous

    def end_round(self, keep_rounds: int = 120) -> None:
        """Forget series not seen for `keep_rounds` rounds (dead replicas, removed nodes)."""
        self._round += 1
        cutoff = self._round - keep_rounds
        for key in [k for k, r in self._seen_round.items() if r < cutoff]:
            del self._seen_round[key]
            self._last.pop(key, None)


class Accumulator:
    """A running total of increments, with history, to answer "how much over the last W s"."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self.total = 0.0
        self._history: deque[tuple[float, float]] = deque()

    def add(self, amount: float) -> None:
        self.total += amount

    def mark(self, at_s: float) -> None:
        """Record the running total as of `at_s` (the time the underlying data was fetched)."""
        self._history.append((at_s, self.total))
        while len(self._history) > 2 and self._history[1][0] <= at_s - self.keep_s:
            self._history.popleft()

    def rebase(self, at_s: float) -> None:
        """Forget the history: windows start again at `at_s` (after an outage)."""
        self._history.clear()
        self.mark(at_s)

    def rate_per_s(self, window_s: float) -> float | None:
        """Increase per second over about the last `window_s`; None with under two marks."""
        span = self._span(window_s)
        if span is None:
            return None
        (start_s, start), (end_s, end) = span
        if end_s <= start_s:
            return None
        return (end - start) / (end_s - start_s)

    def increase(self, window_s: float) -> float | None:
        span = self._span(window_s)
        if span is None:
            return None
        return span[1][1] - span[0][1]

    def _span(self, window_s: float) -> tuple[tuple[float, float], tuple[float, float]] | None:
        if len(self._history) < 2:
            return None
        end = self._history[-1]
        start = self._history[0]
        # The latest mark at or before the window's start, so the window is fully covered.
        for mark in self._history:
            if mark[0] <= end[0] - window_s:
                start = mark
            else:
                break
        return start, end


class HistogramAccumulator:
    """Bucket increments summed over series, with history, for quantiles over a window.

    A bound that no series has added to since before the oldest mark kept is forgotten:
    bucket layouts change (another exporter version, an endpoint that mints a new bound
    every scrape), and a bound that stayed empty for the whole history only bends the
    interpolation between its neighbours while every mark copies it.
    """

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._bounds: list[float] = []
        self._totals: dict[float, float] = {}
        self._history: deque[tuple[float, dict[float, float]]] = deque()
        self._added: set[float] = set()  # bounds added to since the last mark
        self._last_mark_s: dict[float, float] = {}  # bound -> the mark after its last add

    def add(self, upper_bound: float, amount: float) -> None:
        if upper_bound not in self._totals:
            bisect.insort(self._bounds, upper_bound)
            self._totals[upper_bound] = 0.0
        self._totals[upper_bound] += amount
        self._added.add(upper_bound)

    def mark(self, at_s: float) -> None:
        for bound in self._added:
            self._last_mark_s[bound] = at_s
        self._added.clear()
        self._history.append((at_s, dict(self._totals)))
        while len(self._history) > 2 and self._history[1][0] <= at_s - self.keep_s:
            self._history.popleft()
        self._forget_unused()

    def _forget_unused(self) -> None:
        oldest_s = self._history[0][0]
        unused = [bound for bound, marked_s in self._last_mark_s.items() if marked_s < oldest_s]
        if not unused:
            return
        for bound in unused:
            del self._last_mark_s[bound], self._totals[bound]
            # Gone from every mark too: if the bound comes back, it counts from zero.
            for _, totals in self._history:
                totals.pop(bound, None)
        self._bounds = [bound for bound in self._bounds if bound in self._totals]

    def rebase(self, at_s: float) -> None:
        self._history.clear()
        self.mark(at_s)

    def quantile(self, q: float, window_s: float) -> float | None:
        """The q-quantile of the observations in about the last `window_s`; None if none."""
        buckets = self._cumulative(window_s)
        return histogram_quantile(q, buckets) if buckets is not None else None

    def increase(self, window_s: float) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """(finite upper bounds, observations per bucket with +Inf last) added in about
        the last `window_s`, not cumulative; None before two rounds, without a +Inf, or
        with nothing but the +Inf (which says nothing of where observations lie)."""
        buckets = self._cumulative(window_s)
        if not buckets or len(buckets) < 2 or not math.isinf(buckets[-1][0]):
            return None
        counts: list[float] = []
        below = 0.0
        for _, cumulative in buckets:
            cumulative = max(cumulative, below)  # series vanishing mid-window dip
            counts.append(cumulative - below)
            below = cumulative
        return tuple(bound for bound, _ in buckets[:-1]), tuple(counts)

    def _cumulative(self, window_s: float) -> list[tuple[float, float]] | None:
        if len(self._history) < 2:
            return None
        end_s, end = self._history[-1]
        start = self._history[0][1]
        for at_s, totals in self._history:
            if at_s <= end_s - window_s:
                start = totals
            else:
                break
        return [(bound, end.get(bound, 0.0) - start.get(bound, 0.0)) for bound in self._bounds]


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets.

    Linear interpolation inside the bucket that holds the rank; the +Inf bucket answers
    with the largest finite bound. None when the buckets hold no observations.
    """
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    ordered = sorted(buckets)
    # Cumulative counts can dip when series vanish mid-window; make them monotone.
    counts: list[float] = []
    running = 0.0
    for _, count in ordered:
        running = max(running, count)
        counts.append(running)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, count in enumerate(counts) if count >= rank)
    upper = ordered[index][0]
    if math.isinf(upper):
        finite = [bound for bound, _ in ordered if not math.isinf(bound)]
        return finite[-1] if finite else None
    lower = ordered[index - 1][0] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    inside = counts[index] - below
    if inside <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / inside
