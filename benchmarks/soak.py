"""Soak: a day of virtual time through the real `autoscalerd run`, memory and HTTP watched.

Writes an Azure-format request trace of the first `--hours` of the Azure 2024 code week
(`data/traces/azure_llm_2024_code_10s_counts.csv`, arrivals drawn inside each 10 s bin,
thinned by `--rate-scale`, token lengths sampled from the 2023 code trace, all seeded),
and replays it through `autoscalerd run` with the `replay` sensor and the `log` actuator,
the deployment settings of `config/replay.yaml`, a state file and the HTTP API on a free
port. Virtual time runs flat out unless `--speed` is given: the loop yields to the event
loop between ticks, so the API still answers within milliseconds, and a day takes about
two minutes on two cores. About once a wall second the
soak polls GET /healthz, /readyz, /metrics, /v1/status and /v1/decisions?limit=50 (a new
connection each, as probes and scrapers make) and reads the daemon's VmRSS from
/proc/<pid>/status.

The forecast season is one hour of 60 s buckets (`--season-length 60`) rather than the
shipped day: from a cold start a daily season reaches the seasonal fit only on day 3, and
the soak is meant to run every code path a long-lived daemon runs, Holt-Winters refits
included (every 600 s, in line under replay, as the daemon does).

    .venv/bin/python benchmarks/soak.py [--hours 24] [--speed N] [--json soak.json]

Prints a table of a dozen evenly spaced samples and a summary. Exits 1 when RSS grows by
more than the bound after the warm-up (`--warmup-hours`, default 1), when any poll fails,
or when the daemon does not finish the trace and exit 0.

The bound is the larger of 10 % of the RSS after warm-up and 20 MiB. Everything the daemon
keeps is bounded (1,000 decisions for /v1/decisions, an hour of burstiness, three seasons
of buckets), but RSS is not the Python heap: pymalloc arenas and glibc's malloc keep freed
memory and fragment, so RSS steps by a few MiB with no leak. 20 MiB over the 23 hours after
warm-up is about 250 bytes a tick: a leak of one small object per tick shows, noise does
not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoscalerd.sim.traces import EmpiricalTokens, TraceWindow, open_trace  # noqa: E402

COUNTS_TRACE = ROOT / "data/traces/azure_llm_2024_code_10s_counts.csv"
TOKENS_TRACE = ROOT / "data/traces/azure_llm_2023_code.csv"
BASE_CONFIG = ROOT / "config/replay.yaml"
DEPLOYMENT = "llm/code-completion"
POLLED = ("/healthz", "/readyz", "/metrics", "/v1/status", "/v1/decisions?limit=50")
# A poll that takes longer than this failed: far beyond any probe's patience.
POLL_TIMEOUT_S = 10.0
MAX_GROWTH_SHARE = 0.10
MAX_GROWTH_MIB = 20.0
TABLE_ROWS = 12
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Sample:
    wall_s: float  # since the daemon was started
    virtual_h: float  # trace time replayed
    rss_mib: float
    ticks: int
    polls_ok: int  # cumulative
    polls_failed: int  # cumulative
    round_ms: float  # the five GETs of this round, one after another
    slowest_ms: float  # the slowest GET of this round


# ---------------------------------------------------------------- the trace and the config


def write_trace(path: Path, hours: float, rate_scale: float, seed: int) -> tuple[float, int]:
    """An Azure request-level CSV of the first `hours` of the 2024 week: (first request's
    epoch seconds, requests)."""
    tokens = EmpiricalTokens.from_trace(open_trace(TOKENS_TRACE), seed=seed)
    window = TraceWindow(duration_s=hours * 3600.0, rate_scale=rate_scale, seed=seed)
    trace = open_trace(COUNTS_TRACE, window=window, tokens=tokens)
    origin_s = trace.origin_epoch_s or 0.0
    first_s: float | None = None
    requests = 0
    with path.open("w", encoding="utf-8") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for batch in trace.batches():
            for at_s, prompt, output in zip(
                batch.arrival_s.tolist(),
                batch.prompt_tokens.tolist(),
                batch.output_tokens.tolist(),
                strict=True,
            ):
                moment = datetime.fromtimestamp(origin_s + at_s, tz=timezone.utc)
                out.write(f"{moment:%Y-%m-%d %H:%M:%S.%f},{prompt},{output}\n")
                if first_s is None:
                    first_s = moment.timestamp()
            requests += len(batch)
    if first_s is None:
        raise SystemExit(f"soak: {COUNTS_TRACE} gave no requests for {hours} h")
    return first_s, requests


def write_config(path: Path, trace: Path, state: Path, port: int, season_length: int) -> None:
    """config/replay.yaml with this trace, the HTTP API on `port` and a state file."""
    config = yaml.safe_load(BASE_CONFIG.read_text())
    config["http"] = {"enabled": True, "addr": f"127.0.0.1:{port}"}
    config["state"] = {"path": str(state)}
    config["sensors"] = [{"type": "replay", "path": str(trace), "deployment": DEPLOYMENT}]
    (deployment,) = config["deployments"]
    deployment["forecast"]["season_length"] = season_length
    path.write_text(yaml.safe_dump(config))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- watching the daemon


def rss_mib(pid: int) -> float | None:
    """VmRSS of `pid`, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / MIB
    return None


def get(port: int, path: str) -> tuple[int | None, bytes, float]:
    """(status or None when unanswered, body, seconds)."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=POLL_TIMEOUT_S
        ) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except OSError:
        status, body = None, b""
    return status, body, time.perf_counter() - started


def wait_ticking(daemon: subprocess.Popen[bytes], port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"soak: the daemon exited {daemon.returncode} before ticking")
        status, _, _ = get(port, "/healthz")
        if status == 200:
            return
        time.sleep(0.1)
    raise SystemExit(f"soak: /healthz not 200 within {timeout_s:.0f} s of the start")


@dataclass
class Watched:
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # a line for each failed poll
    last_metrics: str = ""  # the last /metrics answer: tick and refit durations


def watch(
    daemon: subprocess.Popen[bytes], port: int, first_s: float, poll_s: float, started: float
) -> Watched:
    """Poll until the daemon exits."""
    watched = Watched()
    samples, failures = watched.samples, watched.failures
    ok = 0
    last_virtual_h, last_ticks = 0.0, 0
    while daemon.poll() is None:
        round_started = time.monotonic()
        answers = [(path, *get(port, path)) for path in POLLED]
        memory = rss_mib(daemon.pid)
        failed = [(path, status) for path, status, _, _ in answers if status != 200]
        if failed and _exits_soon(daemon):
            break  # the trace ran out: the server closed with the loop, not a failure
        for path, status, body, _ in answers:
            if status == 200 and path == "/v1/status":
                status_body = json.loads(body)
                last_virtual_h = (status_body["now_s"] - first_s) / 3600.0
                last_ticks = int(status_body["ticks_completed"])
            if status == 200 and path == "/metrics":
                watched.last_metrics = body.decode()
        ok += len(answers) - len(failed)
        wall_s = round_started - started
        failures.extend(
            f"{wall_s:.1f} s wall, {last_virtual_h:.2f} h virtual: GET {path} -> "
            f"{status if status is not None else 'no answer'}"
            for path, status in failed
        )
        if memory is None:
            break
        samples.append(
            Sample(
                wall_s=round(wall_s, 3),
                virtual_h=round(last_virtual_h, 4),
                rss_mib=round(memory, 2),
                ticks=last_ticks,
                polls_ok=ok,
                polls_failed=len(failures),
                round_ms=round(sum(a[3] for a in answers) * 1000.0, 2),
                slowest_ms=round(max(a[3] for a in answers) * 1000.0, 2),
            )
        )
        time.sleep(max(0.0, poll_s - (time.monotonic() - round_started)))
    return watched


def _exits_soon(daemon: subprocess.Popen[bytes], within_s: float = 5.0) -> bool:
    with contextlib.suppress(subprocess.TimeoutExpired):
        daemon.wait(timeout=within_s)
        return True
    return False


def log_summary(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The daemon's `stopped` event, and its warning and error events, one line each."""
    stopped: dict[str, Any] | None = None
    problems: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"unparsed: {line[:160]}")
            continue
        if event.get("event") == "stopped":
            stopped = event
        if event.get("level") in {"warning", "error", "critical"}:
            problems.append(json.dumps(event)[:200])
    return stopped, problems


# ---------------------------------------------------------------- figures


def slope_per_hour(samples: list[Sample]) -> float:
    """Least-squares RSS slope in MiB per virtual hour."""
    if len(samples) < 2:
        return math.nan
    xs = [s.virtual_h for s in samples]
    ys = [s.rss_mib for s in samples]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return math.nan
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def print_table(samples: list[Sample]) -> None:
    count = min(TABLE_ROWS, len(samples))
    picks = sorted({round(i * (len(samples) - 1) / max(1, count - 1)) for i in range(count)})
    print(
        f"{'wall s':>8} {'virtual h':>9} {'RSS MiB':>8} {'ticks':>7} "
        f"{'polls ok':>8} {'failed':>6} {'round ms':>8} {'slowest ms':>10}"
    )
    for sample in (samples[i] for i in picks):
        print(
            f"{sample.wall_s:8.1f} {sample.virtual_h:9.2f} {sample.rss_mib:8.1f} "
            f"{sample.ticks:7d} {sample.polls_ok:8d} {sample.polls_failed:6d} "
            f"{sample.round_ms:8.1f} {sample.slowest_ms:10.1f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0, help="virtual hours (≤ 168)")
    parser.add_argument("--speed", type=float, default=None, help="default: flat out")
    parser.add_argument("--rate-scale", type=float, default=0.25)
    parser.add_argument("--season-length", type=int, default=60, help="60 s buckets a season")
    parser.add_argument("--warmup-hours", type=float, default=1.0)
    parser.add_argument("--poll-s", type=float, default=1.0, help="wall seconds between polls")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the samples here")
    args = parser.parse_args()
    if not 0 < args.warmup_hours < args.hours <= 168:
        parser.error("need 0 < --warmup-hours < --hours <= 168 (the trace is a week)")

    binary = Path(sys.executable).parent / "autoscalerd"
    with tempfile.TemporaryDirectory(prefix="autoscalerd-soak-") as tmp:
        work = Path(tmp)
        trace, config, log = work / "trace.csv", work / "soak.yaml", work / "daemon.log"
        first_s, requests = write_trace(trace, args.hours, args.rate_scale, args.seed)
        port = free_port()
        write_config(config, trace, work / "state.json", port, args.season_length)
        print(
            f"trace: {args.hours:g} h of the Azure 2024 code week at rate scale "
            f"{args.rate_scale:g}: {requests:,} requests ({requests / args.hours / 3600:.1f}/s)"
        )
        command = [str(binary), "run", "--config", str(config), "--log-format", "json"]
        if args.speed is not None:
            command += ["--speed", str(args.speed)]
        started = time.monotonic()
        with log.open("wb") as log_file:
            daemon = subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
            try:
                wait_ticking(daemon, port)
                watched = watch(daemon, port, first_s, args.poll_s, started)
                code = daemon.wait(timeout=60)
            finally:
                if daemon.poll() is None:
                    daemon.kill()
                    daemon.wait()
        wall_s = time.monotonic() - started
        stopped, problems = log_summary(log)

    if not watched.samples:
        print("soak: no samples taken", file=sys.stderr)
        return 1
    print_table(watched.samples)
    summary = summarize(args, watched, wall_s, code, stopped)
    verdict = report(summary, watched, problems)
    if args.json is not None:
        document = {
            "command": sys.argv[1:],
            "requests": requests,
            "summary": summary,
            "verdict": verdict,
            "samples": [asdict(s) for s in watched.samples],
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    for line in verdict:
        print(f"soak: FAIL: {line}", file=sys.stderr)
    return 1 if verdict else 0


def metric_total(exposition: str, name: str) -> float:
    """The sum of a Prometheus series over its labels (0 when absent)."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in {" ", "{"}:
            total += float(line.rsplit(" ", 1)[1])
    return total


def summarize(
    args: argparse.Namespace,
    watched: Watched,
    wall_s: float,
    code: int,
    stopped: dict[str, Any] | None,
) -> dict[str, Any]:
    samples = watched.samples
    warm = next((s for s in samples if s.virtual_h >= args.warmup_hours), samples[-1])
    end = samples[-1]
    growth_mib = end.rss_mib - warm.rss_mib
    second_half = [s for s in samples if s.virtual_h >= end.virtual_h / 2]
    ticks = int(stopped["ticks"]) if stopped else end.ticks
    metrics = watched.last_metrics
    refits = metric_total(metrics, "autoscalerd_forecast_refit_duration_seconds_count")
    scraped_ticks = metric_total(metrics, "autoscalerd_tick_duration_seconds_count")
    return {
        "speed": args.speed,
        "wall_s": round(wall_s, 1),
        "virtual_h": end.virtual_h,
        "ticks": ticks,
        "ticks_per_wall_s": round(ticks / wall_s, 1),
        "rss_first_mib": samples[0].rss_mib,
        "rss_warm_mib": warm.rss_mib,
        "rss_warm_at_h": warm.virtual_h,
        "rss_end_mib": end.rss_mib,
        "rss_peak_mib": max(s.rss_mib for s in samples),
        "growth_mib": round(growth_mib, 2),
        "growth_percent": round(100.0 * growth_mib / warm.rss_mib, 2),
        "bound_mib": round(max(MAX_GROWTH_SHARE * warm.rss_mib, MAX_GROWTH_MIB), 2),
        "slope_second_half_mib_per_h": round(slope_per_hour(second_half), 4),
        "polls": end.polls_ok + end.polls_failed,
        "polls_failed": end.polls_failed,
        "slowest_poll_ms": max(s.slowest_ms for s in samples),
        "slowest_round_ms": max(s.round_ms for s in samples),
        "mean_tick_ms": round(
            1000.0
            * metric_total(metrics, "autoscalerd_tick_duration_seconds_sum")
            / max(1.0, scraped_ticks),
            3,
        ),
        "refits": int(refits),
        "refit_total_s": round(
            metric_total(metrics, "autoscalerd_forecast_refit_duration_seconds_sum"), 2
        ),
        "exit_code": code,
        "finished": bool(stopped and stopped.get("finished")),
    }


def report(summary: dict[str, Any], watched: Watched, problems: list[str]) -> list[str]:
    """Print the summary; the reasons the soak failed, if any."""
    s = summary
    speed = "flat out" if s["speed"] is None else f"--speed {s['speed']:g}"
    print()
    print(
        f"virtual {s['virtual_h']:.2f} h ({s['ticks']:,} ticks) in {s['wall_s']:.0f} s wall "
        f"({s['ticks_per_wall_s']:,.0f} ticks/s, {speed}); mean tick {s['mean_tick_ms']:.2f} "
        f"ms; {s['refits']} forecaster refits, {s['refit_total_s']:.1f} s in all"
    )
    print(
        f"RSS: {s['rss_first_mib']:.1f} MiB at the first poll, {s['rss_warm_mib']:.1f} MiB at "
        f"{s['rss_warm_at_h']:.2f} h, {s['rss_end_mib']:.1f} MiB at {s['virtual_h']:.2f} h; "
        f"growth {s['growth_mib']:+.1f} MiB ({s['growth_percent']:+.1f} %), bound "
        f"{s['bound_mib']:.1f} MiB; peak {s['rss_peak_mib']:.1f} MiB"
    )
    print(
        f"RSS slope over the second half: {s['slope_second_half_mib_per_h']:+.3f} MiB per "
        "virtual hour"
    )
    print(
        f"HTTP: {s['polls']:,} GETs, {s['polls_failed']} failed; slowest "
        f"{s['slowest_poll_ms']:.0f} ms, slowest round of five {s['slowest_round_ms']:.0f} ms"
    )
    print(
        f"daemon: exit {s['exit_code']}, finished the trace: {s['finished']}, "
        f"{len(problems)} warning or error events"
    )
    for line in watched.failures[:10] + problems[:10]:
        print(f"  {line}")
    verdict = []
    if s["growth_mib"] > s["bound_mib"]:
        verdict.append(
            f"RSS grew {s['growth_mib']:.1f} MiB after warm-up (bound {s['bound_mib']:.1f} MiB)"
        )
    if s["polls_failed"]:
        verdict.append(f"{s['polls_failed']} HTTP poll(s) failed")
    if s["exit_code"] != 0 or not s["finished"]:
        verdict.append(f"the daemon exited {s['exit_code']}, finished the trace: {s['finished']}")
    return verdict


if __name__ == "__main__":
    raise SystemExit(main())
