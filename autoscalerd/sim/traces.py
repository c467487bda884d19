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

import csv
import json
import math
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

# Limits on what a file may ask for, so that a broken or hostile one fails with a message
# instead of exhausting memory or time. Each is far beyond any public trace.
#
# The longest span replayed: the backtest keeps per-minute demand and per-tick series for
# the whole span, so the span bounds its memory. Public traces span days to a few months.
MAX_SPAN_S = 366 * 86400.0
# A timestamp in seconds (or a datetime) beyond this magnitude is not a time: 1e12 s is
# 31,700 years, and below it differences of two timestamps cannot overflow.
MAX_ABS_TIME_S = 1e12
_MAX_ABS_TIME = "1e12"  # as messages show it
# Prompt or output tokens of one request: far past any model's context window, and exact
# in the float64 that pandas parses into (99999999999999999999 would wrap in int64).
MAX_TOKENS = 100_000_000
# Rows of a binned-count file, which is read whole: a year of 10 s bins is 3.2 million.
MAX_BINS = 5_000_000
# Requests in one bin after --rate-scale: their arrival times are drawn at once (about
# 60 bytes each while drawn), so this bounds one bin's memory to a few hundred MB.
MAX_REQUESTS_PER_BIN = 5_000_000
# Bins narrower than a millisecond are a unit mistake (milliseconds read as seconds).
MIN_BIN_S = 0.001
# --rate-scale beyond this is a typo rather than an experiment.
MAX_RATE_SCALE = 1000.0
# Requests drawn or copied per batch, at most (a single heavy bin may exceed it): bounds a
# batch's memory whatever the rate scale. Typical traces and scales never reach it, so
# their batches, and the seeded draws, stay as they are.
MAX_BATCH_REQUESTS = 2_500_000
# A JSONL line, or a CSV header, longer than this is not a trace record.
MAX_LINE_CHARS = 1 << 20

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
    _check_window(window)
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


def load_trace_text(
    data: str | bytes,
    suffix: str = ".csv",
    fmt: TraceFormat | None = None,
    window: TraceWindow | None = None,
) -> RequestBatch:
    """Every request of a trace given as its file's contents, in one batch.

    For tests and fuzzing, where inputs are small: the loaders read files, so `data` is
    written to a temporary `trace{suffix}` (the name that messages show) and opened with
    `open_trace`. Raises TraceError, and nothing else, for any content.
    """
    with tempfile.TemporaryDirectory(prefix="autoscalerd-trace-") as directory:
        path = Path(directory) / f"trace{suffix}"
        path.write_bytes(data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)
        batches = list(open_trace(path, fmt, window).batches())
    if not batches:
        empty = np.empty(0, np.float64)
        return RequestBatch(empty, empty.astype(np.int64), empty.astype(np.int64))
    return RequestBatch(
        np.concatenate([b.arrival_s for b in batches]),
        np.concatenate([b.prompt_tokens for b in batches]),
        np.concatenate([b.output_tokens for b in batches]),
    )


def _check_window(window: TraceWindow) -> None:
    if not 0 < window.rate_scale <= MAX_RATE_SCALE:  # also refuses NaN
        raise TraceError(
            f"rate scale must be a number in (0, {MAX_RATE_SCALE:g}] (got {window.rate_scale:g}); "
            "pass a --rate-scale in that range"
        )
    if not 0 <= window.start_s <= MAX_SPAN_S:
        raise TraceError(
            f"start must be within [0, {MAX_SPAN_S / 86400:g} days] (got {window.start_s:g} s); "
            "check --start"
        )
    if window.duration_s is not None and not 0 < window.duration_s <= MAX_SPAN_S:
        raise TraceError(
            f"duration {window.duration_s:g} s is not within (0, {MAX_SPAN_S / 86400:g} days], "
            "the most a trace may span; pass a shorter --duration"
        )


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
            line = handle.readline(MAX_LINE_CHARS + 1)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file; pass the path of a trace") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory; pass the path of a trace file") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: line 1: not UTF-8 text; pass a CSV or JSONL trace") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror}); check permissions") from None
    if len(line) > MAX_LINE_CHARS:
        raise TraceError(
            f"{path}: line 1: longer than {MAX_LINE_CHARS} characters; a trace starts with a "
            "CSV header or one JSON object per line"
        )
    if not line.strip():
        raise TraceError(f"{path}: line 1: empty; a trace starts with a header or a JSON row")
    return line.rstrip("\r\n")


def _split_header(header: str) -> list[str]:
    # As pandas reads it: a quoted name may hold a comma.
    try:
        columns = next(csv.reader([header], skipinitialspace=True), [])
    except csv.Error:  # a NUL byte, say: pandas will report the file
        columns = header.split(",")
    return [column.strip() for column in columns]


# ---------------------------------------------------------------- request-level CSV


def _open_csv(path: Path, header: str, fmt: TraceFormat, window: TraceWindow) -> Trace:
    columns = _CSV_COLUMNS[fmt]
    missing = [c for c in columns if c not in _split_header(header)]
    if missing:
        raise TraceError(
            f"{path}: line 1: header lacks {', '.join(missing)} for format {fmt}; "
            "check the file or --format"
        )
    time_col = columns[0]
    first = _first_csv_row(path, columns)
    # Timestamps are seconds (a number) or datetimes; the first row decides for the file.
    origin = float(_to_seconds(pd.Series([first]), numeric=True)[0])
    as_datetime = bool(np.isnan(origin))
    if as_datetime:
        origin = float(_to_seconds(pd.Series([first]), numeric=False)[0])
        if np.isnan(origin):
            raise TraceError(
                f"{path}: line 2: {time_col} {_shown(first)} is neither seconds nor a datetime"
            )
    # Azure's TIMESTAMP and ISO datetimes are absolute; plain seconds are relative.
    origin_epoch_s = origin if as_datetime else None

    return Trace(
        path=path,
        format=fmt,
        window=window,
        origin_epoch_s=origin_epoch_s,
        bin_s=None,
        tokens="from the trace",
        _batches=_CsvBatches(path, columns, origin, as_datetime, window),
    )


@dataclass(frozen=True)
class _CsvBatches:
    """A request-level CSV's window, read again on every call. A value, not a closure, so
    that a Trace pickles (the backtest's worker processes open it themselves)."""

    path: Path
    columns: tuple[str, str, str]
    origin: float
    as_datetime: bool
    window: TraceWindow

    def __call__(self) -> Iterator[RequestBatch]:
        return _cut_and_scale(self.path, self._rows(), self.window)

    def _rows(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        path = self.path
        # All columns, not usecols: pandas then reports rows with extra fields.
        with _csv_errors(path):
            reader = pd.read_csv(path, chunksize=_ROWS_PER_CHUNK, **_CSV_OPTIONS)
        with reader:  # closed on an error, and when the window ends before the file
            first_line = 2
            while True:
                with _csv_errors(path):
                    frame = next(reader, None)
                if frame is None:
                    return
                yield _parse_csv_chunk(
                    path, frame, first_line, self.columns, self.origin, self.as_datetime
                )
                first_line += len(frame)


# How every CSV is read: text cells, nothing turned into NaN behind our back, blank lines
# kept so that line numbers in messages are the file's.
_CSV_OPTIONS: dict[str, object] = {
    "index_col": False,
    "dtype": str,
    "skip_blank_lines": False,
    "keep_default_na": False,
    "skipinitialspace": True,
}


@contextmanager
def _csv_errors(path: Path) -> Iterator[None]:
    """pandas' failures while reading `path` as one-line TraceErrors."""
    try:
        with warnings.catch_warnings():
            # pandas only warns when the first row is longer than the header, then drops
            # the extra fields: a broken row like any other.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            yield
    except pd.errors.ParserWarning:
        raise TraceError(
            f"{path}: the first row has more fields than the header; fix that row"
        ) from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text; save the file as UTF-8") from None
    except (pd.errors.ParserError, ValueError, OverflowError, csv.Error) as exc:
        raise TraceError(f"{path}: {_pandas_problem(exc)}") from None


def _first_csv_row(path: Path, columns: tuple[str, str, str]) -> str:
    """The first request's timestamp."""
    with _csv_errors(path):
        frame = pd.read_csv(path, nrows=1, **{**_CSV_OPTIONS, "skip_blank_lines": True})
    time_values = _columns(path, frame, columns)[0]
    if frame.empty:
        raise TraceError(f"{path}: line 2: no requests after the header")
    return str(time_values.iloc[0])


def _columns(path: Path, frame: pd.DataFrame, wanted: tuple[str, ...]) -> list[pd.Series]:
    """The wanted columns of a chunk, by their names with surrounding spaces removed."""
    names = [str(name).strip() for name in frame.columns]
    picked = []
    for column in wanted:
        where = [i for i, name in enumerate(names) if name == column]
        if len(where) != 1:
            problem = "lacks" if not where else "repeats"
            raise TraceError(f"{path}: line 1: header {problem} {column}; check the file")
        picked.append(frame.iloc[:, where[0]])
    return picked


def _pandas_problem(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text[:200]
    match = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", text)
    if match:
        want, line, saw = match.groups()
        return f"line {line}: {saw} fields where the header has {want}; fix that row"
    match = re.search(r"line (\d+)", text)
    if match:
        return f"line {match.group(1)}: {text}"
    return f"cannot parse as CSV ({text})"


_EPOCH = pd.Timestamp(0, tz="UTC")


def _to_seconds(values: pd.Series, numeric: bool) -> np.ndarray:
    """Seconds (since the epoch for datetimes) as float64; NaN where a value does not
    parse or lies beyond MAX_ABS_TIME_S."""
    if numeric:
        seconds = pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    else:
        seconds = _datetime_seconds(values)
    return np.where(np.abs(seconds) <= MAX_ABS_TIME_S, seconds, np.nan)


def _datetime_seconds(values: pd.Series) -> np.ndarray:
    try:
        moments = pd.to_datetime(values, format="ISO8601", errors="coerce", utc=True)
    except (ValueError, OverflowError):
        # One value pandas cannot even coerce: find it, one by one.
        if len(values) == 1:
            return np.full(1, np.nan)
        return np.concatenate(
            [_datetime_seconds(values.iloc[i : i + 1]) for i in range(len(values))]
        )
    # From an epoch in the values' own unit (pandas picks s, ms, us or ns from the text):
    # a nanosecond epoch would overflow for years outside 1677-2262.
    since_epoch = moments - _EPOCH.as_unit(moments.dt.unit)
    return since_epoch.dt.total_seconds().to_numpy(dtype="float64", na_value=np.nan)


def _column(name: str) -> str:
    """A header cell for a message: itself when printable, else its repr cut short."""
    return name if name.isprintable() and len(name) <= 40 else _shown(name)


def _shown(value: object) -> str:
    """A cell or JSON value for a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _parse_csv_chunk(
    path: Path,
    frame: pd.DataFrame,
    first_line: int,
    columns: tuple[str, str, str],
    origin: float,
    as_datetime: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    time_col, prompt_col, output_col = columns
    stamps, prompts, outputs = _columns(path, frame, columns)
    lines = np.arange(first_line, first_line + len(frame))
    # A blank line is skipped, not an error; its number still counts.
    blank = ((stamps == "") & (prompts == "") & (outputs == "")).to_numpy(dtype=bool)
    if blank.any():
        keep = ~blank
        stamps, prompts, outputs, lines = stamps[keep], prompts[keep], outputs[keep], lines[keep]
    times = _to_seconds(stamps, numeric=not as_datetime)
    bad = np.flatnonzero(np.isnan(times))
    if bad.size:
        i = bad[0]
        kind = (
            "a datetime like the first row's"
            if as_datetime
            else f"a finite number of seconds (within ±{_MAX_ABS_TIME})"
        )
        raise TraceError(
            f"{path}: line {lines[i]}: {time_col} {_shown(stamps.iloc[i])} is not {kind}"
        )
    prompt = _token_column(path, prompts, prompt_col, lines)
    output = _token_column(path, outputs, output_col, lines)
    return times - origin, prompt, output, lines


def _token_column(path: Path, cells: pd.Series, column: str, lines: np.ndarray) -> np.ndarray:
    values = pd.to_numeric(cells, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    # NaN fails every comparison, so it is caught with the rest.
    bad = np.flatnonzero(~((values >= 0) & (values <= MAX_TOKENS) & (values == np.floor(values))))
    if bad.size:
        i = bad[0]
        if values[i] > MAX_TOKENS:
            raise TraceError(
                f"{path}: line {lines[i]}: {column} {_shown(cells.iloc[i])} is more than "
                f"{MAX_TOKENS} tokens; fix that row"
            )
        raise TraceError(
            f"{path}: line {lines[i]}: {column} {_shown(cells.iloc[i])} is not a "
            "non-negative whole number of tokens"
        )
    return values.astype(np.int64)


# ---------------------------------------------------------------- Mooncake JSONL


def _open_mooncake(path: Path, window: TraceWindow) -> Trace:
    # Mooncake timestamps are milliseconds from the trace's own start.
    return Trace(
        path=path,
        format="mooncake",
        window=window,
        origin_epoch_s=None,
        bin_s=None,
        tokens="from the trace",
        _batches=_MooncakeBatches(path, window),
    )


@dataclass(frozen=True)
class _MooncakeBatches:
    """A Mooncake JSONL trace's window, read again on every call (a value: it pickles)."""

    path: Path
    window: TraceWindow

    def __call__(self) -> Iterator[RequestBatch]:
        return _cut_and_scale(self.path, _relative_to_first(_mooncake_rows(self.path)), self.window)


def _mooncake_rows(
    path: Path,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    lines: list[int] = []
    # Bytes, decoded per line, so that bad encoding is reported with its line number.
    with path.open("rb") as handle:
        for number, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_CHARS + 1), b""), 1):
            if len(raw) > MAX_LINE_CHARS:
                raise TraceError(
                    f"{path}: line {number}: longer than {MAX_LINE_CHARS} bytes; "
                    "one JSON object per line"
                )
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


# Mooncake timestamps are milliseconds.
_MAX_MOONCAKE_MS = MAX_ABS_TIME_S * 1000.0


def _mooncake_row(path: Path, number: int, text: str) -> tuple[float, int, int]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path}: line {number}: not JSON ({exc.msg}); one object per line"
        ) from None
    except RecursionError:
        raise TraceError(f"{path}: line {number}: not JSON (nested too deeply)") from None
    except ValueError:  # an integer of more digits than Python converts
        raise TraceError(f"{path}: line {number}: not JSON (a number too long)") from None
    if not isinstance(row, dict):
        raise TraceError(f"{path}: line {number}: expected a JSON object, got {type(row).__name__}")
    values: list[float] = []
    for key in _MOONCAKE_KEYS:
        if key not in row:
            raise TraceError(f"{path}: line {number}: missing key {key!r}")
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TraceError(f"{path}: line {number}: {key} {_shown(value)} is not a number")
        # Compared as parsed, not through float(), which overflows on a huge int; NaN fails
        # every comparison.
        if key == "timestamp":
            if not 0 <= value <= _MAX_MOONCAKE_MS:
                raise TraceError(
                    f"{path}: line {number}: {key} {_shown(value)} is not a finite number of "
                    "milliseconds within [0, 1e15]"
                )
        elif value > MAX_TOKENS:  # inf too
            raise TraceError(
                f"{path}: line {number}: {key} {_shown(value)} is more than {MAX_TOKENS} "
                "tokens; fix that row"
            )
        elif not (value >= 0 and value == math.floor(value)):
            raise TraceError(
                f"{path}: line {number}: {key} {_shown(value)} must be a non-negative whole number"
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
            far = np.flatnonzero(times > MAX_SPAN_S)
            if far.size:
                i = far[0]
                raise TraceError(
                    f"{path}: line {lines[i]}: arrives {times[i]:.0f} s after the first request, "
                    f"beyond the {MAX_SPAN_S / 86400:g} days a trace may span; fix the "
                    "timestamp or split the file"
                )
            latest_s = max(latest_s, float(times.max()))
            keep = (times >= window.start_s) & (times < end_s)
            if not keep.all():
                times, prompts, outputs = times[keep], prompts[keep], outputs[keep]
            # Copies of at most MAX_BATCH_REQUESTS requests at a time.
            step = max(1, MAX_BATCH_REQUESTS // math.ceil(window.rate_scale))
            for lo in range(0, times.size, step):
                batch = RequestBatch(
                    times[lo : lo + step] - window.start_s,
                    prompts[lo : lo + step],
                    outputs[lo : lo + step],
                )
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
        if not len(batch):  # thinned to nothing
            continue
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
    busiest = int(bins.counts.max())
    if busiest * window.rate_scale > MAX_REQUESTS_PER_BIN:
        raise TraceError(
            f"{path}: a bin of {busiest} requests at rate scale {window.rate_scale:g} is more "
            f"than {MAX_REQUESTS_PER_BIN} requests in one bin; lower --rate-scale"
        )
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
        _batches=_CountBatches(bins, first, last, window, tokens),
    )


@dataclass(frozen=True)
class _CountBatches:
    """A counts file's window, its arrivals drawn again (the same) on every call (a
    value: it pickles)."""

    bins: Bins
    first: int
    last: int
    window: TraceWindow
    tokens: TokenSampler

    def __call__(self) -> Iterator[RequestBatch]:
        return _draw_arrivals(self.bins, self.first, self.last, self.window, self.tokens)


def read_bins(path: Path, header: str | None = None) -> tuple[Bins, float | None]:
    """Read a `datetime,count` file; infer the bin width from consecutive rows."""
    header = header if header is not None else _first_line(path)
    if len(_split_header(header)) < 2:
        raise TraceError(
            f"{path}: line 1: a binned-count file needs two columns (datetime, count), "
            f"got {header.strip()[:80]!r}"
        )
    with _csv_errors(path):
        frame = pd.read_csv(path, usecols=[0, 1], nrows=MAX_BINS + 1, **_CSV_OPTIONS)
    if len(frame) > MAX_BINS:
        raise TraceError(f"{path}: more than {MAX_BINS} bins; use wider bins or split the file")
    # Header cells may hold anything a quoted CSV field can, line breaks included: a
    # message names them as their repr where they are not plain.
    columns = [_column(str(name).strip()) for name in frame.columns]
    lines = np.arange(2, 2 + len(frame))
    labels, counts = frame.iloc[:, 0], frame.iloc[:, 1]
    blank = ((labels == "") & (counts == "")).to_numpy(dtype=bool)
    if blank.any():
        labels, counts, lines = labels[~blank], counts[~blank], lines[~blank]
    if len(labels) < 2:
        raise TraceError(
            f"{path}: needs at least two bins to infer the bin width (has {len(labels)})"
        )
    numeric = not np.isnan(_to_seconds(labels.iloc[:1], numeric=True)[0])
    seconds = _to_seconds(labels, numeric=numeric)
    bad = np.flatnonzero(np.isnan(seconds))
    if bad.size:
        i = bad[0]
        kind = f"a number of seconds (within ±{_MAX_ABS_TIME})" if numeric else "a datetime"
        raise TraceError(
            f"{path}: line {lines[i]}: {columns[0]} {_shown(labels.iloc[i])} is not {kind}"
        )
    values = pd.to_numeric(counts, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    bad = np.flatnonzero(~((values >= 0) & (values == np.floor(values))))
    if bad.size:
        i = bad[0]
        raise TraceError(
            f"{path}: line {lines[i]}: {columns[1]} {_shown(counts.iloc[i])} is not a "
            "non-negative whole request count"
        )
    heavy = np.flatnonzero(values > MAX_REQUESTS_PER_BIN)
    if heavy.size:
        i = heavy[0]
        raise TraceError(
            f"{path}: line {lines[i]}: {columns[1]} {values[i]:.0f} is more than "
            f"{MAX_REQUESTS_PER_BIN} requests in one bin; use narrower bins"
        )
    steps = np.diff(seconds)
    bin_s = float(steps[0])
    if not bin_s > 0:
        raise TraceError(
            f"{path}: line {lines[1]}: bin starts at or before the previous one; "
            "bins must be in time order"
        )
    if bin_s < MIN_BIN_S:
        raise TraceError(
            f"{path}: line {lines[1]}: bin is {bin_s:g} s after the previous one; bins must be "
            f"at least {MIN_BIN_S:g} s wide (are the times in seconds?)"
        )
    if bin_s + bin_s > MAX_SPAN_S:
        raise TraceError(
            f"{path}: line {lines[1]}: bin is {bin_s:.0f} s after the previous one; two bins "
            f"span more than the {MAX_SPAN_S / 86400:g} days a trace may; fix the row"
        )
    origin = float(seconds[0])
    start_s = seconds - origin
    far = np.flatnonzero(start_s + bin_s > MAX_SPAN_S)
    if far.size:
        i = far[0]
        raise TraceError(
            f"{path}: line {lines[i]}: bin starts {start_s[i]:.0f} s after the first, beyond "
            f"the {MAX_SPAN_S / 86400:g} days a trace may span; fix the row or split the file"
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
    return Bins(start_s, values.astype(np.int64), bin_s), None if numeric else origin


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
    lo = first
    while lo < last:
        hi = min(last, lo + _BINS_PER_BATCH)
        expected = bins.counts[lo:hi] * window.rate_scale
        # Heavy bins: fewer of them per batch, at least one.
        over = np.flatnonzero(np.cumsum(expected) > MAX_BATCH_REQUESTS)
        if over.size:
            hi = lo + max(1, int(over[0]))
            expected = expected[: hi - lo]
        counts = np.floor(expected).astype(np.int64)
        counts += arrivals_rng.random(counts.size) < expected - counts
        which = np.repeat(np.arange(lo, hi), counts)
        times = bins.start_s[which] + arrivals_rng.random(which.size) * bins.bin_s
        times.sort()
        keep = (times >= window.start_s) & (times < end_s)
        times = times[keep] - window.start_s
        prompt, output = tokens.sample(tokens_rng, int(counts.sum()))
        yield RequestBatch(times, prompt[keep], output[keep])
        lo = hi


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
