"""`autoscalerd backtest`: replay a trace through the simulated cluster under each policy.

`add_parser` registers the subcommand on the main CLI; `run` executes it and returns the
exit code: 0 ok, 2 bad usage or input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import cast

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from autoscalerd.config import ConfigError, DeploymentConfig, load_config
from autoscalerd.sim.cluster import REPLICA_PRESETS, ReplicaModel
from autoscalerd.sim.policies import POLICIES
from autoscalerd.sim.traces import (
    FORMATS,
    EmpiricalTokens,
    LognormalTokens,
    TokenSampler,
    TraceError,
    TraceFormat,
    TraceWindow,
    open_trace,
    parse_duration_s,
)

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
# The backtest's own autoscalerd config, shipped with the project.
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "backtest.yaml"


class UsageError(Exception):
    """Bad arguments or input: one line for stderr."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "backtest",
        help="replay a trace through autoscalerd and its peers in a simulated cluster",
        description=(
            "Replay a request trace through a simulated cluster of LLM replicas under "
            "autoscalerd and the policies users would otherwise pick; compare TTFT SLO "
            "attainment and cost. Prints a table; --json and --plot write the rest."
        ),
    )
    trace = parser.add_argument_group("trace")
    trace.add_argument("--trace", required=True, metavar="FILE", help="trace file (CSV or JSONL)")
    trace.add_argument(
        "--format", choices=FORMATS, help="trace format (default: detected from the header)"
    )
    trace.add_argument(
        "--rate-scale",
        type=_positive_float,
        default=1.0,
        metavar="X",
        help="scale the request rate",
    )
    trace.add_argument(
        "--start", default="0", metavar="D", help="skip this much of the trace (e.g. 6h, 2d)"
    )
    trace.add_argument("--duration", metavar="D", help="replay this much (e.g. 6h, 2d)")
    trace.add_argument("--seed", type=int, default=0, metavar="N", help="RNG seed (default 0)")
    trace.add_argument(
        "--tokens-from",
        metavar="FILE",
        help="binned traces: sample token lengths from this request-level trace",
    )
    trace.add_argument(
        "--prompt-tokens",
        default="2048:1.0",
        metavar="MEAN[:CV]",
        help="binned traces without --tokens-from: lognormal prompt length (default 2048:1.0)",
    )
    trace.add_argument(
        "--output-tokens",
        default="28:2.0",
        metavar="MEAN[:CV]",
        help="binned traces without --tokens-from: lognormal output length (default 28:2.0)",
    )

    policy = parser.add_argument_group("policies")
    policy.add_argument(
        "--policy",
        nargs="+",
        default=["all"],
        metavar="NAME",
        help=f"policies to run, or all (default): {', '.join(POLICIES)}; "
        "static-peak and oracle always run",
    )
    policy.add_argument(
        "--config",
        metavar="FILE",
        help="autoscalerd's YAML config (default: config/backtest.yaml); its min/max "
        "replicas bound every policy",
    )
    policy.add_argument(
        "--deployment", metavar="NAME", help="deployment in --config (default: the first listed)"
    )
    policy.add_argument(
        "--jobs",
        type=_jobs,
        default=1,
        metavar="N",
        help="run N simulations at once, in worker processes (default 1; the results are "
        "the same; 0: one per CPU this process may use)",
    )

    model = parser.add_argument_group(
        "simulated replica (a preset, each parameter overridable; default preset 70b-4gpu)"
    )
    defaults = ReplicaModel()
    model.add_argument(
        "--replica-model",
        choices=sorted(REPLICA_PRESETS),
        default="70b-4gpu",
        help="replica preset (default 70b-4gpu; the defaults below are that preset's)",
    )
    model.add_argument(
        "--max-ongoing-requests",
        type=int,
        default=None,
        metavar="N",
        help=f"requests one replica holds (default {defaults.max_ongoing_requests})",
    )
    model.add_argument(
        "--prefill-tokens-per-s",
        type=_positive_float,
        default=None,
        metavar="R",
        help=f"prefill speed, one prefill at a time (default {defaults.prefill_tokens_per_s:g})",
    )
    model.add_argument(
        "--tpot-batch1-s",
        type=_positive_float,
        default=None,
        metavar="S",
        help=f"time per output token, one request decoding (default {defaults.tpot_batch1_s:g})",
    )
    model.add_argument(
        "--tpot-full-batch-s",
        type=_positive_float,
        default=None,
        metavar="S",
        help=f"... with a full batch (default {defaults.tpot_full_batch_s:g}); linear between",
    )
    model.add_argument(
        "--cold-start-s",
        type=_non_negative_float,
        default=None,
        metavar="S",
        help=f"from asking for a replica to its first request (default {defaults.cold_start_s:g})",
    )
    model.add_argument(
        "--gpus-per-replica",
        type=int,
        default=None,
        metavar="N",
        help=f"for GPU-seconds (default {defaults.gpus_per_replica})",
    )
    model.add_argument(
        "--tick-s", type=_positive_float, default=1.0, metavar="S", help="policy period (1)"
    )
    model.add_argument(
        "--ttft-slo-s",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="TTFT SLO for attainment (1); autoscalerd's guard reads its --config",
    )
    model.add_argument(
        "--oracle-utilization",
        type=_positive_float,
        default=0.8,
        metavar="RHO",
        help="the oracle sizes each minute's work at this utilisation (default 0.8)",
    )

    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="OUT", help="write the results as JSON ('-': stdout)")
    out.add_argument("--plot", metavar="OUT.png", help="write the figure (PNG)")
    out.add_argument("--markdown", metavar="OUT.md", help="write the table as Markdown")
    out.add_argument(
        "--no-frontier",
        action="store_true",
        help="skip the static and oracle frontiers (one simulation per point)",
    )
    out.add_argument(
        "--no-progress", action="store_true", help="no progress bar (off anyway without a TTY)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (UsageError, TraceError) as exc:
        print(f"autoscalerd: backtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        for line in exc.problems:
            print(f"autoscalerd: backtest: {line}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenProcessPool:
        print(
            f"autoscalerd: backtest: a worker process of --jobs {args.jobs} ended abruptly "
            "(out of memory?); run again with fewer --jobs",
            file=sys.stderr,
        )
        return EXIT_FAILURE


def _run(args: argparse.Namespace) -> int:
    from autoscalerd.sim import report
    from autoscalerd.sim.backtest import BacktestSettings, run_backtest

    policies = _policies(args.policy)
    cfg = _deployment_config(args.config, args.deployment)
    for option in ("json", "plot", "markdown"):
        _check_writable(getattr(args, option), f"--{option}")
    preset = REPLICA_PRESETS[args.replica_model]
    overrides = {
        name: getattr(args, name)
        for name in (
            "max_ongoing_requests",
            "prefill_tokens_per_s",
            "tpot_batch1_s",
            "tpot_full_batch_s",
            "cold_start_s",
            "gpus_per_replica",
        )
        if getattr(args, name) is not None
    }
    try:
        replica = dataclasses.replace(preset, **overrides)
    except ValueError as exc:
        raise UsageError(f"simulated replica: {exc}") from None
    settings = BacktestSettings(
        replica=replica,
        tick_s=args.tick_s,
        ttft_slo_s=args.ttft_slo_s,
        oracle_utilization=args.oracle_utilization,
        frontiers=not args.no_frontier,
    )
    window = TraceWindow(
        start_s=_duration(args.start, "--start"),
        duration_s=_duration(args.duration, "--duration") if args.duration else None,
        rate_scale=args.rate_scale,
        seed=args.seed,
    )
    if window.duration_s is not None and window.duration_s <= 0:
        raise UsageError("--duration must be > 0")
    tokens = _tokens(args)
    trace = open_trace(args.trace, cast(TraceFormat | None, args.format), window, tokens)

    # autoscalerd is told how long the simulated replica takes to start, as an operator
    # states it for a real one; nothing else about the replica.
    cfg = cfg.model_copy(
        update={"capacity": cfg.capacity.model_copy(update={"cold_start_s": replica.cold_start_s})}
    )
    with _progress(enabled=not args.no_progress) as progress:
        result = run_backtest(
            trace,
            policies,
            cfg,
            settings,
            on_progress=progress.update,
            on_policy_start=progress.start,
            jobs=args.jobs,
        )
    report.print_table(result, Console(soft_wrap=False, width=160))
    if args.json == "-":
        print(report.json_text(result))
    elif args.json:
        report.write_json(result, args.json)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown(result))
    if args.plot:
        report.plot(result, args.plot)
    return EXIT_OK


def _policies(names: list[str]) -> list[str]:
    if "all" in names:
        return list(POLICIES)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise UsageError(
            f"--policy: unknown {', '.join(unknown)}; choose from {', '.join(POLICIES)} or all"
        )
    return list(dict.fromkeys(names))


def _deployment_config(path: str | None, name: str | None) -> DeploymentConfig:
    if path is None:
        # The built-in defaults know nothing of the simulated model (μ = 1 request/s):
        # better no backtest than a misleading one.
        if not DEFAULT_CONFIG.exists():
            raise UsageError(
                f"no --config given and {DEFAULT_CONFIG} is not there; pass --config FILE "
                "(the project ships config/backtest.yaml)"
            )
        path = str(DEFAULT_CONFIG)
    config = load_config(path)
    if name is not None:
        listed = [d.name for d in config.deployments]
        if listed and name not in listed:
            raise UsageError(
                f"--deployment: {name!r} is not in {path}; listed: {', '.join(listed)}"
            )
        return config.deployment(name)
    if config.deployments:
        return config.deployments[0]
    return config.deployment("llm/backtest")


def _tokens(args: argparse.Namespace) -> TokenSampler | None:
    if args.tokens_from:
        source = open_trace(args.tokens_from)
        if source.binned:
            raise UsageError(
                f"--tokens-from: {args.tokens_from} is a binned-count file; "
                "pass a request-level trace with token counts"
            )
        return EmpiricalTokens.from_trace(source, seed=args.seed)
    prompt_mean, prompt_cv = _mean_cv(args.prompt_tokens, "--prompt-tokens")
    output_mean, output_cv = _mean_cv(args.output_tokens, "--output-tokens")
    sampler = LognormalTokens(prompt_mean, prompt_cv, output_mean, output_cv)
    # Only binned traces draw token lengths; a request-level trace carries its own.
    return sampler if _is_binned(args) else None


def _is_binned(args: argparse.Namespace) -> bool:
    if args.format is not None:
        return bool(args.format == "counts")
    from autoscalerd.sim.traces import detect_format

    try:
        with open(args.trace, encoding="utf-8") as handle:
            header = handle.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError):
        return False  # open_trace reports the problem
    try:
        return detect_format(Path(args.trace), header) == "counts"
    except TraceError:
        return False


def _mean_cv(text: str, option: str) -> tuple[float, float]:
    mean_text, _, cv_text = text.partition(":")
    try:
        mean = float(mean_text)
        cv = float(cv_text) if cv_text else 1.0
    except ValueError:
        raise UsageError(f"{option}: {text!r} is not MEAN or MEAN:CV, e.g. 2048:1.0") from None
    if mean < 1 or cv < 0:
        raise UsageError(f"{option}: mean must be >= 1 and cv >= 0 (got {text})")
    return mean, cv


def _duration(text: str, option: str) -> float:
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _check_writable(path: str | None, option: str) -> None:
    if path is None or path == "-":
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{option}: directory {parent} does not exist; create it or pick another")


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number; pass the simulations to run at once"
        ) from None
    if jobs < 0:
        raise argparse.ArgumentTypeError(f"{jobs} is negative; pass 1 or more, or 0 for all CPUs")
    if jobs == 0:
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    return jobs


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text})")
    return value


class _Progress:
    """A rich progress bar per policy on stderr; silent when stderr is not a terminal."""

    def __init__(self, enabled: bool) -> None:
        console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not (enabled and console.is_terminal),
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _Progress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)

    def start(self, policy: str, requests: int) -> None:
        self._tasks[policy] = self._bar.add_task(policy, total=requests)

    def update(self, policy: str, done: int) -> None:
        task = self._tasks.get(policy)
        if task is not None:
            self._bar.update(task, completed=done)


def _progress(enabled: bool) -> _Progress:
    return _Progress(enabled)
