"""Prometheus' HTTP API answers into the prometheus sensor's readings: any answer is
samples or one PrometheusError line; whatever the samples, the round's answers and every
deployment's load read from them hold no NaN, no infinity and no negative number."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import budget
from tests.fuzz.mutations import Mutator
from tests.fuzz.strategies import mutants
from tests.fuzz.targets import TARGETS

TARGET = TARGETS["prometheus_api"]
MUTATOR = Mutator(TARGET.seeds(), TARGET.structure)
SERIES = {"application": "llm", "deployment": "LlmReplica", "replica": "r1"}


def vector(values: list[tuple[dict[str, str], str]]) -> bytes:
    result = [{"metric": labels, "value": [1796150000.5, value]} for labels, value in values]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


# What fuzzing found: two rates near float's limit summed to an infinite token rate, and
# a bucket count near it left a per-tick histogram of infinities and NaN.
NEAR_LIMIT_RATES = vector([(SERIES, "1e308"), ({**SERIES, "replica": "r2"}, "0")])
NEAR_LIMIT_BUCKET = vector(
    [({**SERIES, "le": le}, count) for le, count in (("0.1", "3"), ("0.5", "1e308"), ("+Inf", "9"))]
)

VALUES = st.one_of(
    st.floats().map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e308", "0", "1", "x", ""]),
)
LABELS = st.fixed_dictionaries(
    {"application": st.sampled_from(["llm", "other", ""])},
    optional={
        "deployment": st.sampled_from(["LlmReplica", "x"]),
        "le": st.sampled_from(["0.1", "1", "+Inf", "NaN", "-1", "x"]),
        "replica": st.sampled_from(["r1", "r2", ""]),
    },
)


@budget.fuzz_unshrunk(budget.MUTANTS)
@given(mutants(MUTATOR))
@example(NEAR_LIMIT_RATES)
@example(NEAR_LIMIT_BUCKET)
def test_mutants_of_prometheus_answers_read_as_sane_readings(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


@budget.fuzz_unshrunk(budget.BUILT)
@given(st.lists(st.tuples(LABELS, VALUES), max_size=12))
def test_any_vector_of_series_reads_as_sane_readings(
    values: list[tuple[dict[str, str], str]],
) -> None:
    TARGET.outcome(vector(values), budget.CPU_LIMIT_S)


def test_every_seed_answer_is_read() -> None:
    outcomes = [TARGET.outcome(seed) for seed in TARGET.seeds()]
    assert outcomes.count("ok") == len(outcomes)
