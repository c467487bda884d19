"""Trace loaders: request-level and binned-count files, streamed as numpy batches.

Request-level formats carry one row per request (arrival time, prompt and output tokens):
Azure LLM CSV, BurstGPT CSV, Mooncake JSONL and a generic CSV. A binned-count file carries
one row per time bin (a datetime and a request count); arrivals inside a bin are drawn with
a seeded RNG and token lengths come from a `TokenSampler`.

Nothing here holds a whole trace as Python objects: a `Trace` reads its file again on every
`batches()` call and yields numpy arrays a few hundred thousand requests at a time, and
every call yields exactly the same requests, so each policy in a backtest sees one workload.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import pandas as pd

TraceFormat = Literal["azure", "burstgpt", "mooncake", "generic", "counts"]
FORMATS: tuple[TraceFormat, ...] = ("azure", "burstgpt", "mooncake", "generic", "counts")

# Rows parsed per pandas chunk: big enough to amortise the vectorised conversions, small
# enough that a week-long request file never sits in memory at once.
_ROWS_PER_CHUNK = 250_000
# Bins generated per batch of a binned-count trace (one hour of 10 s bins).
_BINS_PER_BATCH = 360
# Request logs are written by many servers and are not strictly ordered; a request may
# precede one already read by this much. Larger disorder is an error in the file.
REORDER_SLACK_S = 10.0
# A request copied by --rate-scale > 1 arrives this much later, at most (uniformly).
COPY_JITTER_S = 1.0

# Column names of each CSV format: (timestamp, prompt tokens, output tokens).
_CSV_COLUMNS: dict[str, tuple[str, str, str]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "generic": ("timestamp", "prompt_tokens", "output_tokens"),
}
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


class TraceError(Exception):
    """A trace that cannot be read. The message is one line: file, line, problem, fix."""


@dataclass(frozen=True, slots=True)
class RequestBatch:
    """Requests in arrival order. Times are seconds from the start of the trace window."""

    arrival_s: np.ndarray  # float64, non-decreasing
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.arrival_s.size)


class TokenSampler(Protocol):
    """Token lengths for requests whose trace does not carry them."""

    def sample(self, rng: np.random.Generator, requests: int) -> tuple[np.ndarray, np.ndarray]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class LognormalTokens:
    """Prompt and output lengths drawn independently from lognormals with these moments."""

    prompt_mean: float = 2048.0
    prompt_cv: float = 1.0
    output_mean: float = 28.0
    output_cv: float = 2.0

    def sample(self, rng: np.random.Generator, requests: int) -> tuple[np.ndarray, np.ndarray]:
        return (
            _lognormal(rng, self.prompt_mean, self.prompt_cv, requests),
            _lognormal(rng, self.output_mean, self.output_cv, requests),
        )

    def describe(self) -> str:
        return (
            f"lognormal prompt mean {self.prompt_mean:g} cv {self.prompt_cv:g}, "
            f"output mean {self.output_mean:g} cv {self.output_cv:g}"
        )


def _lognormal(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    sigma2 = math.log1p(cv * cv)
    mu = math.log(mean) - sigma2 / 2
    values = rng.lognormal(mu, math.sqrt(sigma2), size)
    return np.maximum(1, np.rint(values)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class EmpiricalTokens:
    """(prompt, output) pairs drawn with replacement from a request-level trace: the two
    lengths stay paired, so their correlation in the source survives."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    # More pairs than this add nothing to the distribution and cost memory.
    MAX_PAIRS = 1_000_000

    @classmethod
    def from_trace(cls, trace: Trace, seed: int = 0) -> EmpiricalTokens:
        prompts: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        for batch in trace.batches():
            prompts.append(batch.prompt_tokens)
            outputs.append(batch.output_tokens)
        prompt = np.concatenate(prompts) if prompts else np.empty(0, np.int64)
        output = np.concatenate(outputs) if outputs else np.empty(0, np.int64)
        if prompt.size == 0:
            raise TraceError(f"{trace.path}: holds no requests to take token lengths from")
        if prompt.size > cls.MAX_PAIRS:
            keep = np.random.default_rng(seed).choice(prompt.size, cls.MAX_PAIRS, replace=False)
            prompt, output = prompt[keep], output[keep]
        return cls(prompt, output, str(trace.path))

    def sample(self, rng: np.random.Generator, requests: int) -> tuple[np.ndarray, np.ndarray]:
        index = rng.integers(0, self.prompt_tokens.size, requests)
        return self.prompt_tokens[index], self.output_tokens[index]

    def describe(self) -> str:
        return f"sampled from {self.source} ({self.prompt_tokens.size} requests)"


@dataclass(frozen=True, slots=True)
class TraceWindow:
    """How to cut and scale a trace: seconds from its first request, and a rate factor."""

    start_s: float = 0.0
    duration_s: float | None = None
    rate_scale: float = 1.0
    seed: int = 0

    def end_s(self) -> float:
        return math.inf if self.duration_s is None else self.start_s + self.duration_s


@dataclass(frozen=True)
class Trace:
    """A trace file, cut and scaled, that can be replayed any number of times."""

    path: Path
    format: TraceFormat
    window: TraceWindow
    # Absolute time (epoch seconds, UTC) of the trace's first request or bin, when the file
    # gives datetimes; None for relative timestamps.
    origin_epoch_s: float | None
    # Known up front for binned files; request-level files are measured by a first pass.
    bin_s: float | None
    tokens: str  # where token lengths come from, for the report
    _batches: Callable[[], Iterator[RequestBatch]]

    @property
    def binned(self) -> bool:
        return self.format == "counts"

    def batches(self) -> Iterator[RequestBatch]:
        """The requests of the window, in order, the same on every call."""
        return self._batches()

    def describe(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "format": self.format,
            "start_s": self.window.start_s,
            "duration_s": self.window.duration_s,
            "rate_scale": self.window.rate_scale,
            "seed": self.window.seed,
            "tokens": self.tokens,
            "bin_s": self.bin_s,
        }


# ---------------------------------------------------------------- opening and detection


def open_trace(
    path: str | Path,
    fmt: TraceFormat | None = None,
    window: TraceWindow | None = None,
    tokens: TokenSampler | None = None,
) -> Trace:
    """Open a trace, detecting its format from the header unless `fmt` is given.

    Reads the header (and, for binned files, every bin) now, so that an unknown or broken
    file fails here; a malformed row deep in a request-level file fails when reached.
    """
    file = Path(path)
    window = window or TraceWindow()
    if window.rate_scale <= 0:
        raise TraceError(f"rate scale must be > 0 (got {window.rate_scale:g})")
    header = _first_line(file)
    detected = fmt or detect_format(file, header)
    if detected == "counts":
        return _open_counts(file, header, window, tokens or LognormalTokens())
    if tokens is not None:
        raise TraceError(
            f"{file}: is a request-level trace ({detected}) with its own token counts; "
            "--tokens-from applies to binned-count traces only"
        )
    if detected == "mooncake":
        return _open_mooncake(file, window)
    return _open_csv(file, header, detected, window)


def detect_format(path: Path, header: str) -> TraceFormat:
    if header.lstrip().startswith("{"):
        return "mooncake"
    columns = _split_header(header)
    for name, wanted in _CSV_COLUMNS.items():
        if set(wanted) <= set(columns):
            return name  # type: ignore[return-value]
    if len(columns) == 2:
        return "counts"
    raise TraceError(
        f"{path}: line 1: unrecognised header {header.strip()[:80]!r}; expected "
        "TIMESTAMP,ContextTokens,GeneratedTokens (Azure), Timestamp,Request tokens,"
        "Response tokens (BurstGPT), timestamp,prompt_tokens,output_tokens, Mooncake "
        "JSONL, or a two-column datetime,count file; or pass --format"
    )


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            line = handle.readline()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file; pass the path of a trace") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory; pass the path of a trace file") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: line 1: not UTF-8 text; pass a CSV or JSONL trace") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror}); check permissions") from None
    if not line.strip():
        raise TraceError(f"{path}: line 1: empty; a trace starts with a header or a JSON row")
    return line.rstrip("\r\n")


def _split_header(header: str) -> list[str]:
    return [column.strip().strip('"') for column in header.split(",")]


# ---------------------------------------------------------------- request-level CSV


def _open_csv(path: Path, header: str, fmt: TraceFormat, window: TraceWindow) -> Trace:
    time_col, prompt_col, output_col = _CSV_COLUMNS[fmt]
    columns = _split_header(header)
    missing = [c for c in (time_col, prompt_col, output_col) if c not in columns]
    if missing:
        raise TraceError(
            f"{path}: line 1: header lacks {', '.join(missing)} for format {fmt}; "
            "check the file or --format"
        )
    first = _first_csv_row(path, (time_col, prompt_col, output_col))
    # Timestamps are seconds (a number) or datetimes; the first row decides for the file.
    as_datetime = _to_seconds(pd.Series([first[0]]), numeric=True).isna().iloc[0]
    if as_datetime:
        origin = _to_seconds(pd.Series([first[0]]), numeric=False).iloc[0]
        if np.isnan(origin):
            raise TraceError(
                f"{path}: line 2: {time_col} {first[0]!r} is neither seconds nor a datetime"
            )
    else:
        origin = float(first[0])
    # Azure's TIMESTAMP and ISO datetimes are absolute; plain seconds are relative.
    origin_epoch_s = float(origin) if as_datetime else None

    def rows() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        try:
            # All columns, not usecols: pandas then reports rows with extra fields.
            reader = pd.read_csv(
                path,
                index_col=False,
                dtype=str,
                chunksize=_ROWS_PER_CHUNK,
                skip_blank_lines=False,
                keep_default_na=False,
                skipinitialspace=True,
            )
            first_line = 2
            for frame in reader:
                yield _parse_csv_chunk(
                    path, frame, first_line, (time_col, prompt_col, output_col), origin, as_datetime
                )
                first_line += len(frame)
        except pd.errors.ParserError as exc:
            raise TraceError(f"{path}: {_pandas_problem(exc)}") from None
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not UTF-8 text; pass a CSV trace") from None

    return Trace(
        path=path,
        format=fmt,
        window=window,
        origin_epoch_s=origin_epoch_s,
        bin_s=None,
        tokens="from the trace",
        _batches=lambda: _cut_and_scale(path, rows(), window),
    )


def _first_csv_row(path: Path, columns: tuple[str, str, str]) -> tuple[str, str, str]:
    try:
        frame = pd.read_csv(path, usecols=list(columns), dtype=str, nrows=1, keep_default_na=False)
    except (pd.errors.ParserError, ValueError) as exc:
        raise TraceError(f"{path}: {_pandas_problem(exc)}") from None
    if frame.empty:
        raise TraceError(f"{path}: line 2: no requests after the header")
    row = frame.iloc[0]
    return str(row[columns[0]]), str(row[columns[1]]), str(row[columns[2]])


def _pandas_problem(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    match = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", text)
    if match:
        want, line, saw = match.groups()
        return f"line {line}: {saw} fields where the header has {want}; fix that row"
    match = re.search(r"line (\d+)", text)
    if match:
        return f"line {match.group(1)}: {text}"
    return f"cannot parse as CSV ({text})"


_EPOCH = pd.Timestamp(0, tz="UTC")


def _to_seconds(values: pd.Series, numeric: bool) -> pd.Series:
    """Seconds as float64, NaN where a value does not parse."""
    if numeric:
        return pd.to_numeric(values, errors="coerce").astype("float64")
    moments = pd.to_datetime(values, format="ISO8601", errors="coerce", utc=True)
    # pandas picks the datetime unit from the text (s, us, ns): go through a timedelta.
    return (moments - _EPOCH).dt.total_seconds().astype("float64")


def _parse_csv_chunk(
    path: Path,
    frame: pd.DataFrame,
    first_line: int,
    columns: tuple[str, str, str],
    origin: float,
    as_datetime: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    time_col, prompt_col, output_col = columns
    lines = np.arange(first_line, first_line + len(frame))
    # A blank line is skipped, not an error; its number still counts.
    blank = (frame[time_col] == "") & (frame[prompt_col] == "") & (frame[output_col] == "")
    if blank.any():
        keep = ~blank.to_numpy()
        frame, lines = frame[keep], lines[keep]
    times = _to_seconds(frame[time_col], numeric=not as_datetime).to_numpy()
    bad = np.flatnonzero(np.isnan(times))
    if bad.size:
        i = bad[0]
        kind = "a datetime" if as_datetime else "seconds (a number)"
        raise TraceError(
            f"{path}: line {lines[i]}: {time_col} {frame[time_col].iloc[i]!r} is not {kind} "
            "like the first row's"
        )
    prompt = _token_column(path, frame, prompt_col, lines)
    output = _token_column(path, frame, output_col, lines)
    return times - origin, prompt, output, lines


def _token_column(path: Path, frame: pd.DataFrame, column: str, lines: np.ndarray) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype="float64")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values != np.floor(values)))
    if bad.size:
        i = bad[0]
        raise TraceError(
            f"{path}: line {lines[i]}: {column} {frame[column].iloc[i]!r} is not a "
            "non-negative whole number of tokens"
        )
    return values.astype(np.int64)


# ---------------------------------------------------------------- Mooncake JSONL


def _open_mooncake(path: Path, window: TraceWindow) -> Trace:
    def rows() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        times: list[float] = []
        prompts: list[int] = []
        outputs: list[int] = []
        lines: list[int] = []
        # Bytes, decoded per line, so that bad encoding is reported with its line number.
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise TraceError(f"{path}: line {number}: not UTF-8 text") from None
                if not text.strip():
                    continue
                times_ms, prompt, output = _mooncake_row(path, number, text)
                times.append(times_ms / 1000.0)
                prompts.append(prompt)
                outputs.append(output)
                lines.append(number)
                if len(times) >= _ROWS_PER_CHUNK:
                    yield _arrays(times, prompts, outputs, lines)
                    times, prompts, outputs, lines = [], [], [], []
        if times:
            yield _arrays(times, prompts, outputs, lines)

    # Mooncake timestamps are milliseconds from the trace's own start.
    return Trace(
        path=path,
        format="mooncake",
        window=window,
        origin_epoch_s=None,
        bin_s=None,
        tokens="from the trace",
        _batches=lambda: _cut_and_scale(path, _relative_to_first(rows()), window),
    )


def _mooncake_row(path: Path, number: int, text: str) -> tuple[float, int, int]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path}: line {number}: not JSON ({exc.msg}); one object per line"
        ) from None
    if not isinstance(row, dict):
        raise TraceError(f"{path}: line {number}: expected a JSON object, got {type(row).__name__}")
    values: list[float] = []
    for key in _MOONCAKE_KEYS:
        if key not in row:
            raise TraceError(f"{path}: line {number}: missing key {key!r}")
        value = row[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise TraceError(f"{path}: line {number}: {key} {value!r} is not a number")
        if value < 0 or (key != "timestamp" and value != int(value)):
            raise TraceError(
                f"{path}: line {number}: {key} {value!r} must be a non-negative whole number"
            )
        values.append(float(value))
    return values[0], int(values[1]), int(values[2])


def _arrays(
    times: list[float], prompts: list[int], outputs: list[int], lines: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.asarray(times, dtype=np.float64),
        np.asarray(prompts, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        np.asarray(lines, dtype=np.int64),
    )


def _relative_to_first(
    rows: Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    origin: float | None = None
    for times, prompts, outputs, lines in rows:
        if origin is None and times.size:
            origin = float(times[0])
        yield times - (origin or 0.0), prompts, outputs, lines


# ---------------------------------------------------------------- ordering, cutting, scaling


def _cut_and_scale(
    path: Path,
    rows: Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    window: TraceWindow,
) -> Iterator[RequestBatch]:
    """Validate order, cut to the window, scale the rate, and yield sorted batches."""
    rng = np.random.default_rng(window.seed)
    end_s = window.end_s()
    latest_s = -math.inf

    def checked() -> Iterator[RequestBatch]:
        nonlocal latest_s
        for times, prompts, outputs, lines in rows:
            if times.size == 0:
                continue
            running_max = np.maximum.accumulate(np.concatenate(([latest_s], times)))[:-1]
            late = np.flatnonzero(times < running_max - REORDER_SLACK_S)
            if late.size:
                i = late[0]
                raise TraceError(
                    f"{path}: line {lines[i]}: arrives {running_max[i] - times[i]:.1f} s before "
                    f"an earlier row (more than {REORDER_SLACK_S:g} s out of order); sort the "
                    "file by timestamp"
                )
            latest_s = max(latest_s, float(times.max()))
            keep = (times >= window.start_s) & (times < end_s)
            if not keep.all():
                times, prompts, outputs = times[keep], prompts[keep], outputs[keep]
            if times.size:
                batch = RequestBatch(times - window.start_s, prompts, outputs)
                yield _scale(batch, window.rate_scale, rng)
            if latest_s - REORDER_SLACK_S >= end_s:
                return

    yield from _reorder(checked(), REORDER_SLACK_S + COPY_JITTER_S, window.duration_s)


def _scale(batch: RequestBatch, rate_scale: float, rng: np.random.Generator) -> RequestBatch:
    """Thin (scale < 1) or copy (scale > 1) requests; each keeps its token lengths.

    A request is kept ⌊scale⌋ times plus once more with probability frac(scale), so the
    expected rate is exact at every point in time and bursts keep their shape. Copies are
    spread over COPY_JITTER_S so that they do not land at one instant.
    """
    if rate_scale == 1.0:
        return batch
    whole = math.floor(rate_scale)
    copies = np.full(len(batch), whole, dtype=np.int64)
    copies += rng.random(len(batch)) < rate_scale - whole
    index = np.repeat(np.arange(len(batch)), copies)
    times = batch.arrival_s[index]
    # Copy 0 of each request keeps its time; further copies are jittered.
    first_copy = np.ones(index.size, dtype=bool)
    first_copy[1:] = index[1:] != index[:-1]
    times = times + np.where(first_copy, 0.0, rng.random(index.size) * COPY_JITTER_S)
    return RequestBatch(times, batch.prompt_tokens[index], batch.output_tokens[index])


def _reorder(
    batches: Iterator[RequestBatch], slack_s: float, duration_s: float | None
) -> Iterator[RequestBatch]:
    """Sort across batch edges: hold back the last `slack_s` of each batch until the next.

    Correct because no later request arrives more than `slack_s` before the latest one
    seen (checked above, and jitter is bounded).
    """
    held: RequestBatch | None = None
    for batch in batches:
        merged = batch if held is None else _concat(held, batch)
        order = np.argsort(merged.arrival_s, kind="stable")
        merged = RequestBatch(
            merged.arrival_s[order], merged.prompt_tokens[order], merged.output_tokens[order]
        )
        cut = int(np.searchsorted(merged.arrival_s, merged.arrival_s[-1] - slack_s, "right"))
        if cut:
            yield _clip(_head(merged, cut), duration_s)
        held = _tail(merged, cut)
    if held is not None and len(held):
        yield _clip(held, duration_s)


def _clip(batch: RequestBatch, duration_s: float | None) -> RequestBatch:
    # Jittered copies may cross the window's end.
    if duration_s is None or not len(batch) or batch.arrival_s[-1] < duration_s:
        return batch
    cut = int(np.searchsorted(batch.arrival_s, duration_s, "left"))
    return _head(batch, cut)


def _concat(a: RequestBatch, b: RequestBatch) -> RequestBatch:
    return RequestBatch(
        np.concatenate((a.arrival_s, b.arrival_s)),
        np.concatenate((a.prompt_tokens, b.prompt_tokens)),
        np.concatenate((a.output_tokens, b.output_tokens)),
    )


def _head(batch: RequestBatch, stop: int) -> RequestBatch:
    return RequestBatch(
        batch.arrival_s[:stop], batch.prompt_tokens[:stop], batch.output_tokens[:stop]
    )


def _tail(batch: RequestBatch, start: int) -> RequestBatch:
    return RequestBatch(
        batch.arrival_s[start:], batch.prompt_tokens[start:], batch.output_tokens[start:]
    )


# ---------------------------------------------------------------- binned counts


@dataclass(frozen=True, slots=True)
class Bins:
    """A binned-count file: bin start times (seconds from the first bin) and counts."""

    start_s: np.ndarray
    counts: np.ndarray
    bin_s: float


def _open_counts(path: Path, header: str, window: TraceWindow, tokens: TokenSampler) -> Trace:
    bins, origin_epoch_s = read_bins(path, header)
    first = int(np.searchsorted(bins.start_s + bins.bin_s, window.start_s, "right"))
    last = int(np.searchsorted(bins.start_s, window.end_s(), "left"))
    if first >= last:
        raise TraceError(
            f"{path}: the window from {window.start_s:g} s holds no bins (the trace spans "
            f"{bins.start_s[-1] + bins.bin_s:g} s); check --start and --duration"
        )
    # The window ends at the last bin's end unless --duration cuts it shorter.
    span_s = float(bins.start_s[last - 1] + bins.bin_s) - window.start_s
    window = TraceWindow(
        start_s=window.start_s,
        duration_s=span_s if window.duration_s is None else min(window.duration_s, span_s),
        rate_scale=window.rate_scale,
        seed=window.seed,
    )
    return Trace(
        path=path,
        format="counts",
        window=window,
        origin_epoch_s=origin_epoch_s,
        bin_s=bins.bin_s,
        tokens=tokens.describe(),
        _batches=lambda: _draw_arrivals(bins, first, last, window, tokens),
    )


def read_bins(path: Path, header: str | None = None) -> tuple[Bins, float | None]:
    """Read a `datetime,count` file; infer the bin width from consecutive rows."""
    header = header if header is not None else _first_line(path)
    columns = _split_header(header)
    if len(columns) < 2:
        raise TraceError(
            f"{path}: line 1: a binned-count file needs two columns (datetime, count), "
            f"got {header.strip()[:80]!r}"
        )
    try:
        frame = pd.read_csv(
            path,
            usecols=[0, 1],
            dtype=str,
            skip_blank_lines=False,
            keep_default_na=False,
            skipinitialspace=True,
        )
    except pd.errors.ParserError as exc:
        raise TraceError(f"{path}: {_pandas_problem(exc)}") from None
    lines = np.arange(2, 2 + len(frame))
    labels, counts = frame.iloc[:, 0], frame.iloc[:, 1]
    blank = ((labels == "") & (counts == "")).to_numpy()
    if blank.any():
        labels, counts, lines = labels[~blank], counts[~blank], lines[~blank]
    if len(labels) < 2:
        raise TraceError(
            f"{path}: needs at least two bins to infer the bin width (has {len(labels)})"
        )
    numeric = not np.isnan(_to_seconds(labels.iloc[:1], numeric=True).iloc[0])
    seconds = _to_seconds(labels, numeric=numeric).to_numpy()
    bad = np.flatnonzero(np.isnan(seconds))
    if bad.size:
        i = bad[0]
        raise TraceError(
            f"{path}: line {lines[i]}: {columns[0]} {labels.iloc[i]!r} is not a datetime"
        )
    values = pd.to_numeric(counts, errors="coerce").to_numpy(dtype="float64")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values != np.floor(values)))
    if bad.size:
        i = bad[0]
        raise TraceError(
            f"{path}: line {lines[i]}: {columns[1]} {counts.iloc[i]!r} is not a non-negative "
            "whole request count"
        )
    steps = np.diff(seconds)
    bin_s = float(steps[0])
    if not bin_s > 0:
        raise TraceError(
            f"{path}: line {lines[1]}: bin starts at or before the previous one; "
            "bins must be in time order"
        )
    # A missing row is an empty bin; anything off the grid is an error.
    multiples = steps / bin_s
    off_grid = np.flatnonzero(
        (multiples < 1 - 1e-6) | (np.abs(multiples - np.rint(multiples)) > 1e-6)
    )
    if off_grid.size:
        i = off_grid[0] + 1
        raise TraceError(
            f"{path}: line {lines[i]}: bin is {steps[i - 1]:g} s after the previous one; "
            f"bins must be {bin_s:g} s apart (the first two rows' spacing) or whole multiples"
        )
    origin = float(seconds[0])
    return Bins(seconds - origin, values.astype(np.int64), bin_s), None if numeric else origin


def _draw_arrivals(
    bins: Bins, first: int, last: int, window: TraceWindow, tokens: TokenSampler
) -> Iterator[RequestBatch]:
    """A Poisson process within each bin, conditioned on the bin's count.

    Given that n requests arrived in a bin, a Poisson process places them independently
    and uniformly in it; the trace's count per bin is kept (scaled) exactly, so totals and
    the shape of the day survive. Scaled counts are rounded stochastically.
    """
    arrivals_rng, tokens_rng = (
        np.random.default_rng(seed) for seed in np.random.SeedSequence(window.seed).spawn(2)
    )
    end_s = window.end_s()
    for lo in range(first, last, _BINS_PER_BATCH):
        hi = min(last, lo + _BINS_PER_BATCH)
        expected = bins.counts[lo:hi] * window.rate_scale
        counts = np.floor(expected).astype(np.int64)
        counts += arrivals_rng.random(counts.size) < expected - counts
        which = np.repeat(np.arange(lo, hi), counts)
        times = bins.start_s[which] + arrivals_rng.random(which.size) * bins.bin_s
        times.sort()
        keep = (times >= window.start_s) & (times < end_s)
        times = times[keep] - window.start_s
        prompt, output = tokens.sample(tokens_rng, int(counts.sum()))
        yield RequestBatch(times, prompt[keep], output[keep])


# ---------------------------------------------------------------- durations


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(text: str) -> float:
    """'90', '90s', '15m', '6h', '2d', '1h30m' -> seconds. ValueError on anything else."""
    compact = text.strip().lower().replace(" ", "")
    if not compact:
        raise ValueError("empty duration")
    total_s = 0.0
    position = 0
    for match in _DURATION.finditer(compact):
        if match.start() != position or not match.group(0):
            break
        total_s += float(match.group(1)) * _UNIT_S[match.group(2)]
        position = match.end()
    if position != len(compact):
        raise ValueError(f"{text!r} is not a duration; use seconds or e.g. 90s, 15m, 6h, 2d")
    return total_s
