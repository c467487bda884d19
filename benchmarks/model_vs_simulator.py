"""The sizing's predicted late share against the simulator's, on stationary Poisson load.

For each case (replica preset, arrival rate, prompt mean and coefficient of variation),
this writes one hour of Poisson arrivals with lognormal prompts, lets autoscalerd run over
it so that the replica model is learned from the simulated sensor as the daemon would
learn it, then holds the simulated cluster at fixed counts R and compares, at each R:

- predicted: `sizing.predicted_tail` at R with the learned model, the true rate and no
  burst term (Poisson has no clumps to speak of), the share of attainable requests late
  by waiting;
- simulated: 1 − attainment / attainable share of the static-R run.

The simulator routes to the least-loaded replica (ongoing requests); the model takes R
independent M/G/1 prefill queues (ARCHITECTURE.md §Decide v2). Where the two part is
what the SLO guard's calibration has to make up online.

    .venv/bin/python benchmarks/model_vs_simulator.py [--duration-s 3600] [--case ...]

About 2 minutes for the default cases on one core. Prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path

import numpy as np

from autoscalerd.config import DeploymentConfig, load_config
from autoscalerd.decide import replica_model, sizing, slo_guard
from autoscalerd.decide.baselines.base import Bounds
from autoscalerd.sim.backtest import (
    BacktestSettings,
    PolicyResult,
    attainable_share,
    opening_replicas,
    simulate_policy,
)
from autoscalerd.sim.cluster import REPLICA_PRESETS
from autoscalerd.sim.policies import AutoscalerdPolicy, StaticPolicy
from autoscalerd.sim.reference import DemandProfile, profile
from autoscalerd.sim.traces import LognormalTokens, Trace, open_trace

ROOT = Path(__file__).resolve().parent.parent
# (preset, requests/s, prompt mean tokens, prompt CV): prefill-bound loads at several
# shares of a replica's prefill capacity, light and heavy-tailed prompts, three presets.
CASES = (
    ("70b-4gpu", 12.0, 2048.0, 1.0),
    ("70b-4gpu", 20.0, 2048.0, 1.0),
    ("70b-4gpu", 12.0, 2048.0, 2.0),
    ("70b-4gpu", 4.0, 2048.0, 2.0),
    ("8b-1gpu", 30.0, 4096.0, 2.0),
    ("32b-2gpu", 20.0, 2048.0, 1.0),
    ("32b-2gpu", 2.5, 4096.0, 2.0),
)
OUTPUT_MEAN_TOKENS = 28.0
OUTPUT_CV = 2.0
# Counts compared: those whose simulated late share is between these (an overloaded count
# and one with no misses say nothing about the tail's level).
SHOWN_LATE = (0.0005, 0.5)


def write_trace(
    path: Path, rate_per_s: float, prompt_mean: float, cv: float, duration_s: float
) -> None:
    rng = np.random.default_rng(1)
    count = int(rng.poisson(rate_per_s * duration_s))
    times = np.sort(rng.uniform(0.0, duration_s, count))
    tokens = LognormalTokens(prompt_mean, cv, OUTPUT_MEAN_TOKENS, OUTPUT_CV)
    prompts, outputs = tokens.sample(rng, count)
    start = dt.datetime(2024, 1, 1)
    with path.open("w") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for at_s, prompt, output in zip(times, prompts, outputs, strict=True):
            stamp = (start + dt.timedelta(seconds=float(at_s))).strftime("%Y-%m-%d %H:%M:%S.%f")
            out.write(f"{stamp},{prompt},{output}\n")


def learn(
    trace: Trace,
    demand: DemandProfile,
    settings: BacktestSettings,
    cfg: DeploymentConfig,
    duration_s: float,
) -> tuple[PolicyResult, AutoscalerdPolicy, float]:
    """autoscalerd over the trace, so that its replica model is learned from the simulated
    sensor as the daemon would learn it, starting warm as the backtest starts every
    adaptive policy (the count the opening window needs): (its row, the policy, the time
    of its last decision)."""
    look_back_s = cfg.autoscaling.look_back_period_s
    bounds = Bounds(cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas)
    opening = opening_replicas(trace, settings, 1, bounds, look_back_s, cfg.slo.attainment_target)
    policy = AutoscalerdPolicy(cfg, opening)
    row, _ = simulate_policy(policy, opening, trace, demand, settings, look_back_s)
    return row, policy, policy.state.last_decided_at_s or duration_s


def run_case(
    case: tuple[str, float, float, float], duration_s: float, workdir: Path
) -> tuple[int | None, int | None, float, float]:
    """Print the case's table; (count the model sizes, count the simulator needs: the
    smallest R whose late share, predicted or simulated, is within ε; autoscalerd's mean
    replicas and late share over the run, calibration and all)."""
    preset, rate_per_s, prompt_mean, cv = case
    replica = REPLICA_PRESETS[preset]
    config = load_config(ROOT / "config/backtest.yaml")
    cfg = config.deployment("llm/backtest")
    cfg = cfg.model_copy(
        update={"capacity": cfg.capacity.model_copy(update={"cold_start_s": replica.cold_start_s})}
    )
    path = workdir / f"poisson_{preset}_{rate_per_s}_{prompt_mean}_{cv}.csv"
    write_trace(path, rate_per_s, prompt_mean, cv, duration_s)
    trace = open_trace(path)
    settings = BacktestSettings(replica=replica, frontiers=False)
    demand = profile(trace.batches(), settings.oracle_bucket_s, trace.window.duration_s)
    look_back_s = cfg.autoscaling.look_back_period_s
    ours, policy, end_s = learn(trace, demand, settings, cfg, duration_s)
    state = policy.state.replica_model
    model = replica_model.view(
        state, cfg.replica_model, end_s, cfg.capacity.service_rate_per_replica
    )
    model = replica_model.restretched(model, state, cfg.replica_model, end_s)
    ttft_s = cfg.slo.ttft_s or settings.ttft_slo_s
    budget_s = slo_guard.wait_budget_s(cfg.slo.queue_wait_s, ttft_s, model.prefill_s)
    assert budget_s is not None  # a TTFT SLO is always given here
    inputs = sizing.SizingInputs(
        arrival_rate_per_s=rate_per_s,
        peak_to_mean=0.0,
        tick_s=settings.tick_s,
        wait_budget_s=budget_s,
        tail_share=1.0 - cfg.slo.attainment_target,
        ttft_s=ttft_s,
    )
    true_sq = prompt_mean**2 * (1 + cv * cv)
    print(
        f"\n{preset}, {rate_per_s:g} requests/s, prompts {prompt_mean:.0f} tokens (CV {cv:g}): "
        f"learned {model.prefill_tokens_per_s or 0:,.0f} prefill tokens/s "
        f"(true {replica.prefill_tokens_per_s:,.0f}), "
        f"E[prompt²] {model.prompt_tokens_sq_mean or 0:.3g} (true {true_sq:.3g})"
    )
    print(f"{'R':>4} {'ρ':>6} {'late, predicted':>16} {'late, simulated':>16} {'ratio':>6}")
    attainable = attainable_share(trace, settings)
    share = 1.0 - cfg.slo.attainment_target
    sized: int | None = None
    needed: int | None = None
    replicas = 1
    while replicas <= cfg.autoscaling.max_replicas:
        row, _ = simulate_policy(
            StaticPolicy(f"static-{replicas}", replicas),
            replicas,
            trace,
            demand,
            settings,
            look_back_s,
        )
        achieved = row.slo_attainment_ttft or 0.0
        simulated = 1.0 - achieved / attainable if attainable else 0.0
        predicted, rho, _, _ = sizing.predicted_tail(model, inputs, replicas)
        if sized is None and predicted <= share:
            sized = replicas
        if needed is None and simulated <= share:
            needed = replicas
        if SHOWN_LATE[0] <= simulated <= SHOWN_LATE[1]:
            ratio = predicted / simulated if simulated > 0 else float("inf")
            rho_shown = "-" if rho is None else f"{rho:.2f}"
            print(
                f"{replicas:>4} {rho_shown:>6} {100 * predicted:>15.2f}% "
                f"{100 * simulated:>15.2f}% {ratio:>6.2f}"
            )
        if simulated < SHOWN_LATE[0] and sized is not None:
            break
        replicas += 1
    ours_late = 1.0 - (ours.slo_attainment_ttft or 0.0) / attainable if attainable else 0.0
    return sized, needed, ours.replica_seconds / duration_s, ours_late


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=3600.0, help="seconds of load per case")
    parser.add_argument(
        "--case",
        action="append",
        default=None,
        metavar="PRESET:RATE:PROMPT_MEAN:CV",
        help="a case instead of the defaults, e.g. 70b-4gpu:12:2048:1 (repeatable)",
    )
    args = parser.parse_args(argv)
    cases = list(CASES)
    if args.case:
        cases = []
        for text in args.case:
            parts = text.split(":")
            if len(parts) != 4 or parts[0] not in REPLICA_PRESETS:
                parser.error(
                    f"--case {text!r}: expected PRESET:RATE:PROMPT_MEAN:CV with PRESET one of "
                    f"{', '.join(sorted(REPLICA_PRESETS))}, e.g. 70b-4gpu:12:2048:1"
                )
            try:
                rate, mean, cv = (float(part) for part in parts[1:])
            except ValueError:
                parser.error(f"--case {text!r}: RATE, PROMPT_MEAN and CV must be numbers")
            if not (rate > 0 and mean > 0 and cv >= 0):
                parser.error(f"--case {text!r}: RATE and PROMPT_MEAN must be > 0, CV ≥ 0")
            cases.append((parts[0], rate, mean, cv))
    if not args.duration_s > 0:
        parser.error("--duration-s must be > 0")
    summary = []
    with tempfile.TemporaryDirectory() as workdir:
        for case in cases:
            summary.append((case, *run_case(case, args.duration_s, Path(workdir))))
    print("\nThe count within ε = 1 − attainment target (uncalibrated model, Poisson load):")
    print(
        f"{'preset':<10} {'rate/s':>7} {'prompt':>7} {'CV':>4} {'model sizes':>12} "
        f"{'needed':>7} {'autoscalerd runs':>17} {'its late share':>15}"
    )
    for (preset, rate, mean, cv), sized, needed, mean_replicas, late in summary:
        print(
            f"{preset:<10} {rate:>7g} {mean:>7.0f} {cv:>4g} {sized if sized else '-':>12} "
            f"{needed if needed else '-':>7} {mean_replicas:>17.2f} {100 * late:>14.2f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
