"""The plugin contract as a third party meets it.

The example package of README.md's "Writing a sensor or actuator", taken from the README
as it stands, is made visible to the daemon the way `pip install` would (its modules and
a `.dist-info` with entry points, on PYTHONPATH) and drives the real `autoscalerd run`;
a plugin that does not fit the protocol is refused at start-up in one line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, autoscalerd_bin

SECTION = "## Writing a sensor or actuator"
DEPLOYMENT = "thirdparty/app"
tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11's tomllib")


def readme_files() -> dict[str, str]:
    """The files of the README's example, by the name on their first line (`# name`)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    files = {}
    for body in re.findall(r"^```[a-z]*\n(.*?)^```$", section, flags=re.M | re.S):
        first = body.partition("\n")[0]
        named = re.fullmatch(r"# ([\w.-]+\.(?:py|toml|yaml))", first)
        if named:
            files[named.group(1)] = body
    return files


def install(site: Path, pyproject: str, modules: dict[str, str]) -> None:
    """What `pip install` leaves in site-packages, without pip: the modules, and a
    `.dist-info` directory whose METADATA and entry_points.txt come from pyproject.toml."""
    project = tomllib.loads(pyproject)["project"]
    dist = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in points.items()]
        lines.append("")
    (dist / "entry_points.txt").write_text("\n".join(lines))
    for name, text in modules.items():
        (site / name).write_text(text)


def with_path(env: dict[str, str], site: Path) -> dict[str, str]:
    paths = [str(site), *filter(None, [env.get("PYTHONPATH")])]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [autoscalerd_bin(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def events(stdout: str) -> list[dict[str, Any]]:
    found = []
    for line in stdout.splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found


class Example:
    """The README's package installed under `site`, its config in `workdir`."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.files = readme_files()
        assert {"pyproject.toml", "fixed_load.py", "target_file.py", "fixed-load.yaml"} <= set(
            self.files
        ), f"README example incomplete: {sorted(self.files)}"
        self.site = root / "site-packages"
        self.workdir = root / "work"
        self.workdir.mkdir()
        modules = {name: text for name, text in self.files.items() if name.endswith(".py")}
        modules.pop("test_fixed_load.py", None)
        install(self.site, self.files["pyproject.toml"], modules)
        self.config = self.workdir / "fixed-load.yaml"
        self.config.write_text(self.files["fixed-load.yaml"])
        self.plain_env = env
        self.env = with_path(env, self.site)


@pytest.fixture
def example(tmp_path: Path, cli_env: dict[str, str]) -> Example:
    return Example(tmp_path, cli_env)


def test_a_third_party_package_drives_the_real_daemon(example: Example) -> None:
    """Sensor and actuator from a package the core never names: the actuator's file shows
    the target the sensor's load needs, 30 requests in flight at 10 per replica."""
    checked = cli("check-config", str(example.config), env=example.env, cwd=example.workdir)
    assert checked.returncode == 0, checked.stderr
    assert ": ok" in checked.stdout
    # Without the package on the path the same config names unknown plugins: the daemon
    # found them through the entry points and nothing else.
    unseen = cli("check-config", str(example.config), env=example.plain_env, cwd=example.workdir)
    assert unseen.returncode == 2
    assert "sensors[0].type: unknown plugin 'fixed_load'" in unseen.stderr

    targets = example.workdir / "targets.jsonl"
    proc = subprocess.Popen(
        [autoscalerd_bin(), "run", "--config", str(example.config), "--log-format", "json"],
        cwd=example.workdir,
        env=example.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if targets.exists() and '"target_replicas": 3' in targets.read_text():
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate(timeout=10)
        time.sleep(1.5)  # three more ticks with the same target
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    written = [json.loads(line) for line in targets.read_text().splitlines()]
    assert written and written[-1] == {"deployment": DEPLOYMENT, "target_replicas": 3}, written
    # Idempotent: one line per change, never the same target twice in a row.
    assert all(a != b for a, b in pairwise(written)), written
    log = events(stdout)
    started = next(e for e in log if e.get("event") == "started")
    assert started["sensors"] == ["fixed_load"] and started["actuators"] == ["target_file"]
    decisions = [e for e in log if e.get("event") == "decision"]
    assert decisions and decisions[-1]["deployment"] == DEPLOYMENT
    assert decisions[-1]["target"] == 3
    failures = [e for e in log if str(e.get("event", "")).endswith("_failed")]
    assert not failures, failures


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        (
            ("ongoing_requests: 30", "ongoing_request: 30"),
            ["sensors[0].ongoing_request: unknown setting; did you mean 'ongoing_requests'?"],
        ),
        (
            ("ongoing_requests: 30", "ongoing_requests: -1"),
            ["sensors[0].ongoing_requests: input should be greater than or equal to 0 (got -1)"],
        ),
        (
            ("path: targets.jsonl", "paht: targets.jsonl"),
            [
                "actuators[0].path: field required",
                "actuators[0].paht: unknown setting; did you mean 'path'?",
            ],
        ),
    ],
)
def test_check_config_rejects_a_mistake_in_a_third_party_setting(
    example: Example, replace: tuple[str, str], expected: list[str]
) -> None:
    """The plugin's `settings_model` checked without building it: one line per problem."""
    text = example.config.read_text()
    assert replace[0] in text
    bad = example.workdir / "bad.yaml"
    bad.write_text(text.replace(*replace))
    result = cli("check-config", str(bad), env=example.env, cwd=example.workdir)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"autoscalerd: {bad}: {start}"), line


def test_the_readme_unit_test_passes(example: Example, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "Testing one" snippet, run as written against the example sensor."""
    monkeypatch.syspath_prepend(str(example.site))
    namespace: dict[str, Any] = {}
    try:
        exec(compile(example.files["test_fixed_load.py"], "test_fixed_load.py", "exec"), namespace)
        namespace["test_reports_the_fixed_load"]()
    finally:
        sys.modules.pop("fixed_load", None)


BROKEN = '''
from autoscalerd.sense.base import SenseResult


class Quiet:
    """Fits: reports nothing."""

    name = "quiet"

    def __init__(self, settings, config):
        pass

    async def sense(self, now_s):
        return SenseResult({}, {})

    async def close(self):
        return None


class NoClose:
    name = "no_close"

    def __init__(self, settings, config):
        pass

    async def sense(self, now_s):
        return SenseResult({}, {})


class Nameless:
    def __init__(self, settings, config):
        pass

    async def sense(self, now_s):
        return SenseResult({}, {})

    async def close(self):
        return None


class SyncApply:
    name = "sync_apply"

    def __init__(self, settings, context):
        pass

    def apply(self, actuations):
        return []

    async def close(self):
        return None
'''

BROKEN_PYPROJECT = """
[project]
name = "autoscalerd-broken"
version = "0.1.0"

[project.entry-points."autoscalerd.sensors"]
quiet = "broken_plugins:Quiet"
no_close = "broken_plugins:NoClose"
nameless = "broken_plugins:Nameless"

[project.entry-points."autoscalerd.actuators"]
sync_apply = "broken_plugins:SyncApply"
"""


@pytest.mark.parametrize(
    ("sensor", "actuator", "expected", "check_config_sees_it"),
    [
        (
            "no_close",
            "log",
            "sensors[0].type: plugin 'no_close' is not a sensor: it lacks close",
            True,
        ),
        (
            "nameless",
            "log",
            "sensors[0].type: plugin 'nameless' is not a sensor: it lacks name",
            False,
        ),
        (
            "quiet",
            "sync_apply",
            "actuators[0].type: plugin 'sync_apply' is not an actuator: apply must be `async def`",
            True,
        ),
    ],
)
def test_a_plugin_that_does_not_fit_the_protocol_is_a_one_line_config_error(
    tmp_path: Path,
    cli_env: dict[str, str],
    sensor: str,
    actuator: str,
    expected: str,
    check_config_sees_it: bool,
) -> None:
    """Refused when the daemon builds it, exit 2, before any tick; `check-config` sees
    what the class shows (its methods), the rest is seen at start-up."""
    site = tmp_path / "site-packages"
    install(site, BROKEN_PYPROJECT, {"broken_plugins.py": BROKEN})
    env = with_path(cli_env, site)
    config = tmp_path / "broken.yaml"
    config.write_text(
        f"http:\n  enabled: false\nsensors:\n  - type: {sensor}\nactuators:\n  - type: {actuator}\n"
    )
    ran = cli("run", "--config", str(config), env=env, cwd=tmp_path)
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in ran.stderr, lines
    assert expected in lines[0], lines
    assert "README.md: Writing a sensor or actuator" in lines[0]
    assert not any(e.get("event") == "started" for e in events(ran.stdout))

    checked = cli("check-config", str(config), env=env, cwd=tmp_path)
    if check_config_sees_it:
        assert checked.returncode == 2
        assert expected in checked.stderr, checked.stderr
    else:
        assert checked.returncode == 0, checked.stderr
