"""Restart-safe state: the file format, atomic writes, unusable files, and the restore rule."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autoscalerd import state
from autoscalerd.config import Config, DeploymentConfig, StateConfig
from autoscalerd.decide import policy
from autoscalerd.decide.forgetting import Sums
from autoscalerd.forecast.holt_winters import FittedModel, ForecasterState
from autoscalerd.model import DeploymentState, Observation, Reading, Reason


def cfg() -> DeploymentConfig:
    return Config.model_validate(
        {
            "deployments": [
                {
                    "name": "app/dep",
                    "autoscaling": {
                        "min_replicas": 1,
                        "max_replicas": 10,
                        "upscale_delay_s": 0,
                        "downscale_delay_s": 60,
                        "look_back_period_s": 10,
                    },
                    "capacity": {
                        "sizing": "utilization",
                        "service_rate_per_replica": 10,
                        "target_utilization": 1.0,
                    },
                    "forecast": {"enabled": False},
                    "max_metric_age_s": 5,
                }
            ]
        }
    ).deployment("app/dep")


def step(
    s: DeploymentState, rate: float, now_s: float
) -> tuple[int, tuple[Reason, ...], DeploymentState]:
    obs = Observation("app/dep", now_s, arrival_rate_per_s=Reading(rate, now_s))
    decision, s = policy.decide(obs, s, cfg(), now_s)
    return decision.target_replicas, decision.reasons, s


def busy_then_quiet() -> DeploymentState:
    """50 req/s for 100 s (5 replicas), then 10 req/s for 50 s: still 5, held by the window."""
    s = policy.initial_state(cfg(), 0.0, None)
    for t in range(1, 151):
        target, _, s = step(s, 50.0 if t <= 100 else 10.0, float(t))
    assert target == 5
    return s


def first_scale_down_s(s: DeploymentState, start_s: float) -> tuple[float, set[Reason]]:
    reasons: set[Reason] = set()
    for t in range(int(start_s), int(start_s) + 200):
        before = s.target_replicas
        target, why, s = step(s, 10.0, float(t))
        reasons.update(why)
        if target < before:
            return float(t), reasons
    raise AssertionError("never scaled down")


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    model = FittedModel(
        method="holt_winters",
        alpha=0.3,
        level=12.5,
        beta=0.1,
        phi=0.98,
        trend=-0.25,
        gamma=0.05,
        seasonal="add",
        season=(1.0, -1.0, 0.5),
        buckets_seen=40,
        fitted_buckets=36,
        residual_rms_per_s=0.7,
        fit_errors=(0.1, -0.2),
    )
    forecaster = ForecasterState(
        bucket_start_s=120.0,
        bucket_arrivals=33.0,
        bucket_covered_s=3.0,
        history=(1.0, 2.0, 3.5),
        closed_buckets=40,
        model=model,
        last_fit_at_s=100.0,
        errors=(0.5, -0.5),
        ewma_rate_per_s=2.25,
    )
    decided = busy_then_quiet()
    learned = dataclasses.replace(
        decided.replica_model,
        prompt_mix=Sums((3.0, 5.0, 1.0), updated_at_s=140.0, samples=9),
        prompt_bounds=(100.0, 1000.0),
    )
    saved = state.SavedDeployment(
        saved_at_s=150.0,
        state=decided.with_(forecaster=forecaster, replica_model=learned),
        paused=True,
        override_replicas=4,
        override_until_s=900.0,
        applied_replicas=5,
    )
    snapshot = state.Snapshot(150.0, 1.7e9, 10.0, {"app/dep": saved})
    path = tmp_path / "state.json"
    state.write_atomic(path, state.encode(snapshot))
    assert state.load(path) == snapshot
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left
    body = json.loads(path.read_text())
    assert body["format"] == "autoscalerd-state" and body["version"] == state.FORMAT_VERSION


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not JSON"),
        ('["a"]', "not an autoscalerd state file"),
        ('{"format": "autoscalerd-state", "version": 99}', "format version 99"),
        (
            '{"format": "autoscalerd-state", "version": 2, "saved_at_s": 1, "saved_wall_s": 1,'
            ' "surprise": true}',
            "surprise: unknown field",
        ),
        (
            '{"format": "autoscalerd-state", "version": 2, "saved_at_s": 1, "saved_wall_s": 1,'
            ' "deployments": []}',
            "deployments: expected an object",
        ),
    ],
)
def test_unusable_files_are_rejected_with_the_place_named(text: str, problem: str) -> None:
    with pytest.raises(state.StateError, match=problem):
        state.decode(text)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            '{"target_replicas": "3", "started_at_s": 0}',
            "state.target_replicas: expected an integer",
        ),
        ('{"target_replicas": -2, "started_at_s": 0}', "state.target_replicas: out of range"),
        (
            '{"target_replicas": 2, "started_at_s": 0, "running_seen": [-1.0, null]}',
            "state.running_seen: not (running replicas, since) in range",
        ),
        (
            '{"target_replicas": 2, "started_at_s": 0, "running_seen": [2.0, 1e9]}',
            "state.running_seen: not (running replicas, since) in range",
        ),
        (
            '{"target_replicas": 2, "started_at_s": 0, "burst": {"clump_weights":'
            ' [{"values": [1.0], "samples": 1, "updated_at_s": 0}]}}',
            "state.burst.clump_weights[0]: 1 values, not 150",
        ),
        (
            '{"target_replicas": 2, "started_at_s": 0, "burst": {"recent": ['
            + ", ".join(["1.0"] * 65)
            + "]}}",
            "state.burst.recent: not recent arrival counts",
        ),
        (
            '{"target_replicas": 2, "started_at_s": 0, "burst": {"recent": [-1.0]}}',
            "state.burst.recent: not recent arrival counts",
        ),
        (
            '{"target_replicas": 2, "started_at_s": 0, "burst": {"episodes": [[[5.0, 1.0, 1.0]]]}}',
            "state.burst.episodes: not (first, last, run, gap) sightings",
        ),
        (
            '{"target_replicas": 2, "started_at_s": 0, "burst": {"episodes": [[[1.0]]]}}',
            "state.burst.episodes: not (first, last, run, gap) sightings",
        ),
        (
            '{"target_replicas": 2, "started_at_s": 0,'
            ' "burst": {"episodes": [[[1.0, 5.0, 2.0, -1.0]]]}}',
            "state.burst.episodes: not (first, last, run, gap) sightings",
        ),
    ],
)
def test_an_unusable_deployment_is_dropped_with_the_place_named(entry: str, problem: str) -> None:
    text = (
        '{"format": "autoscalerd-state", "version": 2, "saved_at_s": 1, "saved_wall_s": 1,'
        f' "deployments": {{"a": {{"saved_at_s": 1, "state": {entry}}}}}}}'
    )
    snapshot = state.decode(text)
    assert snapshot.deployments == {} and problem in snapshot.dropped["a"]


def test_episodes_saved_before_gaps_were_kept_still_load() -> None:
    """A state file from before the longest gap was recorded holds (first, last, run)
    triples: they load as they are (read as no gap yet), next to the four-item form."""
    text = (
        '{"format": "autoscalerd-state", "version": 2, "saved_at_s": 1, "saved_wall_s": 1,'
        ' "deployments": {"a": {"saved_at_s": 1, "state": {"target_replicas": 2,'
        ' "started_at_s": 0, "burst": {"episodes": [[[1.0, 5.0, 2.0], [1.0, 5.0, 5.0, 3.0]]]}}}}}'
    )
    snapshot = state.decode(text)
    assert snapshot.dropped == {}
    episodes = snapshot.deployments["a"].state.burst.episodes
    assert episodes == (((1.0, 5.0, 2.0), (1.0, 5.0, 5.0, 3.0)),)


def test_an_unusable_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("\x00garbage")
    assert state.load_or_set_aside(path) is None
    assert not path.exists()
    [aside] = list(tmp_path.iterdir())
    assert aside.name.startswith("state.json.bad-") and aside.read_text() == "\x00garbage"
    assert state.load_or_set_aside(tmp_path / "absent.json") is None


def test_path_from_config_else_systemd_state_directory() -> None:
    assert state.resolve_path(StateConfig(path="/x/s.json"), {"STATE_DIRECTORY": "/y"}) == Path(
        "/x/s.json"
    )
    assert state.resolve_path(StateConfig(), {"STATE_DIRECTORY": "/y:/z"}) == Path("/y/state.json")
    assert state.resolve_path(StateConfig(), {}) is None


def test_replay_resumes_where_the_trace_would_be() -> None:
    snapshot = state.Snapshot(saved_at_s=500.0, saved_wall_s=1000.0, clock_origin_s=0.0)
    assert snapshot.resume_s(0.0, 20.0, 1002.5) == 550.0  # down 2.5 s at 20x
    assert snapshot.resume_s(0.0, None, 1002.5) == 500.0  # flat out: where it stopped
    assert snapshot.same_clock(0.0) and not snapshot.same_clock(None)
    assert not snapshot.same_clock(7.0)


def test_even_a_brief_restart_waits_a_full_window_before_scaling_down() -> None:
    # The platform may have been scaled while the daemon was down, however briefly: the
    # saved windows predate that, so only fresh data may lower what runs.
    saved = state.SavedDeployment(saved_at_s=150.0, state=busy_then_quiet())
    uninterrupted, _ = first_scale_down_s(saved.state, 151)
    restored = state.restore(saved, 153.0, cfg())
    assert restored is not None and restored.fresh_since_s is None
    after_restart, reasons = first_scale_down_s(restored, 153)
    assert Reason.WARMUP in reasons
    assert after_restart >= 153 + cfg().autoscaling.downscale_delay_s > uninterrupted


def test_long_outage_blocks_scale_down_for_a_full_window_after_the_start() -> None:
    saved = state.SavedDeployment(saved_at_s=150.0, state=busy_then_quiet())
    restored = state.restore(saved, 190.0, cfg())
    assert restored is not None
    assert restored.fresh_since_s is None and restored.target_replicas == 5
    scaled_down_s, reasons = first_scale_down_s(restored, 190)
    # The restored window already says "fewer" at 190; only the missing fresh data holds it.
    assert Reason.WARMUP in reasons
    assert scaled_down_s >= 190 + cfg().autoscaling.downscale_delay_s


def test_platform_target_wins_and_a_future_save_is_not_used() -> None:
    saved = state.SavedDeployment(saved_at_s=150.0, state=busy_then_quiet())
    restored = state.restore(saved, 151.0, cfg(), platform_replicas=7)
    assert restored is not None and restored.target_replicas == 7
    assert state.restore(saved, 149.0, cfg()) is None


def test_a_file_nested_too_deeply_is_moved_aside_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("[" * 100000)
    with pytest.raises(state.StateError, match="nested too deeply"):
        state.load(path)
    assert state.load_or_set_aside(path) is None
    assert not path.exists() and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize(
    "damage",
    [
        ("smoothed_replicas", float("nan")),
        ("smoothed_replicas", float("inf")),
        ("last_action_at_s", 1e308),
        ("target_replicas", -3),
        ("target_replicas", 10**30),
        ("fresh_since_s", "soon"),
    ],
)
def test_a_damaged_deployment_is_dropped_and_the_others_kept(damage: tuple[str, object]) -> None:
    good = state.SavedDeployment(saved_at_s=150.0, state=busy_then_quiet())
    text = state.encode(state.Snapshot(150.0, 0.0, None, {"a/good": good, "a/bad": good}))
    raw = json.loads(text)
    field, value = damage
    raw["deployments"]["a/bad"]["state"][field] = value
    snapshot = state.decode(json.dumps(raw))
    assert list(snapshot.deployments) == ["a/good"]
    assert "a/bad" in snapshot.dropped and field in snapshot.dropped["a/bad"]


async def test_a_state_that_cannot_be_decided_on_is_dropped_at_adoption() -> None:
    from autoscalerd.clock import VirtualClock
    from autoscalerd.loop import Controller
    from tests.test_safety import NAME, Platform, PlatformActuator, PlatformSensor, config

    # Damage of a kind no decoder check catches: decide() raises on it.
    poisoned = DeploymentState(target_replicas=5, started_at_s=0.0, burst=None)  # type: ignore[arg-type]
    platform = Platform()
    controller = Controller(
        config(), [PlatformSensor(platform)], [PlatformActuator(platform)], VirtualClock(0.0)
    )
    controller.restored = {NAME: state.SavedDeployment(saved_at_s=9.0, state=poisoned)}
    report = await controller.tick(10.0)
    assert not report.deployment_errors
    assert controller.deployments[NAME].state.burst is not None
    # The same damage arising while running: a few failed ticks, then learning restarts.
    controller.deployments[NAME].state = poisoned
    errors = [bool((await controller.tick(float(t))).deployment_errors) for t in range(11, 16)]
    assert errors == [True, True, True, False, False]
    assert controller.deployments[NAME].state.target_replicas == 10  # what the load needs
