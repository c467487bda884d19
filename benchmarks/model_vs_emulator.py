"""The replica model's predictions against a real local Ray cluster, at several loads.

The simulator and the learned model share a form, so agreement there proves little. This
starts the fake multi-node Ray cluster with the LLM-emulating app (one prefill engine per
replica, Serve's own router in front), holds it at a fixed replica count, and sends Poisson
load at several shares of its prefill capacity. At each load the real sensor feeds the
replica model tick by tick, exactly as the daemon does; at the end of the phase the
sizing's formulas predict, at the replicas running and the arrival rate measured, the
share of requests late by waiting (TTFT over the SLO although the prompt's own prefill is
within it) and the mean wait; the client's own timings say what happened (TTFT = the
request's latency less its decode).

    .venv/bin/python benchmarks/model_vs_emulator.py [--replicas 2] [--phase-s 40]

Minutes of wall time; one Ray cluster, so nothing else heavy alongside. Prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from autoscalerd.config import ReplicaModelConfig, parse_config
from autoscalerd.decide import replica_model, sizing
from autoscalerd.emulator import cluster as local
from autoscalerd.emulator import loadgen
from autoscalerd.sense.ray_serve import RayServeSensor

NAME = "llm/LlmReplica"
PROMPT_TOKENS = 800
OUTPUT_TOKENS = 20
ARGS = {"max_ongoing_requests": 8, "prefill_tokens_per_s": 4000, "tpot_s": 0.01}
TTFT_SLO_S = 0.5


def scale(cluster: local.LocalCluster, replicas: int) -> None:
    app, dep = NAME.split("/", 1)
    status, body = cluster.request(
        "POST",
        f"/api/v1/applications/{app}/deployments/{dep}/scale",
        {"target_num_replicas": replicas},
    )
    if status != 200:
        raise SystemExit(f"scale: HTTP {status}: {body}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        apps = cluster.applications()
        deployment = apps[app]["deployments"][dep]
        running = [r for r in deployment.get("replicas", []) if r.get("state") == "RUNNING"]
        if len(running) == replicas:
            return
        time.sleep(1)
    raise SystemExit(f"{replicas} replicas did not start within 120 s")


async def phase(
    cluster: local.LocalCluster, probe: RayServeSensor, rate_per_s: float, duration_s: float
) -> dict[str, Any]:
    answers: list[loadgen.Answer] = []
    schedule = loadgen.poisson(rate_per_s, duration_s, PROMPT_TOKENS, OUTPUT_TOKENS, seed=7)
    load = asyncio.ensure_future(
        loadgen.run(cluster.serve_url + "/llm", schedule, on_answer=answers.append)
    )
    priors = ReplicaModelConfig()
    state = replica_model.ReplicaModelState()
    last_s: float | None = None
    rates: list[float] = []
    running = 0
    started = time.monotonic()
    while not load.done():
        now_s = time.time()
        obs = (await probe.sense(now_s)).observations.get(NAME)
        if obs is not None:
            tick_s = now_s - last_s if last_s is not None else 1.0
            state = replica_model.learn(state, obs, priors, now_s, tick_s, 10.0)
            engine = dataclasses.replace(
                replica_model.view(state, priors, now_s, 1.0), path_stretch=1.0
            )
            state = replica_model.learn_stretch(
                state,
                obs,
                lambda lam, r, engine=engine: sizing.slot_time_under_load_s(engine, lam, r),
                priors,
                now_s,
                tick_s,
                10.0,
            )
            if obs.arrival_rate_per_s is not None and time.monotonic() - started > 10:
                rates.append(obs.arrival_rate_per_s.value)
            if obs.running_replicas is not None:
                running = int(obs.running_replicas.value)
        last_s = now_s
        await asyncio.sleep(1.0)
    await load
    model = replica_model.view(state, priors, time.time(), 1.0)
    measured = sum(rates) / len(rates) if rates else rate_per_s
    inputs = sizing.SizingInputs(measured, 0.0, 1.0, TTFT_SLO_S, 0.01, ttft_s=TTFT_SLO_S)
    predicted, rho, _, _ = sizing.predicted_tail(model, inputs, max(1, running))
    # The client's TTFT: its latency less the decode the emulator reports.
    waits, late = [], 0
    ok = [a for a in answers if a.ok and a.server_e2e_s is not None and a.server_ttft_s is not None]
    for answer in ok:
        assert answer.server_e2e_s is not None and answer.server_ttft_s is not None
        ttft_s = answer.latency_s - (answer.server_e2e_s - answer.server_ttft_s)
        prefill_s = PROMPT_TOKENS / float(ARGS["prefill_tokens_per_s"])
        waits.append(max(0.0, ttft_s - prefill_s))
        late += ttft_s > TTFT_SLO_S
    observed = late / len(ok) if ok else float("nan")
    return {
        "rate": measured,
        "rho": rho,
        "replicas": running,
        "prefill_tps": model.prefill_tokens_per_s,
        "stretch": model.path_stretch,
        "predicted": predicted,
        "observed": observed,
        "wait_mean_s": sum(waits) / len(waits) if waits else float("nan"),
        "requests": len(ok),
    }


async def main_async(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="model-vs-emulator-"))
    apps = [local.AppSpec("llm", "/llm", external_scaler_enabled=True, args=ARGS)]
    with local.running(workdir, apps) as cluster:
        scale(cluster, args.replicas)
        document = {
            "cluster": {
                "dashboard_url": cluster.dashboard_url,
                "token_file": str(cluster.token_file),
                "address": cluster.gcs_address,
            },
            "defaults": {"autoscaling": {"look_back_period_s": 10}},
        }
        config = parse_config(yaml.safe_dump(document))
        probe = RayServeSensor({"metrics_interval_s": 1, "rate_window_s": 5}, config)
        capacity_per_s = args.replicas * float(ARGS["prefill_tokens_per_s"]) / PROMPT_TOKENS
        print(
            f"{args.replicas} replicas, prefill capacity {capacity_per_s:.1f} requests/s, "
            f"TTFT SLO {TTFT_SLO_S} s, prompts of {PROMPT_TOKENS} tokens"
        )
        print(
            f"{'load':>5} {'rate/s':>7} {'rho':>5} {'prefill tok/s':>13} "
            f"{'late predicted':>14} {'late observed':>13} {'mean wait s':>11} {'requests':>8} "
            f"{'path stretch':>12}"
        )
        try:
            for share in args.loads:
                row = await phase(cluster, probe, share * capacity_per_s, args.phase_s)
                print(
                    f"{share:>5.2f} {row['rate']:>7.2f} {row['rho'] or 0:>5.2f} "
                    f"{row['prefill_tps'] or 0:>13.0f} {100 * row['predicted']:>13.2f}% "
                    f"{100 * row['observed']:>12.2f}% {row['wait_mean_s']:>11.3f} "
                    f"{row['requests']:>8} {row['stretch']:>12.2f}",
                    flush=True,
                )
        finally:
            await probe.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--phase-s", type=float, default=40.0)
    parser.add_argument("--loads", type=float, nargs="*", default=[0.3, 0.6, 0.85])
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
