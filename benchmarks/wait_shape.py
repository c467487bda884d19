"""The waits a run sees against the steady wait tail at the count it runs.

For each trace and replica preset (the backtest matrix's cells), autoscalerd runs over the
trace as in the matrix. At every settled tick (no replica starting, the guard's own
condition for calibrating) the tick's queue-wait histogram is set against the steady
formulas' wait tail (`sizing.steady_queue`: the prefill queue and the slots, Poisson
arrivals at the look-back mean, no bursts, no rate mixture) at the count running, with
the replica model as learned by that tick. Per count running it prints the requests seen
and, for each wait threshold, the share predicted over it against the share observed.

What the SLO guard calibrates on is the share over each request's budget, about the
last threshold. Where the observed short waits run above the steady tail and the long
ones at or below it, the traffic's clumps make many short waits and few long ones: the
shape a burst term has to predict, not one a calibration factor on the steady tail can
give (docs/backtest/HISTORY.md, "Four measurements that moved no miss").

    .venv/bin/python benchmarks/wait_shape.py [--only TRACE ...] [--presets PRESET ...]
        [--random-models N --seed S] [--thresholds-s T ...]

About 5-10 seconds a one-hour cell on one core (autoscalerd alone, no references).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The script's own folder is first on sys.path: the matrix's cells, presets and helpers.
import backtest_matrix as bm

from autoscalerd.config import DeploymentConfig, load_config
from autoscalerd.decide import replica_model, sizing
from autoscalerd.decide.baselines.base import Bounds, Policy
from autoscalerd.model import Observation
from autoscalerd.sim.backtest import BacktestSettings, opening_replicas, simulate
from autoscalerd.sim.policies import AutoscalerdPolicy, PolicyContext
from autoscalerd.sim.reference import oracle_plan, profile
from autoscalerd.sim.traces import Trace

ROOT = Path(__file__).resolve().parent.parent
THRESHOLDS_S = (0.001, 0.01, 0.1, 0.3, 0.5, 1.0)
# Counts run for fewer settled ticks than this are left out: too few waits to read.
MIN_TICKS = 30


@dataclass
class Tally:
    """One count's settled ticks: requests, and requests over each threshold."""

    ticks: int = 0
    requests: float = 0.0
    predicted: dict[float, float] = field(default_factory=dict)
    observed: dict[float, float] = field(default_factory=dict)


class WaitRecorder:
    """autoscalerd, unchanged, with each settled tick's waits tallied by count running."""

    name = "autoscalerd"

    def __init__(
        self, inner: AutoscalerdPolicy, cfg: DeploymentConfig, thresholds_s: tuple[float, ...]
    ) -> None:
        self.inner = inner
        self._cfg = cfg
        self._thresholds_s = thresholds_s
        self.tallies: dict[int, Tally] = {}

    def step(self, obs: Observation, now_s: float) -> int:
        target = self.inner.step(obs, now_s)
        decision = self.inner.last_decision
        waits = obs.queue_wait_histogram
        running = obs.running_replicas.value if obs.running_replicas else None
        starting = obs.starting_replicas.value if obs.starting_replicas else None
        if (
            decision is None
            or waits is None
            or waits.total <= 0
            or not running
            or starting != 0
            or decision.arrival_rate_obs_per_s is None
            or decision.wait_budget_s is None
        ):
            return target
        cfg = self._cfg
        state = self.inner.state.replica_model
        model = replica_model.view(
            state, cfg.replica_model, now_s, cfg.capacity.service_rate_per_replica
        )
        model = replica_model.restretched(model, state, cfg.replica_model, now_s)
        steady = sizing.steady_queue(
            model, decision.arrival_rate_obs_per_s, int(running), 1.0, decision.wait_budget_s
        )
        tally = self.tallies.setdefault(int(running), Tally())
        tally.ticks += 1
        tally.requests += waits.total
        for threshold_s in self._thresholds_s:
            share = 1.0 if steady.tail is None else steady.tail.above(threshold_s)
            tally.predicted[threshold_s] = (
                tally.predicted.get(threshold_s, 0.0) + share * waits.total
            )
            tally.observed[threshold_s] = tally.observed.get(threshold_s, 0.0) + waits.count_above(
                threshold_s
            )
        return target


def run_cell(
    trace: Trace, cfg: DeploymentConfig, settings: BacktestSettings, thresholds_s: tuple[float, ...]
) -> tuple[WaitRecorder, float, float]:
    """autoscalerd over `trace`, warm as the backtest starts it: (the recorder, its
    replica-seconds, its attainment)."""
    demand = profile(trace.batches(), settings.oracle_bucket_s, trace.window.duration_s)
    bounds = Bounds(cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas)
    look_back_s = cfg.autoscaling.look_back_period_s
    plan = oracle_plan(
        demand, settings.replica, settings.oracle_utilization, settings.replica.cold_start_s,
        bounds.min_replicas, bounds.max_replicas,
    )  # fmt: skip
    opening = opening_replicas(
        trace, settings, plan.target_at(0.0), bounds, look_back_s, cfg.slo.attainment_target
    )
    ctx = PolicyContext(cfg=cfg, bounds=bounds, initial_replicas=opening, plan=plan)
    recorders: list[WaitRecorder] = []

    def wrap(policy: Policy) -> Policy:
        assert isinstance(policy, AutoscalerdPolicy)
        recorders.append(WaitRecorder(policy, cfg, thresholds_s))
        return recorders[-1]

    row, _ = simulate("autoscalerd", trace, ctx, demand, settings, look_back_s, wrap=wrap)
    return recorders[0], row.replica_seconds, row.slo_attainment_ttft or 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=ROOT / "data" / "traces")
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "backtest.yaml")
    parser.add_argument("--only", nargs="*", help="trace names to run (default: every one)")
    parser.add_argument("--presets", nargs="*", help="replica presets (default: the matrix's two)")
    parser.add_argument("--random-models", type=int, default=0, metavar="N")
    parser.add_argument("--seed", type=int, default=0, help="for --random-models")
    parser.add_argument("--week-duration", type=float, default=6 * 3600.0, metavar="S")
    parser.add_argument(
        "--thresholds-s", type=float, nargs="+", default=list(THRESHOLDS_S), metavar="T"
    )
    args = parser.parse_args()
    if args.random_models < 0:
        parser.error(f"--random-models must be ≥ 0, got {args.random_models}")
    if any(t < 0 for t in args.thresholds_s):
        parser.error("--thresholds-s: every threshold must be ≥ 0 seconds")
    drawn = bm.random_models(args.random_models, args.seed)
    bm.MODELS.update(drawn)
    presets = list(drawn) or args.presets or list(bm.DEVELOPMENT_PRESETS)
    unknown = [p for p in presets if p not in bm.MODELS]
    if unknown:
        parser.error(
            f"--presets: unknown {', '.join(unknown)}; known: {', '.join(sorted(bm.MODELS))}"
        )
    cells = bm.traces(args.traces, args.week_duration)
    names = [name for name, *_ in cells]
    if args.only:
        missing = [n for n in args.only if n not in names]
        if missing:
            parser.error(f"--only: unknown {', '.join(missing)}; known: {', '.join(names)}")
        cells = [c for c in cells if c[0] in args.only]
    try:
        config = load_config(args.config)
    except Exception as exc:  # a config error is a usage error here, said in one line
        print(f"{args.config}: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    base = config.deployment("llm/backtest")
    thresholds_s = tuple(args.thresholds_s)
    print(
        "per count running, settled ticks: share of requests waiting over each threshold, "
        "steady tail predicted / observed"
    )
    for name, path, window, tokens in cells:
        trace = bm.open_cell(path, window, tokens, args.traces)
        for preset in presets:
            cfg, replica = bm.variant_cell(base, bm.MODELS[preset], "as shipped", 1.0, 1.0)
            settings = BacktestSettings(replica=replica, frontiers=False)
            recorder, cost, attained = run_cell(trace, cfg, settings, thresholds_s)
            print(f"\n{name} {preset}: {cost:,.0f} replica-seconds, {100 * attained:.2f} %")
            for replicas in sorted(recorder.tallies):
                tally = recorder.tallies[replicas]
                if tally.ticks < MIN_TICKS:
                    continue
                shares = " ".join(
                    f">{t:g}s {100 * tally.predicted[t] / tally.requests:.2f}/"
                    f"{100 * tally.observed[t] / tally.requests:.2f}%"
                    for t in thresholds_s
                )
                print(
                    f"  {replicas:>3} running, {tally.ticks:>5} ticks, "
                    f"{tally.requests:>7,.0f} requests: {shares}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
