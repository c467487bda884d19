"""The demo's live terminal view: a rich panel on a TTY, a plain line per tick otherwise."""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from autoscalerd.demo.report import TickRow


def _fmt(value: float | int | None, spec: str = ".1f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


class DemoView:
    """Shows each tick's row; call `close()` at the end."""

    def __init__(
        self,
        deployment: str,
        ttft_slo_s: float,
        e2e_slo_s: float | None,
        total_s: float,
        stream: TextIO | None = None,
    ) -> None:
        self.deployment = deployment
        self.ttft_slo_s = ttft_slo_s
        self.e2e_slo_s = e2e_slo_s
        self.total_s = total_s
        self.stream = stream or sys.stdout
        self.console = Console(file=self.stream)
        self.live: Live | None = None
        self.sent = 0
        self.answered = 0
        if self.stream.isatty():
            self.live = Live(self._table(None), console=self.console, refresh_per_second=4)
            self.live.start()

    def update(self, row: TickRow, sent: int, answered: int) -> None:
        self.sent, self.answered = sent, answered
        if self.live is not None:
            self.live.update(self._table(row))
            return
        print(self._line(row), file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _line(self, row: TickRow) -> str:
        return (
            f"t={row.at_s:6.1f}s λ={_fmt(row.arrival_rate_per_s)}/s "
            f"forecast={_fmt(row.forecast_rate_per_s)}/s "
            f"replicas desired={_fmt(row.desired_replicas, 'd')} "
            f"running={_fmt(row.running_replicas, 'd')} "
            f"starting={_fmt(row.starting_replicas, 'd')} "
            f"queue={_fmt(row.queued_requests, '.0f')} "
            f"ttft_p99={_fmt(row.ttft_p99_s, '.2f', 's')} "
            f"e2e_p99={_fmt(row.e2e_p99_s, '.2f', 's')} "
            f"gpu_nodes={_fmt(row.gpu_nodes, 'd')} sent={self.sent} answered={self.answered} "
            f"reasons={','.join(row.reasons) or '-'}"
            + (f" gpu_faults={';'.join(row.gpu_faults)}" if row.gpu_faults else "")
        )

    def _table(self, row: TickRow | None) -> Table:
        title = f"autoscalerd demo: {self.deployment}"
        if row is not None:
            title += f"  t={row.at_s:.0f}/{self.total_s:.0f} s"
        table = Table(title=title, show_header=True, header_style="bold")
        table.add_column("signal")
        table.add_column("value", justify="right")
        table.add_column("note")
        if row is None:
            table.add_row("starting", "", "Ray cluster, Serve app, load generator")
            return table

        def slo(value: float | None, limit: float | None) -> str:
            if value is None or limit is None:
                return ""
            return "[red]over SLO[/red]" if value > limit else "[green]within SLO[/green]"

        table.add_row("arrival rate observed", _fmt(row.arrival_rate_per_s, ".1f", "/s"), "sensor")
        table.add_row(
            "arrival rate forecast", _fmt(row.forecast_rate_per_s, ".1f", "/s"), "upper bound"
        )
        table.add_row("replicas desired", _fmt(row.desired_replicas, "d"), ", ".join(row.reasons))
        table.add_row("replicas running", _fmt(row.running_replicas, "d"), "")
        table.add_row("replicas starting", _fmt(row.starting_replicas, "d"), "")
        table.add_row("queued requests", _fmt(row.queued_requests, ".0f"), "")
        table.add_row(
            "TTFT p99", _fmt(row.ttft_p99_s, ".2f", " s"), slo(row.ttft_p99_s, self.ttft_slo_s)
        )
        table.add_row(
            "e2e p99", _fmt(row.e2e_p99_s, ".2f", " s"), slo(row.e2e_p99_s, self.e2e_slo_s)
        )
        table.add_row("GPU nodes", _fmt(row.gpu_nodes, "d"), "logical, Ray autoscaler")
        if row.gpu_lost_replicas is not None:
            table.add_row(
                "capacity lost to GPU faults",
                _fmt(row.gpu_lost_replicas, ".1f", " replicas"),
                "; ".join(row.gpu_faults) or "all GPUs healthy",
            )
        table.add_row("requests sent / answered", f"{self.sent} / {self.answered}", "open loop")
        return table
