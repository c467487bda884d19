"""The sizing's late share on a bursty real trace: at the mean rate, and mixed over the
local rate, against the simulator at fixed counts.

The sizing's queueing formulas (`sizing.predicted_tail`: R prefill M/G/1 queues behind
the router, R·slots servers) assume Poisson arrivals at the rate they are given. On a
trace that clumps at the scale of seconds (the Azure 2023 code trace: 73 % of its seconds
empty, up to 67 requests in one), they predict almost no late request at the mean rate
where the simulator has 1-3 %; the sizing's burst conditions (fluid bounds on a clump
at the quantile) make up part of it, the SLO guard's calibration the rest. This script
measures one alternative: the same formulas evaluated at the rate of each window of
`--window-s` seconds, weighted by the requests that arrive as the window ends (a
locally stationary queue, as Markov-modulated arrivals are often approximated).

It lets autoscalerd run over the trace so that the replica model is learned from the
simulated sensor as the daemon would learn it, then for each fixed count R prints the
simulator's late share (1 − attainment / attainable share of the static-R run), the
formulas' at the mean rate, and the mixture's at each window.

    .venv/bin/python benchmarks/rate_mixture.py [--preset 405b-8gpu] [--window-s 2 8 32]

About half a minute per preset on one core (the Azure 2023 trace, counts 1 to 40).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np
from model_vs_simulator import learn  # benchmarks/, on the path as the script's folder

from autoscalerd.config import load_config
from autoscalerd.decide import replica_model, sizing, slo_guard
from autoscalerd.sim.backtest import BacktestSettings, attainable_share, simulate_policy
from autoscalerd.sim.cluster import REPLICA_PRESETS
from autoscalerd.sim.policies import StaticPolicy
from autoscalerd.sim.reference import profile
from autoscalerd.sim.traces import open_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data/traces/azure_llm_2023_code.csv"
# Counts shown: those whose simulated late share says something about the tail.
SHOWN_LATE = (0.0005, 0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument(
        "--preset",
        nargs="*",
        default=["70b-4gpu", "32b-2gpu", "405b-8gpu"],
        choices=sorted(REPLICA_PRESETS),
    )
    parser.add_argument("--window-s", type=int, nargs="*", default=[2, 8, 32])
    parser.add_argument("--max-replicas", type=int, default=40)
    args = parser.parse_args()
    if not args.trace.is_file():
        print(f"rate_mixture: no trace at {args.trace}; pass --trace FILE", file=sys.stderr)
        return 2
    for preset in args.preset:
        run_preset(args.trace, preset, args.window_s, args.max_replicas)
    return 0


def run_preset(path: Path, preset: str, windows_s: list[int], max_replicas: int) -> None:
    replica = REPLICA_PRESETS[preset]
    cfg = load_config(ROOT / "config/backtest.yaml").deployment("llm/backtest")
    cfg = cfg.model_copy(
        update={"capacity": cfg.capacity.model_copy(update={"cold_start_s": replica.cold_start_s})}
    )
    trace = open_trace(path)
    settings = BacktestSettings(replica=replica, frontiers=False)
    arrivals = np.concatenate([batch.arrival_s for batch in trace.batches()])
    duration_s = trace.window.duration_s or float(arrivals.max()) + 1.0
    demand = profile(trace.batches(), settings.oracle_bucket_s, duration_s)
    look_back_s = cfg.autoscaling.look_back_period_s
    _, policy, end_s = learn(trace, demand, settings, cfg, duration_s)
    model = replica_model.view(
        policy.state.replica_model, cfg.replica_model, end_s, cfg.capacity.service_rate_per_replica
    )
    ttft_s = cfg.slo.ttft_s or settings.ttft_slo_s
    budget_s = slo_guard.wait_budget_s(cfg.slo.queue_wait_s, ttft_s, model.prefill_s)
    assert budget_s is not None  # a TTFT SLO is always given here

    def late(rate_per_s: float, replicas: int) -> float:
        inputs = sizing.SizingInputs(
            arrival_rate_per_s=rate_per_s,
            peak_to_mean=0.0,
            tick_s=settings.tick_s,
            wait_budget_s=budget_s,
            tail_share=1.0 - cfg.slo.attainment_target,
            ttft_s=ttft_s,
        )
        return sizing.predicted_tail(model, inputs, replicas)[0] if rate_per_s > 0 else 0.0

    per_tick = np.bincount(arrivals.astype(np.int64)).astype(float)
    mean_rate = float(per_tick.sum()) / len(per_tick)
    # Per window: (requests in the window ending at a tick, the tick's arrivals), summed.
    mixes: dict[int, dict[float, float]] = {}
    for window_s in windows_s:
        sums = np.convolve(per_tick, np.ones(window_s))[: len(per_tick)]
        mix: dict[float, float] = collections.defaultdict(float)
        for requests, weight in zip(sums, per_tick, strict=True):
            if weight > 0:
                mix[float(requests)] += float(weight)
        mixes[window_s] = mix
    attainable = attainable_share(trace, settings)
    print(
        f"\n{path.name}, {preset}: {int(per_tick.sum()):,} requests, mean {mean_rate:.2f}/s; "
        f"learned prefill {model.prefill_tokens_per_s or 0:,.0f} tokens/s "
        f"(true {replica.prefill_tokens_per_s:,.0f}); late shares of attainable requests"
    )
    header = f"{'R':>4} {'simulated':>10} {'mean rate':>10}"
    header += "".join(f" {f'mix {w} s':>10}" for w in windows_s)
    print(header)
    for replicas in range(1, max_replicas + 1):
        row, _ = simulate_policy(
            StaticPolicy(f"static-{replicas}", replicas),
            replicas,
            trace,
            demand,
            settings,
            look_back_s,
        )
        simulated = 1.0 - (row.slo_attainment_ttft or 0.0) / attainable if attainable else 0.0
        if simulated < SHOWN_LATE[0]:
            break
        if simulated > SHOWN_LATE[1]:
            continue
        total = float(per_tick.sum())
        line = f"{replicas:>4} {simulated:>10.2%} {late(mean_rate, replicas):>10.3%}"
        for window_s in windows_s:
            mixed = sum(
                weight * late(requests / window_s, replicas)
                for requests, weight in mixes[window_s].items()
            )
            line += f" {mixed / total:>10.2%}"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
