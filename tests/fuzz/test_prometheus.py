"""Prometheus text into the MetricsBook: any scrape is samples or one MetricsParseError;
whatever the samples, every query the sensor makes answers without an exception, never
a negative rate; and what the book keeps stays bounded by what the endpoints export now."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.prometheus import MetricsParseError, parse
from tests.fuzz import budget, seeds
from tests.fuzz.mutations import Mutator
from tests.fuzz.strategies import HOSTILE_NUMBERS, TEXT, mutants
from tests.fuzz.targets import SERVE_STATE, TARGETS, check_book, new_book

TARGET = TARGETS["prometheus"]
MUTATOR = Mutator(TARGET.seeds(), TARGET.structure)
NAMES = st.builds(
    lambda family, suffix: family + suffix,
    st.sampled_from(sorted(sm.FAMILY_NAMES)),
    st.sampled_from(["", "_total", "_bucket", "_count", "_sum", "_created"]),
)
LABEL_VALUES = st.one_of(
    TEXT,
    st.sampled_from(["llm", "LlmReplica", "r1", "w-rep", "llm#LlmReplica#abc", "app", "Dep"]),
    st.floats().map(repr),
    st.sampled_from(["+Inf", "-Inf", "NaN", "1e308", "-1"]),
)
LABELS = st.dictionaries(
    st.sampled_from(
        ["application", "deployment", "replica", "ReplicaId", "WorkerId", "le", "route"]
    ),
    LABEL_VALUES,
    max_size=5,
)
VALUES = st.one_of(
    st.floats().map(repr),
    HOSTILE_NUMBERS.map(str),
    st.integers(min_value=0, max_value=10**6).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "9" * 400]),
)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def expositions(draw: st.DrawFn) -> str:
    """Exposition text of the families the sensor reads, with any labels and values."""
    lines = []
    for _ in range(draw(st.integers(1, 12))):
        name = draw(NAMES)
        if draw(st.booleans()):
            kind = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped"]))
            lines.append(f"# TYPE {name} {kind}")
        labels = ",".join(f'{k}="{_escaped(v)}"' for k, v in draw(LABELS).items())
        stamp = draw(st.sampled_from(["", " 1700000000000", " -1", " " + "9" * 400]))
        lines.append(f"{name}{{{labels}}} {draw(VALUES)}{stamp}")
    return "\n".join(lines) + "\n"


@budget.fuzz(budget.MUTANTS)
@given(mutants(MUTATOR))
def test_mutants_of_ray_scrapes_parse_or_are_one_parse_error(data: bytes) -> None:
    TARGET.outcome(data, budget.CPU_LIMIT_S)


@budget.fuzz(budget.BUILT)
@given(expositions())
def test_any_exposition_of_our_families_is_queried_safely(text: str) -> None:
    TARGET.outcome(text.encode("utf-8", "surrogatepass"), budget.CPU_LIMIT_S)


@budget.fuzz(budget.BUILT // 4)
@given(st.lists(expositions(), min_size=2, max_size=6), st.integers(1, 3))
def test_rounds_of_changing_scrapes_keep_the_book_sane(texts: list[str], gap: int) -> None:
    """Scrapes change between rounds (resets, series that come and go, a gap): still sane."""
    book = new_book()
    who = sm.Attribution(SERVE_STATE)
    at_s = 0.0
    for number, text in enumerate(texts * 3):
        try:
            samples = parse(text, sm.FAMILY_NAMES)
        except MetricsParseError:
            book.end_round(at_s, endpoints=1, failed=1)
        else:
            book.ingest("http://192.0.2.2:8080/metrics", samples, at_s, who, count=number > 0)
            book.end_round(at_s, endpoints=1)
        at_s += 2.0 * gap if number % 5 else 7.0  # now and then a gap past gap_s
        check_book(book, sorted(SERVE_STATE.deployments))


# ---------------------------------------------------------------- found by fuzzing


def _bucket(bound: str, count: float) -> str:
    labels = f'application="llm",deployment="LlmReplica",replica="r1",le="{bound}"'
    return f"ray_serve_deployment_processing_latency_ms_bucket{{{labels}}} {count}\n"


def test_bucket_bounds_no_series_exports_any_more_are_forgotten() -> None:
    """An endpoint minting a new `le` every scrape must not grow the book without end."""
    book = new_book()
    who = sm.Attribution(SERVE_STATE)
    name = "llm/LlmReplica"
    for number in range(400):
        text = _bucket("100.0", number) + _bucket(f"{1000 + number}.5", 2 * number)
        text += _bucket("+Inf", 2 * number)
        book.ingest("t", parse(text, sm.FAMILY_NAMES), 2.0 * number, who, count=number > 0)
        book.end_round(2.0 * number)
    histogram = book._histograms[(name, sm.PROCESSING_LATENCY_MS)]
    # The bounds exported within the history kept (20 s at a round per 2 s), and no more.
    assert len(histogram._bounds) <= 2 + 12, len(histogram._bounds)
    assert all(len(totals) <= 2 + 12 for _, totals in histogram._history)
    increase = book.increase(name, sm.PROCESSING_LATENCY_MS, 2.0)
    assert increase is not None and increase[0][0] == 100.0 and 1399.5 in increase[0]
    # 1 more in (0, 100] ms, 1 more in the newest bucket, each round: p99 lies past 100 ms.
    p99 = book.quantile(name, sm.PROCESSING_LATENCY_MS, 0.99, 2.0)
    assert p99 is not None and p99 > 100.0


def test_a_forgotten_bound_that_returns_counts_from_zero() -> None:
    book = new_book()
    who = sm.Attribution(SERVE_STATE)
    name = "llm/LlmReplica"
    at_s = 0.0
    for text in [_bucket("50.0", 7) + _bucket("+Inf", 7)] * 3 + [_bucket("+Inf", 7)] * 20:
        book.ingest("t", parse(text, sm.FAMILY_NAMES), at_s, who, count=at_s > 0)
        book.end_round(at_s)
        at_s += 2.0
    back = _bucket("50.0", 9) + _bucket("+Inf", 9)
    for _ in range(2):
        book.ingest("t", parse(back, sm.FAMILY_NAMES), at_s, who, count=True)
        book.end_round(at_s)
        at_s += 2.0
    increase = book.increase(name, sm.PROCESSING_LATENCY_MS, 30.0)
    assert increase is not None
    bounds, counts = increase
    assert bounds == (50.0,) and all(count >= 0 for count in counts), increase


def test_a_histogram_of_only_the_inf_bucket_has_no_distribution() -> None:
    """vLLM's prompt-length histogram with nothing but +Inf: no bucket to take E[x²] from,
    no bound to count SLO misses against; unknown, as its quantile is."""
    book = new_book()
    who = sm.Attribution(SERVE_STATE)
    labels = 'WorkerId="w-rep",ReplicaId="llm#LlmReplica#abc",le="+Inf"'
    for number in range(3):
        text = f"ray_vllm_request_prompt_tokens_bucket{{{labels}}} {5 * number}\n"
        book.ingest("t", parse(text, sm.FAMILY_NAMES), 2.0 * number, who, count=number > 0)
        book.end_round(2.0 * number)
    name = "llm/LlmReplica"
    assert book.increase(name, sm.VLLM_PROMPT_LENGTH, 10.0) is None
    assert book.quantile(name, sm.VLLM_PROMPT_LENGTH, 0.99, 10.0) is None
    check_book(book, [name])


def test_values_and_timestamps_of_hundreds_of_digits() -> None:
    family = "ray_serve_num_router_requests_total"
    samples = parse(f'{family} {"9" * 400}\n{family}{{a="b"}} -{"9" * 400}\n', {family[:-6]})
    assert [s.value for s in samples] == [math.inf, -math.inf]  # unknown to every reader
    try:
        parse(f"{family} 1 {'9' * 400}\n", sm.FAMILY_NAMES)
    except MetricsParseError as exc:
        assert "\n" not in str(exc)
    else:
        raise AssertionError("a timestamp past float's range was read")


def test_every_seed_scrape_parses() -> None:
    for text in seeds.prometheus():
        assert parse(text.decode(), sm.FAMILY_NAMES)
