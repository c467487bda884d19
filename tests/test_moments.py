"""E[x²] from histogram bucket counts: the prefill queue's variability."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscalerd.sense.moments import second_moment
from autoscalerd.sim.cluster import PROMPT_TOKEN_BUCKETS


def test_each_bucket_is_a_power_law_with_its_neighbours_slope() -> None:
    # Buckets [1,10], [10,100], [100,1000] hold 90, 90 and 9: densities 10, 1 and 0.01 at
    # geometric centres a factor 10 apart. Slopes of the log density: 1 (the first, only
    # its upper neighbour), 1.5 (both neighbours), 2 (the last, only its lower one).
    bounds = (1.0, 10.0, 100.0, 1000.0)
    counts = (0.0, 90.0, 90.0, 9.0, 0.0)
    # E[x²] for density x^(−k) on [a, b] is ∫x^(2−k) / ∫x^(−k).
    first = (10.0**2 - 1.0) / 2.0 / math.log(10.0)  # k = 1
    middle = (2.0 / 3.0) * (100.0**1.5 - 10.0**1.5) / (2.0 * (10.0**-0.5 - 100.0**-0.5))
    last = 900.0 / (1.0 / 100.0 - 1.0 / 1000.0)  # k = 2
    expected = (90.0 * first + 90.0 * middle + 9.0 * last) / 189.0
    assert second_moment(bounds, counts, (0.0,) * 5) == pytest.approx(expected, rel=1e-12)
    # Only what was added between the snapshots counts.
    later = tuple(c + 7.0 for c in counts)
    assert second_moment(bounds, later, (7.0,) * 5) == pytest.approx(expected, rel=1e-12)
    assert second_moment(bounds, counts, counts) is None


def test_a_lone_bucket_is_uniform_and_overflow_sits_past_the_last_bound() -> None:
    bounds = (10.0, 100.0)
    # No neighbour to read a slope from: uniform on [10, 100], E[x²] = (10² + 10·100 + 100²)/3.
    alone = second_moment(bounds, (0.0, 4.0, 0.0), (0.0, 0.0, 0.0))
    assert alone == pytest.approx((100.0 + 1000.0 + 10_000.0) / 3.0, rel=1e-12)
    # The first bucket, from 0, is uniform; the +Inf bucket is at 1.5x the last bound.
    assert second_moment(bounds, (3.0, 0.0, 0.0), (0.0,) * 3) == pytest.approx(100.0 / 3.0)
    assert second_moment(bounds, (0.0, 0.0, 2.0), (0.0,) * 3) == pytest.approx(150.0**2)
    assert second_moment((), (5.0,), (0.0,)) is None  # only +Inf: no length known


def test_bounds_near_the_float_limit_give_no_moment_and_no_error() -> None:
    """Found by fuzzing Prometheus' API answers: `** 2` of 1.5e200 raised OverflowError."""
    assert second_moment((1e200,), (0.0, 3.0), (0.0, 0.0)) is None
    assert second_moment((1.0, 1e300), (0.0, 2.0, 0.0), (0.0,) * 3) is None


@pytest.mark.parametrize(("mean", "cv"), [(2048.0, 1.0), (300.0, 0.5), (12_000.0, 2.0)])
def test_lognormal_lengths_in_vllms_buckets_read_within_a_few_percent(
    mean: float, cv: float
) -> None:
    """vLLM's 1-2-5 bounds; taken at bucket midpoints these mixes read 13-36 % high."""
    rng = random.Random(7)
    sigma = math.sqrt(math.log(1.0 + cv * cv))
    mu = math.log(mean) - sigma * sigma / 2.0
    lengths = [round(rng.lognormvariate(mu, sigma)) for _ in range(100_000)]
    counts = [0.0] * (len(PROMPT_TOKEN_BUCKETS) + 1)
    for length in lengths:
        index = next(
            (i for i, bound in enumerate(PROMPT_TOKEN_BUCKETS) if length <= bound),
            len(PROMPT_TOKEN_BUCKETS),
        )
        counts[index] += 1.0
    truth = sum(x * x for x in lengths) / len(lengths)
    estimate = second_moment(PROMPT_TOKEN_BUCKETS, counts, (0.0,) * len(counts))
    assert estimate is not None
    assert estimate / truth == pytest.approx(1.0, abs=0.05)


@given(
    st.lists(
        st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
        min_size=1,
        max_size=12,
        unique=True,
    ),
    st.data(),
)
def test_any_sorted_bounds_and_counts_give_a_finite_moment_or_none(
    raw_bounds: list[float], data: st.DataObject
) -> None:
    bounds = sorted(raw_bounds)
    counts = data.draw(
        st.lists(
            st.floats(min_value=0.0, max_value=1e9, allow_nan=False),
            min_size=len(bounds) + 1,
            max_size=len(bounds) + 1,
        )
    )
    moment = second_moment(bounds, counts, (0.0,) * len(counts))
    if sum(counts) <= 0:
        assert moment is None
    else:
        assert moment is not None and math.isfinite(moment) and moment >= 0.0
