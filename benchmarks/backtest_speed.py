"""Backtest speed: simulated requests per second of CPU time, per policy, on one core.

Replays a trace (default: the Azure 2024 week of 10 s counts, token lengths drawn from the
2023 request-level file) through the simulated cluster under each policy, the way
`autoscalerd backtest` does, and reports for each: requests, ticks, CPU seconds, requests
per CPU second, and the share of the time spent inside the policy's `step` (the rest is
the simulator and its sensor). The process is pinned to one CPU; CPU time rather than
wall time is reported because a shared machine slows the wall clock, not the work.

    .venv/bin/python benchmarks/backtest_speed.py                  # the whole week
    .venv/bin/python benchmarks/backtest_speed.py --duration 1d --policy autoscalerd
    .venv/bin/python benchmarks/backtest_speed.py --duration 2h --profile autoscalerd \
        --profile-out /tmp/decide.prof   # the whole profile, for pstats' callers/callees
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

# One core, for every thread: pin before numpy starts its BLAS threads (a thread inherits
# its creator's affinity; pinning later moves only the calling thread), and ask for one.
if "--no-pin" not in sys.argv and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoscalerd.config import load_config  # noqa: E402
from autoscalerd.decide.baselines.base import Bounds, Policy  # noqa: E402
from autoscalerd.model import Observation  # noqa: E402
from autoscalerd.sim.backtest import BacktestSettings, simulate  # noqa: E402
from autoscalerd.sim.policies import POLICIES, PolicyContext  # noqa: E402
from autoscalerd.sim.reference import oracle_plan, profile  # noqa: E402
from autoscalerd.sim.traces import (  # noqa: E402
    EmpiricalTokens,
    TraceWindow,
    open_trace,
    parse_duration_s,
)

TRACE = ROOT / "data/traces/azure_llm_2024_code_10s_counts.csv"
TOKENS = ROOT / "data/traces/azure_llm_2023_code.csv"
CONFIG = ROOT / "config/backtest.yaml"


class TimedPolicy:
    """Passes every call through to `inner`, adding up the CPU time spent in it."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.cpu_s = 0.0

    def step(self, obs: Observation, now_s: float) -> int:
        started = time.process_time()
        target = self.inner.step(obs, now_s)
        self.cpu_s += time.process_time() - started
        return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--tokens-from", default=str(TOKENS))
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--duration", default=None, help="e.g. 6h, 1d (default: all of it)")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--policy", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--profile", choices=POLICIES, help="cProfile one policy's run instead")
    parser.add_argument(
        "--profile-out",
        type=Path,
        metavar="FILE",
        help="with --profile, also write the whole profile to FILE (pstats format)",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    args = parser.parse_args()

    # Import what the policies import lazily (Ray, statsmodels), so no run pays for it.
    import ray.serve.autoscaling_policy  # noqa: F401
    import statsmodels.tsa.holtwinters  # noqa: F401

    cfg = load_config(args.config).deployment("llm/backtest")
    source = open_trace(args.trace)
    tokens = EmpiricalTokens.from_trace(open_trace(args.tokens_from)) if source.binned else None
    window = TraceWindow(
        duration_s=parse_duration_s(args.duration) if args.duration else None,
        rate_scale=args.rate_scale,
    )
    trace = open_trace(args.trace, window=window, tokens=tokens)
    settings = BacktestSettings()
    demand = profile(trace.batches(), settings.oracle_bucket_s, trace.window.duration_s)
    bounds = Bounds(cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas)
    plan = oracle_plan(
        demand, settings.replica, settings.oracle_utilization, settings.replica.cold_start_s,
        bounds.min_replicas, bounds.max_replicas,
    )  # fmt: skip
    ctx = PolicyContext(cfg=cfg, bounds=bounds, initial_replicas=plan.target_at(0.0), plan=plan)
    ticks = round(demand.duration_s / settings.tick_s)
    look_back_s = cfg.autoscaling.look_back_period_s
    print(
        f"{Path(args.trace).name} x{args.rate_scale:g}: {demand.requests:,} requests, "
        f"{ticks:,} ticks of {settings.tick_s:g} s, peak plan {plan.peak} replicas"
    )

    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(simulate, args.profile, trace, ctx, demand, settings, look_back_s)
        if args.profile_out:
            profiler.dump_stats(args.profile_out)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return 0

    print(
        f"{'policy':<12} {'cpu s':>8} {'wall s':>8} {'requests/cpu s':>15} "
        f"{'in policy':>10} {'simulator req/s':>16}"
    )
    for name in args.policy:
        timed: list[TimedPolicy] = []

        def wrap(policy: Policy, timed: list[TimedPolicy] = timed) -> Policy:
            timed.append(TimedPolicy(policy))
            return timed[-1]

        cpu_started, wall_started = time.process_time(), time.perf_counter()
        simulate(name, trace, ctx, demand, settings, look_back_s, wrap=wrap)
        cpu_s = time.process_time() - cpu_started
        wall_s = time.perf_counter() - wall_started
        policy_s = timed[0].cpu_s
        print(
            f"{name:<12} {cpu_s:>8.1f} {wall_s:>8.1f} {demand.requests / cpu_s:>15,.0f} "
            f"{policy_s / cpu_s:>10.0%} {demand.requests / max(cpu_s - policy_s, 1e-9):>16,.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
