"""Restart-safe state: each deployment's DeploymentState and operator settings in one file.

Format: versioned JSON, the dataclasses written field by field (never pickle: a state file
must not be able to run code, and must stay readable across Python versions). Written
atomically (temp file, fsync, rename, fsync of the directory), so a crash leaves the old
file or the new one, never half of one. A file that cannot be used (corrupt, another
version, a field that no longer fits) is moved aside with a warning and the daemon starts
without it.

Restoring keeps what took time to learn: the forecaster (history, fitted model, errors),
the learned replica model, the rate and recommendation windows, the cooldown and
scale-to-zero timers, the last target, and the operator's pause or override with its audit
trail (who, why, since, until). One thing is never kept: `fresh_since_s`, the start of the
current run of fresh data, which is what allows a scale-down (decide() blocks scale-down
until it is a full downscale_delay_s old). However brief the downtime, the platform may
have been scaled meanwhile (by another controller, an operator, a head restart), and the
saved windows describe the world before that: a restored state never lowers the platform's
count before a full downscale window of fresh data, exactly as without a state file. The
platform's current target, when read, wins over the saved one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoscalerd import codec, logs
from autoscalerd.audit import OperatorAction
from autoscalerd.config import Config, DeploymentConfig, StateConfig
from autoscalerd.model import DeploymentState

FORMAT = "autoscalerd-state"
# Bump on any change an older or newer daemon could misread; a mismatch sets the file aside.
# 2: the decision core v2 (replica model, burst shape, SLO guard sums).
FORMAT_VERSION = 2
# A deployment not seen since the start is carried over from the file it came from for this
# long, so that a deployment briefly absent (redeployed) keeps its forecaster.
CARRY_UNSEEN_S = 7 * 24 * 3600.0


# The most replicas a state file may name.
_MAX_COUNT = 100_000


class StateError(ValueError):
    """The state file cannot be used. One line: what is wrong and where."""


@dataclass(frozen=True, slots=True)
class SavedDeployment:
    """One deployment as saved: the policy's state plus what the shell and operator set."""

    saved_at_s: float  # the daemon's clock (trace time under replay)
    state: DeploymentState
    paused: bool = False
    override_replicas: int | None = None
    override_until_s: float | None = None
    applied_replicas: int | None = None  # the last target an actuator confirmed
    # Added within format 2, with defaults, so that files written before still load.
    paused_until_s: float | None = None
    operator_action: OperatorAction | None = None  # who set the pause or override, and why
    operator_history: tuple[OperatorAction, ...] = ()  # the last actions, oldest first


@dataclass(frozen=True, slots=True)
class Snapshot:
    saved_at_s: float  # the daemon's clock
    saved_wall_s: float  # wall time, to place a replay's resume point after a restart
    # None under real time; under replay, the trace's first instant. Times in the file
    # are on that clock, so a file is only used by a daemon on the same one.
    clock_origin_s: float | None = None
    deployments: dict[str, SavedDeployment] = field(default_factory=dict)
    # Deployments left out because their saved state did not fit: name -> problem.
    dropped: dict[str, str] = field(default_factory=dict)

    def same_clock(self, clock_origin_s: float | None) -> bool:
        if self.clock_origin_s is None or clock_origin_s is None:
            return self.clock_origin_s is None and clock_origin_s is None
        return abs(self.clock_origin_s - clock_origin_s) < 1e-6

    def resume_s(self, start_s: float, speed: float | None, wall_now_s: float) -> float:
        """Where a replay restarted from this snapshot resumes: the trace moved on while
        the daemon was down, as traffic would have (`speed` trace seconds per wall second;
        a replay run flat out, speed None, resumes where it stopped)."""
        down_s = max(0.0, wall_now_s - self.saved_wall_s) * (speed or 0.0)
        return max(start_s, self.saved_at_s + down_s)


def resolve_path(cfg: StateConfig, environ: Mapping[str, str] | None = None) -> Path | None:
    """`state.path`, else $STATE_DIRECTORY/state.json (systemd's StateDirectory=), else None."""
    env = os.environ if environ is None else environ
    if cfg.path:
        return Path(cfg.path).expanduser()
    # StateDirectory= may list several directories, colon-separated; the first is ours.
    directory = env.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(directory) / "state.json" if directory else None


# ---------------------------------------------------------------- restore


def restore(
    saved: SavedDeployment,
    now_s: float,
    cfg: DeploymentConfig,
    platform_replicas: int | None = None,
) -> DeploymentState | None:
    """The state to continue from at `now_s`, or None when the saved one cannot be placed in
    time (saved in the future of this clock: another trace, or the clock stepped back).

    `platform_replicas`, when the platform reports its target, wins over the saved target:
    what runs is the truth; the saved target is only what this daemon last asked for.
    """
    gap_s = now_s - saved.saved_at_s
    if not math.isfinite(gap_s) or gap_s < 0:
        return None
    state = saved.state
    brief = gap_s <= cfg.max_metric_age_s
    return state.with_(
        target_replicas=platform_replicas
        if platform_replicas is not None
        else state.target_replicas,
        fresh_since_s=None,
        smoothed_replicas=state.smoothed_replicas if brief else None,
        # The first tick's interval is the sensor's, not the downtime: decide() would
        # otherwise spread this tick's rate over the whole gap in the forecaster.
        last_decided_at_s=None,
    )


# ---------------------------------------------------------------- the file


def encode(snapshot: Snapshot) -> str:
    body = {"format": FORMAT, "version": FORMAT_VERSION, **codec.to_json(snapshot)}
    return json.dumps(body, separators=(",", ":"))


def decode(text: str) -> Snapshot:
    """The snapshot in `text`; StateError when the file as a whole cannot be used. A
    deployment whose saved state does not fit (a field of the wrong type, a number that
    is not finite or out of range) is left out and named in `dropped`: the others keep
    what they learned."""
    try:
        raw = json.loads(text)
    except RecursionError:
        raise StateError("not JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integer too long
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise StateError(f"not JSON ({first})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise StateError("not an autoscalerd state file")
    if raw.get("version") != FORMAT_VERSION:
        raise StateError(
            f"format version {raw.get('version')!r}; this autoscalerd reads {FORMAT_VERSION}"
        )
    body = {k: v for k, v in raw.items() if k not in {"format", "version", "deployments"}}
    saved_raw = raw.get("deployments", {})
    if not isinstance(saved_raw, dict):
        raise StateError("deployments: expected an object")
    try:
        snapshot = codec.from_json(Snapshot, body, "")
    except codec.CodecError as exc:
        raise StateError(str(exc)) from None
    assert isinstance(snapshot, Snapshot)
    kept: dict[str, SavedDeployment] = {}
    dropped: dict[str, str] = {}
    for name, entry in saved_raw.items():
        if not _plain_name(name):
            dropped[ascii(name)] = "not a deployment name (app/deployment, UTF-8, one line)"
            continue
        try:
            saved = codec.from_json(SavedDeployment, entry, f"deployments.{name}")
            _check_ranges(saved, f"deployments.{name}")
        except (codec.CodecError, StateError, RecursionError, OverflowError) as exc:
            dropped[name] = str(exc) if isinstance(exc, ValueError) else type(exc).__name__
            continue
        kept[name] = saved
    return dataclasses.replace(snapshot, deployments=kept, dropped=dropped)


def _plain_name(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: not text any file of ours holds
        return False
    return 0 < len(name) <= 512 and name.isprintable()


def _check_sums(state: DeploymentState, where: str) -> None:
    """The learned sums have the shapes the stages add into, and learned rates are > 0:
    a sum of another length (or a slot count near zero) would make every decision from
    it raise or divide by almost nothing."""
    from autoscalerd.decide import burstiness

    model = state.replica_model
    shapes: list[tuple[str, Any, int | None]] = [
        ("burst.weights", state.burst.weights, burstiness.BINS),
        *(
            (f"burst.clump_weights[{i}]", sums, burstiness.COUNT_BINS)
            for i, sums in enumerate(state.burst.clump_weights)
        ),
        ("guard.fast", state.guard.fast, 2),
        ("guard.slow", state.guard.slow, 2),
        ("guard.calibrating", state.guard.calibrating, 2),
        ("guard.calibrating_fast", state.guard.calibrating_fast, 2),
        ("guard.clumped", state.guard.clumped, 1),
        ("guard.clumped_fast", state.guard.clumped_fast, 1),
        ("replica_model.prefill", model.prefill, 2),
        ("replica_model.tpot", model.tpot, 5),
        ("replica_model.prompt", model.prompt, 2),
        ("replica_model.prompt_sq", model.prompt_sq, 2),
        ("replica_model.output", model.output, 2),
        ("replica_model.little", model.little, 2),
        ("replica_model.stretch", model.stretch, 2),
        (
            "replica_model.prompt_mix",
            model.prompt_mix,
            len(model.prompt_bounds) + 1 if model.prompt_bounds is not None else None,
        ),
    ]
    for name, sums, length in shapes:
        if sums is None:
            continue
        if length is None or len(sums.values) != length:
            raise StateError(f"{where}.state.{name}: {len(sums.values)} values, not {length}")
        if any(v < 0 for v in sums.values) and not name.startswith("replica_model.tpot"):
            raise StateError(f"{where}.state.{name}: a negative sum")
    burst = state.burst
    if len(burst.clump_weights) > len(burstiness.CLUMP_TICKS):
        raise StateError(f"{where}.state.burst.clump_weights: more windows than measured")
    if len(burst.episodes) > len(burstiness.CLUMP_TICKS) or any(
        len(record) > burstiness.EPISODE_GROUPS or not all(map(_episode, record))
        for record in burst.episodes
    ):
        raise StateError(f"{where}.state.burst.episodes: not (first, last, run, gap) sightings")
    if len(burst.recent) > burstiness.CLUMP_TICKS[-1] or any(
        not 0 <= v < math.inf for v in burst.recent
    ):
        raise StateError(f"{where}.state.burst.recent: not recent arrival counts")
    if model.slots is not None and not model.slots >= 1:
        raise StateError(f"{where}.state.replica_model.slots: below one slot")
    bounds = model.prompt_bounds
    if bounds is not None and (list(bounds) != sorted(bounds) or any(b <= 0 for b in bounds)):
        raise StateError(f"{where}.state.replica_model.prompt_bounds: not increasing")


def _episode(episode: tuple[float, ...]) -> bool:
    """(first, last, run start) sightings in order, then the longest gap between runs (not
    negative; absent from a state saved before it was kept)."""
    if len(episode) not in (3, 4):
        return False
    first_s, last_s, run_s = episode[:3]
    return first_s <= run_s <= last_s and (len(episode) == 3 or episode[3] >= 0)


def _check_ranges(saved: SavedDeployment, where: str) -> None:
    state = saved.state
    _check_sums(state, where)
    if not 0 <= state.target_replicas <= _MAX_COUNT:
        raise StateError(f"{where}.state.target_replicas: out of range")
    seen = state.running_seen
    if seen is not None and (
        not 0 <= seen[0] <= _MAX_COUNT or (seen[1] is not None and seen[1] > saved.saved_at_s)
    ):
        raise StateError(f"{where}.state.running_seen: not (running replicas, since) in range")
    if any(len(entry) != 2 or not 0 <= entry[1] <= _MAX_COUNT for entry in state.guard.burnt):
        raise StateError(f"{where}.state.guard.burnt: not (time, replicas) pairs in range")
    for name in ("override_replicas", "applied_replicas"):
        value = getattr(saved, name)
        if value is not None and not 0 <= value <= _MAX_COUNT:
            raise StateError(f"{where}.{name}: out of range")
    actions = [("operator_action", saved.operator_action)] + [
        (f"operator_history[{i}]", action) for i, action in enumerate(saved.operator_history)
    ]
    for path, action in actions:
        replicas = action.replicas if action is not None else None
        if replicas is not None and not 0 <= replicas <= _MAX_COUNT:
            raise StateError(f"{where}.{path}.replicas: out of range")


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text`: a reader (or a crash) sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry is.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load(path: Path) -> Snapshot | None:
    """The saved snapshot; None when there is no file; StateError when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StateError(f"cannot read ({exc})") from None
    return decode(text)


def load_or_set_aside(path: Path) -> Snapshot | None:
    """load(), but an unusable file is renamed `<name>.bad-<UTC time>` and None returned."""
    log = logs.get("autoscalerd.state").bind(path=str(path))
    try:
        snapshot = load(path)
    except StateError as exc:
        aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        try:
            os.replace(path, aside)
        except OSError as move_error:
            log.warning("state_unusable", problem=str(exc), set_aside_failed=str(move_error))
            return None
        log.warning(
            "state_unusable",
            problem=str(exc),
            moved_to=str(aside),
            action="starting without saved state",
        )
        return None
    if snapshot is None:
        log.info("state_absent", action="starting without saved state")
    else:
        for name, problem in snapshot.dropped.items():
            log.warning(
                "state_dropped", deployment=name, problem=problem, action="starting it afresh"
            )
        log.info(
            "state_loaded",
            deployments=sorted(snapshot.deployments),
            saved_at_s=snapshot.saved_at_s,
        )
    return snapshot


# ---------------------------------------------------------------- the daemon's side


class Snapshottable(Protocol):
    """What the state keeper needs of the controller: its state as plain values."""

    @property
    def config(self) -> Config: ...

    def snapshot(self, now_s: float) -> dict[str, SavedDeployment]: ...


def snapshot_of(controller: Snapshottable, now_s: float, clock_origin_s: float | None) -> Snapshot:
    return Snapshot(
        saved_at_s=now_s,
        saved_wall_s=time.time(),
        clock_origin_s=clock_origin_s,
        deployments=controller.snapshot(now_s),
    )


class StateKeeper:
    """The Controller listener that saves every `state.every_ticks` ticks (and on request).

    The snapshot is taken on the event loop, between ticks, so it is consistent; encoding
    and the fsync run in a thread so a slow disk never delays a tick.
    """

    def __init__(
        self,
        path: Path,
        clock_origin_s: float | None = None,
        on_saved: Callable[[bool], None] | None = None,
    ) -> None:
        self.path = path
        self.clock_origin_s = clock_origin_s
        self._on_saved = on_saved
        self._ticks = 0
        self._requested = False
        self._writing: asyncio.Future[None] | None = None
        self._failing = False
        self._log = logs.get("autoscalerd.state").bind(path=str(path))

    def request_save(self) -> None:
        """Save after the next tick (an operator changed something worth keeping)."""
        self._requested = True

    def __call__(self, controller: Snapshottable, report: Any) -> None:
        self._ticks += 1
        due = self._ticks >= controller.config.state.every_ticks
        if not (due or self._requested) or self._writing is not None:
            return
        self._ticks = 0
        self._requested = False
        snapshot = snapshot_of(controller, report.started_at_s, self.clock_origin_s)  # a TickReport
        loop = asyncio.get_running_loop()
        self._writing = loop.run_in_executor(None, self._write, snapshot)
        self._writing.add_done_callback(self._written)

    async def flush(self, controller: Snapshottable, now_s: float) -> bool:
        """At shutdown: wait for a write in flight, then save the final state."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        try:
            self._write(snapshot_of(controller, now_s, self.clock_origin_s))
        except Exception as exc:
            self._saved(False, exc)
            return False
        self._saved(True, None)
        return True

    def _write(self, snapshot: Snapshot) -> None:
        write_atomic(self.path, encode(snapshot))

    def _written(self, future: asyncio.Future[None]) -> None:
        self._writing = None
        if future.cancelled():
            return
        error = future.exception()
        self._saved(error is None, error)

    def _saved(self, ok: bool, error: BaseException | None) -> None:
        if self._on_saved is not None:
            self._on_saved(ok)
        if not ok and not self._failing:
            self._log.error("state_save_failed", error=f"{type(error).__name__}: {error}")
        elif ok and self._failing:
            self._log.info("state_save_recovered")
        self._failing = not ok
