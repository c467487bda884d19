"""Trace loaders: every format, detection, cutting and scaling, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoscalerd.sim.traces import (
    MAX_BATCH_REQUESTS,
    EmpiricalTokens,
    LognormalTokens,
    RequestBatch,
    TraceError,
    TraceWindow,
    load_trace_text,
    open_trace,
    parse_duration_s,
)

ROOT = Path(__file__).resolve().parents[1]
AZURE_2023 = ROOT / "data" / "traces" / "azure_llm_2023_code.csv"
AZURE_2024_COUNTS = ROOT / "data" / "traces" / "azure_llm_2024_code_10s_counts.csv"


def collect(trace_batches: object) -> RequestBatch:
    batches = list(trace_batches)  # type: ignore[call-overload]
    if not batches:
        empty = np.empty(0)
        return RequestBatch(empty, empty.astype(np.int64), empty.astype(np.int64))
    return RequestBatch(
        np.concatenate([b.arrival_s for b in batches]),
        np.concatenate([b.prompt_tokens for b in batches]),
        np.concatenate([b.output_tokens for b in batches]),
    )


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- formats


def test_azure_2023_file_loads_whole_and_in_order() -> None:
    trace = open_trace(AZURE_2023)
    requests = collect(trace.batches())
    assert trace.format == "azure"
    assert len(requests) == 8819
    assert requests.arrival_s[0] == 0.0
    assert np.all(np.diff(requests.arrival_s) >= 0)
    # First rows: 18:17:03.9799600 (4808, 10), then 18:17:04.0319600 (3180, 8).
    assert requests.arrival_s[1] == pytest.approx(0.052, abs=1e-6)
    assert requests.prompt_tokens[:2].tolist() == [4808, 3180]
    assert requests.output_tokens[:2].tolist() == [10, 8]
    assert trace.origin_epoch_s == pytest.approx(1700158623.97996)
    # Replays are identical.
    again = collect(trace.batches())
    assert np.array_equal(requests.arrival_s, again.arrival_s)


def test_burstgpt_reads_its_columns_and_ignores_the_rest(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "burst.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,100,20,120,Conversation log\n"
        "6.5,GPT-4,300,0,300,API log\n",
    )
    trace = open_trace(path)
    requests = collect(trace.batches())
    assert trace.format == "burstgpt"
    assert requests.arrival_s.tolist() == [0.0, 1.5]
    assert requests.prompt_tokens.tolist() == [100, 300]
    assert requests.output_tokens.tolist() == [20, 0]


def test_mooncake_jsonl_in_milliseconds(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 100, "output_length": 7, "hash_ids": []},
    ]
    path = write(tmp_path, "mc.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    trace = open_trace(path)
    requests = collect(trace.batches())
    assert trace.format == "mooncake"
    assert requests.arrival_s.tolist() == [0.0, 1.5]
    assert requests.prompt_tokens.tolist() == [6955, 100]


def test_generic_csv_seconds_and_iso_datetimes(tmp_path: Path) -> None:
    seconds = write(tmp_path, "s.csv", "timestamp,prompt_tokens,output_tokens\n10.5,5,6\n12,7,8\n")
    requests = collect(open_trace(seconds).batches())
    assert requests.arrival_s.tolist() == [0.0, 1.5]
    iso = write(
        tmp_path,
        "iso.csv",
        "timestamp,prompt_tokens,output_tokens\n"
        "2024-05-10T00:00:00Z,5,6\n2024-05-10T00:00:02.25Z,7,8\n",
    )
    trace = open_trace(iso)
    assert collect(trace.batches()).arrival_s.tolist() == [0.0, 2.25]
    assert trace.origin_epoch_s == pytest.approx(1715299200.0)


def test_binned_counts_keep_every_bin_total(tmp_path: Path) -> None:
    path = write(tmp_path, "c.csv", "period,count\n2024-01-01 00:00,3\n2024-01-01 00:01,0\n"
                 "2024-01-01 00:02,5\n")  # fmt: skip
    trace = open_trace(path, tokens=LognormalTokens(100, 0.5, 10, 0.5))
    requests = collect(trace.batches())
    assert trace.format == "counts" and trace.bin_s == 60.0
    assert trace.window.duration_s == 180.0
    counts = np.bincount((requests.arrival_s // 60).astype(int), minlength=3)
    assert counts.tolist() == [3, 0, 5]
    assert np.all(np.diff(requests.arrival_s) >= 0)
    assert np.all(requests.prompt_tokens >= 1)


def test_azure_2024_counts_file_detected_with_its_odd_header() -> None:
    trace = open_trace(AZURE_2024_COUNTS, window=TraceWindow(duration_s=600))
    requests = collect(trace.batches())
    assert trace.format == "counts" and trace.bin_s == 10.0
    # The first 60 bins of the file: 146 + 238 + 268 + ...
    assert len(requests) > 0
    assert requests.arrival_s.max() < 600
    first_bin = np.count_nonzero(requests.arrival_s < 10)
    assert first_bin == 146


def test_a_missing_bin_row_is_an_empty_bin(tmp_path: Path) -> None:
    path = write(tmp_path, "gap.csv", "Time,n\n2024-01-01 00:00:00,2\n2024-01-01 00:00:30,4\n")
    trace = open_trace(path, fmt="counts")
    requests = collect(trace.batches())
    assert trace.bin_s == 30.0
    assert len(requests) == 6


def test_format_override(tmp_path: Path) -> None:
    # Two columns would be detected as counts; the user says otherwise and is told why not.
    path = write(tmp_path, "x.csv", "timestamp,prompt_tokens\n1,2\n")
    with pytest.raises(TraceError, match=r"x\.csv: line 1: header lacks output_tokens"):
        open_trace(path, fmt="generic")


# ---------------------------------------------------------------- cutting and scaling


def test_start_and_duration_cut_relative_to_the_first_request(tmp_path: Path) -> None:
    rows = "".join(f"{t},10,5\n" for t in range(100, 200))
    path = write(tmp_path, "s.csv", "timestamp,prompt_tokens,output_tokens\n" + rows)
    trace = open_trace(path, window=TraceWindow(start_s=10, duration_s=20))
    requests = collect(trace.batches())
    # Requests at 110..129 s, shifted to the window's start.
    assert requests.arrival_s.tolist() == [float(t) for t in range(20)]


def test_rate_scale_thins_and_copies_deterministically() -> None:
    base = len(collect(open_trace(AZURE_2023).batches()))
    half = collect(open_trace(AZURE_2023, window=TraceWindow(rate_scale=0.5, seed=1)).batches())
    assert abs(len(half) - base / 2) < 4 * np.sqrt(base)
    triple = open_trace(AZURE_2023, window=TraceWindow(rate_scale=3.0, seed=1))
    first, second = collect(triple.batches()), collect(triple.batches())
    assert len(first) == 3 * base
    assert np.array_equal(first.arrival_s, second.arrival_s)
    assert np.all(np.diff(first.arrival_s) >= 0)
    other_seed = collect(
        open_trace(AZURE_2023, window=TraceWindow(rate_scale=3.0, seed=2)).batches()
    )
    assert not np.array_equal(first.arrival_s, other_seed.arrival_s)


def test_binned_scale_keeps_the_total_in_expectation() -> None:
    window = TraceWindow(duration_s=3600, rate_scale=2.5, seed=3)
    scaled = collect(open_trace(AZURE_2024_COUNTS, window=window).batches())
    plain = collect(open_trace(AZURE_2024_COUNTS, window=TraceWindow(duration_s=3600)).batches())
    assert len(scaled) == pytest.approx(2.5 * len(plain), rel=0.01)


def test_tokens_from_a_request_trace_keep_pairs() -> None:
    source = open_trace(AZURE_2023)
    tokens = EmpiricalTokens.from_trace(source)
    trace = open_trace(AZURE_2024_COUNTS, window=TraceWindow(duration_s=120), tokens=tokens)
    requests = collect(trace.batches())
    pairs = set(zip(tokens.prompt_tokens.tolist(), tokens.output_tokens.tolist(), strict=True))
    drawn = zip(requests.prompt_tokens.tolist(), requests.output_tokens.tolist(), strict=True)
    assert all(pair in pairs for pair in drawn)


def test_tokens_from_is_for_binned_traces_only() -> None:
    tokens = LognormalTokens()
    with pytest.raises(TraceError, match="binned-count traces only"):
        open_trace(AZURE_2023, tokens=tokens)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("6h", 21600), ("2d", 172800), ("1h30m", 5400),
     ("1.5h", 5400)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "6x", "1h-2m", "abc"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_s(text)


# ---------------------------------------------------------------- malformed input


MALFORMED = [
    # (file name, content, expected message pieces)
    ("empty.csv", "", ["empty.csv: line 1: empty"]),
    ("header.csv", "a,b,c\n1,2,3\n", ["header.csv: line 1: unrecognised header", "--format"]),
    (
        "tokens.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.97,10,5\n2023-11-16 18:17:04.00,abc,5\n",
        ["tokens.csv: line 3: ContextTokens 'abc' is not a non-negative whole number"],
    ),
    (
        "negative.csv",
        "timestamp,prompt_tokens,output_tokens\n1,10,5\n2,10,5\n3,10,-1\n",
        ["negative.csv: line 4: output_tokens '-1'"],
    ),
    (
        "time.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,5\nyesterday,10,5\n",
        ["time.csv: line 3: TIMESTAMP 'yesterday' is not a datetime"],
    ),
    (
        "fields.csv",
        "timestamp,prompt_tokens,output_tokens\n1,10,5\n2,10,5,7\n",
        ["fields.csv: line 3:", "fields"],
    ),
    (
        "order.csv",
        "timestamp,prompt_tokens,output_tokens\n100,10,5\n200,10,5\n150,10,5\n",
        ["order.csv: line 4: arrives 50.0 s before an earlier row", "sort the file"],
    ),
    ("bad.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{oops\n',
     ["bad.jsonl: line 2: not JSON"]),
    ("key.jsonl", '{"timestamp": 0, "input_length": 1}\n', ["key.jsonl: line 1: missing key 'output_length'"]),
    ("count.csv", "Time,TIMESTAMP\n2024-05-10 00:00:00,146\n2024-05-10 00:00:10,x\n",
     ["count.csv: line 3: TIMESTAMP 'x' is not a non-negative whole request count"]),
    ("grid.csv", "Time,n\n2024-05-10 00:00:00,1\n2024-05-10 00:00:10,1\n2024-05-10 00:00:15,1\n",
     ["grid.csv: line 4: bin is 5 s after the previous one"]),
    ("one.csv", "Time,n\n2024-05-10 00:00:00,1\n", ["one.csv: needs at least two bins"]),
    ("label.csv", "Time,n\n2024-05-10 00:00:00,1\nnoon,1\n", ["label.csv: line 3: Time 'noon' is not a datetime"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "content", "pieces"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input_is_one_line_naming_file_line_and_problem(
    tmp_path: Path, name: str, content: str, pieces: list[str]
) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(TraceError) as caught:
        trace = open_trace(path)
        collect(trace.batches())
    message = str(caught.value)
    assert "\n" not in message
    for piece in pieces:
        assert piece in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        open_trace(tmp_path / "nope.csv")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "blob.csv"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="line 1: not UTF-8"):
        open_trace(path)


# ---------------------------------------------------------------- hostile input and limits


HOSTILE = [
    # Found by fuzzing: each once raised something other than TraceError, or loaded garbage.
    ("year1.csv", "timestamp,prompt_tokens,output_tokens\n0001-01-01T00:00:00Z,1,1\n"
     "2024-01-01T00:00:00Z,1,1\n", ["year1.csv: line 3:", "366 days"]),
    ("year2262.csv", "Time,n\n2024-01-01,1\n2262-05-01,1\n", ["year2262.csv: line 3:", "366 days"]),
    ("deep.jsonl", '{"timestamp": ' + "[" * 100_000 + "\n", ["deep.jsonl: line 1: not JSON"]),
    ("digits.jsonl", '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 1}\n',
     ["digits.jsonl: line 1: not JSON"]),
    ("huge.jsonl", '{"timestamp": 0, "input_length": 99999999999999999999, "output_length": 1}\n',
     ["huge.jsonl: line 1: input_length 99999999999999999999 is more than 100000000 tokens"]),
    ("hugetime.jsonl", '{"timestamp": 1' + "0" * 400 + ', "input_length": 1, "output_length": 1}\n',
     ["hugetime.jsonl: line 1: timestamp", "not a finite number"]),
    ("huge.csv", "timestamp,prompt_tokens,output_tokens\n1,99999999999999999999,1\n",
     ["huge.csv: line 2: prompt_tokens '99999999999999999999' is more than 100000000 tokens"]),
    ("inf.csv", "timestamp,prompt_tokens,output_tokens\n1,1,1\ninf,1,1\n",
     ["inf.csv: line 3: timestamp 'inf' is not a finite number of seconds"]),
    ("far.csv", "timestamp,prompt_tokens,output_tokens\n0,1,1\n1e12,1,1\n",
     ["far.csv: line 3:", "366 days"]),
    ("bigbin.csv", "Time,n\n2024-01-01 00:00,1700000000\n2024-01-01 00:01,1\n",
     ["bigbin.csv: line 2: n 1700000000", "5000000 requests in one bin"]),
    ("span.csv", "Time,n\n0,1\n1,1\n100000000000,1\n", ["span.csv: line 4:", "366 days"]),
    ("infbin.csv", "Time,n\n0,1\ninf,1\n", ["infbin.csv: line 3: Time 'inf' is not"]),
    ("tinybin.csv", "Time,n\n0,1\n1e-9,1\n", ["tinybin.csv: line 3:", "at least 0.001 s"]),
    ("quoted.csv", '"Time,n"\n0,1\n1,1\n', ["quoted.csv: line 1:"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "content", "pieces"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_a_trace_error(
    tmp_path: Path, name: str, content: str, pieces: list[str]
) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(TraceError) as caught:
        collect(open_trace(path).batches())
    message = str(caught.value)
    assert "\n" not in message
    for piece in pieces:
        assert piece in message, message


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("late.csv", b"timestamp,prompt_tokens,output_tokens\n1,1,1\n2,\xff\xfe,1\n"),
        ("bins.csv", b"Time,n\n0,1\n1,\xff\n"),
    ],
)
def test_bytes_that_are_not_utf8_after_the_header(
    tmp_path: Path, name: str, content: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError, match=rf"{name}: .*not UTF-8"):
        collect(open_trace(path).batches())


def test_datetimes_beyond_the_nanosecond_range_still_load(tmp_path: Path) -> None:
    path = write(tmp_path, "old.csv", "Time,n\n1677-01-01,1\n1677-01-02,2\n")
    trace = open_trace(path)
    assert trace.bin_s == 86400.0 and len(collect(trace.batches())) == 3
    assert trace.origin_epoch_s == -9_246_096_000.0  # 1677-01-01, before the nanosecond range


def test_header_names_with_spaces_around_them(tmp_path: Path) -> None:
    path = write(tmp_path, "spaces.csv", "timestamp , prompt_tokens,output_tokens \n1,2,3\n")
    assert collect(open_trace(path).batches()).prompt_tokens.tolist() == [2]


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (TraceWindow(rate_scale=float("nan")), "rate scale must be"),
        (TraceWindow(rate_scale=float("inf")), "rate scale must be"),
        (TraceWindow(rate_scale=1e9), "rate scale must be"),
        (TraceWindow(duration_s=1e12), "366 days"),
        (TraceWindow(start_s=float("nan")), "start must be"),
    ],
)
def test_absurd_windows_are_refused(window: TraceWindow, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        open_trace(AZURE_2023, window=window)


def test_a_big_scale_is_copied_in_bounded_batches() -> None:
    trace = open_trace(AZURE_2023, window=TraceWindow(duration_s=300, rate_scale=1000))
    sizes = [len(batch) for batch in trace.batches()]
    assert sum(sizes) > 100_000
    assert max(sizes) <= 2 * MAX_BATCH_REQUESTS


def test_load_trace_text_reads_every_request_or_raises_trace_error() -> None:
    requests = load_trace_text("timestamp,prompt_tokens,output_tokens\n1,2,3\n4,5,6\n")
    assert requests.arrival_s.tolist() == [0.0, 3.0]
    assert requests.output_tokens.tolist() == [3, 6]
    counts = load_trace_text(b"Time,n\n0,2\n10,1\n", window=TraceWindow(seed=4))
    assert len(counts) == 3
    with pytest.raises(TraceError, match=r"trace\.jsonl: line 1: not JSON"):
        load_trace_text(b"{oops\n", ".jsonl")


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("Time,n\n2024-01-01 00:00,1700000000\n2024-01-01 00:01,1\n", [], "in one bin"),
        ("timestamp,prompt_tokens,output_tokens\n0,1,1\n1e12,1,1\n", [], "366 days"),
        ("timestamp,prompt_tokens,output_tokens\n0,1,1\n", ["--rate-scale", "inf"], "rate scale"),
        ("timestamp,prompt_tokens,output_tokens\n0,1,1\n", ["--duration", "999999d"], "366 days"),
    ],
)
def test_the_backtest_command_turns_a_trace_error_into_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, args: list[str], message: str
) -> None:
    from autoscalerd.cli import main

    path = write(tmp_path, "t.csv", content)
    assert main(["backtest", "--trace", str(path), "--no-progress", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autoscalerd: backtest: ") and message in err, err
    assert len(err.splitlines()) == 1


def test_a_trace_thinned_to_nothing_is_empty_not_a_crash(tmp_path: Path) -> None:
    path = write(tmp_path, "two.csv", "timestamp,prompt_tokens,output_tokens\n0,1,1\n0,1,1\n")
    # Seed 1 at scale 0.5 keeps neither request.
    assert len(collect(open_trace(path, window=TraceWindow(rate_scale=0.5, seed=1)).batches())) == 0


@pytest.mark.parametrize("kind", ["azure", "mooncake", "counts", "counts-lognormal"])
def test_an_opened_trace_pickles_and_replays_the_same(kind: str) -> None:
    # `autoscalerd backtest --jobs N` sends the opened trace to worker processes, which
    # read the file again themselves: a pickled trace must replay request for request.
    import pickle

    window = TraceWindow(start_s=120.0, duration_s=900.0, rate_scale=0.7, seed=3)
    if kind == "azure":
        trace = open_trace(AZURE_2023, window=window)
    elif kind == "mooncake":
        trace = open_trace(
            ROOT / "data" / "traces" / "mooncake_fast25_synthetic.jsonl", window=window
        )
    elif kind == "counts":
        trace = open_trace(
            AZURE_2024_COUNTS,
            window=window,
            tokens=EmpiricalTokens.from_trace(open_trace(AZURE_2023)),
        )
    else:
        trace = open_trace(
            AZURE_2024_COUNTS, window=window, tokens=LognormalTokens(2048, 1.0, 28, 2.0)
        )
    copy = pickle.loads(pickle.dumps(trace))
    mine, theirs = collect(trace.batches()), collect(copy.batches())
    assert len(mine) > 100
    assert np.array_equal(mine.arrival_s, theirs.arrival_s)
    assert np.array_equal(mine.prompt_tokens, theirs.prompt_tokens)
    assert np.array_equal(mine.output_tokens, theirs.output_tokens)
    assert copy.describe() == trace.describe()
