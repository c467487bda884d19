"""Hypothesis strategies for hostile values: numbers that are not readings, JSON of any
shape, and text with what breaks quoting and encodings."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.fuzz.mutations import Mutator

# Numbers a reading or a setting must not be taken as: NaN, ±Inf, negative, beyond float.
HOSTILE_NUMBERS: st.SearchStrategy[Any] = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        -1,
        -1.0,
        -0.0,
        0,
        5e-324,
        1e-300,
        1e300,
        1e308,
        -1e308,
        2**53 + 1,
        2**63,
        10**30,
        -(10**30),
        10**400,
    ]
)
NUMBERS: st.SearchStrategy[Any] = st.one_of(
    HOSTILE_NUMBERS,
    st.integers(),
    st.floats(),
    st.floats(min_value=0.0, max_value=1e4),
)
TEXT: st.SearchStrategy[str] = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "\n", '"', "\\", "\x00", "\ud800", "NaN", "+Inf", "a/b", "a#b#c"]),
)
SCALARS: st.SearchStrategy[Any] = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)


def json_values(keys: st.SearchStrategy[str] = TEXT, leaves: int = 20) -> st.SearchStrategy[Any]:
    """Any JSON value (NaN and infinities included, as json.loads reads them)."""
    return st.recursive(
        SCALARS,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5)
        ),
        max_leaves=leaves,
    )


def maybe(
    strategy: st.SearchStrategy[Any], keys: st.SearchStrategy[str] = TEXT
) -> st.SearchStrategy[Any]:
    """Mostly `strategy`, sometimes any other JSON value in its place."""
    return st.one_of(strategy, strategy, strategy, json_values(keys, leaves=4))


def mutants(mutator: Mutator) -> st.SearchStrategy[bytes]:
    """Mutants of the mutator's seeds, driven by hypothesis's randomness so that they shrink."""
    return st.randoms(use_true_random=False).map(mutator.mutate)
