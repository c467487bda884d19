"""The HTTP API's input checks: any body, override or Authorization header is accepted as
meant or refused with a one-line 4xx that never shows the token."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from autoscalerd import server
from tests.fuzz import budget
from tests.fuzz.mutations import Mutator
from tests.fuzz.strategies import NUMBERS, TEXT, json_values, mutants
from tests.fuzz.targets import (
    HTTP_TOKENS,
    TARGETS,
    check_api_error,
    check_authorization,
    check_override,
)

TARGET = TARGETS["http"]
MUTATOR = Mutator(TARGET.seeds(), TARGET.structure)
OVERRIDES = st.dictionaries(
    st.sampled_from(["replicas", "ttl_s"]) | TEXT,
    NUMBERS | json_values(leaves=4),
    max_size=3,
)
HEADERS = st.one_of(
    st.text(),
    st.builds(
        lambda scheme, space, token: f"{scheme}{space}{token}",
        st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", "", "Bearer\t"]),
        st.sampled_from([" ", "  ", "\t", ""]),
        st.one_of(st.sampled_from(HTTP_TOKENS), st.text()),
    ),
)
TOKENS = st.text(min_size=1).map(str.strip).filter(bool)


@budget.fuzz(budget.MUTANTS)
@given(mutants(MUTATOR))
def test_mutants_of_real_requests_are_taken_or_a_4xx(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


@budget.fuzz(budget.BUILT)
@given(st.one_of(st.binary(max_size=64), json_values().map(lambda v: json.dumps(v).encode())))
def test_any_body_is_an_object_or_a_4xx(raw: bytes) -> None:
    try:
        body = server.json_body(raw)
    except server.ApiError as exc:
        check_api_error(exc)
        return
    assert isinstance(body, dict)
    with contextlib.suppress(server.ApiError):
        check_override(body)


@budget.fuzz(budget.BUILT)
@given(OVERRIDES)
def test_any_override_is_a_count_and_a_ttl_or_a_4xx(body: dict[str, Any]) -> None:
    with contextlib.suppress(server.ApiError):
        check_override(body)


@budget.fuzz(budget.BUILT)
@given(HEADERS)
def test_any_authorization_header_is_checked_without_an_exception(header: str) -> None:
    check_authorization(header)


@budget.fuzz(budget.BUILT)
@given(TOKENS, st.sampled_from(["Bearer", "bearer"]), st.sampled_from([" ", "  "]))
def test_the_token_itself_is_always_let_in(token: str, scheme: str, space: str) -> None:
    server.check_bearer(f"{scheme}{space}{token}", token)
