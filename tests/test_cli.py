"""The CLI as a user runs it: the real console script in a subprocess."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, autoscalerd_bin


def run_cli(
    *args: str, env: dict[str, str], cwd: Path = REPO, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [autoscalerd_bin(), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_version(cli_env: dict[str, str]) -> None:
    result = run_cli("--version", env=cli_env)
    assert result.returncode == 0
    assert result.stdout.startswith("autoscalerd ")


@pytest.mark.parametrize("name", ["replay.yaml", "example.yaml"])
def test_check_config_accepts_the_shipped_examples(name: str, cli_env: dict[str, str]) -> None:
    result = run_cli("check-config", f"config/{name}", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert ": ok" in result.stdout


def test_check_config_warns_of_ray_factors_above_one_in_autoscalerds_mode(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # Ray's gain on the delta overshoots the sizing above 1; a config written when the
    # factors were step caps learns where the caps went. Ray-compatible mode: Ray's own.
    path = tmp_path / "factors.yaml"
    body = (
        "deployments:\n"
        "  - name: a/b\n"
        "    {mode}autoscaling_config: {{min_replicas: 1, max_replicas: 8,"
        " upscaling_factor: 2, smoothing_factor: 0.5}}\n"
    )
    path.write_text(body.format(mode=""))
    result = run_cli("check-config", str(path), env=cli_env)
    assert result.returncode == 0 and ": ok" in result.stdout
    assert result.stderr.count("warning") == 1, result.stderr
    assert (
        f"{path}: warning: deployments[0].autoscaling_config: the scaling factor up is 2, "
        "Ray's gain on the delta" in result.stderr
    )
    assert "stabilize.max_step_up_ratio" in result.stderr
    path.write_text(body.format(mode="mode: ray-compatible\n    "))
    result = run_cli("check-config", str(path), env=cli_env)
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


BAD_CONFIGS = {
    "ray_custom_policy": (
        "deployments:\n  - name: a/b\n    autoscaling_config:\n"
        "      policy: {policy_function: 'my.module:policy'}\n",
        [
            "deployments[0].autoscaling_config.policy: Ray's custom autoscaling policy does "
            "not run in autoscalerd; remove it"
        ],
    ),
    "pasted_typo": (
        "deployments:\n  - name: a/b\n    autoscaling_config:\n      upscale_delay: 3\n",
        [
            "deployments[0].autoscaling_config.upscale_delay: unknown key; "
            "did you mean 'upscale_delay_s'?"
        ],
    ),
    "aggregation": (
        "deployments:\n  - name: a/b\n    autoscaling_config:\n"
        "      aggregation_function: median\n",
        [
            "deployments[0].autoscaling_config.aggregation_function: input should be "
            "'mean', 'max' or 'min' (got 'median')"
        ],
    ),
    "bounds": (
        "deployments:\n  - name: a/b\n    autoscaling:\n      min_replicas: 4\n      max_replicas: 2\n",
        ["deployments[0].autoscaling.max_replicas: must be >= min_replicas (4)"],
    ),
    "syntax": (
        "tick_s: 1\ndeployments:\n  - name: a\n   bad: [\n",
        [":4:", "YAML syntax error"],
    ),
    "unknown_key": (
        "deployments:\n  - name: a/b\n    autoscaling:\n      target_ongoing_request: 3\n",
        [
            "deployments[0].autoscaling.target_ongoing_request: unknown key; did you mean 'target_ongoing_requests'?"
        ],
    ),
    "range": (
        "defaults:\n  capacity:\n    target_utilization: 1.5\n",
        ["defaults.capacity.target_utilization: input should be less than or equal to 1 (got 1.5)"],
    ),
    "type": ("tick_s: fast\n", ["tick_s: input should be a valid number"]),
    "plugin": (
        "actuators:\n  - type: ray_servve\n",
        ["actuators[0].type: unknown plugin 'ray_servve'"],
    ),
    "top_level": ("- a\n- b\n", ["top level must be a mapping"]),
    "duplicate": (
        "deployments:\n  - name: a/b\n  - name: a/b\n",
        ["deployment 'a/b' is listed twice"],
    ),
    "deep": ("tick_s: " + "[" * 5000 + "\n", ["nested too deeply"]),
    "deep_flow": ("deployments: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", ["nested too deeply"]),
    "inf_tick": ("tick_s: 1e400\n", ["tick_s: input should be a finite number"]),
    "inf_age": (
        "defaults:\n  max_metric_age_s: .inf\n",
        ["max_metric_age_s: input should be a finite number"],
    ),
    "nan": (
        "defaults:\n  capacity:\n    cold_start_s: .nan\n",
        ["cold_start_s: input should be a finite number"],
    ),
    "plugin_inf": (
        "sensors:\n  - type: ray_serve\n    metrics_interval_s: .inf\n",
        ["metrics_interval_s: input should be a finite number"],
    ),
    "plugin_typo": (
        "sensors:\n  - type: ray_serve\n    metrics_intervl_s: 2\n",
        ["sensors[0].metrics_intervl_s: unknown setting; did you mean 'metrics_interval_s'?"],
    ),
    "empty": ("", ["empty"]),
    "comments_only": ("# nothing here\n", ["empty"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_check_config_rejects_bad_files_with_one_line_each(
    case: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    text, expected = BAD_CONFIGS[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = run_cli("check-config", str(path), env=cli_env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith(f"autoscalerd: {path}") for line in lines), lines
    for fragment in expected:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_check_config_reports_every_problem(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tick_s: -1\nsensorz: []\ndefaults:\n  max_metric_age_s: 0\n")
    result = run_cli("check-config", str(path), env=cli_env)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 3, result.stderr
    assert "did you mean 'sensors'?" in result.stderr


def test_missing_file_and_usage_errors_exit_2(cli_env: dict[str, str]) -> None:
    missing = run_cli("check-config", "no/such.yaml", env=cli_env)
    assert missing.returncode == 2
    assert (
        missing.stderr.strip()
        == "autoscalerd: no/such.yaml: no such file; pass the path of a YAML config"
    )
    usage = run_cli("run", env=cli_env)
    assert usage.returncode == 2
    assert "--config" in usage.stderr and "Traceback" not in usage.stderr
    bad_speed = run_cli("run", "--config", "config/replay.yaml", "--speed", "-3", env=cli_env)
    assert bad_speed.returncode == 2


def test_bad_trace_path_is_a_config_error(tmp_path: Path, cli_env: dict[str, str]) -> None:
    config = (
        (REPO / "config/replay.yaml")
        .read_text()
        .replace("data/traces/azure_llm_2023_code.csv", str(tmp_path / "gone.csv"))
    )
    path = tmp_path / "replay.yaml"
    path.write_text(config)
    result = run_cli("run", "--dry-run", "--config", str(path), env=cli_env)
    assert result.returncode == 2
    assert "sensors[0]: path: cannot open trace" in result.stderr
    assert "Traceback" not in result.stderr


def test_dry_run_replays_the_whole_trace_and_logs_one_json_decision_per_change(
    cli_env: dict[str, str],
) -> None:
    result = run_cli(
        "run", "--dry-run", "--config", "config/replay.yaml", env=cli_env, timeout_s=300
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    decisions = [e for e in events if e["event"] == "decision"]
    assert len(decisions) >= 2
    for decision in decisions:
        assert decision["target"] != decision["previous"]
        assert decision["dry_run"] is True
        assert decision["reasons"] and decision["deployment"] == "llm/code-completion"
        assert "replicas_raw" in decision and "arrival_rate_target_per_s" in decision
    stopped = events[-1]
    assert stopped["event"] == "stopped" and stopped["finished"] is True
    # 57 minutes of trace at a 1 s tick.
    assert 3300 <= stopped["ticks"] <= 3500
    ups = [d for d in decisions if d["target"] > d["previous"]]
    downs = [d for d in decisions if d["target"] < d["previous"]]
    assert ups and downs


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_the_loop_cleanly(signum: int, cli_env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [autoscalerd_bin(), "run", "--dry-run", "--config", "config/replay.yaml", "--speed", "1"],
        cwd=REPO,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert json.loads(first)["event"] == "started"
        time.sleep(1.5)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert '"event": "stopped"' in out
    assert "Traceback" not in err


# ---------------------------------------------------------------- the console log


def console_run(tmp_path: Path, env: dict[str, str], *, tty: bool) -> tuple[int, str]:
    """`autoscalerd run --dry-run --log-format console` over a two-minute trace, its
    stdout a terminal (a pseudo-terminal) or a pipe."""
    import os
    import pty

    from tests.test_service import write_trace

    trace = write_trace(tmp_path / "trace.csv", [(60, 2.0), (60, 40.0)])
    config = tmp_path / "config.yaml"
    config.write_text(
        "discovery: {enabled: false}\nhttp: {enabled: false}\n"
        f"sensors:\n  - type: replay\n    path: {trace}\n    deployment: llm/chat\n"
        "deployments:\n  - name: llm/chat\n    autoscaling: {upscale_delay_s: 0}\n"
    )
    args = [autoscalerd_bin(), "run", "--dry-run", "--config", str(config)]
    args += ["--log-format", "console"]
    if not tty:
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        return result.returncode, result.stdout
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(args, env=env, stdout=secondary, stderr=subprocess.DEVNULL)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the process ended and closed its side
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    return proc.wait(timeout=60), b"".join(chunks).decode()


@pytest.mark.parametrize(
    ("tty", "no_color", "coloured"),
    [(True, None, True), (True, "1", False), (True, "", True), (False, None, False)],
)
def test_console_colour_only_on_a_terminal_and_never_under_no_color(
    tty: bool, no_color: str | None, coloured: bool, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    env = {k: v for k, v in cli_env.items() if k not in ("NO_COLOR", "TERM")}
    env["TERM"] = "xterm"
    if no_color is not None:
        env["NO_COLOR"] = no_color  # https://no-color.org: any non-empty value disables it
    code, out = console_run(tmp_path, env, tty=tty)
    assert code == 0, out
    assert "decision" in out
    assert ("\x1b[" in out) is coloured, out[:500]


def test_a_console_decision_line_leads_with_the_deployment_and_target(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    code, out = console_run(tmp_path, cli_env, tty=False)
    assert code == 0, out
    decisions = [line for line in out.splitlines() if " decision " in line]
    assert decisions, out
    for line in decisions:
        _, _, rest = line.partition("] [autoscalerd.loop] decision llm/chat ")
        assert rest, line
        # target first, then previous and the reasons, then the rest.
        assert re.match(r"target=\d+ previous=\d+ reasons=\[", rest), line
        assert "dry_run=True" in rest and "deployment=" not in rest
