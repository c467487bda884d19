"""Fuzz every parser in-process with seeded mutations of real inputs, single process.

Usage: .venv/bin/python benchmarks/fuzz.py [--inputs 1000000] [--parser NAME ...]
       [--out DIR] [--seed 0] [--cpu-limit-s 5]

Parsers: config, state, traces, prometheus, serve_api, http (tests/fuzz/targets.py says
what each may raise and what its results must satisfy; tests/fuzz/mutations.py is the
mutation engine). Each unhandled kind (exception type and where it was raised, a broken
invariant, an input over the CPU limit) is saved once under --out as `<parser>/<kind>.bin`
(the input) and `.txt` (the traceback). Prints a table: inputs, inputs per second, ok,
refused with the allowed error, skipped (refused before the parser), unhandled; exits 1
if anything was unhandled. Ctrl-C prints the table so far.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import random
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz.mutations import Mutator  # noqa: E402
from tests.fuzz.targets import TARGETS, Target  # noqa: E402

# Progress is printed this often while a parser runs.
PROGRESS_EVERY_S = 30.0


@dataclass
class Kind:
    count: int
    example: Path


@dataclass
class Tally:
    parser: str
    inputs: int = 0
    ok: int = 0
    allowed: int = 0
    skipped: int = 0
    unhandled: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    kinds: dict[str, Kind] = field(default_factory=dict)

    @property
    def rate_per_s(self) -> float:
        return self.inputs / self.wall_s if self.wall_s > 0 else 0.0


def kind_of(exc: BaseException) -> str:
    """An exception type and the place in autoscalerd (else the deepest frame) it came from."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/autoscalerd/" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(exc).__name__}@{where}"


def save_example(out: Path, parser: str, kind: str, data: bytes, exc: BaseException) -> Path:
    folder = out / parser
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", kind)
    (folder / f"{stem}.bin").write_bytes(data)
    text = "".join(traceback.format_exception(exc))
    digest = hashlib.sha256(data).hexdigest()[:16]
    (folder / f"{stem}.txt").write_text(
        f"{kind}\ninput: {len(data)} bytes, sha256 {digest}\n\n{text}"
    )
    return folder / f"{stem}.bin"


def fuzz(target: Target, inputs: int, seed: int, out: Path, cpu_limit_s: float) -> Tally:
    tally = Tally(target.name)
    mutator = Mutator(target.seeds(), target.structure)
    target.warm_up()
    rng = random.Random(f"{seed}:{target.name}")
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    next_report_s = started_wall + PROGRESS_EVERY_S
    try:
        for _ in range(inputs):
            data = mutator.mutate(rng)
            tally.inputs += 1
            try:
                outcome = target.outcome(data, cpu_limit_s)
            except Exception as exc:  # a bug: record it, carry on
                tally.unhandled += 1
                kind = kind_of(exc)
                if kind not in tally.kinds:
                    tally.kinds[kind] = Kind(0, save_example(out, target.name, kind, data, exc))
                tally.kinds[kind].count += 1
            else:
                setattr(tally, outcome, getattr(tally, outcome) + 1)
            now_s = time.perf_counter()
            if now_s >= next_report_s:
                next_report_s = now_s + PROGRESS_EVERY_S
                rate = tally.inputs / (now_s - started_wall)
                left_s = (inputs - tally.inputs) / rate
                print(
                    f"  {target.name}: {tally.inputs:,} of {inputs:,}, {rate:,.0f}/s, "
                    f"{tally.unhandled} unhandled, about {left_s / 60:,.0f} min left",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        tally.wall_s = time.perf_counter() - started_wall
        tally.cpu_s = time.process_time() - started_cpu
    return tally


def table(tallies: list[Tally], total_s: float) -> str:
    head = ("parser", "inputs", "inputs/s", "ok", "allowed errors", "skipped", "unhandled")
    rows = [
        (
            t.parser,
            f"{t.inputs:,}",
            f"{t.rate_per_s:,.0f}",
            f"{t.ok:,}",
            f"{t.allowed:,}",
            f"{t.skipped:,}",
            f"{t.unhandled:,}" + (f" ({len(t.kinds)} kinds)" if t.kinds else ""),
        )
        for t in tallies
    ]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [head, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for t in tallies:
        for name, kind in sorted(t.kinds.items()):
            lines.append(f"{t.parser}: {kind.count:,} x {name}, example {kind.example}")
    lines.append(f"total {total_s:,.1f} s wall")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=10**6, help="inputs per parser")
    parser.add_argument(
        "--parser", action="append", choices=sorted(TARGETS), help="repeat for several"
    )
    parser.add_argument("--out", type=Path, help="where examples go (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-limit-s", type=float, default=5.0, help="CPU time per input")
    args = parser.parse_args()
    if args.inputs < 1:
        parser.error("--inputs must be at least 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="autoscalerd-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    names = args.parser or list(TARGETS)
    print(f"{args.inputs:,} inputs per parser, seed {args.seed}, examples in {out}", flush=True)
    started_s = time.perf_counter()
    tallies: list[Tally] = []
    try:
        for name in names:
            tallies.append(fuzz(TARGETS[name], args.inputs, args.seed, out, args.cpu_limit_s))
    except KeyboardInterrupt:
        print("interrupted: the table so far", file=sys.stderr)
    total_s = time.perf_counter() - started_s
    print(table(tallies, total_s))
    summary = {
        "date": datetime.date.today().isoformat(),
        "seed": args.seed,
        "inputs_per_parser": args.inputs,
        "total_s": round(total_s, 1),
        "parsers": [
            {
                "parser": t.parser,
                "inputs": t.inputs,
                "inputs_per_s": round(t.rate_per_s, 1),
                "cpu_s": round(t.cpu_s, 1),
                "ok": t.ok,
                "allowed": t.allowed,
                "skipped": t.skipped,
                "unhandled": t.unhandled,
                "kinds": {name: kind.count for name, kind in t.kinds.items()},
            }
            for t in tallies
        ],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if any(t.unhandled for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
