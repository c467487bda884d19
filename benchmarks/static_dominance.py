"""Check a backtest_matrix output for fixed counts that dominate a row it does not name.

A row printed against a reference computed with another cost of autoscalerd's (a cached
reference from an earlier version of the decisions, or the shipped row's reference for
a sensitivity or rule row, before 8372a59) was compared with a static frontier that need
not hold the count just below the row's cost, the fixed count most likely to dominate it.
This finds that count again without simulating autoscalerd: the row's cost is its
"x static" column times static peak's replica-seconds (simulated again), and the counts
just below it are simulated over the row's trace and replica model.

    .venv/bin/python benchmarks/static_dominance.py docs/backtest/matrix_32b.txt ...

Each row gets one verdict: `ok` (no fixed count costing no more reaches its attainment,
or the row names the one that does), `MISSED static-N` (a count reaches it for no more
cost, beyond the two-decimal rounding of the file's figures) or `rounding static-N` (it
does within that rounding; rerun the row to tell). Static peak's own count is left out:
every row was compared with static peak itself, exactly. Rows of traces or presets this
checkout cannot rebuild are skipped, with a reason. Exit status 1 when a row is MISSED.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from autoscalerd.config import load_config
from autoscalerd.sim.backtest import (
    BacktestResult,
    BacktestSettings,
    FrontierPoint,
    complete_static_frontier,
    run_backtest,
)
from autoscalerd.sim.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(
    r"^(?P<trace>\S+)\s+(?P<preset>\S+)\s+(?P<label>.+?)\s+(?P<attained>[\d.]+)%\s+"
    r"[\d.]+%\s+\S+\s+\S+\s+(?P<static_x>[\d.]+)\s+(?P<dominated>\S+) / "
)
RANDOM = re.compile(r"^# (random-\d+) \(seed (\d+)\)")
# The file's figures are rounded to two decimals: attainment in percent, cost in
# multiples of static peak.
ATTAINED_ROUNDING = 0.00005
STATIC_X_ROUNDING = 0.005


def _matrix() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "backtest_matrix", ROOT / "benchmarks" / "backtest_matrix.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["backtest_matrix"] = module
    spec.loader.exec_module(module)
    return module


def verdict(
    points: tuple[FrontierPoint, ...],
    attained: float,
    cost_s: float,
    rounding_s: float,
    named: set[str],
) -> str:
    """`ok`, `MISSED static-N` or `rounding static-N` for a row of `attained` at
    `cost_s` (± `rounding_s`), given the static points simulated and those it names."""
    reaching = [
        p
        for p in points
        if p.replica_seconds <= cost_s + rounding_s
        and p.slo_attainment_ttft >= attained - ATTAINED_ROUNDING
        and p.label not in named
    ]
    if not reaching:
        return "ok"
    # No attainment exceeds 1: a row printed at 100.00 % is reached by a count at 100 %.
    highest = min(1.0, attained + ATTAINED_ROUNDING)
    certain = [
        p
        for p in reaching
        if p.replica_seconds < cost_s - rounding_s and p.slo_attainment_ttft >= highest
    ]
    if certain:
        return "MISSED " + ",".join(p.label for p in certain)
    return "rounding " + ",".join(p.label for p in reaching)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--traces", type=Path, default=ROOT / "data" / "traces")
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "backtest.yaml")
    parser.add_argument(
        "--week-duration",
        type=float,
        default=6 * 3600.0,
        metavar="S",
        help="the window of the 2024 week and WorldCup98 the file was run with",
    )
    args = parser.parse_args()
    bm = _matrix()
    config = load_config(args.config)
    base_cfg = config.deployments[0] if config.deployments else config.deployment("llm/backtest")
    cells = {
        name: (path, window, tokens)
        for name, path, window, tokens in [
            *bm.traces(args.traces, args.week_duration),
            *bm.held_out_slices(args.traces, args.week_duration),
            *bm.held_out_traces(args.traces),
        ]
    }
    variants = {label: (prior_x, cold_x) for label, prior_x, cold_x in bm.VARIANTS}
    missed = False
    # The trace and static peak per trace and replica model: the rows of a cell share them.
    references: dict[tuple[str, str, float], tuple[Trace, BacktestResult]] = {}
    for file in args.files:
        try:
            lines = file.read_text().splitlines()
        except OSError as exc:
            print(f"{file}: cannot read ({exc.strerror}); give a backtest_matrix output")
            return 2
        for line in lines:
            drawn = RANDOM.match(line)
            if drawn:
                count = int(drawn.group(1).split("-")[1]) + 1
                bm.MODELS.update(bm.random_models(count, int(drawn.group(2))))
        print(f"# {file}")
        for line in lines:
            row = ROW.match(line)
            if row is None:
                continue
            name, preset, label = row["trace"], row["preset"], row["label"].strip()
            where = f"{name:<20} {preset:<9} {label:<15}"
            if name not in cells or preset not in bm.MODELS or label not in variants:
                print(f"{where} skipped: trace, preset or variant unknown to this checkout")
                continue
            prior_x, cold_x = variants[label]
            cfg, replica = bm.variant_cell(base_cfg, bm.MODELS[preset], label, prior_x, cold_x)
            key = (name, preset, cold_x)
            if key not in references:
                path, window, tokens = cells[name]
                trace = bm.open_cell(path, window, tokens, args.traces)
                settings = BacktestSettings(replica=replica, frontiers=False)
                references[key] = (trace, run_backtest(trace, [], cfg, settings))
            trace, reference = references[key]
            static_peak = reference.row("static-peak")
            cost_s = float(row["static_x"]) * static_peak.replica_seconds
            rounding_s = STATIC_X_ROUNDING * static_peak.replica_seconds
            # The walk below the row's cost, from its highest reading.
            probe = dataclasses.replace(
                static_peak, policy="row", replica_seconds=cost_s + rounding_s
            )
            points = complete_static_frontier(
                trace, dataclasses.replace(reference, rows=(probe,)), (), cfg
            )
            # Static peak's own count is the same simulation as static peak, with which
            # the file's row was compared exactly (it runs with every policy).
            peak = (static_peak.replica_seconds, static_peak.slo_attainment_ttft or 0.0)
            points = tuple(p for p in points if (p.replica_seconds, p.slo_attainment_ttft) != peak)
            named = set(row["dominated"].split(","))
            said = verdict(points, float(row["attained"]) / 100.0, cost_s, rounding_s, named)
            missed = missed or said.startswith("MISSED")
            print(f"{where} {said}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
