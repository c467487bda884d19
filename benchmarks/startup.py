"""Start-up time of the daemon's commands: `autoscalerd --version` and `autoscalerd
check-config config/example.yaml`, each the median wall time of N fresh processes.

Usage: .venv/bin/python benchmarks/startup.py [--runs 15] [--binary PATH]
Prints the median, fastest and slowest wall time of each against its target (0.5 s and
1 s), the median CPU time (what the machine's other load does not inflate much), the load
average, and the modules that take longest to import (python -X importtime); exits 1
when a median wall time misses its target. The first run of each is a warm-up (the page
cache, .pyc files), not counted.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = (
    ("autoscalerd --version", ["--version"], 0.5),
    ("autoscalerd check-config config/example.yaml", ["check-config", "config/example.yaml"], 1.0),
)


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of `command`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall_s, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def slowest_imports(args: list[str], count: int = 5) -> list[tuple[str, float]]:
    """The top-level imports of the command's entry that took longest, cumulative."""
    code = "import sys; from autoscalerd.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    times: dict[str, float] = {}
    for line in result.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if match and len(match.group(2)) <= 2:  # the entry's own imports, and theirs
            times[match.group(3)] = int(match.group(1)) / 1e6
    return sorted(times.items(), key=lambda item: -item[1])[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument(
        "--binary",
        default=str(Path(sys.executable).parent / "autoscalerd"),
        help="the console script (default: this environment's)",
    )
    args = parser.parse_args()
    missed = 0
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for label, command_args, target_s in COMMANDS:
        command = [args.binary, *command_args]
        timed(command)  # warm-up
        runs = [timed(command) for _ in range(args.runs)]
        walls = [wall for wall, _ in runs]
        median_s = statistics.median(walls)
        verdict = "ok" if median_s < target_s else "MISSED"
        missed += median_s >= target_s
        print(
            f"{label}: median {median_s:.3f} s wall over {args.runs} runs "
            f"(fastest {min(walls):.3f} s, slowest {max(walls):.3f} s), "
            f"{statistics.median(cpu for _, cpu in runs):.3f} s CPU; "
            f"target < {target_s:g} s: {verdict}"
        )
        imports = ", ".join(
            f"{name} {seconds:.3f} s" for name, seconds in slowest_imports(command_args)
        )
        print(f"  slowest imports: {imports}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
