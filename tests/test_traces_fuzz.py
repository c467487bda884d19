"""Trace loaders against mutated files: every input either loads into sane requests or
fails with a one-line TraceError naming the file, never another exception.

Each example starts from a valid file of one of the formats the loaders accept and applies
a few mutations: a field replaced by a hostile token, bytes inserted or cut, lines
repeated, swapped or dropped."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscalerd.sim.traces import (
    MAX_TOKENS,
    TraceError,
    TraceWindow,
    load_trace_text,
)

HOSTILE_TOKENS = [
    "", " ", "-1", "0", "-0", "1.5", "1e309", "-1e309", "inf", "-inf", "nan", "NaN", "NaT",
    "99999999999999999999", "1" + "0" * 400, "9" * 5000, "1700000000", "500000", "1e-9",
    "1e300", "0x10", "1_000", "\u0661\u0662", "0001-01-01", "9999-12-31T23:59:59",
    "1677-09-21", "2262-04-12", "2024-02-30", "2024-01-01T24:00:00", "2024-01-01 00:00:00+99:00",
    '"', '""', "'", "[" * 1000, "{" * 1000, '{"a":' * 50, "\x00", "\ufeff", "\u00e9", "true",
    "null", "[]", "{}", "1,2", "\r", "\t", "\\", "#", "\n\n\n",
]  # fmt: skip
HOSTILE_BYTES = [b"\xff", b"\xc3", b"\x80", b"\xfe\xff", b"\x00", b"\r\n", b",", b'"', b"\n"]


@st.composite
def valid_trace(draw: st.DrawFn) -> tuple[str, str]:
    """(text, file suffix) of a valid trace of a random format."""
    kind = draw(st.sampled_from(["generic", "azure", "burstgpt", "mooncake", "bins", "nbins"]))
    rows = draw(st.integers(2, 12))
    gaps = draw(st.lists(st.floats(0, 20, allow_nan=False), min_size=rows, max_size=rows))
    times = np.cumsum(gaps)
    tokens = draw(st.lists(st.integers(0, 9000), min_size=2 * rows, max_size=2 * rows))
    prompts, outputs = tokens[:rows], tokens[rows:]
    base = 1_700_000_000.0
    if kind == "generic":
        lines = ["timestamp,prompt_tokens,output_tokens"]
        lines += [f"{t:.3f},{p},{o}" for t, p, o in zip(times, prompts, outputs, strict=True)]
    elif kind == "azure":
        stamps = np.datetime64("2023-11-16T18:17:03") + (times * 1e6).astype("timedelta64[us]")
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
        lines += [
            f"{str(s).replace('T', ' ')},{p},{o}"
            for s, p, o in zip(stamps, prompts, outputs, strict=True)
        ]
    elif kind == "burstgpt":
        lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
        lines += [
            f"{t:g},ChatGPT,{p},{o},{p + o},Conversation log"
            for t, p, o in zip(times, prompts, outputs, strict=True)
        ]
    elif kind == "mooncake":
        return "\n".join(
            json.dumps(
                {"timestamp": int(t * 1000), "input_length": p, "output_length": o, "hash_ids": [1]}
            )
            for t, p, o in zip(times, prompts, outputs, strict=True)
        ) + "\n", ".jsonl"
    else:
        bin_s = draw(st.sampled_from([1, 10, 60]))
        counts = [p % 40 for p in prompts]
        if kind == "bins":
            start = np.datetime64("2024-05-10T00:00:00")
            lines = ["Time,n"] + [
                f"{str(start + np.timedelta64(i * bin_s, 's')).replace('T', ' ')},{c}"
                for i, c in enumerate(counts)
            ]
        else:
            lines = ["period,count"] + [f"{base + i * bin_s:.0f},{c}" for i, c in enumerate(counts)]
    return "\n".join(lines) + "\n", ".csv"


@st.composite
def mutated_trace(draw: st.DrawFn) -> tuple[bytes, str]:
    text, suffix = draw(valid_trace())
    lines = text.split("\n")
    for _ in range(draw(st.integers(0, 4))):
        what = draw(st.sampled_from(["field", "field", "swap", "repeat", "drop"]))
        row = draw(st.integers(0, len(lines) - 1))
        if what == "field":
            sep = ", " if suffix == ".jsonl" else ","
            fields = lines[row].split(sep)
            column = draw(st.integers(0, max(0, len(fields) - 1)))
            token = draw(st.sampled_from(HOSTILE_TOKENS))
            if suffix == ".jsonl" and ": " in fields[column]:
                key, _, _ = fields[column].partition(": ")
                fields[column] = f"{key}: {token}"
            else:
                fields[column] = token
            lines[row] = sep.join(fields)
        elif what == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[row], lines[other] = lines[other], lines[row]
        elif what == "repeat":
            lines[row:row] = [lines[row]] * draw(st.integers(1, 3))
        elif what == "drop" and len(lines) > 1:
            del lines[row]
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(data)))
        if draw(st.booleans()):
            data = data[:at] + draw(st.sampled_from(HOSTILE_BYTES)) + data[at:]
        else:
            data = data[:at] + data[at + draw(st.integers(1, 40)) :]
    return data, suffix


WINDOWS = st.builds(
    TraceWindow,
    start_s=st.sampled_from([0.0, 5.0]),
    duration_s=st.sampled_from([None, 30.0]),
    rate_scale=st.sampled_from([0.5, 1.0, 2.5]),
    seed=st.integers(0, 3),
)


# A warning on stderr (pandas, numpy, an unclosed file) is as visible to a user as an error.
@pytest.mark.filterwarnings("error")
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated_trace(), WINDOWS)
def test_a_mutated_trace_loads_or_is_one_trace_error(
    trace: tuple[bytes, str], window: TraceWindow
) -> None:
    data, suffix = trace
    try:
        requests = load_trace_text(data, suffix, window=window)
    except TraceError as exc:
        message = str(exc)
        assert "\n" not in message and f"trace{suffix}" in message, message
        return
    if window.duration_s is not None:
        assert np.all(requests.arrival_s < window.duration_s)
    assert np.all(np.isfinite(requests.arrival_s)) and np.all(requests.arrival_s >= 0)
    assert np.all(np.diff(requests.arrival_s) >= 0)
    for tokens in (requests.prompt_tokens, requests.output_tokens):
        assert tokens.dtype == np.int64
        assert np.all((tokens >= 0) & (tokens <= MAX_TOKENS))
