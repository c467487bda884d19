"""The lengths inside one histogram bucket, read from its neighbours."""

from __future__ import annotations

import math

import pytest

from autoscalerd import bucket_shape


def test_the_exponent_is_the_log_log_slope_of_the_touching_neighbours() -> None:
    # Densities 10, 1 and 0.01 per token at geometric centres √10, √1000 and √100000: the
    # slope through the two neighbours is log(0.001)/log(100) = −1.5.
    low, mid, high = (1.0, 10.0, 90.0), (10.0, 100.0, 90.0), (100.0, 1000.0, 9.0)
    assert bucket_shape.exponent(mid, low, high) == pytest.approx(-1.5)
    # One neighbour: through it and the bucket itself (−1 from 10 to 1 over a decade).
    assert bucket_shape.exponent(mid, low, None) == pytest.approx(-1.0)
    # A neighbour that does not touch, or is empty, is not one; alone means uniform.
    assert bucket_shape.exponent(mid, (1.0, 5.0, 90.0), None) == 0.0
    assert bucket_shape.exponent(mid, (1.0, 10.0, 0.0), None) == 0.0
    # A bucket from 0 or without an upper bound has no log scale: uniform.
    assert bucket_shape.exponent((0.0, 10.0, 5.0), None, mid) == 0.0
    assert bucket_shape.exponent((1000.0, math.inf, 5.0), high, None) == 0.0
    # Beyond ±8 the fit is noise: a density falling 10¹² over a decade reads −8.
    steep = bucket_shape.exponent((10.0, 100.0, 1.0), (1.0, 10.0, 1e12), None)
    assert steep == -bucket_shape.ALPHA_MAX


def test_share_and_quantile_are_inverse_and_match_the_closed_form() -> None:
    # Density x^−2 on [1,000, 2,000]: the share below x is (1/1000 − 1/x)/(1/1000 − 1/2000).
    share = bucket_shape.share_below(1200.0, 1000.0, 2000.0, -2.0)
    assert share == pytest.approx((1 / 1000 - 1 / 1200) / (1 / 1000 - 1 / 2000))
    assert bucket_shape.quantile(share, 1000.0, 2000.0, -2.0) == pytest.approx(1200.0)
    # x^−1: equal mass per log-length; uniform at 0.
    assert bucket_shape.quantile(0.5, 10.0, 1000.0, -1.0) == pytest.approx(100.0)
    assert bucket_shape.quantile(0.5, 10.0, 1000.0, 0.0) == pytest.approx(505.0)
    # E[x²] of x^−1 on [10, 100]: (100² − 10²)/(2 ln 10).
    second = bucket_shape.mean_power(10.0, 100.0, -1.0, 2.0)
    assert second == pytest.approx((100.0**2 - 10.0**2) / (2.0 * math.log(10.0)))
