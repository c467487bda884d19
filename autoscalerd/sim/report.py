"""Backtest output: the table (rich), the JSON document, a Markdown table, the PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from autoscalerd.sim.backtest import WORK_BOUND, BacktestResult, PolicyResult

# Column heading, row field, format. One list serves the terminal and the Markdown table.
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "s"),
    ("requests", "requests", "d"),
    ("TTFT SLO met", "slo_attainment_ttft", "pct"),
    ("TTFT p50 s", "ttft_p50_s", ".3f"),
    ("TTFT p99 s", "ttft_p99_s", ".2f"),
    ("e2e p99 s", "e2e_p99_s", ".2f"),
    ("TPOT p99 ms", "tpot_p99_s", "ms"),
    ("replica-s", "replica_seconds", ",.0f"),
    ("× oracle", "cost_vs_oracle", ".2f"),
    ("× static", "cost_vs_static_peak", ".2f"),
    ("actions", "scale_actions", "d"),
    ("max queue", "max_queue", "d"),
)

# Colours per policy, fixed so every figure reads the same.
_COLOURS = {
    "autoscalerd": "#d62728",
    "ray-serve": "#1f77b4",
    "hpa": "#2ca02c",
    "kpa": "#9467bd",
    "threshold": "#8c564b",
    "static-peak": "#7f7f7f",
    "oracle": "#ff7f0e",
}


def _cell(row: PolicyResult, field: str, fmt: str) -> str:
    value = getattr(row, field)
    if value is None:
        return "—"
    if fmt == "pct":
        return f"{100 * value:.2f}%"
    if fmt == "ms":
        return f"{1000 * value:.1f}"
    return format(value, fmt)


def table(result: BacktestResult) -> Table:
    demand = result.demand
    title = (
        f"{Path(str(result.trace['path'])).name}: {demand.requests:,} requests over "
        f"{_duration(demand.duration_s)}, TTFT SLO {result.settings.ttft_slo_s:g} s"
    )
    out = Table(title=title, title_justify="left")
    for heading, _, fmt in _COLUMNS:
        out.add_column(heading, justify="left" if fmt == "s" else "right")
    for row in result.rows:
        style = "dim" if row.policy in (WORK_BOUND, "static-peak", "oracle") else None
        out.add_row(*(_cell(row, field, fmt) for _, field, fmt in _COLUMNS), style=style)
    return out


def print_table(result: BacktestResult, console: Console | None = None) -> None:
    (console or Console()).print(table(result))


def markdown(result: BacktestResult) -> str:
    lines = [
        "| " + " | ".join(heading for heading, _, _ in _COLUMNS) + " |",
        "|" + "|".join("---" if fmt == "s" else "---:" for _, _, fmt in _COLUMNS) + "|",
    ]
    for row in result.rows:
        lines.append("| " + " | ".join(_cell(row, f, fmt) for _, f, fmt in _COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def write_json(result: BacktestResult, path: str | Path) -> None:
    document = result.as_json()
    Path(path).write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")


def json_text(result: BacktestResult) -> str:
    return json.dumps(result.as_json(), indent=2, allow_nan=False)


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"


def plot(result: BacktestResult, path: str | Path) -> None:
    """Three panels over time: load and autoscalerd's forecast, replicas, TTFT p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    demand = result.demand
    scale_s, unit = (3600.0, "hours") if demand.duration_s > 3 * 3600 else (60.0, "minutes")
    figure, (load_ax, replicas_ax, ttft_ax, frontier_ax) = plt.subplots(
        4, 1, figsize=(12, 14), gridspec_kw={"height_ratios": [1, 1.2, 1, 1.3]}
    )
    replicas_ax.sharex(load_ax)
    ttft_ax.sharex(load_ax)
    name = Path(str(result.trace["path"])).name
    figure.suptitle(f"Backtest of {name} ({demand.requests:,} requests)")

    # Load, per oracle bucket, and autoscalerd's forecast in requests/s. A last bucket cut
    # short by the end of the trace would read as a drop in load: leave it out.
    full = int(demand.duration_s // demand.bucket_s) or demand.arrivals.size
    bucket_time = (np.arange(full) + 0.5) * demand.bucket_s / scale_s
    load_ax.plot(
        bucket_time, demand.arrival_rate_per_s()[:full], color="black", lw=0.8, label="arrivals"
    )
    series = result.series.get("autoscalerd")
    if series is not None and series.forecast_per_s is not None:
        per_request = _load_per_request(result)
        load_ax.plot(
            series.time_s / scale_s,
            series.forecast_per_s / per_request,
            color=_COLOURS["autoscalerd"],
            lw=0.9,
            alpha=0.8,
            label="autoscalerd forecast",
        )
        if series.forecast_upper_per_s is not None:
            load_ax.plot(
                series.time_s / scale_s,
                series.forecast_upper_per_s / per_request,
                color=_COLOURS["autoscalerd"],
                lw=0.6,
                ls=":",
                label="forecast upper bound",
            )
    load_ax.set_ylabel(f"requests/s ({demand.bucket_s:g} s bins)")
    load_ax.legend(loc="upper right", fontsize=8)

    # autoscalerd last, on top; the reference policies dashed.
    order = sorted(result.series, key=lambda policy: policy == "autoscalerd")
    for policy in order:
        policy_series = result.series[policy]
        ours = policy == "autoscalerd"
        style: dict[str, Any] = {
            "color": _COLOURS.get(policy),
            "lw": 1.3 if ours else 0.7,
            "alpha": 1.0 if ours else 0.75,
            "ls": "--" if policy in ("static-peak", "oracle") else "-",
            "zorder": 3 if ours else 2,
            "label": policy,
        }
        replicas_ax.plot(policy_series.time_s / scale_s, policy_series.replicas, **style)
        ttft_ax.plot(policy_series.ttft_time_s / scale_s, policy_series.ttft_p99_s, **style)
    model = result.settings.replica
    # The replicas the work would keep busy at 100 %: what no policy can go below.
    busy = np.maximum(
        demand.prompt_tokens[:full] / model.prefill_tokens_per_s,
        demand.output_tokens[:full] / model.decode_tokens_per_s,
    )
    replicas_ax.plot(
        bucket_time, busy / demand.bucket_s, color="black", lw=0.6, ls=":", label="work"
    )
    replicas_ax.set_ylabel("replicas (costing)")
    replicas_ax.legend(loc="upper right", fontsize=8, ncol=2)

    ttft_ax.axhline(result.settings.ttft_slo_s, color="black", lw=0.8, ls="--", label="SLO")
    ttft_ax.set_yscale("log")
    bin_min = _ttft_bin_minutes(result)
    ttft_ax.set_ylabel(f"TTFT p99 s ({bin_min:g} min bins)")
    ttft_ax.set_xlabel(unit)
    ttft_ax.legend(loc="upper right", fontsize=8, ncol=2)
    _frontier_panel(frontier_ax, result)
    for ax in (load_ax, replicas_ax, ttft_ax, frontier_ax):
        ax.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _frontier_panel(ax: Any, result: BacktestResult) -> None:
    """Attainment against cost: the frontiers as lines, the policies as points."""
    for points, label, colour in (
        (result.static_frontier, "static N", _COLOURS["static-peak"]),
        (result.oracle_frontier, "oracle at ρ", _COLOURS["oracle"]),
    ):
        if points:
            ordered = sorted(points, key=lambda p: p.replica_seconds)
            ax.plot(
                [p.replica_seconds for p in ordered],
                [100 * p.slo_attainment_ttft for p in ordered],
                color=colour,
                lw=1.0,
                marker=".",
                label=label,
            )
    for row in result.rows:
        if row.slo_attainment_ttft is None or row.policy in ("static-peak", "oracle"):
            continue
        ax.scatter(
            [row.replica_seconds],
            [100 * row.slo_attainment_ttft],
            color=_COLOURS.get(row.policy, "black"),
            zorder=3,
            s=40 if row.policy == "autoscalerd" else 20,
        )
        ax.annotate(row.policy, (row.replica_seconds, 100 * row.slo_attainment_ttft), fontsize=8)
    if result.attainable_ttft is not None:
        ax.axhline(100 * result.attainable_ttft, color="black", lw=0.6, ls=":", label="attainable")
    ax.set_xscale("log")
    ax.set_xlabel("replica-seconds")
    ax.set_ylabel("TTFT SLO met %")
    ax.legend(loc="lower right", fontsize=8)


def _load_per_request(result: BacktestResult) -> float:
    """Divide a forecast in the load unit by this to get requests/s."""
    if result.load_unit != "tokens":
        return 1.0
    demand = result.demand
    per_request = demand.mean_prompt_tokens + demand.mean_output_tokens
    return per_request if per_request > 0 and math.isfinite(per_request) else 1.0


def _ttft_bin_minutes(result: BacktestResult) -> float:
    for series in result.series.values():
        if series.ttft_time_s.size > 1:
            return float(series.ttft_time_s[1] - series.ttft_time_s[0]) / 60.0
    return 1.0


def summary(result: BacktestResult) -> dict[str, Any]:
    """Wall-clock speed of each policy's simulation: requests per second."""
    requests = result.demand.requests
    return {
        name: {"wall_s": round(wall_s, 3), "requests_per_s": round(requests / wall_s)}
        for name, wall_s in result.wall_s.items()
        if wall_s > 0
    }
