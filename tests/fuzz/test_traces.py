"""Trace files: mutants of the shipped traces' heads, and rows built from hostile cells,
load into sane requests or fail with one TraceError naming the file."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import budget
from tests.fuzz.mutations import HOSTILE_NUMBERS, Mutator
from tests.fuzz.strategies import TEXT, mutants
from tests.fuzz.targets import TARGETS

TARGET = TARGETS["traces"]
MUTATOR = Mutator(TARGET.seeds(), TARGET.structure)
HEADERS = [
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "timestamp,prompt_tokens,output_tokens",
    "Time,TIMESTAMP",
    "period,count",
]
CELLS = st.one_of(
    st.sampled_from([number.decode("utf-8", "replace") for number in HOSTILE_NUMBERS]),
    st.sampled_from(["2024-05-10 00:00:00", "2024-05-10T00:00:10Z", "0001-01-01", "1677-09-21"]),
    st.sampled_from(
        ["9999-12-31T23:59:59", "2024-02-30", '"', '""', "ChatGPT", "Conversation log"]
    ),
    st.integers(-5, 10**6).map(str),
    st.floats(min_value=0, max_value=1e10).map(repr),
    TEXT,
)


@st.composite
def csv_traces(draw: st.DrawFn) -> bytes:
    header = draw(st.sampled_from(HEADERS))
    columns = header.count(",") + 1
    rows = [
        ",".join(draw(st.lists(CELLS, min_size=columns - 1, max_size=columns + 1)))
        for _ in range(draw(st.integers(0, 8)))
    ]
    return "\n".join([header, *rows]).encode("utf-8", "surrogatepass") + b"\n"


@st.composite
def jsonl_traces(draw: st.DrawFn) -> bytes:
    keys = st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"])
    values = st.one_of(
        st.integers(-5, 10**30), st.floats(), st.none(), st.booleans(), TEXT, st.just([1, 2])
    )
    rows = draw(st.lists(st.dictionaries(keys, values, min_size=2, max_size=4), max_size=8))
    return "\n".join(json.dumps(row) for row in rows).encode("utf-8", "surrogatepass") + b"\n"


# A warning on stderr (pandas, numpy, an unclosed file) is as visible to a user as an error.
@pytest.mark.filterwarnings("error")
@budget.fuzz(budget.MUTANTS)
@given(mutants(MUTATOR))
def test_mutants_of_shipped_traces_load_or_are_one_trace_error(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


@pytest.mark.filterwarnings("error")
@budget.fuzz(budget.BUILT)
@given(st.one_of(csv_traces(), jsonl_traces()))
def test_rows_of_hostile_cells_load_or_are_one_trace_error(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


# What the long runs found, each a one-line TraceError now.
KNOWN = [
    # A binned-count file whose header's count column is a quoted field with line breaks:
    # the message named the column as it was, breaks and all.
    b'period,"count\n1,2\n2"\n2024-05-10 00:00:00,x\n2024-05-10 00:01:00,1\n',
]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("data", KNOWN)
def test_known_trace_findings_are_one_trace_error(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)
