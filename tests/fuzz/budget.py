"""How long the fuzz tests run: hypothesis settings shared by every test in this package.

The whole package runs in well under a minute on two cores. Derandomized and without an
example database, every run tries the same inputs: CI is reproducible, and a test marked
as failing on a known bug fails every time until the bug is fixed. `benchmarks/fuzz.py`
explores for longer, with a seed of its choosing.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

# Inputs per test: mutants of real inputs, and inputs built by a strategy.
MUTANTS = 300
BUILT = 200
# CPU time one input may take in a test; far above what any input needs.
CPU_LIMIT_S = 1.0

_FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(examples: int) -> settings:
    return settings(_FUZZ, max_examples=examples)


def fuzz_unshrunk(examples: int) -> settings:
    """For the parsers that decide on what they parsed (config, state): an input that hangs
    costs CPU_LIMIT_S on every shrinking step, so their failures are reported unshrunk."""
    return settings(_FUZZ, max_examples=examples, phases=(Phase.explicit, Phase.generate))
