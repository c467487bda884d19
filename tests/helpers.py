"""Shared test helpers: the installed console script, the repository root, and the
benchmark scripts (loaded as modules, or run as a user runs them)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def autoscalerd_bin() -> str:
    """The console script of this environment (the one `make test` installed)."""
    candidate = Path(sys.executable).parent / "autoscalerd"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("autoscalerd")
    assert found, "autoscalerd console script not installed; run `make test`"
    return found


def benchmark_module(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module, registered under its name in sys.modules, so that
    a pool's process finds its functions by name; loaded once, so that every test holds
    the module a pool pickles by name."""
    path = REPO / "benchmarks" / f"{name}.py"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_benchmark(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """benchmarks/NAME.py run as a user runs it, its output captured."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
