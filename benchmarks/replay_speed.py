"""Wall time of `autoscalerd run --dry-run` over the shipped 57-minute trace.

Usage: .venv/bin/python benchmarks/replay_speed.py [--config config/replay.yaml] [--repeat 3]
Prints the wall time per run, ticks, and trace seconds replayed per wall second.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/replay.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    binary = Path(sys.executable).parent / "autoscalerd"
    for run in range(1, args.repeat + 1):
        started = time.perf_counter()
        result = subprocess.run(
            [str(binary), "run", "--dry-run", "--config", args.config],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        wall_s = time.perf_counter() - started
        events = [json.loads(line) for line in result.stdout.splitlines()]
        ticks = next(e["ticks"] for e in reversed(events) if e["event"] == "stopped")
        decisions = sum(1 for e in events if e["event"] == "decision")
        print(
            f"run {run}: {wall_s:6.2f} s wall, {ticks} ticks ({ticks / wall_s:,.0f} ticks/s, "
            f"{ticks / wall_s:,.0f}x real time), {decisions} decisions logged"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
