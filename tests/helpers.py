"""Shared test helpers: the installed console script and the repository root."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def autoscalerd_bin() -> str:
    """The console script of this environment (the one `make test` installed)."""
    candidate = Path(sys.executable).parent / "autoscalerd"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("autoscalerd")
    assert found, "autoscalerd console script not installed; run `make test`"
    return found
