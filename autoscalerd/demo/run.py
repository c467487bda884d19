"""`autoscalerd demo`: autoscale an embedded local Ray cluster under a real trace.

Starts a local autoscaling Ray cluster (logical GPU worker nodes), deploys the LLM
emulator with external scaling, replays a slice of a real trace against it over loopback,
time-compressed and open loop, runs autoscalerd live against it (ray_serve sensor,
ray_serve and ray_autoscaler actuators), shows a live view, and writes a report. Whatever
happens (Ctrl-C, an error), the cluster it started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoscalerd import extras, logs
from autoscalerd.config import Config, ConfigError, PluginConfig, load_config
from autoscalerd.decide.gpu_health import ReplicaPlacement

REPO = Path(__file__).resolve().parents[2]
# The Azure 2024 code week from Sunday noon to Tuesday 00:00 (36 h): the quiet weekend,
# Monday's morning ramp to the weekday peak (about 10x the night's rate) and its fall,
# replayed 288x faster (7.5 minutes) and thinned to what three emulated replicas serve.
# Not faster: on two cores a replica takes 10-15 s from the request to serving (a logical
# GPU node's raylet, agents and worker, then the replica, starve the serving processes
# while they start), and at 432x the morning ramp quadruples in less than that.
DEFAULT_TRACE = REPO / "data" / "traces" / "azure_llm_2024_code_10s_counts.csv"
DEFAULT_CONFIG = REPO / "config" / "demo.yaml"
APP_NAME = "llm"
ROUTE = "/llm"
# The emulated replica, a model on one GPU: 8 requests at a time, one prefill at a time
# at 40,000 tokens/s (~0.05 s for the Azure code trace's mean prompt) + 30 ms per output
# token (about 9 requests/s a replica): the replicas, not the two cores' Ray proxy, are
# what runs out at the peak, and node starts leave the serving path CPU to spare.
EMULATOR_ARGS = {
    "max_ongoing_requests": 8,
    "num_gpus": 1,
    "prefill_tokens_per_s": 40_000,
    "tpot_s": 0.03,
    "max_prompt_tokens": 32_768,
    "max_output_tokens": 512,
}


def add_parser(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="autoscale an embedded local Ray cluster under a real trace, with a report"
    )
    demo.add_argument(
        "--trace",
        type=Path,
        default=DEFAULT_TRACE,
        help="trace file (any format the backtest reads)",
    )
    demo.add_argument(
        "--start", default="60h", help="where the slice starts in the trace (s, or 2m, 1h)"
    )
    demo.add_argument("--duration", default="36h", help="length of the trace slice (s, or 12m)")
    demo.add_argument("--speed", type=float, default=288.0, help="trace seconds per wall second")
    demo.add_argument(
        "--rate-scale", type=float, default=0.00045, help="thin (<1) or copy (>1) requests"
    )
    demo.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help="autoscalerd config for the demo"
    )
    demo.add_argument("--report-dir", type=Path, default=Path("demo-report"))
    demo.add_argument(
        "--tail",
        type=float,
        default=None,
        help="seconds to keep watching after the load (default: downscale delay + cold start "
        "+ actuation delay + forecast bucket)",
    )
    demo.add_argument(
        "--inject-gpu-fault",
        action="store_true",
        help="halfway through the load, one replica's (emulated) GPU reports XID 79: the "
        "daemon replaces the lost capacity",
    )


@dataclass(frozen=True, slots=True)
class Plan:
    schedule: list[Any]  # emulator.loadgen.ScheduledRequest
    load_s: float
    tail_s: float
    config: Config


def _seconds(text: str, what: str) -> float:
    from autoscalerd.sim.traces import parse_duration_s  # the backtest's: 90, 15m, 6h, 2d

    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise ConfigError([f"--{what}: {exc}"]) from None


def plan(args: argparse.Namespace) -> Plan:
    from autoscalerd.emulator.loadgen import ScheduledRequest
    from autoscalerd.sim.traces import TraceError, TraceWindow, open_trace

    if args.speed <= 0 or args.rate_scale <= 0:
        raise ConfigError(["--speed and --rate-scale: must be > 0"])
    start_s = _seconds(args.start, "start")
    duration_s = _seconds(args.duration, "duration")
    config = load_config(args.config)
    try:
        trace = open_trace(args.trace, window=TraceWindow(start_s, duration_s, args.rate_scale, 0))
        schedule = [
            ScheduledRequest(float(at_s) / args.speed, int(prompt), int(output))
            for batch in trace.batches()
            for at_s, prompt, output in zip(
                batch.arrival_s, batch.prompt_tokens, batch.output_tokens, strict=True
            )
        ]
    except TraceError as exc:
        raise ConfigError([str(exc)]) from None
    if not schedule:
        raise ConfigError(
            [f"--trace {args.trace}: no requests in the slice; change --start/--duration"]
        )
    # The quiet tail lasts what the daemon needs to see the quiet and act on it: the
    # forecast looks a lead time ahead, in buckets, and then the downscale delay runs.
    d = config.defaults
    settle_s = (
        d.autoscaling.downscale_delay_s
        + d.capacity.cold_start_s
        + d.capacity.actuation_delay_s
        + d.forecast.bucket_s
    )
    tail_s = args.tail if args.tail is not None else settle_s
    return Plan(schedule, duration_s / args.speed, tail_s, config)


def run(args: argparse.Namespace) -> int:
    """Exit 0 with a report, 2 on bad input or without the demo extra, 1 when the cluster
    or the run failed."""
    # Ray (its module and the `ray` executable that starts the cluster), pandas, rich and
    # matplotlib, checked before anything starts: one line if the extra is missing.
    extras.require("demo")
    logs.configure("error", stream=sys.stderr)
    the_plan = plan(args)
    from autoscalerd.emulator import cluster as local

    workdir = Path(tempfile.mkdtemp(prefix="autoscalerd-demo-"))
    print(
        f"autoscalerd demo: {len(the_plan.schedule)} requests from {args.trace.name} "
        f"over {the_plan.load_s:.0f} s (speed {args.speed:g}x), then {the_plan.tail_s:.0f} s "
        f"of quiet; starting a local Ray cluster (logs in {workdir})",
        flush=True,
    )
    started = time.monotonic()
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        cluster = local.start(workdir)
        local.deploy(cluster, [local.AppSpec(APP_NAME, ROUTE, True, EMULATOR_ARGS)])
        print(f"cluster up in {time.monotonic() - started:.0f} s; replaying the trace", flush=True)
        summary_text = asyncio.run(_drive(cluster, the_plan, args))
        print(summary_text, flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the local Ray cluster", file=sys.stderr, flush=True)
    except local.ClusterError as exc:
        print(f"autoscalerd demo: {exc}", file=sys.stderr)
        return 1
    finally:
        local.stop()
        signal.signal(signal.SIGTERM, previous)
        print(f"local Ray cluster stopped ({time.monotonic() - started:.0f} s in all)", flush=True)
    return 130 if interrupted else 0


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def _drive(cluster: Any, the_plan: Plan, args: argparse.Namespace) -> str:
    from autoscalerd.act import registry
    from autoscalerd.act.base import ActuatorContext
    from autoscalerd.clock import RealClock
    from autoscalerd.demo.report import RequestOutcome, TickRow, write_report
    from autoscalerd.demo.view import DemoView
    from autoscalerd.emulator import loadgen
    from autoscalerd.forecast import holt_winters
    from autoscalerd.loop import Controller, TickReport

    os.environ.update({k: v for k, v in cluster.env().items() if k.startswith("RAY_")})
    config = the_plan.config.model_copy(
        update={
            "cluster": the_plan.config.cluster.model_copy(
                update={
                    "dashboard_url": cluster.dashboard_url,
                    "token": cluster.token,
                    "address": cluster.gcs_address,
                }
            )
        }
    )
    deployment = f"{APP_NAME}/{_deployment_name()}"
    gpus: EmulatedGpus | None = None
    if args.inject_gpu_fault:
        gpus = EmulatedGpus(
            Path(tempfile.mkdtemp(prefix="autoscalerd-gpus-")) / "nvml.json",
            # One per logical GPU node the local cluster can start, and one spare.
            config.deployment(deployment).autoscaling.max_replicas + 1,
        )
        os.environ["AUTOSCALERD_FAKE_NVML"] = str(gpus.path)
        config = config.model_copy(
            update={
                "sensors": (
                    *config.sensors,
                    PluginConfig(type="nvml", library="autoscalerd.emulator.fake_nvml"),
                ),
                # The local cluster has as many logical GPU nodes as max_replicas: the
                # failed replica must make room, not wait for a GPU that is not there.
                "gpu": config.gpu.model_copy(update={"replace_failed": True}),
            }
        )
    slo = config.deployment(deployment).slo
    ttft_slo_s = slo.ttft_s or 1.0
    sensors = registry.build_sensors(config)
    actuators = registry.build_actuators(config, ActuatorContext(config=config, dry_run=False))
    # Refits are tiny here (a few 10 s buckets): in line, no worker process to clean up;
    # statsmodels imported before the load starts, not by the first refit in mid-load.
    holt_winters.preload()
    controller = Controller(config, sensors, actuators, RealClock(), inline_refit=True)
    view = DemoView(deployment, ttft_slo_s, slo.e2e_s, the_plan.load_s + the_plan.tail_s)
    rows: list[TickRow] = []
    outcomes: list[RequestOutcome] = []
    load_started = time.monotonic()
    gpu_nodes: list[int | None] = [None]
    progress = {"sent": 0, "answered": 0}

    def on_tick(ctrl: Controller, report: TickReport) -> None:
        runtime = ctrl.deployments.get(deployment)
        if runtime is None:
            return
        obs, decision = runtime.last_observation, runtime.last_decision
        value = obs.fresh if obs is not None else None

        def seen(name: str) -> float | None:
            return value(name, ctrl.clock.now_s(), 60.0) if value is not None else None

        def count(name: str) -> int | None:
            got = seen(name)
            return None if got is None else int(got)

        row = TickRow(
            at_s=round(time.monotonic() - load_started, 3),
            arrival_rate_per_s=seen("arrival_rate_per_s"),
            forecast_rate_per_s=decision.arrival_rate_upper_per_s if decision else None,
            desired_replicas=decision.target_replicas if decision else None,
            running_replicas=count("running_replicas"),
            starting_replicas=count("starting_replicas"),
            queued_requests=seen("queued_requests"),
            ttft_p99_s=seen("ttft_p99_s"),
            e2e_p99_s=seen("e2e_p99_s"),
            gpu_nodes=gpu_nodes[0],
            service_rate_per_s=decision.service_rate_per_replica_per_s if decision else None,
            reasons=tuple(r.value for r in decision.reasons) if decision else (),
            gpu_lost_replicas=decision.gpu_lost_replicas if decision else None,
            gpu_faults=tuple(f"{r} {why}" for r, _, _, why in decision.gpu_replicas)
            if decision
            else (),
        )
        rows.append(row)
        view.update(row, progress["sent"], progress["answered"])

    def on_answer(answer: loadgen.Answer) -> None:
        progress["answered"] += 1
        ttft_s = None
        if answer.ok and answer.server_ttft_s is not None and answer.server_e2e_s is not None:
            # Client-side TTFT: everything before the replica's decode started.
            ttft_s = max(0.0, answer.latency_s - (answer.server_e2e_s - answer.server_ttft_s))
        outcomes.append(
            RequestOutcome(
                sent_at_s=answer.sent_at_s,
                ok=answer.ok,
                ttft_s=ttft_s,
                e2e_s=answer.latency_s if answer.ok else None,
            )
        )

    def on_sent() -> None:
        progress["sent"] += 1

    async def watch_nodes() -> None:
        while True:
            with contextlib.suppress(Exception):
                gpu_nodes[0] = await asyncio.to_thread(cluster.gpu_nodes)
            await asyncio.sleep(2.0)

    async def emulate_gpus() -> None:
        """One emulated GPU per replica process; XID 79 on one of them halfway through."""
        assert gpus is not None
        fault_at = load_started + the_plan.load_s / 2
        while True:
            runtime = controller.deployments.get(deployment)
            replicas = runtime.info.replicas if runtime and runtime.info else ()
            decision = runtime.last_decision if runtime else None
            if decision is not None and decision.gpu_replicas:
                gpus.confirmed = True
            gpus.update(replicas, inject=time.monotonic() >= fault_at)
            if gpus.injected and not gpus.announced:
                gpus.announced = True
                view.message(f"injected XID 79 on the GPU of replica {gpus.injected}")
            await asyncio.sleep(0.5)

    controller.listeners.append(on_tick)
    loop_task = asyncio.create_task(controller.run())
    nodes_task = asyncio.create_task(watch_nodes())
    gpu_task = asyncio.create_task(emulate_gpus()) if gpus is not None else None
    try:
        result = await loadgen.run(
            f"{cluster.serve_url}{ROUTE}",
            the_plan.schedule,
            max_in_flight=512,
            request_timeout_s=120.0,
            max_duration_s=the_plan.load_s + 5.0,
            drain_s=60.0,
            on_answer=on_answer,
            on_sent=on_sent,
        )
        view.message(
            f"load done: {result.sent} sent, {result.ok} ok, {result.failed} failed, "
            f"{result.dropped} dropped; watching the scale-down for {the_plan.tail_s:.0f} s"
        )
        await asyncio.sleep(
            max(0.0, load_started + the_plan.load_s + the_plan.tail_s - time.monotonic())
        )
    finally:
        controller.stop()
        nodes_task.cancel()
        if gpu_task is not None:
            gpu_task.cancel()
        await asyncio.gather(
            loop_task, nodes_task, *([gpu_task] if gpu_task else []), return_exceptions=True
        )
        view.close()
    summary, png, summary_path = write_report(
        args.report_dir,
        rows,
        outcomes,
        ttft_slo_s,
        slo.e2e_s,
        about={
            "trace": str(args.trace),
            "start": args.start,
            "duration": args.duration,
            "speed": args.speed,
            "rate_scale": args.rate_scale,
            "deployment": deployment,
            "emulator": EMULATOR_ARGS,
            "gpu_fault_injected_on": gpus.injected if gpus is not None else None,
        },
    )
    s = summary
    lines = [
        f"report: {png} and {summary_path}",
        f"  requests {s.requests} ({s.failed} failed); TTFT SLO {s.ttft_slo_s:g} s met by "
        f"{s.slo_attainment_ttft:.1%}",
        f"  TTFT p50 {_s(s.ttft_p50_s)}, p99 {_s(s.ttft_p99_s)}; e2e p99 {_s(s.e2e_p99_s)}",
        f"  replica-seconds {s.replica_seconds:.0f}; static peak provisioning "
        f"({s.peak_replicas} replicas) {s.static_peak_replica_seconds:.0f}: "
        f"{s.saving_vs_static_peak:.0%} saved",
        f"  {s.scale_ups} scale-ups, {s.scale_downs} scale-downs; "
        f"GPU nodes peaked at {s.gpu_nodes_peak}",
    ]
    return "\n" + "\n".join(lines)


class EmulatedGpus:
    """The script the emulated NVML reads: a fixed set of GPUs (as a host has), each
    replica process on a free one, and the fault: XID 79 on one replica's GPU, which is
    then never given to another replica."""

    def __init__(self, path: Path, count: int) -> None:
        self.path = path
        self.injected: str | None = None  # the replica whose GPU got the XID
        self.announced = False
        self.confirmed = False  # a decision has counted the fault
        self._owner: list[str | None] = [None] * count
        self._pid: dict[str, int] = {}
        self._broken: set[int] = set()
        self._xids: list[dict[str, Any]] = []
        self._write()

    def update(self, replicas: Sequence[ReplicaPlacement], inject: bool) -> None:
        alive = {r.replica_id: r for r in replicas if r.pid is not None}
        for index, owner in enumerate(self._owner):
            if owner is not None and owner not in alive:
                self._owner[index] = None
        for replica in alive.values():
            if replica.replica_id in self._owner:
                continue
            free = [i for i, o in enumerate(self._owner) if o is None and i not in self._broken]
            if free:
                self._owner[free[0]] = replica.replica_id
                self._pid[replica.replica_id] = int(replica.pid or 0)
        if self.injected is not None and self.injected not in alive and not self.confirmed:
            # Serve stopped it for a scale-down before the daemon saw the XID: the fault
            # goes to another replica.
            self.injected = None
            self.announced = False
        running = [r for r in alive.values() if r.state == "RUNNING"]
        if inject and self.injected is None and running:
            target = running[0].replica_id
            if target in self._owner:
                index = self._owner.index(target)
                self.injected = target
                self._broken.add(index)
                self._xids.append(
                    {"id": len(self._xids) + 1, "gpu": f"GPU-emulated-{index}", "xid": 79}
                )
        self._write()

    def _write(self) -> None:
        gpus = [
            {
                "uuid": f"GPU-emulated-{index}",
                "name": "emulated GPU",
                "util": 60 if owner else 0,
                "pids": [self._pid[owner]] if owner else [],
            }
            for index, owner in enumerate(self._owner)
        ]
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps({"gpus": gpus, "xids": self._xids}))
        os.replace(temp, self.path)


def _deployment_name() -> str:
    from autoscalerd.emulator.llm_app import DEPLOYMENT_NAME

    return DEPLOYMENT_NAME


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
