"""Every target warmed up once, before any input runs under the CPU limit."""

from __future__ import annotations

import pytest

from tests.fuzz.targets import TARGETS


@pytest.fixture(scope="session", autouse=True)
def _warmed_up_targets() -> None:
    for target in TARGETS.values():
        target.warm_up()
