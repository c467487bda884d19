"""Fixtures shared by every test module."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def cli_env() -> dict[str, str]:
    """The environment for a subprocess of the CLI: unbuffered, no debug tracebacks."""
    env = dict(os.environ)
    env.pop("AUTOSCALERD_DEBUG", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env
