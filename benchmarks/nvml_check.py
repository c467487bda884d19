"""The nvml sensor against the real NVML of this host: prints what it read.

    .venv/bin/python benchmarks/nvml_check.py [--seconds 5]

For a machine with an NVIDIA GPU (CI has none: the tests use autoscalerd/emulator/fake_nvml.py).
Reads every GPU twice, listens for XID events for `--seconds`, and prints each reading
and its health as autoscalerd would judge it. Exit 0 when NVML answered, 1 when it did
not (the line says why).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time

from autoscalerd.config import Config
from autoscalerd.decide.gpu_health import assess
from autoscalerd.sense.nvml import NvmlSensor


async def main(seconds: float) -> int:
    sensor = NvmlSensor({"event_wait_ms": 200}, Config())
    started = time.monotonic()
    try:
        first = await sensor.sense(time.time())
        await asyncio.sleep(max(0.0, seconds))
        result = await sensor.sense(time.time())
    finally:
        await sensor.close()
    if not result.gpus and not first.gpus:
        print("nvml_check: NVML gave no GPUs (see the nvml_unavailable line above)")
        return 1
    for gpu in result.gpus:
        health = assess(gpu, time.time(), throttle_sustain_s=30.0)
        print(
            json.dumps({"reading": dataclasses.asdict(gpu), "health": dataclasses.asdict(health)})
        )
    print(f"nvml_check: {len(result.gpus)} GPU(s) read in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    sys.exit(asyncio.run(main(parser.parse_args().seconds)))
