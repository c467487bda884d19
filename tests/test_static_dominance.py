"""benchmarks/static_dominance.py: a fixed count that dominates a row the file does not
name is found again from the row's figures, and rounding is told apart from a miss."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from autoscalerd.sim.backtest import FrontierPoint

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "static_dominance.py"
HEADER = (
    "trace                preset    variant         attained attainable   share x oracle= "
    "x static  dominated_by / best peer\n"
)


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("static_dominance", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _point(replicas: int, attained: float, cost_s: float) -> FrontierPoint:
    return FrontierPoint(f"static-{replicas}", replicas, None, attained, cost_s)


def test_the_verdict_tells_a_miss_from_rounding_and_from_a_named_count() -> None:
    verdict = _checker().verdict
    points = (_point(2, 0.95, 7200.0), _point(3, 1.0, 10800.0))
    # A row at 100 % for 11,000 replica-seconds (± 50): static-3 serves it for less.
    assert verdict(points, 1.0, 11000.0, 50.0, set()) == "MISSED static-3"
    assert verdict(points, 1.0, 11000.0, 50.0, {"static-3"}) == "ok"
    # Within the rounding of the cost, or of the attainment, only: a rerun tells.
    assert verdict(points, 1.0, 10780.0, 50.0, set()) == "rounding static-3"
    close = (_point(3, 0.99992, 10800.0),)
    assert verdict(close, 0.9999, 11000.0, 50.0, set()) == "rounding static-3"
    assert verdict(close, 0.9998, 11000.0, 50.0, set()) == "MISSED static-3"
    # Costlier than the row, or short of its attainment: no verdict against it.
    assert verdict(points, 1.0, 10700.0, 50.0, set()) == "ok"
    assert verdict((_point(3, 0.99, 10800.0),), 0.999, 11000.0, 50.0, set()) == "ok"


def _check(tmp_path: Path, dominated_by: str) -> subprocess.CompletedProcess[str]:
    table = tmp_path / "matrix.txt"
    # Azure 2023 code under 8b-1gpu as the development matrix prints it: 100 % at 3.26
    # times static peak, where static-3 serves every request for less.
    table.write_text(
        "# a backtest_matrix output\n"
        + HEADER
        + "azure-2023-code      8b-1gpu   as shipped       100.00%    100.00%  100.0%      "
        f"1.52     3.26  {dominated_by} / ray-serve 93.28% x1.36\n"
        + "azure-2023-code      8b-1gpu   no such        100.00%    100.00%  100.0%      "
        "1.52     3.26  - / ray-serve 93.28% x1.36\n"
    )
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(table)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_row_that_does_not_name_its_dominating_count_is_reported(tmp_path: Path) -> None:
    missed = _check(tmp_path, "-")
    assert missed.returncode == 1, missed.stderr
    assert "MISSED static-3" in missed.stdout
    assert "no such" in missed.stdout and "skipped" in missed.stdout
    named = _check(tmp_path, "static-3")
    assert named.returncode == 0, named.stderr
    assert "as shipped      ok" in named.stdout


def test_an_unreadable_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "absent.txt")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gone.returncode == 2
    assert "cannot read" in gone.stdout and "Traceback" not in gone.stderr


def test_the_walk_starts_high_enough_where_few_replicas_leave_a_backlog(tmp_path: Path) -> None:
    """Random model 0 on Azure 2023: one replica's backlog outlasts the trace (3,512
    replica-seconds over 3,458 s), so starting the walk from one replica's cost lands on
    static-32; static-33 (114,114 replica-seconds, 90.94 %) is the count below the row's
    cost (6.63 times static peak's 17,300) that dominates it."""
    table = tmp_path / "random.txt"
    row = (
        "azure-2023-code      random-0  as shipped        90.77%     91.29%   99.4%      "
        "0.86     6.63  {} / ray-serve 67.07% x1.18\n"
    )
    table.write_text(
        "# random-0 (seed 0): 64 slots, prefill 5,753 tokens/s\n" + HEADER + row.format("-")
    )
    run = [sys.executable, str(SCRIPT), str(table)]
    missed = subprocess.run(run, capture_output=True, text=True, timeout=300, check=False)
    assert missed.returncode == 1, missed.stderr
    assert "MISSED static-33" in missed.stdout
    table.write_text(
        "# random-0 (seed 0): 64 slots, prefill 5,753 tokens/s\n" + HEADER + row.format("static-33")
    )
    named = subprocess.run(run, capture_output=True, text=True, timeout=300, check=False)
    assert named.returncode == 0, named.stdout
