"""State files: any file is a Snapshot whose every restored deployment decides without an
exception, or one StateError. A file that decodes but would poison decide() must be
refused at load, not crash the first tick after a restart."""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autoscalerd import state
from autoscalerd.decide.forgetting import Sums
from tests.fuzz import budget, seeds
from tests.fuzz.mutations import Mutator
from tests.fuzz.strategies import HOSTILE_NUMBERS, mutants
from tests.fuzz.targets import TARGETS

TARGET = TARGETS["state"]
MUTATOR = Mutator(TARGET.seeds(), TARGET.structure)


# Most values are plausible (times and rates of a running daemon, small counts); some are
# extreme yet finite, and a few hostile, so that most states decode and reach decide().
TYPICAL, EXTREME, HOSTILE = 40, 3, 1
FLOATS = (st.floats(0.0, 1e4), st.sampled_from([1e-300, 1e12, -1.0, -1e12, 0.0]), HOSTILE_NUMBERS)
INTS = (st.integers(0, 50), st.sampled_from([10**6, 2**31, -1]), HOSTILE_NUMBERS)


def _weighted(typical: Any, extreme: Any, hostile: Any) -> st.SearchStrategy[Any]:
    choices = [typical] * TYPICAL + [extreme] * EXTREME + [hostile] * HOSTILE
    return st.sampled_from(choices).flatmap(lambda strategy: strategy)


def values_of(kind: Any) -> st.SearchStrategy[Any]:
    """Values of the type `kind` (a dataclass of the state, or a part of one)."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        parts = {f.name: values_of(hints[f.name]) for f in dataclasses.fields(kind)}
        return st.fixed_dictionaries(parts).map(lambda fields: kind(**fields))
    if origin in (typing.Union, types.UnionType):
        return st.one_of(st.none(), *(values_of(a) for a in args if a is not type(None)))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(values_of(args[0]), max_size=6).map(tuple)
    if origin is tuple:
        return st.tuples(*(values_of(a) for a in args))
    if origin is dict:
        return st.dictionaries(st.text(max_size=4), values_of(args[1]), max_size=2)
    if kind is float:
        return _weighted(*FLOATS)
    if kind is int:
        return _weighted(*INTS)
    if kind is bool:
        return st.booleans()
    if kind is str:
        return st.sampled_from(["holt_winters", "holt", "ewma", "add", "mul", "", "x"])
    raise TypeError(f"no strategy for {kind!r}")


# ---------------------------------------------------------------- known bugs, found by fuzzing
# Each is a state-file bug not fixed yet; the tests below are marked to fail until it is.


def _saved_with(path: list[str], value: Any) -> bytes:
    """The learned-state seed file with one field of app/dep's state replaced."""
    document = json.loads(seeds.state_files()[1])
    node = document["deployments"]["app/dep"]["state"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = copy.deepcopy(value)
    return json.dumps(document).encode()


KNOWN = {
    # Forgotten sums whose length is not their kind's: decide() unpacks or zips them.
    "burst-weights-length": (["burst", "weights", "values"], [1.0]),
    "guard-sums-length": (["guard", "fast", "values"], [1.0, 2.0, 3.0]),
    "tpot-sums-length": (["replica_model", "tpot", "values"], [1.0, 2.0]),
    "prefill-sums-length": (["replica_model", "prefill", "values"], [1.0]),
    "prompt-bounds-vs-mix": (["replica_model", "prompt_bounds"], [1.0, 2.0, 3.0, 4.0, 5.0]),
    # Slots per replica that round the service rate to zero: capacity.py divides by it.
    "learned-slots-near-zero": (["replica_model", "slots"], 1e-300),
    # Output tokens over a vanishing request count: an infinite mean output, an infinite
    # slot time, a service rate of zero that the backlog sizing divided by.
    "output-mean-over-no-requests": (["replica_model", "output", "values"], [1e-320, 247750.0]),
}


KNOWN_FILES = [_saved_with(path, value) for path, value in KNOWN.values()]
_LEARNED = state.decode(seeds.state_files()[1].decode()).deployments["app/dep"]
# The first of KNOWN as a value: burst weights of one bin.
SHORT_BURST_SUMS = dataclasses.replace(
    _LEARNED,
    state=_LEARNED.state.with_(
        burst=dataclasses.replace(_LEARNED.state.burst, weights=Sums((1.0,)))
    ),
)


def known_bugs_first(test: Any) -> Any:
    """The bugs fuzzing found, as explicit examples: every run tries them first."""
    for data in reversed(KNOWN_FILES):
        test = example(data)(test)
    return test


@budget.fuzz_unshrunk(budget.MUTANTS)
@given(mutants(MUTATOR))
@known_bugs_first
def test_mutants_of_written_state_files_restore_or_are_one_state_error(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


@budget.fuzz_unshrunk(budget.BUILT)
@given(values_of(state.SavedDeployment))
@example(SHORT_BURST_SUMS)
def test_any_typed_saved_state_restores_or_is_one_state_error(
    saved: state.SavedDeployment,
) -> None:
    """Every field of its type, values from plausible to hostile: what a file that decodes
    can hold after a bug, a disk error or an edit by hand."""
    snapshot = state.Snapshot(saved.saved_at_s, 1.7e9, None, {"app/dep": saved})
    TARGET.outcome(state.encode(snapshot).encode(), budget.CPU_LIMIT_S)


@pytest.mark.parametrize(("path", "value"), KNOWN.values(), ids=KNOWN.keys())
def test_what_fuzzing_found_is_now_one_state_error(path: list[str], value: Any) -> None:
    TARGET.outcome(_saved_with(path, value), budget.CPU_LIMIT_S)


# Raw files fuzzing found, each tried by the mutation test too.
KNOWN_RAW = {
    # A key with a line break in it: the "unknown field" error printed it raw, two lines.
    "key-with-a-line-break": b'{"format":"autoscalerd-state","version":2,"saved_at_s":0.0,'
    b'"saved_wall_s":0.0,"clock_origin_s":null,"deployme\\nts":{},"dropped":{}}',
}


@pytest.mark.parametrize("data", list(KNOWN_RAW.values()), ids=list(KNOWN_RAW))
def test_raw_files_fuzzing_found_are_one_state_error(data: bytes) -> None:
    assert TARGET.outcome(data, budget.CPU_LIMIT_S) == "allowed"  # one line, or it raises
    with pytest.raises(state.StateError, match=r"^'deployme\\nts': unknown field$"):
        state.decode(data.decode())


def test_every_seed_state_file_restores() -> None:
    for data in seeds.state_files():
        assert TARGET.outcome(data) == "ok"
