"""`autoscalerd demo` end to end: a shortened run against its own local Ray cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers import REPO, autoscalerd_bin


def ray_processes() -> list[str]:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    return [
        line
        for line in listing.stdout.splitlines()
        # Ray's own dashboard script, not a test file of that name on a pytest command line.
        if any(name in line for name in ("raylet", "gcs_server", "ray::", "dashboard/dashboard.py"))
    ]


def test_short_demo_scales_up_reports_and_leaves_no_ray_behind(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    assert not ray_processes(), "a Ray cluster is already running here"
    report_dir = tmp_path / "report"
    # Four minutes of the Azure 2023 code trace from 2 min in (a burst, then calmer) at
    # 4x: a minute of load, then the quiet tail (downscale delay + lead time + a forecast
    # bucket).
    slice_args = ["--trace", str(REPO / "data" / "traces" / "azure_llm_2023_code.csv")]
    slice_args += ["--start", "2m", "--duration", "4m", "--speed", "4", "--rate-scale", "0.3"]
    result = subprocess.run(
        [autoscalerd_bin(), "demo", *slice_args, "--report-dir", str(report_dir)],
        cwd=REPO,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert (report_dir / "demo.png").stat().st_size > 10_000
    summary = json.loads((report_dir / "summary.json").read_text())["summary"]
    assert summary["requests"] > 100
    assert summary["ok"] > 0.9 * summary["requests"]
    # Up under the burst. Down is the SLO guard's call: misses at two replicas hold three
    # while the error budget's fast window (75 s here) still burns, which in a 4-minute
    # slice can last to the end; the full demo reports what it did.
    assert summary["scale_ups"] >= 1
    assert summary["peak_replicas"] >= 2
    assert summary["replica_seconds"] < summary["static_peak_replica_seconds"]
    timeline = json.loads((report_dir / "timeline.json").read_text())
    running = [row["running_replicas"] for row in timeline if row["running_replicas"] is not None]
    assert max(running) > running[0]
    assert "report:" in result.stdout and "local Ray cluster stopped" in result.stdout
    assert not ray_processes()
