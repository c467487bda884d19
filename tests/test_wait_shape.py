"""benchmarks/wait_shape.py as a user runs it: it watches autoscalerd without changing a
decision (the run's cost and attainment are the backtest's own), every share it prints
is a share that falls as the threshold rises, and bad arguments get a one-line error and
exit code 2."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from autoscalerd.config import load_config
from autoscalerd.sim.backtest import BacktestSettings, run_backtest
from tests.helpers import benchmark_module, run_benchmark

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_benchmark("wait_shape", *args)


def test_the_recorder_changes_no_decision_and_prints_falling_shares() -> None:
    done = _run(
        "--only", "azure-2023-code", "--presets", "8b-1gpu", "--thresholds-s", "0.001", "0.1", "1"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = next(line for line in lines if line.startswith("azure-2023-code 8b-1gpu:"))
    cost = float(re.search(r": ([\d,]+) replica-seconds", head).group(1).replace(",", ""))  # type: ignore[union-attr]
    attained = float(re.search(r", ([\d.]+) %", head).group(1))  # type: ignore[union-attr]
    # The same cell through the backtest itself, opened as backtest_matrix opens it.
    bm = benchmark_module("backtest_matrix")
    cells = {name: rest for name, *rest in bm.traces(ROOT / "data" / "traces", 6 * 3600.0)}
    path, window, tokens = cells["azure-2023-code"]
    trace = bm.open_cell(path, window, tokens, ROOT / "data" / "traces")
    base = load_config(ROOT / "config" / "backtest.yaml").deployment("llm/backtest")
    cfg, replica = bm.variant_cell(base, bm.MODELS["8b-1gpu"], "as shipped", 1.0, 1.0)
    settings = BacktestSettings(replica=replica, frontiers=False)
    row = run_backtest(trace, ["autoscalerd"], cfg, settings).row("autoscalerd")
    assert round(row.replica_seconds) == cost
    assert round(100 * (row.slo_attainment_ttft or 0.0), 2) == attained
    counts = [line for line in lines if line.startswith("  ") and " running, " in line]
    assert counts, done.stdout
    for line in counts:
        pairs = re.findall(r">[\d.]+s ([\d.]+)/([\d.]+)%", line)
        assert len(pairs) == 3
        predicted = [float(p) for p, _ in pairs]
        observed = [float(o) for _, o in pairs]
        assert all(0.0 <= share <= 100.0 for share in predicted + observed)
        assert predicted == sorted(predicted, reverse=True)
        assert observed == sorted(observed, reverse=True)


def test_bad_arguments_get_one_line_and_exit_code_2() -> None:
    for args, flag in (
        (("--thresholds-s", "-1"), "--thresholds-s"),
        (("--only", "no-such-trace"), "--only"),
        (("--presets", "no-such-preset"), "--presets"),
        (("--random-models", "-2"), "--random-models"),
    ):
        done = _run(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert flag in done.stderr.splitlines()[-1]
        assert "Traceback" not in done.stderr
