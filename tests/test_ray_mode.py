"""`mode: ray-compatible` through decide(): the same targets as Ray's own policy functions.

The simulated cluster is driven by the backtest's `ray-serve` baseline, which runs Ray
2.60's `replica_queue_length_autoscaling_policy` under `_apply_autoscaling_config`; the
daemon's decide() in the Ray-compatible mode sees the same observations in lockstep and
must reach the same target every tick.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide.baselines.base import Bounds
from autoscalerd.decide.baselines.ray_serve import RayServePolicy, RayServeSettings
from autoscalerd.decide.policy import decide, initial_state
from autoscalerd.model import Reason
from autoscalerd.sim.cluster import Cluster, ReplicaModel
from autoscalerd.sim.sensor import SimSensor
from autoscalerd.sim.traces import TraceWindow, open_trace

AZURE_2023 = Path(__file__).resolve().parents[1] / "data" / "traces" / "azure_llm_2023_code.csv"


@pytest.mark.parametrize("aggregation", ["mean", "max", "min"])
def test_ray_compatible_mode_matches_rays_policy_tick_for_tick(aggregation: str) -> None:
    # Ray's aggregation_function reduces the look-back window's request counts: the
    # baseline runs Ray's own aggregate_timeseries for max and min.
    knobs = RayServeSettings(aggregation_function=aggregation)
    cfg = DeploymentConfig.model_validate(
        {
            "name": "llm/ray",
            "mode": "ray-compatible",
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": 20,
                "initial_replicas": 2,
                "target_ongoing_requests": knobs.target_ongoing_requests,
                "upscale_delay_s": knobs.upscale_delay_s,
                "downscale_delay_s": knobs.downscale_delay_s,
                "upscaling_factor": knobs.upscaling_factor,
                "downscaling_factor": knobs.downscaling_factor,
                "look_back_period_s": knobs.look_back_period_s,
                "aggregation_function": aggregation.upper(),
            },
        }
    )
    assert cfg.autoscaling.aggregation_function == aggregation
    # A rate 4x the trace's, so Ray's rule has queues to scale on.
    trace = open_trace(AZURE_2023, window=TraceWindow(duration_s=900, rate_scale=4.0))
    ray = RayServePolicy(Bounds(1, 20), 2, knobs, "llm/ray")
    cluster = Cluster(ReplicaModel(cold_start_s=20.0), 2)
    sensor = SimSensor(cluster, "llm/ray", knobs.look_back_period_s, 1.0)
    state = initial_state(cfg, 0.0, 2)
    targets: list[tuple[int, int]] = []

    def on_tick(now_s: float) -> None:
        nonlocal state
        obs = sensor.observe(now_s)
        decision, state = decide(obs, state, cfg, now_s)
        theirs = ray.step(obs, now_s)
        assert Reason.RAY_COMPATIBLE in decision.reasons
        targets.append((decision.target_replicas, theirs))
        cluster.set_target(theirs, now_s)

    cluster.run(trace.batches(), 1.0, 900.0, on_tick)
    mismatches = [
        (tick, ours, theirs) for tick, (ours, theirs) in enumerate(targets) if ours != theirs
    ]
    assert not mismatches, mismatches[:5]
    assert len({theirs for _, theirs in targets}) > 2  # it did scale, both ways or up


def test_ray_compatible_mode_holds_on_stale_data() -> None:
    from autoscalerd.model import Observation, Reading

    cfg = DeploymentConfig.model_validate(
        {"name": "llm/ray", "mode": "ray-compatible", "max_metric_age_s": 5,
         "autoscaling_config": {"max_replicas": 10, "downscale_delay_s": 0}}
    )  # fmt: skip
    state = initial_state(cfg, 0.0, 6)
    stale = Observation(
        "llm/ray", 100.0, ongoing_requests=Reading(0.0, 50.0), running_replicas=Reading(6, 50.0)
    )
    decision, _ = decide(stale, state, cfg, 100.0)
    assert decision.target_replicas == 6 and Reason.STALE_DATA in decision.reasons


def test_a_pasted_block_takes_rays_defaults_and_check_config_warns(tmp_path: Path) -> None:
    import subprocess

    from autoscalerd.decide.ray_compat import RayKnobs

    cfg = DeploymentConfig.model_validate(
        {"name": "llm/ray", "mode": "ray-compatible", "autoscaling_config": {"min_replicas": 1}}
    )
    knobs = RayKnobs.from_autoscaling(cfg.autoscaling)
    # Ray 2.60's defaults, not autoscalerd's (10 replicas, 16 requests, 10 s and 300 s).
    assert (knobs.max_replicas, knobs.target_ongoing_requests) == (1, 2.0)
    assert (knobs.upscale_delay_s, knobs.downscale_delay_s) == (30.0, 600.0)
    path = tmp_path / "ray.yaml"
    path.write_text(
        "deployments:\n  - name: llm/ray\n    mode: ray-compatible\n"
        "    autoscaling_config:\n      min_replicas: 1\n"
    )
    cli = Path(sys.executable).parent / "autoscalerd"
    result = subprocess.run(
        [str(cli), "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "deployments[0].autoscaling_config: max_replicas not set" in result.stderr
    assert "Ray's default applies" in result.stderr
