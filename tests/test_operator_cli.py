"""The operator's commands: what they print from a recorded /v1/status, and the real
`autoscalerd status | explain | pause | override | resume` against the real daemon."""

from __future__ import annotations

import copy
import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from autoscalerd import operator_view
from autoscalerd.model import Reason
from autoscalerd.operator_cli import parse_time
from tests.daemon import Daemon, free_port
from tests.helpers import REPO, autoscalerd_bin
from tests.test_service import NAME as SERVICE_NAME
from tests.test_service import TOKEN, TOKEN_ENV, write_config, write_trace

# /v1/status of `autoscalerd run --config config/replay.yaml`, recorded after a pause by
# bob and an override by alice.
RECORDED = json.loads((Path(__file__).parent / "data" / "operator_status.json").read_text())
NAME = "llm/code-completion"


@pytest.fixture
def status() -> dict[str, Any]:
    return copy.deepcopy(RECORDED)


def iso(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- rendering


def test_the_status_table_from_a_recorded_status(status: dict[str, Any]) -> None:
    text = operator_view.status_text(status)
    lines = text.splitlines()
    assert (
        lines[0] == f"autoscalerd 0.1.0 at {iso(status['now_s'])}: healthy, ready, 358 ticks of 1 s"
    )
    header = next(line for line in lines if line.startswith("DEPLOYMENT"))
    assert header.split() == [
        "DEPLOYMENT",
        "LOAD/S",
        "UPPER/S",
        "DESIRED",
        "APPLIED",
        "RUNNING",
        "WAIT",
        "P99/BUDGET",
        "BURN",
        "FAST/SLOW",
        "SLO",
        "OPERATOR",
        "REASONS",
    ]
    [row] = [line for line in lines if line.startswith(NAME + " ")]
    # load 1.58 observed, 7.54 upper; 6 desired and applied, running unknown; the wait
    # budget 1 s with no p99 sensed; no burn rates yet; the override in force.
    assert row.split() == [
        NAME,
        "1.58",
        "7.54",
        "6",
        "6",
        "-",
        "-/1.00",
        "s",
        "-/-",
        "ok",
        "override",
        "6",
        "forecast_leads",
        "burst",
        "scale_up",
        "override",
    ]
    override = status["deployments"][NAME]["operator"]
    assert (
        f"{NAME}: override 6 replicas by alice since {iso(override['since_s'])} (1m 0s ago), "
        f"until {iso(override['until_s'])} (in 29m 0s): load test"
    ) in lines
    assert "operator actions" not in text  # only for one deployment


def test_status_of_one_deployment_lists_its_operator_actions(status: dict[str, Any]) -> None:
    text = operator_view.status_text(status, NAME)
    actions = text.split("operator actions, oldest first:\n")[1].splitlines()
    pause, override = status["deployments"][NAME]["operator_history"]
    assert actions == [
        f"  {iso(pause['at_s'])} (1m 38s ago)  pause by bob: deploy freeze",
        f"  {iso(override['at_s'])} (1m 0s ago)  override 6 by alice until "
        f"{iso(override['until_s'])}: load test",
    ]


def test_status_shows_breaches_errors_conflicts_and_gpus_not_healthy(
    status: dict[str, Any],
) -> None:
    entry = status["deployments"][NAME]
    entry["operator"] = None
    entry["last_decision"].update(
        slo_breached=["queue_wait_p99_s"], burn_rate_fast=14.2, burn_rate_slow=3.1
    )
    entry["last_observation"]["inputs"].update(
        queue_wait_p99_s={"value": 2.5, "age_s": 1.0}, running_replicas={"value": 5, "age_s": 1.0}
    )
    entry["last_error"] = "ray_serve: timeout: timed out"
    entry["conflicts"] = {"count": 2, "last": "ray_serve: target 9 set by someone else", "age_s": 3}
    entry["gpus"] = [
        {"replica": "r1", "gpu": "GPU-aaa", "node_ip": "10.0.0.2", "state": "healthy"},
        {
            "replica": "r2",
            "gpu": "GPU-bbb",
            "node_ip": "10.0.0.3",
            "state": "failed",
            "reason": "xid 79: fallen off the bus",
            "capacity_share": 0.0,
        },
    ]
    status["sensors"]["replay"] = {"ok": False, "error": "trace unreadable"}
    status["waiting"] = {"llm/next": "no sensor has reported it yet"}
    status["gpus_unattributed"] = [{"gpu": "GPU-ccc", "state": "degraded", "reason": "throttled"}]
    status["healthy"] = False
    lines = operator_view.status_text(status).splitlines()
    assert lines[0].endswith(": NOT HEALTHY, ready, 358 ticks of 1 s")
    assert lines[1:3] == [
        "sensor replay: trace unreadable",
        "waiting: llm/next (no sensor has reported it yet)",
    ]
    [row] = [line for line in lines if line.startswith(NAME + " ")]
    assert "2.50/1.00 s" in row and "14.20/3.10" in row and "BREACHED queue_wait_p99_s" in row
    assert row.split()[5] == "5"  # running
    assert f"{NAME}: error: ray_serve: timeout: timed out" in lines
    assert (
        f"{NAME}: 2 changes of its target by others, last: ray_serve: target 9 set by someone else"
        in lines
    )
    assert (
        f"{NAME}: GPU GPU-bbb (replica r2 on 10.0.0.3): failed (xid 79: fallen off the bus), "
        "0% of its capacity"
    ) in lines
    assert "GPU-aaa" not in "\n".join(lines)
    assert "GPU GPU-ccc (on no known replica): degraded (throttled)" in lines


def test_explain_walks_a_recorded_decision_stage_by_stage(status: dict[str, Any]) -> None:
    entry = status["deployments"][NAME]
    decision = entry["last_decision"]
    text = operator_view.explain_text(decision, entry, entry["operator_history"], status["now_s"])
    lines = text.splitlines()
    assert (
        lines[0]
        == f"{NAME}: 6 replicas, unchanged, decided at {iso(decision['decided_at_s'])} (now)"
    )
    assert lines[1] == "mode autoscalerd, sizing model, load in requests per second"
    titles = [line for line in lines if line and not line.startswith(" ")][2:]
    assert titles == [
        "1. rates",
        "2. replica model",
        "3. sizing",
        "4. SLO guard",
        "5. knobs",
        "6. bounds and fail-static",
        "7. GPU",
        "8. operator",
        "result",
        "reasons",
    ]

    def row(label: str, index: int = 0) -> str:
        return [line[30:] for line in lines if line.startswith(f"  {label}  ")][index]

    assert row("observed (look-back mean)") == "1.58/s"
    assert row("forecast point / upper") == "3.09 / 7.54/s (ewma)"
    assert row("target").startswith("7.54/s  the larger of the forecast's upper bound")
    assert row("service rate per replica") == "7.80/s"
    assert row("slots") == "5                 0  prior"
    assert row("prompt_tokens_sq_mean") == "2e+06             0  prior"
    assert row("replicas for the load") == "10 (concurrency rule: -)"
    assert row("binding condition").startswith("burst: serving a tick's burst or a clump")
    assert row("clumps") == "none measured yet"  # under 50 requests in every window
    shown = [{"window_s": 4.0, "requests": 64.4}, {"window_s": 8.0, "requests": 120.0}]
    assert operator_view._clumps(shown) == "64 in 4 s, 120 in 8 s"
    assert row("peak-to-mean") == "18.19"
    assert row("wait budget") == "1.000 s"
    assert row("burn rate fast / slow").startswith("- / -")
    assert row("model calibration").startswith("1.00")
    assert row("raw").startswith("10  from the short-window rate")
    assert row("stabilized").startswith("10  after the delay windows (up 3 s, down 300 s)")
    assert row("bounds") == "[1, 16] as configured now"
    assert row("held or clipped by") == "nothing"
    assert row("GPUs not healthy") == "none"
    override = entry["operator_history"][1]
    assert row("in force") == (
        f"{iso(override['at_s'])}  override 6 by alice until {iso(override['until_s'])}: load test"
    )
    assert row("target", -1) == "6 (previous 6)"
    reasons = text.split("\nreasons\n")[1].splitlines()
    assert reasons == [
        "  forecast_leads  The forecast's upper bound (7.54/s), not the short-window rate "
        "(0.00/s), set the target rate (by at least one request over the lead time).",
        "  burst           The measured burstiness set the count: one tick's requests at "
        "18.19x the mean, and each clump of several ticks (none measured yet), must be served "
        "within their window plus the wait budget of 1.000 s.",
        "  scale_up        The policy asked for more replicas than the previous target (6).",
        "  override        An operator pinned the target at 6.",
    ]


def test_every_reason_code_has_a_sentence_even_without_numbers() -> None:
    bare = {"reasons": [r.value for r in Reason], "target_replicas": 1, "previous_replicas": 1}
    text = operator_view.explain_text(bare)
    for reason in Reason:
        assert reason.value in operator_view.REASON_TEXT
    assert "{" not in text and operator_view._UNKNOWN_REASON not in text
    held = "slo_breach, cooldown, bounded_min, bounded_max, scale_to_zero, activate_from_zero, stale_data, partial_data, warmup"
    assert f"  held or clipped by          {held}\n" in text


def test_explain_names_ray_factors_after_their_fallbacks_and_the_step_caps() -> None:
    decision = {
        "target_replicas": 8,
        "previous_replicas": 4,
        "reasons": ["step_limited", "step_capped"],
    }
    config = {
        "autoscaling": {"smoothing_factor": 0.5, "upscale_smoothing_factor": 0.8},
        "stabilize": {"ema_weight": 1.0, "max_step_up_ratio": 2.0, "min_step_down_ratio": None},
    }
    text = operator_view.explain_text(decision, {"config": config})
    assert (
        "Ray's upscaling_factor / downscaling_factor (0.80/0.50) scaled the step from 4 "
        "(a gain on the delta, as in Ray)." in text
    )
    assert (
        "stabilize.max_step_up_ratio / min_step_down_ratio (2.00/-) capped the step from 4." in text
    )
    assert "  smoothed                    -  stabilize.ema_weight 1.00\n" in text
    assert "Ray's factors (0.80/0.50) and step caps" in text


def test_explain_of_a_stale_ray_compatible_decision_shows_dashes() -> None:
    decision = {
        "deployment": "a/b",
        "decided_at_s": 12.0,
        "target_replicas": 2,
        "previous_replicas": 3,
        "reasons": ["ray_compatible", "stale_data", "surprise"],
        "replica_model": {},
        "gpu_replicas": [{"replica": "r1", "gpu": "GPU-1", "state": "degraded", "reason": ""}],
    }
    text = operator_view.explain_text(decision, None, (), 20.0)
    assert text.startswith("a/b: 3 -> 2 replicas, decided at t=12.0s (8s ago)")
    assert "  observed (look-back mean)   -\n" in text
    assert "  estimates                   none (not used by this mode)" in text
    assert "  GPUs not healthy            GPU-1 on r1: degraded" in text
    assert "  held or clipped by          stale_data" in text
    assert f"  surprise        {operator_view._UNKNOWN_REASON}" in text


def test_the_lines_confirming_an_operator_change() -> None:
    at_s = 1_700_000_000.0
    operator = {
        "action": "pause",
        "by": "bob",
        "reason": "freeze",
        "since_s": at_s,
        "until_s": None,
    }
    answer = {
        "deployment": NAME,
        "operator": operator,
        "recorded": {"action": "pause", "at_s": at_s},
    }
    assert operator_view.change_text(answer) == (
        f"{NAME}: paused by bob since {iso(at_s)} (now), until resumed: freeze"
    )
    operator = {**operator, "action": "override", "replicas": 16, "until_s": at_s + 3600}
    answer = {**answer, "operator": operator}
    assert operator_view.change_text(answer, requested=50) == (
        f"{NAME}: override 16 replicas by bob since {iso(at_s)} (now), until "
        f"{iso(at_s + 3600)} (in 1h 0m): freeze (asked 50, clipped to the bounds)"
    )
    resumed = {"deployment": NAME, "recorded": {"action": "resume", "by": "bob", "reason": "ok"}}
    assert operator_view.change_text(resumed) == f"{NAME}: resumed by bob: ok"


@pytest.mark.parametrize(
    ("text", "at_s"),
    [
        ("1700000000.5", 1700000000.5),
        ("2023-11-14T22:13:20Z", 1700000000.0),
        ("2023-11-14T22:13:20", 1700000000.0),  # UTC unless it says otherwise
        ("2023-11-15T00:13:20+02:00", 1700000000.0),
    ],
)
def test_explain_at_takes_seconds_or_iso_8601(text: str, at_s: float) -> None:
    assert parse_time(text) == at_s


# ---------------------------------------------------------------- against the daemon


def autoscalerd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [autoscalerd_bin(), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr, result.stderr
    if result.returncode != 0:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result


def test_the_commands_against_the_real_daemon(tmp_path: Path, cli_env: dict[str, str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", [(900, 36.0)])
    port = free_port()
    config = write_config(tmp_path / "config.yaml", trace, port, tmp_path / "state.json")
    env = {k: v for k, v in cli_env.items() if k not in ("AUTOSCALERD_URL", "AUTOSCALERD_TOKEN")}
    daemon = Daemon(config, port, {**env, TOKEN_ENV: TOKEN}, speed=2)
    url = f"http://127.0.0.1:{port}"
    # The operator's shell: the token in the environment, a login name of its own.
    shell = {**env, "AUTOSCALERD_TOKEN": TOKEN, "AUTOSCALERD_URL": url, "LOGNAME": "carol"}
    try:
        daemon.wait_http("/readyz")
        daemon.wait_until(
            lambda: (
                daemon.get("/v1/status")[1]["deployments"][SERVICE_NAME]["target_replicas"] == 5
            ),
            "5 replicas",
        )

        shown = autoscalerd("status", env=shell)
        assert shown.returncode == 0, shown.stderr
        [row] = [line for line in shown.stdout.splitlines() if line.startswith(SERVICE_NAME)]
        assert row.split()[3:5] == ["5", "5"] and "capacity" in row
        as_json = json.loads(autoscalerd("status", SERVICE_NAME, "--json", env=shell).stdout)
        assert as_json["target_replicas"] == 5

        explained = autoscalerd("explain", SERVICE_NAME, env=shell)
        assert explained.returncode == 0, explained.stderr
        assert "1. rates" in explained.stdout and "\nreasons\n  capacity" in explained.stdout

        def decisions() -> list[dict[str, Any]]:
            listed: list[dict[str, Any]] = daemon.get(
                f"/v1/decisions?deployment={SERVICE_NAME}&limit=1000"
            )[1]["decisions"]
            return listed

        # The third decision, one at 5 that changed nothing: the commands above can all
        # answer before the daemon's third tick.
        daemon.wait_until(lambda: len(decisions()) >= 3, "three decisions")
        first = decisions()[2]
        # Half a tick after it, as ISO-8601: the decision at or before.
        at = datetime.fromtimestamp(first["decided_at_s"] + 0.5, tz=timezone.utc).isoformat()
        past = autoscalerd("explain", SERVICE_NAME, "--at", at, "--json", env=shell)
        assert past.returncode == 0 and json.loads(past.stdout) == first
        past = autoscalerd("explain", SERVICE_NAME, "--at", str(first["decided_at_s"]), env=shell)
        assert past.stdout.startswith(f"{SERVICE_NAME}: 5 replicas, unchanged, decided at ")
        too_early = autoscalerd("explain", SERVICE_NAME, "--at", "1000", env=shell)
        assert too_early.returncode == 1
        assert "no decision for llm/chat at or before t=1000.0s" in too_early.stderr

        paused = autoscalerd(
            "pause", SERVICE_NAME, "--reason", "incident 4711", "--by", "alice", "--ttl-s", "600",
            env=shell,
        )  # fmt: skip
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith(f"{SERVICE_NAME}: paused by alice since ")
        assert paused.stdout.rstrip().endswith("(in 10m 0s): incident 4711")
        operator = daemon.get("/v1/status")[1]["deployments"][SERVICE_NAME]["operator"]
        assert operator["action"] == "pause" and operator["by"] == "alice"
        assert operator["reason"] == "incident 4711"
        assert operator["until_s"] == operator["since_s"] + 600
        [event] = daemon.find("operator_pause")
        assert (event["deployment"], event["by"], event["reason"], event["until_s"]) == (
            SERVICE_NAME,
            "alice",
            "incident 4711",
            operator["until_s"],
        )

        # No --by: the login name; no --ttl-s: the daemon's default of an hour.
        pinned = autoscalerd("override", SERVICE_NAME, "3", "--reason", "load test", env=shell)
        assert pinned.returncode == 0, pinned.stderr
        assert f"{SERVICE_NAME}: override 3 replicas by carol" in pinned.stdout
        operator = daemon.get("/v1/status")[1]["deployments"][SERVICE_NAME]["operator"]
        assert operator["by"] == "carol" and operator["until_s"] == operator["since_s"] + 3600
        daemon.wait_until(
            lambda: (
                daemon.get("/v1/status")[1]["deployments"][SERVICE_NAME]["target_replicas"] == 3
            ),
            "the override applied",
        )
        explained = autoscalerd("explain", SERVICE_NAME, env=shell)
        assert "  in force                    " in explained.stdout
        assert "override 3 by carol until" in explained.stdout

        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        no_token = {k: v for k, v in shell.items() if k != "AUTOSCALERD_TOKEN"}
        resumed = autoscalerd(
            "resume", SERVICE_NAME, "--reason", "done", "--token-file", str(token_file),
            env=no_token,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout == f"{SERVICE_NAME}: resumed by carol: done\n"
        chat = daemon.get("/v1/status")[1]["deployments"][SERVICE_NAME]
        assert chat["operator"] is None and chat["paused"] is False
        assert [(a["action"], a["by"], a["reason"]) for a in chat["operator_history"]] == [
            ("pause", "alice", "incident 4711"),
            ("override", "carol", "load test"),
            ("resume", "carol", "done"),
        ]
        listed = autoscalerd("status", SERVICE_NAME, env=shell).stdout
        assert listed.count(" by carol") == 2 and "pause by alice until " in listed

        # Usage: exit 2, nothing sent.
        for args in (
            ("pause", SERVICE_NAME),  # no --reason
            ("override", SERVICE_NAME, "-1", "--reason", "x"),
            ("override", SERVICE_NAME, "three", "--reason", "x"),
            ("explain", SERVICE_NAME, "--at", "yesterday"),
            ("status", "--url", "localhost:8270"),
            ("status", "--token-file", str(tmp_path / "missing")),
        ):
            usage = autoscalerd(*args, env=shell)
            assert usage.returncode == 2, (args, usage.stderr)
            assert usage.stderr.startswith("autoscalerd: "), usage.stderr
        assert (
            len(daemon.get("/v1/status")[1]["deployments"][SERVICE_NAME]["operator_history"]) == 3
        )

        # The daemon says no, or is not there: exit 1, one line naming the URL and a fix.
        wrong = autoscalerd(
            "pause", SERVICE_NAME, "--reason", "x", env={**shell, "AUTOSCALERD_TOKEN": "wrong"}
        )
        assert wrong.returncode == 1
        assert wrong.stderr == (
            f"autoscalerd: {url}/v1/deployments/{SERVICE_NAME}/pause: HTTP 403: wrong token; "
            "check the token in $AUTOSCALERD_TOKEN or --token-file\n"
        )
        unmanaged = autoscalerd("explain", "llm/other", env=shell)
        assert unmanaged.returncode == 1
        assert f"deployment 'llm/other' is not managed; managed: {SERVICE_NAME}" in unmanaged.stderr
        closed = free_port()
        unreachable = autoscalerd("status", "--url", f"http://127.0.0.1:{closed}", env=shell)
        assert unreachable.returncode == 1
        assert unreachable.stderr.startswith(
            f"autoscalerd: http://127.0.0.1:{closed}/v1/status: cannot connect"
        )
        assert "; is autoscalerd running" in unreachable.stderr

        code, _ = daemon.stop()
    finally:
        daemon.close()
    assert code == 0, daemon.stderr
    assert TOKEN not in json.dumps(daemon.events)
