"""Config files: any YAML is a Config that decides without an exception, or a ConfigError
with one line per problem naming the file."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import annotated_types
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from autoscalerd.config import Config, DeploymentConfig
from tests.fuzz import budget
from tests.fuzz.mutations import Mutator
from tests.fuzz.strategies import HOSTILE_NUMBERS, SCALARS, TEXT, json_values, mutants
from tests.fuzz.targets import TARGETS

TARGET = TARGETS["config"]
MUTATOR = Mutator(TARGET.seeds(), TARGET.structure)
# Most values are what a user could write: within each field's declared range, typical or
# extreme (1e-300 s, 1e300 replicas). Now and then one is hostile: NaN, ±Inf, out of range,
# of another type, or a key no model has. Most documents validate and get decided on.
TYPICAL, EXTREME, HOSTILE = 30, 4, 1
EXTREMES = (5e-324, 1e-300, 1e-9, 1e-3, 1e9, 1e15, 1e300, 1.7e308)
MAX_MODEL_DEPTH = 3
UNKNOWN_KEYS = st.one_of(
    st.sampled_from(["zz_unknown", "tick s", "z\n", "a\rb", "\ud800", '"', "", "Replicas"]),
    st.text(max_size=8),
)


def _weighted(typical: Any, extreme: Any, hostile: Any) -> st.SearchStrategy[Any]:
    choices = [typical] * TYPICAL + [extreme] * EXTREME + [hostile] * HOSTILE
    return st.sampled_from(choices).flatmap(lambda strategy: strategy)


def _range(field: FieldInfo | None) -> tuple[float | None, float | None, bool, bool]:
    low = high = None
    open_low = open_high = False
    for rule in field.metadata if field is not None else ():
        if isinstance(rule, annotated_types.Gt):
            low, open_low = rule.gt, True
        elif isinstance(rule, annotated_types.Ge):
            low = rule.ge
        elif isinstance(rule, annotated_types.Lt):
            high, open_high = rule.lt, True
        elif isinstance(rule, annotated_types.Le):
            high = rule.le
    return low, high, open_low, open_high


def _numbers(kind: type, field: FieldInfo | None) -> st.SearchStrategy[Any]:
    low, high, open_low, open_high = _range(field)

    def inside(value: float) -> bool:
        above = low is None or (value > low if open_low else value >= low)
        below = high is None or (value < high if open_high else value <= high)
        return above and below

    if kind is int:
        start = int(low) + int(open_low) if low is not None else -5
        typical: st.SearchStrategy[Any] = st.integers(start, start + 40)
        extreme = [v for v in (10**6, 10**12, 2**63, 10**30) if inside(v)]
    else:
        lowest = max(low if low is not None else 0.0, 0.001)
        highest = min(high if high is not None else 1000.0, 1000.0)
        typical = st.floats(lowest, highest).filter(inside)
        extreme = [v for v in EXTREMES if inside(v)]
    return _weighted(typical, st.sampled_from(extreme) if extreme else typical, HOSTILE_NUMBERS)


def values_for(
    annotation: Any, field: FieldInfo | None = None, depth: int = 0
) -> st.SearchStrategy[Any]:
    """Values for a field of this type and range."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    anything = json_values(leaves=4)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if depth >= MAX_MODEL_DEPTH:
            return st.fixed_dictionaries({})
        return _weighted(documents(annotation, depth + 1), st.just({}), anything)
    if origin is Literal:
        return _weighted(st.sampled_from(args), st.sampled_from(args), st.just("bogus"))
    if origin in (typing.Union, types.UnionType):
        options = [values_for(a, field, depth) for a in args if a is not type(None)]
        return st.one_of(st.none(), *options) if type(None) in args else st.one_of(*options)
    if origin is tuple:
        return _weighted(
            st.lists(values_for(args[0], field, depth), max_size=2), anything, anything
        )
    if annotation is bool:
        return _weighted(st.booleans(), st.booleans(), anything)
    if annotation in (int, float):
        return _numbers(annotation, field)
    if annotation is str:
        default = field.default if field is not None else None
        typical = st.just(default) if isinstance(default, str) else st.just("llm/chat")
        return _weighted(typical, TEXT, anything)
    return anything


def documents(model: type[BaseModel], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping of some of `model`'s fields; a deployment always has its name."""
    fields = {
        name: values_for(field.annotation, field, depth)
        for name, field in model.model_fields.items()
    }
    if model is Config:  # one or two deployments, each decided on
        deployments = st.lists(documents(DeploymentConfig, depth + 1), min_size=1, max_size=2)
        fields.pop("deployments")
        return st.fixed_dictionaries({"deployments": deployments}, optional=fields)
    if model is DeploymentConfig:
        fields.pop("name")
        return st.fixed_dictionaries(
            {"name": st.sampled_from(["llm/chat", "app/dep", "a/b/c"]) | TEXT}, optional=fields
        )
    mapping = st.fixed_dictionaries({}, optional=fields)
    # A key the model does not have: a typo, or a name no error line can show as it is.
    unknown = st.tuples(mapping, st.dictionaries(UNKNOWN_KEYS, SCALARS, min_size=1, max_size=1))
    return _weighted(mapping, mapping, unknown.map(lambda parts: {**parts[0], **parts[1]}))


# ---------------------------------------------------------------- known bugs, found by fuzzing
# Each is a config bug not fixed yet; its test below is marked to fail until it is.

KNOWN = {
    # yaml.safe_load raises ValueError (not a YAMLError) for an integer past 4300 digits.
    "integer-of-4400-digits": b"tick_s: " + b"9" * 4400 + b"\n",
    # A hexadecimal one reads fine, but has more than 4300 digits to print in the error.
    "hex-integer-of-4400-digits": b"deployments: [{name: a/b, slo: {attainment_target: 0x"
    + b"9" * 4400
    + b"}}]\n",
    # The key is shown as it is: its newline breaks the one-line error in two.
    "unknown-key-with-a-newline": b'defaults:\n  forecast:\n    "z\\n": 1\n',
    # At wall-clock times (1.7e9 s) bucket_start_s + bucket_s rounds back to itself, and
    # closing the forecaster's buckets never ends: the first tick hangs.
    "bucket-too-small-for-the-clock": b"deployments: [{name: a/b, forecast: {bucket_s: 1.0e-7}}]\n",
    # ongoing / 5e-324 is infinite; math.ceil raises OverflowError in capacity.py.
    "target-ongoing-near-zero": b"deployments: [{name: a/b, autoscaling: "
    b"{target_ongoing_requests: 5.0e-324}}]\n",
    # The same in the Ray-compatible mode: ray_compat.py's math.ceil of an infinity.
    "ray-mode-target-ongoing-near-zero": b"deployments: [{name: a/b, mode: ray-compatible, "
    b"autoscaling: {target_ongoing_requests: 5.0e-324}}]\n",
    # The prior's square overflows in the replica model.
    "prompt-prior-near-float-max": b"deployments: [{name: a/b, replica_model: "
    b"{prompt_tokens: 1.0e+300}}]\n",
    # Ray's gain on the step, near the float limit: ray_compat.py's math.ceil of inf.
    "ray-mode-upscaling-factor-near-float-max": b"deployments: [{name: llm/chat, "
    b"mode: ray-compatible, autoscaling_config: {min_replicas: 0, max_replicas: 4, "
    b"upscaling_factor: 1e308}}]\n",
    # A replica count of 400 digits: the sizing's division by it overflows to float.
    "max-replicas-of-400-digits": b"deployments: [{name: a/b, autoscaling: {max_replicas: 1"
    + b"0" * 400
    + b"}}]\n",
    # An attainment target near zero: 1 - (1 - target) is 0 and the normal quantile of it
    # raises in burstiness.py.
    # A season of 45 digits: the forecaster's history limit times bucket_s overflowed.
    "season-length-of-45-digits": b"deployments: [{name: a/b, forecast: {season_length: "
    + b"9" * 45
    + b"}}]\n",
    "attainment-target-near-zero": b"deployments: [{name: a/b, slo: "
    b"{attainment_target: 1.0e-300}}]\n",
}


def known_bugs_first(test: Any) -> Any:
    """The bugs fuzzing found, as explicit examples: every run tries them first."""
    for text in reversed(KNOWN.values()):
        test = example(text)(test)
    return test


@budget.fuzz_unshrunk(budget.MUTANTS)
@given(mutants(MUTATOR))
@known_bugs_first
def test_mutants_of_shipped_configs_run_or_are_one_config_error(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


@budget.fuzz_unshrunk(budget.BUILT)
@given(documents(Config))
@example({"deployments": [{"name": "a/b"}], "defaults": {"forecast": {"z\n": 1}}})
def test_documents_of_every_setting_run_or_are_one_config_error(document: dict[str, Any]) -> None:
    text = yaml.safe_dump(document, allow_unicode=True, sort_keys=False)
    TARGET.outcome(text.encode("utf-8", "surrogatepass"), budget.CPU_LIMIT_S)


@pytest.mark.parametrize("text", KNOWN.values(), ids=KNOWN.keys())
def test_what_fuzzing_found_is_now_one_config_error(text: bytes) -> None:
    TARGET.outcome(text, budget.CPU_LIMIT_S)
