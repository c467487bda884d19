"""The demo's record and report: a row per tick, the requests' outcomes, a PNG and a summary.

The timeline is what the daemon saw and decided each tick; the requests are what the load
generator measured from outside. The summary compares the replica-seconds used with what
static peak provisioning of the same run would have cost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the demo runs headless as often as not
import itertools

import matplotlib.pyplot as plt


@dataclass(frozen=True, slots=True)
class TickRow:
    """One tick of one deployment, as the daemon saw it."""

    at_s: float  # seconds since the load started
    arrival_rate_per_s: float | None
    forecast_rate_per_s: float | None
    desired_replicas: int | None
    running_replicas: int | None
    starting_replicas: int | None
    queued_requests: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    gpu_nodes: int | None
    service_rate_per_s: float | None = None  # μ per replica the decision used
    reasons: tuple[str, ...] = ()
    # Replicas' worth of capacity lost to GPU faults, and the GPUs behind it.
    gpu_lost_replicas: float | None = None
    gpu_faults: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request as the client measured it."""

    sent_at_s: float  # seconds since the load started
    ok: bool
    ttft_s: float | None  # router queue + prefill: client e2e minus the replica's decode time
    e2e_s: float | None


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    ok: int
    failed: int
    ttft_slo_s: float
    slo_attainment_ttft: float  # share of all requests (failures count as misses)
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    duration_s: float
    replica_seconds: float
    peak_replicas: int
    static_peak_replica_seconds: float
    saving_vs_static_peak: float  # 1 - used / static peak
    scale_ups: int
    scale_downs: int
    gpu_nodes_peak: int


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def summarize(
    rows: Sequence[TickRow], outcomes: Sequence[RequestOutcome], ttft_slo_s: float
) -> Summary:
    """Replica-seconds integrate the running replicas tick by tick; static peak provisioning
    runs the peak count for the whole run."""
    ttfts = [o.ttft_s for o in outcomes if o.ok and o.ttft_s is not None]
    e2es = [o.e2e_s for o in outcomes if o.ok and o.e2e_s is not None]
    within = sum(1 for t in ttfts if t <= ttft_slo_s)
    replica_seconds = 0.0
    for before, after in itertools.pairwise(rows):
        replica_seconds += (before.running_replicas or 0) * (after.at_s - before.at_s)
    duration_s = rows[-1].at_s - rows[0].at_s if len(rows) > 1 else 0.0
    peak = max((r.running_replicas or 0 for r in rows), default=0)
    static = peak * duration_s
    desired = [r.desired_replicas for r in rows if r.desired_replicas is not None]
    ups = sum(1 for a, b in itertools.pairwise(desired) if b > a)
    downs = sum(1 for a, b in itertools.pairwise(desired) if b < a)
    ok = sum(1 for o in outcomes if o.ok)
    return Summary(
        requests=len(outcomes),
        ok=ok,
        failed=len(outcomes) - ok,
        ttft_slo_s=ttft_slo_s,
        slo_attainment_ttft=within / len(outcomes) if outcomes else 0.0,
        ttft_p50_s=_quantile(ttfts, 0.5),
        ttft_p99_s=_quantile(ttfts, 0.99),
        e2e_p99_s=_quantile(e2es, 0.99),
        duration_s=duration_s,
        replica_seconds=replica_seconds,
        peak_replicas=peak,
        static_peak_replica_seconds=static,
        saving_vs_static_peak=1.0 - replica_seconds / static if static else 0.0,
        scale_ups=ups,
        scale_downs=downs,
        gpu_nodes_peak=max((r.gpu_nodes or 0 for r in rows), default=0),
    )


def write_report(
    directory: Path,
    rows: Sequence[TickRow],
    outcomes: Sequence[RequestOutcome],
    ttft_slo_s: float,
    e2e_slo_s: float | None,
    about: dict[str, object],
) -> tuple[Summary, Path, Path]:
    """Write demo.png, summary.json and timeline.json into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows, outcomes, ttft_slo_s)
    png = directory / "demo.png"
    _plot(png, rows, outcomes, ttft_slo_s, e2e_slo_s)
    summary_path = directory / "summary.json"
    summary_path.write_text(json.dumps({"run": about, "summary": asdict(summary)}, indent=2))
    (directory / "timeline.json").write_text(
        json.dumps([asdict(r) for r in rows], separators=(",", ":"))
    )
    return summary, png, summary_path


def _plot(
    path: Path,
    rows: Sequence[TickRow],
    outcomes: Sequence[RequestOutcome],
    ttft_slo_s: float,
    e2e_slo_s: float | None,
) -> None:
    times = [r.at_s for r in rows]
    fig, (load, replicas, latency) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    fig.suptitle("autoscalerd on a local Ray cluster: a real trace, time-compressed")

    sent = sorted(o.sent_at_s for o in outcomes)
    if sent:
        end_s = max(times[-1] if times else 0.0, sent[-1])
        bins = max(1, int(end_s // 2) + 1)
        counts = [0] * bins
        for at_s in sent:
            counts[min(bins - 1, int(at_s // 2))] += 1
        load.step(
            [i * 2 for i in range(bins)],
            [c / 2 for c in counts],
            where="post",
            color="0.7",
            label="sent (client, 2 s bins)",
        )
    load.plot(times, [_nan(r.arrival_rate_per_s) for r in rows], label="observed λ (sensor)")
    load.plot(
        times, [_nan(r.forecast_rate_per_s) for r in rows], "--", label="forecast upper bound"
    )
    load.set_ylabel("requests/s")
    load.legend(loc="upper right", fontsize=8)

    replicas.step(times, [_nan(r.desired_replicas) for r in rows], where="post", label="desired")
    faults = [r.at_s for r in rows if r.gpu_lost_replicas]
    if faults:
        replicas.axvline(faults[0], color="red", linestyle=":", label="GPU fault (XID)")
    replicas.step(times, [_nan(r.running_replicas) for r in rows], where="post", label="running")
    replicas.step(
        times,
        [_nan(r.gpu_nodes) for r in rows],
        where="post",
        linestyle=":",
        label="GPU nodes (Ray autoscaler)",
    )
    replicas.set_ylabel("replicas / nodes")
    replicas.yaxis.get_major_locator().set_params(integer=True)
    replicas.legend(loc="upper right", fontsize=8)

    latency.plot(times, [_nan(r.ttft_p99_s) for r in rows], label="TTFT p99 (replica metrics)")
    client = [(o.sent_at_s, o.ttft_s) for o in outcomes if o.ok and o.ttft_s is not None]
    if client:
        latency.scatter(
            [c[0] for c in client],
            [c[1] for c in client],
            s=2,
            color="0.6",
            label="TTFT per request (client)",
        )
    latency.plot(times, [_nan(r.e2e_p99_s) for r in rows], label="e2e p99 (Serve metrics)")
    latency.axhline(ttft_slo_s, color="red", linestyle="--", label=f"TTFT SLO {ttft_slo_s:g} s")
    if e2e_slo_s is not None:
        latency.axhline(e2e_slo_s, color="darkred", linestyle=":", label=f"e2e SLO {e2e_slo_s:g} s")
    latency.set_yscale("log")
    latency.set_ylim(bottom=0.01)
    latency.set_ylabel("seconds")
    latency.set_xlabel("seconds since the load started")
    latency.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
