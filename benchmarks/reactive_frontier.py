"""How much of the gap to the clairvoyant oracle is the price of not knowing the future.

The backtest's oracle frontier plans each minute from the demand of the minutes ahead
(it asks for a replica a cold start before the minute that needs it). A policy that
reads the platform cannot: the best it can know is the minute that has just passed.
This script replays a development trace through a *reactive* plan with that knowledge,
exact: during each minute it holds what the last `hold` seconds of finished minutes
needed at utilisation u (the oracle's own per-minute count, `replicas_needed`), and
prints its TTFT attainment, its replica-seconds and its cost against the oracle frontier
at equal attainment (the backtest's `cost_vs_oracle_at_equal_attainment`). A cell where
no reactive plan comes within 1.25x of the oracle at the attainment autoscalerd reaches
asks for foresight, not for better sizing; one where some plan does shows what a hold
rule could still gain.

    .venv/bin/python benchmarks/reactive_frontier.py worldcup98-flash 8b-1gpu
    .venv/bin/python benchmarks/reactive_frontier.py azure-2023-code 8b-1gpu \
        --utilizations 0.1 0.15 0.2 --holds 0 300 600 900 1800

One simulation per oracle utilisation and per (u, hold): about 45 s per preset for the
WorldCup98 flash crowds on one core. Trace names are those of
benchmarks/backtest_matrix.py. The minute is the oracle's bucket: on traces whose clumps
last seconds (Azure 2023) every plan, reactive or clairvoyant, misses them alike, and the
comparison says little.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from backtest_matrix import (
    ROOT,
    open_cell,
    traces,
)  # benchmarks/, on the path as the script's folder

from autoscalerd.config import load_config
from autoscalerd.sim.backtest import BacktestSettings, simulate_policy
from autoscalerd.sim.cluster import REPLICA_PRESETS
from autoscalerd.sim.policies import OraclePolicy
from autoscalerd.sim.reference import OraclePlan, oracle_plan, profile, replicas_needed

UTILIZATIONS = (0.5, 0.7, 0.9)
HOLDS_S = (0.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a trace name of benchmarks/backtest_matrix.py")
    parser.add_argument("preset", choices=sorted(REPLICA_PRESETS))
    parser.add_argument(
        "--utilizations",
        type=float,
        nargs="+",
        default=list(UTILIZATIONS),
        metavar="U",
        help="the oracle utilisations whose per-minute counts the plans hold (0 < U ≤ 1)",
    )
    parser.add_argument(
        "--holds",
        type=float,
        nargs="+",
        default=list(HOLDS_S),
        metavar="S",
        help="how long, in seconds, each plan holds a finished minute's count (≥ 0)",
    )
    args = parser.parse_args()
    if any(not 0.0 < u <= 1.0 for u in args.utilizations):
        parser.error(f"--utilizations must lie in (0, 1], got {args.utilizations}")
    if any(not math.isfinite(h) or h < 0.0 for h in args.holds):
        parser.error(f"--holds must be seconds ≥ 0, got {args.holds}")
    directory = ROOT / "data" / "traces"
    cells = {
        name: (path, window, tokens) for name, path, window, tokens in traces(directory, 6 * 3600.0)
    }
    if args.trace not in cells:
        print(
            f"reactive_frontier: unknown trace {args.trace!r}; known: {', '.join(cells)}",
            file=sys.stderr,
        )
        return 2
    path, window, tokens = cells[args.trace]
    trace = open_cell(path, window, tokens, directory)
    config = load_config(ROOT / "config" / "backtest.yaml")
    cfg = config.deployments[0] if config.deployments else config.deployment("llm/backtest")
    low, high = cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas
    replica = REPLICA_PRESETS[args.preset]
    settings = BacktestSettings(replica=replica)
    demand = profile(trace.batches(), settings.oracle_bucket_s, trace.window.duration_s)
    look_back_s = cfg.autoscaling.look_back_period_s

    def run(plan: OraclePlan) -> tuple[float, float]:
        row, _ = simulate_policy(
            OraclePolicy(plan), plan.target_at(0.0), trace, demand, settings, look_back_s
        )
        return row.slo_attainment_ttft or 0.0, row.replica_seconds

    frontier = [
        run(oracle_plan(demand, replica, u, replica.cold_start_s, low, high))
        for u in settings.oracle_utilizations
    ]

    def vs_oracle(attained: float, cost_s: float) -> float:
        meeting = [c for a, c in frontier if a >= attained]
        reference = min(meeting) if meeting else max(frontier)[1]
        return cost_s / reference

    print(
        f"{args.trace} {args.preset}: cold start {replica.cold_start_s:g} s, "
        f"buckets {demand.bucket_s:g} s"
    )
    print("oracle frontier: " + ", ".join(f"{100 * a:.3f} % for {c:,.0f}" for a, c in frontier))
    print(f"{'u':>4} {'hold_s':>7} {'attained':>9} {'replica_s':>10} {'x oracle=':>9}")
    for utilization in args.utilizations:
        needed = replicas_needed(demand, replica, utilization)
        for hold_s in args.holds:
            # Minute b holds the most that minutes b-1-k .. b-1 needed (the first minute's
            # need stands in before the trace).
            k = math.ceil(hold_s / demand.bucket_s)
            padded = np.concatenate((np.full(k + 1, needed[0]), needed))[: needed.size + k]
            held = np.lib.stride_tricks.sliding_window_view(padded, k + 1).max(axis=1)
            attained, cost_s = run(OraclePlan(demand.bucket_s, np.clip(held, low, high)))
            print(
                f"{utilization:>4g} {hold_s:>7.0f} {100 * attained:>8.3f}% {cost_s:>10,.0f} "
                f"{vs_oracle(attained, cost_s):>9.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
