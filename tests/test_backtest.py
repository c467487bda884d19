"""The backtest: peer policies by their own rules, Ray's own code for ray-serve, the runner,
and the `autoscalerd backtest` command as a user runs it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoscalerd.config import load_config
from autoscalerd.decide.baselines.base import Bounds
from autoscalerd.decide.baselines.hpa import HpaPolicy, HpaSettings
from autoscalerd.decide.baselines.kpa import KpaPolicy, KpaSettings
from autoscalerd.decide.baselines.ray_serve import RayServePolicy, RayServeSettings
from autoscalerd.decide.baselines.threshold import ThresholdPolicy, ThresholdSettings
from autoscalerd.model import Observation, Reading
from autoscalerd.sim.backtest import WORK_BOUND, run_backtest
from autoscalerd.sim.policies import POLICIES
from autoscalerd.sim.traces import EmpiricalTokens, TraceWindow, open_trace

ROOT = Path(__file__).resolve().parents[1]
AZURE_2023 = ROOT / "data" / "traces" / "azure_llm_2023_code.csv"
AZURE_2024_COUNTS = ROOT / "data" / "traces" / "azure_llm_2024_code_10s_counts.csv"
BACKTEST_CONFIG = ROOT / "config" / "backtest.yaml"
AUTOSCALERD = Path(sys.executable).parent / "autoscalerd"

ROW_FIELDS = {
    "policy",
    "requests",
    "slo_attainment_ttft",
    "ttft_p50_s",
    "ttft_p99_s",
    "e2e_p99_s",
    "tpot_p99_s",
    "replica_seconds",
    "cost_vs_oracle",
    "cost_vs_static_peak",
    "scale_actions",
    "max_queue",
}


def observation(
    now_s: float,
    *,
    ongoing: float = 0.0,
    queued: float = 0.0,
    running: float = 1.0,
    starting: float = 0.0,
    target: float | None = None,
) -> Observation:
    def reading(value: float) -> Reading:
        return Reading(value, now_s)

    return Observation(
        deployment="app/llm",
        sensed_at_s=now_s,
        arrival_rate_per_s=reading(1.0),
        ongoing_requests=reading(ongoing),
        queued_requests=reading(queued),
        running_replicas=reading(running),
        starting_replicas=reading(starting),
        platform_target_replicas=reading(running + starting if target is None else target),
    )


# ---------------------------------------------------------------- ray-serve: Ray's own code


def test_ray_serve_runs_rays_policy_functions_on_the_simulated_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.serve import autoscaling_policy as ray_policy

    policy = RayServePolicy(Bounds(1, 16), 2, RayServeSettings())
    core_calls: list[tuple[int, int, float, float]] = []
    clock_reads: list[float] = []
    real_core = ray_policy._core_replica_queue_length_policy
    real_delay = ray_policy._apply_delay_logic

    def core(ctx: Any) -> Any:
        core_calls.append(
            (
                ctx.current_num_replicas,
                ctx.target_num_replicas,
                ctx.total_num_requests,
                ctx.current_time,
            )
        )
        return real_core(ctx)

    def delay(*args: Any, **kwargs: Any) -> Any:
        # What Ray's delay logic gets from time.time() inside the call.
        clock_reads.append(ray_policy.time.time())
        return real_delay(*args, **kwargs)

    monkeypatch.setattr(ray_policy, "_core_replica_queue_length_policy", core)
    monkeypatch.setattr(ray_policy, "_apply_delay_logic", delay)

    # 48 requests on 2 replicas at target 12 wants 4; upscaling_factor 2 makes the step
    # 2 + 2·(4 − 2) = 6, once the wish has lasted upscale_delay_s = 3 s.
    targets = []
    target = 2
    for now_s in (1000.0, 1001.0, 1002.0, 1003.0):
        target = policy.step(observation(now_s, ongoing=48, running=2, target=target), now_s)
        targets.append(target)
    assert targets == [2, 2, 2, 6]
    assert clock_reads == [1000.0, 1001.0, 1002.0, 1003.0]
    assert core_calls[0] == (2, 2, 48.0, 1000.0)
    # The real clock is back once the call returns.
    assert ray_policy.time is time


def test_ray_serve_waits_out_the_downscale_delay() -> None:
    policy = RayServePolicy(Bounds(1, 16), 4, RayServeSettings())
    target = 4
    history = {}
    for step in range(0, 302):
        now_s = 100.0 + step
        target = policy.step(observation(now_s, ongoing=12, running=4, target=target), now_s)
        history[step] = target
    # Wants 1 from the first tick; downscaling_factor 0.5 makes it 4 + 0.5·(1 − 4) → 3.
    assert history[299] == 4
    assert history[300] == 3


# ---------------------------------------------------------------- autoscalerd: the daemon's code


def test_autoscalerd_policy_is_the_daemons_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoscalerd.decide import policy as decision_core
    from autoscalerd.sim.policies import AutoscalerdPolicy

    calls: list[float] = []
    real_decide = decision_core.decide

    def decide(obs: Observation, state: Any, cfg: Any, now_s: float) -> Any:
        calls.append(now_s)
        return real_decide(obs, state, cfg, now_s)

    monkeypatch.setattr(decision_core, "decide", decide)
    cfg = load_config(BACKTEST_CONFIG).deployment("llm/code")
    policy = AutoscalerdPolicy(cfg, 2)
    targets = [policy.step(observation(float(t), ongoing=10, running=2), float(t)) for t in (1, 2)]
    assert calls == [1.0, 2.0]
    assert policy.last_decision is not None
    assert targets[-1] == policy.last_decision.target_replicas


# ---------------------------------------------------------------- hpa, kpa, threshold


def test_hpa_scale_up_is_limited_to_max_of_100_percent_and_4_pods_per_15_s() -> None:
    policy = HpaPolicy(Bounds(1, 64), 2, HpaSettings())
    # 120 ongoing on 2 ready replicas at target 12: ratio 5, wants 10; at most max(2+4, 4).
    assert policy.step(observation(0.0, ongoing=120, running=2), 0.0) == 6
    # Between syncs nothing changes.
    assert policy.step(observation(5.0, ongoing=500, running=2, starting=4), 5.0) == 6
    # 15 s later, the 4 new ones are still starting (missing pods count as 0 on the way up):
    # ratio over 6 pods = 120/6/12 = 1.67 -> 10, limit max(6+4, 12) = 12.
    assert policy.step(observation(15.0, ongoing=120, running=2, starting=4), 15.0) == 10


def test_hpa_tolerance_and_scale_down_stabilisation() -> None:
    policy = HpaPolicy(Bounds(1, 64), 10, HpaSettings())
    # Within 10 % of the target: no change.
    assert policy.step(observation(0.0, ongoing=10 * 12 * 1.05, running=10), 0.0) == 10
    # Load halves: the recommendation is 5, but the 300 s window remembers 10.
    now_s = 15.0
    while now_s < 300.0:
        assert policy.step(observation(now_s, ongoing=60, running=10), now_s) == 10
        now_s += 15.0
    assert policy.step(observation(315.0, ongoing=60, running=10), 315.0) == 5


def test_kpa_panics_and_does_not_scale_down_while_panicking() -> None:
    policy = KpaPolicy(Bounds(1, 64), 2, KpaSettings())
    target = 2
    for now_s in range(1, 60):
        target = policy.step(observation(float(now_s), ongoing=12, running=2), float(now_s))
    assert target == 1  # 12 over the stable window needs one replica (scale-down rate 2)
    # A burst: 96 concurrent for a few seconds on 2 ready replicas: 8 pods >= 200 % of 2.
    for now_s in range(60, 66):
        target = policy.step(observation(float(now_s), ongoing=96, running=2), float(now_s))
    assert target == 8
    # The burst ends; while panicking the count holds.
    for now_s in range(66, 100):
        target = policy.step(observation(float(now_s), ongoing=0, running=8), float(now_s))
        assert target == 8
    # A stable window after the last over-threshold tick, panic ends and stable rules.
    for now_s in range(100, 200):
        target = policy.step(observation(float(now_s), ongoing=0, running=target), float(now_s))
    assert target < 8


def test_threshold_policy_follows_the_toy() -> None:
    policy = ThresholdPolicy(Bounds(1, 6), 3, ThresholdSettings())
    queues = [13, 13, 13, 13, 0, 0, 0, 0]
    targets = [policy.step(observation(float(i), queued=q), float(i)) for i, q in enumerate(queues)]
    # Up one, hold two ticks (cooldown 3, counted down in the same tick), up again, ...
    assert targets == [4, 4, 4, 5, 5, 5, 4, 4]


# ---------------------------------------------------------------- the runner


@pytest.fixture(scope="module")
def ten_minutes() -> Any:
    cfg = load_config(BACKTEST_CONFIG).deployment("llm/code")
    trace = open_trace(AZURE_2023, window=TraceWindow(duration_s=600))
    return run_backtest(trace, list(POLICIES), cfg)


def test_every_policy_serves_every_request(ten_minutes: Any) -> None:
    result = ten_minutes
    names = [row.policy for row in result.rows]
    assert names == [*POLICIES, WORK_BOUND]
    requests = result.demand.requests
    work = result.row(WORK_BOUND).replica_seconds
    for row in result.rows:
        assert row.requests == requests
        if row.policy == WORK_BOUND:
            continue
        assert row.unfinished == 0
        assert 0 <= row.slo_attainment_ttft <= 1
        assert row.ttft_p50_s <= row.ttft_p99_s <= row.e2e_p99_s
        # Nothing serves the trace for less than the work it holds.
        assert row.replica_seconds >= work
    assert result.row("oracle").cost_vs_oracle == 1.0
    assert result.row("static-peak").cost_vs_static_peak == 1.0
    assert result.series["autoscalerd"].forecast_per_s is not None


def test_json_document_follows_the_schema(ten_minutes: Any) -> None:
    document = json.loads(json.dumps(ten_minutes.as_json()))
    assert set(document) == {
        "trace", "simulator", "results", "attainable_ttft", "static_frontier", "oracle_frontier",
    }  # fmt: skip
    assert document["trace"]["path"].endswith("azure_llm_2023_code.csv")
    for row in document["results"]:
        assert set(row) >= ROW_FIELDS
    # The 2023 code trace's prompts prefill in well under the 1 s SLO on the 70B preset.
    assert 0.99 < document["attainable_ttft"] <= 1.0
    statics = document["static_frontier"]
    assert [p["replicas"] for p in statics] == sorted(p["replicas"] for p in statics)
    assert statics[0]["replicas"] == 1
    # Past static peak, until a fixed count holds the SLO's attainment target: the
    # slice's clumps need more than its busiest minute's mean rate does.
    goal = 0.99 * document["attainable_ttft"]
    # The smallest such count is on the frontier, and the one below it is too.
    meeting = [p["replicas"] for p in statics if p["slo_attainment_ttft"] >= goal]
    assert meeting and meeting[0] - 1 in [p["replicas"] for p in statics]
    assert all(p["slo_attainment_ttft"] < goal for p in statics if p["replicas"] < meeting[0])
    assert document["oracle_frontier"][0]["target_utilization"] == 0.05
    ours = next(r for r in document["results"] if r["policy"] == "autoscalerd")
    assert ours["cost_vs_oracle_at_equal_attainment"] is not None
    assert isinstance(ours["dominated_by"], list)


# ---------------------------------------------------------------- the command


def run_cli(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AUTOSCALERD), "backtest", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )


def test_cli_request_level_trace_all_policies(tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    done = run_cli(
        "--trace", str(AZURE_2023), "--duration", "5m", "--policy", "all",
        "--json", str(out_json), "--plot", str(out_png),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "autoscalerd" in done.stdout and "work-bound" in done.stdout
    document = json.loads(out_json.read_text())
    assert [row["policy"] for row in document["results"]] == [*POLICIES, WORK_BOUND]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_binned_trace_with_tokens_from_a_request_trace(tmp_path: Path) -> None:
    out_json = tmp_path / "out.json"
    done = run_cli(
        "--trace", str(AZURE_2024_COUNTS), "--duration", "10m", "--rate-scale", "0.5",
        "--tokens-from", str(AZURE_2023), "--policy", "hpa", "kpa", "--json", str(out_json),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(out_json.read_text())
    assert document["trace"]["format"] == "counts"
    assert document["trace"]["rate_scale"] == 0.5
    assert [r["policy"] for r in document["results"]] == [
        "hpa", "kpa", "static-peak", "oracle", WORK_BOUND,
    ]  # fmt: skip


def test_cli_jobs_run_simulations_in_workers_with_the_same_results(tmp_path: Path) -> None:
    # A counts trace with token lengths drawn from a request trace: the trace, its token
    # sampler and the config travel to the worker processes, which replay it themselves.
    outputs = []
    for jobs in ("1", "2"):
        out_json = tmp_path / f"jobs{jobs}.json"
        done = run_cli(
            "--trace", str(AZURE_2024_COUNTS), "--duration", "10m", "--rate-scale", "0.5",
            "--tokens-from", str(AZURE_2023), "--policy", "autoscalerd", "hpa",
            "--jobs", jobs, "--json", str(out_json),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(out_json.read_text()))
    one, two = outputs
    assert one == two
    # Frontiers included: one simulation per point, handed out with the policies.
    assert len(one["static_frontier"]) >= 2 and len(one["oracle_frontier"]) == 12
    assert [r["policy"] for r in one["results"]] == [
        "autoscalerd", "hpa", "static-peak", "oracle", WORK_BOUND,
    ]  # fmt: skip


def _spawned_workers(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # The parent pid is the field after the command's closing parenthesis and state.
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def test_cli_a_worker_killed_mid_run_is_one_line_and_exit_1() -> None:
    import signal

    process = subprocess.Popen(
        [
            str(AUTOSCALERD), "backtest", "--trace", str(AZURE_2024_COUNTS), "--duration", "12h",
            "--tokens-from", str(AZURE_2023), "--policy", "all", "--jobs", "2", "--no-progress",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60.0
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            workers = _spawned_workers(process.pid)
        assert len(workers) == 2, "the backtest never had its two workers"
        time.sleep(1.0)  # into the simulations
        os.kill(workers[0], signal.SIGKILL)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, err
    assert err.strip() == (
        "autoscalerd: backtest: a worker process of --jobs 2 ended abruptly (out of "
        "memory?); run again with fewer --jobs"
    )
    # No worker outlives the command.
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "nope.csv"], "nope.csv: no such file"),
        (["--trace", str(AZURE_2023), "--jobs", "-1"], "--jobs: -1 is negative"),
        (["--trace", str(AZURE_2023), "--jobs", "many"], "--jobs: 'many' is not a whole"),
        (["--trace", str(AZURE_2023), "--policy", "magic"], "--policy: unknown magic"),
        (["--trace", str(AZURE_2023), "--duration", "soon"], "--duration: 'soon' is not"),
        (["--trace", str(AZURE_2023), "--json", "/no/such/dir/x.json"], "--json: directory"),
        (["--trace", str(AZURE_2023), "--start", "2h"], "no requests in the window"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_malformed_trace_through_run_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from autoscalerd.sim import cli

    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,1,x\n")
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["backtest", "--trace", str(bad), "--policy", "hpa"])
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"autoscalerd: backtest: {bad}: line 2: GeneratedTokens 'x' is not a non-negative "
        "whole number of tokens"
    )


def test_tokens_are_sampled_in_pairs_from_the_request_trace() -> None:
    tokens = EmpiricalTokens.from_trace(open_trace(AZURE_2023))
    assert tokens.prompt_tokens.size == 8819


def test_adaptive_policies_start_at_what_the_opening_load_needs_for_the_slo() -> None:
    """The warm start: the fewest replicas that, held static over the opening window,
    meet the SLO for the target share of what is attainable there; one fewer does not."""
    from autoscalerd.sim.backtest import (
        OPENING_MIN_S,
        BacktestSettings,
        _until,
        attainable_share,
        opening_replicas,
        simulate_policy,
    )
    from autoscalerd.sim.policies import StaticPolicy
    from autoscalerd.sim.reference import profile

    trace = open_trace(AZURE_2023, window=TraceWindow(duration_s=900))
    settings = BacktestSettings()
    bounds = Bounds(1, 64)
    chosen = opening_replicas(trace, settings, 1, bounds, 30.0, 0.99)
    window_s = max(OPENING_MIN_S, 2.0 * settings.replica.cold_start_s)
    opening = dataclasses.replace(trace, _batches=lambda: _until(trace.batches(), window_s))
    demand = profile(opening.batches(), settings.oracle_bucket_s, window_s)
    need = 0.99 * (attainable_share(opening, settings) or 0.0)

    def attained(replicas: int) -> float:
        row, _ = simulate_policy(
            StaticPolicy("s", replicas), replicas, opening, demand, settings, 30.0
        )
        return row.slo_attainment_ttft or 0.0

    assert chosen > 1  # the code trace's opening bursts need more than the oracle's one
    assert attained(chosen) >= need > attained(chosen - 1)
    # Never below the oracle plan's count, and within the bounds.
    assert opening_replicas(trace, settings, chosen + 2, bounds, 30.0, 0.99) == chosen + 2
    assert opening_replicas(trace, settings, 1, Bounds(1, 2), 30.0, 0.99) <= 2
