"""Every development trace x every replica preset, with config/backtest.yaml unchanged.

Prints, per trace and preset: autoscalerd's TTFT attainment, the attainable share, its
cost against the oracle frontier at equal attainment, the peers and static-N points that
dominate it (none is the goal), and the best peer. `--sensitivity` adds the table of the
replica-model priors x0.5 and x2 and the cold start x0.5 and x2.

    .venv/bin/python benchmarks/backtest_matrix.py [--traces DIR] [--sensitivity]
    .venv/bin/python benchmarks/backtest_matrix.py --random-models 8 --seed 0 \
        --only azure-2023-code mooncake mooncake-conv   # replica models nobody chose
    .venv/bin/python benchmarks/backtest_matrix.py --held-out-traces   # traces nobody tuned on

The traces are those of data/traces (or --traces DIR); the 2024 week is replayed
for its first `--week-duration` (default 6h), its token lengths drawn from the 2023 file;
WorldCup98 twice: its first `--week-duration` (a calm tide) and the five hours of flash
crowds on May 18 (`worldcup98-flash`).
One simulation per policy and per frontier point: minutes per trace on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import pickle
import random
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

from autoscalerd.config import DeploymentConfig, load_config
from autoscalerd.sim.backtest import (
    BacktestResult,
    BacktestSettings,
    compare_with_frontiers,
    complete_static_frontier,
    run_backtest,
)
from autoscalerd.sim.cluster import REPLICA_PRESETS, ReplicaModel
from autoscalerd.sim.traces import (
    EmpiricalTokens,
    LognormalTokens,
    TokenSampler,
    Trace,
    TraceWindow,
    open_trace,
)

ROOT = Path(__file__).resolve().parents[1]
# The replica presets the decisions were developed on; the others are held out.
DEVELOPMENT_PRESETS = ("70b-4gpu", "8b-1gpu")
PEERS = ["autoscalerd", "ray-serve", "hpa", "kpa"]
# Replica models beyond the product's presets that the decisions were never developed on
# (benchmark-only: not `autoscalerd backtest --replica-model` names): shapes a user may
# run, each far from the development presets in one respect.
MORE_MODELS: dict[str, ReplicaModel] = {
    # A small model on a fast GPU: 128 slots, prefill 100,000 tokens/s, 6-20 ms per output
    # token, serving 15 s after it is asked for (the prefill prior, 8,000, is 12.5x slow).
    "tiny-fast": ReplicaModel(
        max_ongoing_requests=128,
        prefill_tokens_per_s=100_000.0,
        tpot_batch1_s=0.006,
        tpot_full_batch_s=0.020,
        cold_start_s=15.0,
        gpus_per_replica=1,
    ),
    # Decode-bound: 24 slots, 40-120 ms per output token, prefill 20,000 tokens/s.
    "decode-bound": ReplicaModel(
        max_ongoing_requests=24,
        prefill_tokens_per_s=20_000.0,
        tpot_batch1_s=0.040,
        tpot_full_batch_s=0.120,
        cold_start_s=120.0,
        gpus_per_replica=4,
    ),
    # A slow start: weights pulled over the network, 10 minutes before a replica serves.
    "slow-start": ReplicaModel(
        max_ongoing_requests=32,
        prefill_tokens_per_s=12_000.0,
        tpot_batch1_s=0.025,
        tpot_full_batch_s=0.060,
        cold_start_s=600.0,
        gpus_per_replica=4,
    ),
}
MODELS = {**REPLICA_PRESETS, **MORE_MODELS}


def random_models(count: int, seed: int) -> dict[str, ReplicaModel]:
    """`count` replica models drawn at random (`--random-models`), reproducible from
    `seed`: held out by construction. Each parameter is drawn over the range of what
    serves LLMs today, log-uniform where it spans orders of magnitude: 8-256 slots,
    prefill 5,000-160,000 tokens/s, 5-50 ms per output token at batch 1 and 1.5-4x that
    at a full batch, a cold start of 10 s to 10 minutes, 1-8 GPUs."""
    rng = random.Random(seed)

    def log_uniform(low: float, high: float) -> float:
        return float(10 ** rng.uniform(math.log10(low), math.log10(high)))

    models: dict[str, ReplicaModel] = {}
    for index in range(count):
        tpot_batch1_s = log_uniform(0.005, 0.05)
        models[f"random-{index}"] = ReplicaModel(
            max_ongoing_requests=rng.choice([8, 16, 32, 64, 128, 256]),
            prefill_tokens_per_s=round(log_uniform(5_000, 160_000)),
            tpot_batch1_s=round(tpot_batch1_s, 4),
            tpot_full_batch_s=round(tpot_batch1_s * rng.uniform(1.5, 4.0), 4),
            cold_start_s=round(log_uniform(10.0, 600.0)),
            gpus_per_replica=rng.choice([1, 2, 4, 8]),
        )
    return models


def describe(model: ReplicaModel) -> str:
    return (
        f"{model.max_ongoing_requests} slots, prefill {model.prefill_tokens_per_s:,.0f} "
        f"tokens/s, {1000 * model.tpot_batch1_s:g}-{1000 * model.tpot_full_batch_s:g} ms per "
        f"output token, cold start {model.cold_start_s:g} s, {model.gpus_per_replica} "
        f"GPU{'s' if model.gpus_per_replica > 1 else ''}"
    )


# The WorldCup98 file's flash crowds: hours 343-348 (1998-05-18, 07:00-12:00).
FLASH_START_S = 343 * 3600.0
FLASH_DURATION_S = 5 * 3600.0


def traces(directory: Path, week_duration_s: float) -> list[tuple[str, Path, TraceWindow, str]]:
    return [
        ("azure-2023-code", directory / "azure_llm_2023_code.csv", TraceWindow(), "own"),
        (
            "azure-2024-week",
            directory / "azure_llm_2024_code_10s_counts.csv",
            TraceWindow(duration_s=week_duration_s),
            "2023",
        ),
        ("mooncake", directory / "mooncake_fast25_synthetic.jsonl", TraceWindow(), "own"),
        (
            "mooncake-conv",
            directory / "mooncake_fast25_conversation.jsonl",
            TraceWindow(),
            "own",
        ),
        (
            "worldcup98",
            directory / "worldcup98_may_per_minute_20rps.csv",
            TraceWindow(duration_s=week_duration_s),
            "lognormal",
        ),
        # May 18, 07:00-12:00: a dozen flash crowds, from a few requests a minute to
        # 300-1,200 within the minute, and back.
        (
            "worldcup98-flash",
            directory / "worldcup98_may_per_minute_20rps.csv",
            TraceWindow(start_s=FLASH_START_S, duration_s=FLASH_DURATION_S),
            "lognormal",
        ),
    ]


# Other windows of the two long traces, chosen before looking at them: the decisions were
# developed on the first six hours of each (and on the flash crowds), never on these.
HELD_OUT_SLICES_H = {"azure-2024-week": (36.0, 75.0, 138.0), "worldcup98": (180.0, 378.0, 606.0)}


# Real traces of the judged kinds that no decision was developed on (`--held-out-traces`):
# run as they came, to estimate how the decision core does on traffic it never saw. A
# trace that has been tuned on is a development trace and belongs in `traces`.
def held_out_traces(directory: Path) -> list[tuple[str, Path, TraceWindow, str]]:
    """The Azure 2023 conversation service (19,366 requests over 58 minutes)."""
    return [("azure-2023-conv", directory / "azure_llm_2023_conv.csv", TraceWindow(), "own")]


def held_out_slices(directory: Path, duration_s: float) -> list[tuple[str, Path, TraceWindow, str]]:
    """Six-hour windows of the 2024 week and of WorldCup98 that no decision was tuned on."""
    found = []
    for name, path, _, tokens in traces(directory, duration_s):
        for start_h in HELD_OUT_SLICES_H.get(name, ()):
            window = TraceWindow(start_s=start_h * 3600.0, duration_s=duration_s)
            found.append((f"{name}@{start_h:.0f}h", path, window, tokens))
    return found


def open_cell(path: Path, window: TraceWindow, tokens: str, directory: Path) -> Trace:
    """A cell's trace, its token lengths as `traces` names them: the trace's own, drawn
    from the 2023 file ("2023"), or the lognormal 2,048 / 28 ("lognormal")."""
    sampler: TokenSampler | None = None
    if tokens == "2023":
        sampler = EmpiricalTokens.from_trace(open_trace(directory / "azure_llm_2023_code.csv"))
    elif tokens == "lognormal":
        sampler = LognormalTokens(2048, 1.0, 28, 2.0)
    return open_trace(str(path), None, window, sampler)


# What the peers and the frontiers run: the simulator, the peers' policies, the types
# they exchange and the config they read. A cached reference is used only while these
# sources are byte for byte those it was computed on (`reference_key`);
# tests/test_backtest_matrix.py checks that a peers-only backtest calls no other code.
REFERENCE_SOURCES = (
    "autoscalerd/sim",
    "autoscalerd/decide/baselines",
    "autoscalerd/model.py",
    "autoscalerd/config.py",
    "autoscalerd/sense/moments.py",
    "autoscalerd/bucket_shape.py",
)


def reference_key(
    path: Path, window: TraceWindow, tokens: str, cfg: DeploymentConfig,
    settings: BacktestSettings, directory: Path,
) -> str:  # fmt: skip
    """A digest of everything a cell's reference (peers and frontiers) depends on: the
    sources in REFERENCE_SOURCES, the trace (and the token file it borrows), the window,
    the replica model and settings, and the deployment config."""
    digest = hashlib.sha256()
    for source in REFERENCE_SOURCES:
        root = ROOT / source
        for file in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            digest.update(str(file.relative_to(ROOT)).encode())
            digest.update(file.read_bytes())
    digest.update(Path(path).read_bytes())
    if tokens == "2023":
        digest.update((directory / "azure_llm_2023_code.csv").read_bytes())
    digest.update(repr((window, tokens, settings, PEERS)).encode())
    digest.update(cfg.model_dump_json().encode())
    return digest.hexdigest()[:40]


def cached_reference(cache: Path, key: str) -> BacktestResult | None:
    """The reference stored under `key`, or None (absent or unreadable: recomputed)."""
    file = cache / f"{key}.pickle"
    if not file.exists():
        return None
    try:
        loaded = pickle.loads(file.read_bytes())
    except Exception as exc:  # a torn or foreign file: recompute, say so
        print(f"# {file}: unreadable ({type(exc).__name__}); recomputing", file=sys.stderr)
        return None
    return loaded if isinstance(loaded, BacktestResult) else None


def store_reference(cache: Path, key: str, result: BacktestResult) -> None:
    """Store `result` under `key`, without its per-tick series (a reference is read for
    its rows and frontiers); written whole or not at all, so runs may share a cache."""
    cache.mkdir(parents=True, exist_ok=True)
    file = cache / f"{key}.pickle"
    partial = cache / f"{key}.{os.getpid()}.partial"
    partial.write_bytes(pickle.dumps(dataclasses.replace(result, series={})))
    partial.replace(file)


def reference_of(
    path: Path, window: TraceWindow, tokens: str, cfg: DeploymentConfig,
    settings: BacktestSettings, directory: Path,
) -> BacktestResult:  # fmt: skip
    """A cell's reference alone: the peers, static peak, the oracle and the frontiers,
    without autoscalerd (run_one's work for a pool's process)."""
    trace = open_cell(path, window, tokens, directory)
    return dataclasses.replace(run_backtest(trace, PEERS[1:], cfg, settings), series={})


def run_one(
    name: str, path: Path, window: TraceWindow, tokens: str, cfg: DeploymentConfig,
    settings: BacktestSettings, directory: Path, reference: BacktestResult | None = None,
    cache: Path | None = None, pool: Executor | None = None,
) -> tuple[dict[str, object], BacktestResult]:  # fmt: skip
    """One trace under one setting: its row, and the reference it was compared with (the
    full run's result when it made its own). With `reference` (the same trace, replica
    and cold start, other priors), the peers and frontiers are taken from it: they do not
    depend on autoscalerd's priors, and each costs a simulation. With `cache`, a reference
    computed before on the same sources, trace and settings is taken from it, and one
    computed here is stored in it. With `pool`, a reference computed here runs in the
    pool while autoscalerd runs in this process: the same row, in about the time of the
    longer of the two."""
    trace = open_cell(path, window, tokens, directory)
    key = None
    if reference is None and cache is not None:
        key = reference_key(path, window, tokens, cfg, settings, directory)
        reference = cached_reference(cache, key)
    alone = dataclasses.replace(settings, frontiers=False)
    if reference is None and pool is not None:
        # The reference in the pool's process while autoscalerd runs in this one; then
        # the same comparison as with a cached reference.
        pending = pool.submit(reference_of, path, window, tokens, cfg, settings, directory)
        result = run_backtest(trace, ["autoscalerd"], cfg, alone)
        reference = pending.result()
        if cache is not None and key is not None:
            store_reference(cache, key, reference)
    elif reference is not None:
        result = run_backtest(trace, ["autoscalerd"], cfg, alone)
    if reference is None:
        result = run_backtest(trace, PEERS, cfg, settings)
        if cache is not None and key is not None:
            store_reference(cache, key, result)
        ours = result.row("autoscalerd")
        peers = [r for r in result.rows if r.policy in PEERS[1:]]
    else:
        peers = [r for r in reference.rows if r.policy in PEERS[1:]]
        # Every row a full run compares with: the peers, and this run's static peak and
        # oracle (the same simulations as the reference's); the static frontier with the
        # count just below this run's cost, as a full run samples it.
        statics = complete_static_frontier(trace, result, reference.static_frontier, cfg)
        compared = compare_with_frontiers(
            [*result.rows, *peers], statics, reference.oracle_frontier
        )
        ours = next(r for r in compared if r.policy == "autoscalerd")
    compared_with = result if reference is None else reference
    best = max(peers, key=lambda r: (r.slo_attainment_ttft or 0.0, -r.replica_seconds))
    attainable = result.attainable_ttft or 0.0
    return {
        "trace": name,
        "attained": ours.slo_attainment_ttft or 0.0,
        "attainable": attainable,
        "share_of_attainable": (ours.slo_attainment_ttft or 0.0) / attainable
        if attainable
        else None,
        "cost_vs_oracle_eq": ours.cost_vs_oracle_at_equal_attainment,
        "cost_vs_static_peak": ours.cost_vs_static_peak,
        "dominated_by": ",".join(ours.dominated_by) or "-",
        "best_peer": f"{best.policy} {100 * (best.slo_attainment_ttft or 0):.2f}% "
        f"x{best.cost_vs_oracle_at_equal_attainment or 0:.2f}",
    }, compared_with


# Each row's variant: its label, the factor on the replica-model priors and the factor
# on the cold start (the rule's row sizes by ⌈λ/(ρμ)⌉ instead of the model).
VARIANTS: list[tuple[str, float, float]] = [
    ("as shipped", 1.0, 1.0),
    ("rule λ/(ρμ)", 1.0, 1.0),
    ("priors x0.5", 0.5, 1.0),
    ("priors x2", 2.0, 1.0),
    ("cold start x0.5", 1.0, 0.5),
    ("cold start x2", 1.0, 2.0),
]


def variant_cell(
    base_cfg: DeploymentConfig, replica: ReplicaModel, label: str, prior_x: float, cold_x: float
) -> tuple[DeploymentConfig, ReplicaModel]:
    """A row's deployment config and simulated replica: `replica` with its cold start
    scaled by `cold_x`, the config's priors scaled by `prior_x`."""
    replica = dataclasses.replace(replica, cold_start_s=replica.cold_start_s * cold_x)
    priors = base_cfg.replica_model
    cfg = base_cfg.model_copy(
        update={
            "replica_model": priors.model_copy(
                update={
                    "prefill_tokens_per_s": priors.prefill_tokens_per_s * prior_x,
                    "tpot_batch1_s": priors.tpot_batch1_s * prior_x,
                    "tpot_full_batch_s": priors.tpot_full_batch_s * prior_x,
                    "prompt_tokens": priors.prompt_tokens * prior_x,
                    "output_tokens": priors.output_tokens * prior_x,
                }
            ),
            # The operator states the replica's start time; nothing else.
            "capacity": base_cfg.capacity.model_copy(
                update={
                    "cold_start_s": replica.cold_start_s,
                    "sizing": "utilization" if label.startswith("rule") else "model",
                }
            ),
        }
    )
    return cfg, replica


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT / "data" / "traces")
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "backtest.yaml")
    parser.add_argument("--week-duration", type=float, default=6 * 3600.0, metavar="S")
    parser.add_argument("--only", nargs="*", help="trace names to run")
    parser.add_argument(
        "--presets",
        nargs="*",
        default=list(DEVELOPMENT_PRESETS),
        choices=sorted(MODELS),
        help="replica presets (default: the two developed on; 32b-2gpu and 405b-8gpu are held "
        "out, and so are the benchmark's own tiny-fast, decode-bound and slow-start)",
    )
    parser.add_argument(
        "--random-models",
        type=int,
        default=0,
        metavar="N",
        help="run N replica models drawn at random (random_models) instead of --presets",
    )
    parser.add_argument("--seed", type=int, default=0, help="for --random-models")
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument(
        "--held-out-slices",
        action="store_true",
        help="replay other six-hour windows of the 2024 week and WorldCup98 instead",
    )
    parser.add_argument(
        "--held-out-traces",
        action="store_true",
        help="replay the real traces no decision was developed on (held_out_traces) instead",
    )
    parser.add_argument(
        "--reference-cache",
        type=Path,
        metavar="DIR",
        help="keep each cell's peers and frontiers in DIR and reuse them while the "
        "simulator, the peers, the trace and the settings are unchanged (a rerun after a "
        "change of autoscalerd's decisions then simulates autoscalerd alone)",
    )
    parser.add_argument(
        "--utilization",
        action="store_true",
        help="add the classic rule ⌈λ/(ρ·μ)⌉ (capacity.sizing: utilization) for comparison",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        choices=(1, 2),
        help="2: compute a cell's reference in a second process while autoscalerd runs "
        "(the same rows on two cores in about the time of the longer part)",
    )
    args = parser.parse_args()
    if args.random_models < 0:
        parser.error(f"--random-models must be ≥ 0, got {args.random_models}")
    drawn = random_models(args.random_models, args.seed)
    MODELS.update(drawn)
    if drawn:
        args.presets = list(drawn)
        for name, model in drawn.items():
            print(f"# {name} (seed {args.seed}): {describe(model)}")
    config = load_config(args.config)
    base_cfg = config.deployments[0] if config.deployments else config.deployment("llm/backtest")
    header = (
        f"{'trace':<20} {'preset':<9} {'variant':<14} {'attained':>9} {'attainable':>10} "
        f"{'share':>7} {'x oracle=':>9} {'x static':>8}  dominated_by / best peer"
    )
    print(header)
    variants = [VARIANTS[0]]
    if args.utilization:
        variants.append(VARIANTS[1])
    if args.sensitivity:
        variants += VARIANTS[2:]
    if args.held_out_slices and args.held_out_traces:
        parser.error("--held-out-slices and --held-out-traces are two runs: give one")
    if args.held_out_slices:
        cells = held_out_slices(args.traces, args.week_duration)
    elif args.held_out_traces:
        cells = held_out_traces(args.traces)
    else:
        cells = traces(args.traces, args.week_duration)
    # A second process for references when asked: one worker, so two cores at most.
    pool = ProcessPoolExecutor(max_workers=1) if args.jobs == 2 else None
    try:
        for name, path, window, tokens in cells:
            if args.only and name not in args.only:
                continue
            for preset in args.presets:
                shipped: BacktestResult | None = None
                for label, prior_x, cold_x in variants:
                    cfg, replica = variant_cell(base_cfg, MODELS[preset], label, prior_x, cold_x)
                    row, compared_with = run_one(
                        name,
                        path,
                        window,
                        tokens,
                        cfg,
                        BacktestSettings(replica=replica),
                        args.traces,
                        reference=shipped if cold_x == 1.0 else None,
                        cache=args.reference_cache,
                        pool=pool,
                    )
                    if label == "as shipped":
                        shipped = compared_with
                    share = row["share_of_attainable"]
                    ratio = row["cost_vs_oracle_eq"]
                    print(
                        f"{name:<20} {preset:<9} {label:<14} {100 * float(row['attained']):>8.2f}% "  # type: ignore[arg-type]
                        f"{100 * float(row['attainable']):>9.2f}% "  # type: ignore[arg-type]
                        f"{'-' if share is None else f'{100 * float(share):.1f}%':>7} "  # type: ignore[arg-type]
                        f"{'-' if ratio is None else f'{float(ratio):.2f}':>9} "  # type: ignore[arg-type]
                        f"{float(row['cost_vs_static_peak'] or 0):>8.2f}  "  # type: ignore[arg-type]
                        f"{row['dominated_by']} / {row['best_peer']}",
                        flush=True,
                    )
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
