"""The lengths inside one histogram bucket: a power law read from the neighbouring buckets.

vLLM exports prompt lengths as a histogram whose bounds go in 1-2-5 steps, so a bucket
spans a factor of 2-2.5. Where lengths thin out, a heavy-tailed mix falls by a decade or
more across one bucket and most of its requests sit near the lower edge: uniform, as
Prometheus' histogram_quantile reads a bucket, places them too high. Here the density
inside a bucket is x^α, α the slope on log-log axes of the densities (count ÷ width, at
the geometric centre) of the occupied neighbours that touch it: both where both are, else
the one neighbour and the bucket itself. The histogram's own shape, interpolated on the
log scale its bounds are spaced on.

One reading for every consumer: the replica model's E[prompt²] (sense/moments.py) and the
wait budgets of the SLO guard and the sizing (decide/prompt_budgets.py).
"""

from __future__ import annotations

import math

# A bucket as (lower bound, upper bound, mass): a count or a share.
Bucket = tuple[float, float, float]

# The exponent is bounded: two neighbours a decade apart in density over a 2x bucket step
# give about −3.3; beyond ±8 the fit says more about sparse counts than about the shape.
ALPHA_MAX = 8.0
# A bucket with no occupied neighbour has no slope to read: uniform, as Prometheus reads
# it. It is the cautious reading for both consumers (the larger E[x²], the shorter wait
# budgets) of a mix narrow enough to fit one bucket, where the reading matters least.
ALPHA_ALONE = 0.0


def exponent(here: Bucket, below: Bucket | None, above: Bucket | None) -> float:
    """α of the density x^α inside `here`, from the neighbours below and above it (None
    where there is none). 0, uniform, for a bucket from 0 or unbounded: no log scale."""
    centre = _density(here)
    if centre is None:
        return 0.0
    low, high, _ = here
    left = _density(below) if below is not None and below[1] == low else None
    right = _density(above) if above is not None and above[0] == high else None
    if left is None and right is None:
        return ALPHA_ALONE
    a = left if left is not None else centre
    b = right if right is not None else centre
    try:
        slope = math.log(b[1] / a[1]) / math.log(b[0] / a[0])
    except (ArithmeticError, ValueError):
        return ALPHA_ALONE  # densities beyond a float's range: no slope to read
    if not math.isfinite(slope):
        return ALPHA_ALONE
    return max(-ALPHA_MAX, min(ALPHA_MAX, slope))


def share_below(x: float, low: float, high: float, alpha: float) -> float:
    """The share of a bucket [low, high] of density x^α that lies below x."""
    if alpha == 0.0 or low <= 0:
        return (x - low) / (high - low)
    beta = alpha + 1.0
    if abs(beta) < 1e-9:
        return math.log(x / low) / math.log(high / low)
    return (x**beta - low**beta) / (high**beta - low**beta)


def quantile(u: float, low: float, high: float, alpha: float) -> float:
    """The length below which a share u of a bucket [low, high] of density x^α lies."""
    if alpha == 0.0 or low <= 0:
        return low + u * (high - low)
    beta = alpha + 1.0
    if abs(beta) < 1e-9:
        return low * (high / low) ** u
    return (low**beta + u * (high**beta - low**beta)) ** (1.0 / beta)


def mean_power(low: float, high: float, alpha: float, power: float) -> float:
    """E[x^power] over a bucket [low, high] of density x^α (0 < low < high); may raise
    ArithmeticError or return a non-finite value for bounds near a float's range."""
    return _integral(low, high, alpha + power) / _integral(low, high, alpha)


def _integral(low: float, high: float, power: float) -> float:
    """∫ x^power dx from low to high (0 < low < high)."""
    if abs(power + 1.0) < 1e-9:
        return math.log(high / low)
    return (high ** (power + 1.0) - low ** (power + 1.0)) / (power + 1.0)


def _density(bucket: Bucket) -> tuple[float, float] | None:
    """(geometric centre, mass per unit length) of a bounded, occupied bucket off 0."""
    low, high, mass = bucket
    if low <= 0 or math.isinf(high) or high <= low or mass <= 0:
        return None
    return math.sqrt(low * high), mass / (high - low)
