"""Command line: run | check-config | backtest | demo | version, and the operator's
status | explain | pause | resume | override (operator_cli.py, against the HTTP API).

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad config. Errors are one line on
stderr; a traceback is shown only with AUTOSCALERD_DEBUG=1.

Each command imports what it needs when it runs, so that `--version`, `check-config`,
`run` and the operator commands never load the backtest's and the demo's dependencies
(pandas, matplotlib, rich, Ray; tests/test_packaging.py checks it): the parsers of
`backtest` and `demo` are built only when one of them is the command.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoscalerd import __version__, extras, operator_cli

if TYPE_CHECKING:
    from autoscalerd.config import Config

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

# Commands whose module (parser and implementation) is imported only when it is the
# command: the module, and the help line `autoscalerd --help` shows meanwhile.
_LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "backtest": (
        "autoscalerd.sim.cli",
        "replay a trace through autoscalerd and its peers in a simulated cluster",
    ),
    "demo": (
        "autoscalerd.demo.run",
        "autoscale an embedded local Ray cluster under a real trace, with a report",
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"autoscalerd: {message}; see `{self.prog} --help`\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; `command` (the one being run) gets its full parser even
    when its module is imported lazily (the others get their help line only)."""
    parser = _Parser(
        prog="autoscalerd", description="Predictive, SLO-guarded autoscaler for Ray Serve."
    )
    parser.add_argument("--version", action="version", version=f"autoscalerd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="run the control loop")
    run.add_argument("--config", required=True, metavar="FILE", help="YAML config file")
    run.add_argument(
        "--dry-run", action="store_true", help="decide and record, actuate nothing (shadow mode)"
    )
    run.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        metavar="N",
        help="replay sensors only: N trace seconds per wall second (default: as fast as possible)",
    )
    run.add_argument(
        "--http-addr", metavar="HOST:PORT", help="serve /metrics, /healthz, /v1/... here"
    )
    run.add_argument(
        "--log-format", choices=("json", "console"), help="default: json unless stdout is a TTY"
    )

    check = sub.add_parser("check-config", help="validate a config file (exit 0 valid, 2 invalid)")
    check.add_argument("file", metavar="FILE")

    sub.add_parser("version", help="print the version")

    for name, (_, help_line) in _LAZY_COMMANDS.items():
        if name == command:
            _lazy_module(name).add_parser(sub)
        else:
            sub.add_parser(name, help=help_line)
    operator_cli.add_parsers(sub)
    return parser


def _lazy_module(command: str) -> Any:
    """The module of a lazily imported command; MissingExtra when its extra is not
    installed (checked before the import, which would fail half-way)."""
    if command == "backtest":
        extras.require("backtest")  # its module imports pandas and rich
    import importlib

    return importlib.import_module(_LAZY_COMMANDS[command][0])


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in `argv`: the first word not an option (the top level has
    options without values only: --help, --version)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    try:
        parser = build_parser(command)
    except extras.MissingExtra as exc:
        print(f"autoscalerd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)  # --version and --help exit here, nothing else loaded
    from autoscalerd.config import ConfigError

    try:
        if args.command == "run":
            return _run(args)
        if args.command == "check-config":
            return _check_config(args.file)
        if args.command == "version":
            print(f"autoscalerd {__version__}")
            return EXIT_OK
        if args.command in _LAZY_COMMANDS:
            return int(_lazy_module(args.command).run(args))
        if args.command in operator_cli.COMMANDS:
            return operator_cli.run(args)
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        for line in exc.problems:
            print(f"autoscalerd: {line}", file=sys.stderr)
        return EXIT_USAGE
    except extras.MissingExtra as exc:
        print(f"autoscalerd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        missing = (
            extras.for_missing_module(args.command, exc)
            if isinstance(exc, ModuleNotFoundError)
            else None
        )
        if missing is not None:
            print(f"autoscalerd: {missing}", file=sys.stderr)
            return EXIT_USAGE
        if os.environ.get("AUTOSCALERD_DEBUG"):
            traceback.print_exc()
        print(
            f"autoscalerd: {type(exc).__name__}: {exc} (set AUTOSCALERD_DEBUG=1 for details)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


def bound_warnings(config: Config, path: str) -> list[str]:
    """Ray-compatible deployments whose replica bounds come from Ray's defaults.

    A pasted `autoscaling_config` without max_replicas runs at most one replica, as it did
    in Ray (whose default is 1): legal, and rarely what was meant.
    """
    lines = []
    for index, deployment in enumerate(config.deployments):
        if deployment.mode != "ray-compatible":
            continue
        missing = [
            name
            for name in ("min_replicas", "max_replicas")
            if name not in deployment.autoscaling.model_fields_set
        ]
        if missing:
            lines.append(
                f"{path}: warning: deployments[{index}].autoscaling_config: "
                f"{' and '.join(missing)} not set, so Ray's default applies (min 1, max 1); "
                "set them to the bounds you mean"
            )
    return lines


def factor_warnings(config: Config, path: str) -> list[str]:
    """Deployments in autoscalerd's mode whose Ray scaling factors exceed 1.

    Ray's factors are a gain on the delta: above 1 a step overshoots what the sizing
    asked for (up 2 from 4 toward 6 goes to 8; down 2 from 10 toward 8 goes to 6, below
    the count the SLO needs). Configs written before the factors meant Ray's gain used
    them as step caps, which are `stabilize.max_step_up_ratio` / `min_step_down_ratio`.
    """
    from autoscalerd.decide.stabilize import effective_factors

    lines = []
    for index, deployment in enumerate(config.deployments):
        if deployment.mode != "autoscalerd":
            continue
        up_factor, down_factor = effective_factors(deployment.autoscaling)
        for direction, factor, cap in (
            ("up", up_factor, "stabilize.max_step_up_ratio"),
            ("down", down_factor, "stabilize.min_step_down_ratio"),
        ):
            if factor > 1:
                lines.append(
                    f"{path}: warning: deployments[{index}].autoscaling_config: the scaling "
                    f"factor {direction} is {factor:g}, Ray's gain on the delta, so each step "
                    f"{direction} overshoots what the sizing asks; to cap a step's size use "
                    f"{cap} instead"
                )
    return lines


def _check_config(path: str) -> int:
    from autoscalerd.act import registry
    from autoscalerd.config import ConfigError, load_config

    config = load_config(path)
    # Plugins named in the config must exist, and their settings fit their own schema:
    # a typo there is a config error too.
    problems = [f"{path}: {line}" for line in registry.check_plugins(config)]
    if problems:
        raise ConfigError(problems)
    for line in bound_warnings(config, path) + factor_warnings(config, path):
        print(line, file=sys.stderr)
    names = ", ".join(d.name for d in config.deployments) or "none listed"
    discovery = "on" if config.discovery.enabled else "off"
    print(f"{path}: ok ({len(config.deployments)} deployment(s): {names}; discovery {discovery})")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from autoscalerd import logs
    from autoscalerd.config import ConfigError, HttpConfig, load_config

    config = load_config(args.config)
    if args.http_addr:
        try:
            http = HttpConfig.model_validate({**config.http.model_dump(), "addr": args.http_addr})
        except Exception:
            raise ConfigError(
                [f"--http-addr: must be HOST:PORT, e.g. 127.0.0.1:8270 (got {args.http_addr!r})"]
            ) from None
        config = config.model_copy(update={"http": http})
    logs.configure(
        config.log_level, json={"json": True, "console": False}.get(args.log_format or "")
    )
    return asyncio.run(_serve(config, args))


async def _serve(config: Config, args: argparse.Namespace) -> int:
    import asyncio
    import signal
    import time

    from autoscalerd import logs
    from autoscalerd import state as saved_state
    from autoscalerd.act import registry
    from autoscalerd.act.base import Actuator, ActuatorContext
    from autoscalerd.act.shadow import ShadowActuator
    from autoscalerd.clock import Clock, RealClock, VirtualClock
    from autoscalerd.loop import Controller
    from autoscalerd.metrics import Metrics
    from autoscalerd.notify import Notifier, TickNotifier, keep_watchdog_fed, watchdog_interval_s
    from autoscalerd.sense.base import TraceSensor
    from autoscalerd.server import HealthRule, create_app, start

    log = logs.get("autoscalerd")
    loop = asyncio.get_running_loop()
    # A SIGHUP before the controller exists is kept and applied once it does: the
    # default action would end the process.
    early_reloads: list[bool] = []
    loop.add_signal_handler(signal.SIGHUP, early_reloads.append, True)
    sensors = registry.build_sensors(config)
    # Virtual time when every sensor replays a trace (see sense.base.TraceSensor).
    traces = [s for s in sensors if isinstance(s, TraceSensor)]
    replay = bool(sensors) and len(traces) == len(sensors)
    actuators: list[Actuator]
    if args.dry_run:
        actuators = [ShadowActuator(replaced=[p.type for p in config.actuators])]
    else:
        actuators = registry.build_actuators(config, ActuatorContext(config=config, dry_run=False))
    log.info(
        "started",
        version=__version__,
        config=args.config,
        dry_run=args.dry_run,
        clock="virtual" if replay else "real",
        sensors=[s.name for s in sensors],
        actuators=[a.name for a in actuators],
    )

    # Saved state first: under replay it decides where in the trace the clock resumes.
    origin_s = min(s.start_s for s in traces) if replay else None
    state_path = saved_state.resolve_path(config.state)
    snapshot = saved_state.load_or_set_aside(state_path) if state_path else None
    if state_path is None:
        log.info("state_off", hint="set state.path or $STATE_DIRECTORY to survive restarts")
    if snapshot is not None and not snapshot.same_clock(origin_s):
        log.warning("state_ignored", path=str(state_path), reason="saved on another clock")
        snapshot = None
    clock: Clock = RealClock()
    if origin_s is not None:
        resume_s = snapshot.resume_s(origin_s, args.speed, time.time()) if snapshot else origin_s
        if resume_s > origin_s:
            # A replay's first sense() sets its baseline and the second consumes the
            # trace up to there, so the first tick sees traffic from resume_s on only.
            for sensor in sensors:
                for _ in range(2):
                    await sensor.sense(resume_s)
            log.info("replay_resumed", at_s=resume_s, skipped_s=round(resume_s - origin_s, 3))
        clock = VirtualClock(resume_s, args.speed)
    controller = Controller(
        config, sensors, actuators, clock, inline_refit=replay, dry_run=args.dry_run
    )
    if snapshot is not None:
        controller.restored = dict(snapshot.deployments)

    metrics = Metrics()
    controller.listeners.append(metrics.on_tick)
    controller.refit_listeners.append(metrics.on_refit)
    keeper = None
    if state_path is not None:
        keeper = saved_state.StateKeeper(state_path, origin_s, metrics.on_state_saved)
        controller.listeners.append(keeper)
    notifier = Notifier()
    controller.listeners.append(TickNotifier(notifier))
    health = HealthRule(args.speed if replay else None)
    runner = None
    if config.http.enabled or args.http_addr:  # asking for an address on the command line
        runner = await start(create_app(controller, metrics, health, keeper), config.http.addr)
        log.info("http_listening", addr=config.http.addr)
    watchdog: asyncio.Task[None] | None = None
    interval_s = watchdog_interval_s()
    if interval_s is not None:
        watchdog = asyncio.create_task(
            keep_watchdog_fed(notifier, interval_s, lambda: health.check(controller)[0])
        )

    def stop(signame: str) -> None:
        if not controller.stopping:
            log.info("stopping", signal=signame)
            notifier.stopping(f"stopping on {signame}")
        controller.stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signal.Signals(signum).name)
    loop.add_signal_handler(signal.SIGHUP, _reload, controller, args, metrics, notifier)
    if early_reloads:
        _reload(controller, args, metrics, notifier)
    try:
        await controller.run()
    finally:
        notifier.stopping()
        if watchdog is not None:
            watchdog.cancel()
        if keeper is not None and await keeper.flush(controller, clock.now_s()):
            log.info("state_saved", path=str(state_path))
        if runner is not None:
            await runner.cleanup()
        notifier.close()
    log.info("stopped", ticks=controller.ticks_completed, finished=controller.finished())
    return EXIT_OK


def _reload(controller: Any, args: argparse.Namespace, metrics: Any, notifier: Any) -> None:
    """SIGHUP: re-read the config. Invalid: rejected whole, the running one kept. Valid:
    applied at the next tick; every deployment keeps its state."""
    from autoscalerd import logs
    from autoscalerd.config import ConfigError, load_config

    log = logs.get("autoscalerd")
    notifier.reloading()
    try:
        config = load_config(args.config)
    except Exception as exc:  # whatever the file holds, the running config stays
        problems = exc.problems if isinstance(exc, ConfigError) else [f"{type(exc).__name__}"]
        log.error("reload_rejected", config=args.config, problems=problems, kept="previous")
        metrics.on_reload(False)
        notifier.ready(f"reload rejected: {problems[0]}")
        return
    if args.http_addr:  # validated at start; the command line still wins over the file
        config = config.model_copy(
            update={"http": config.http.model_copy(update={"addr": args.http_addr})}
        )
    old = controller.config
    # These are built once at start; the rest (deployments, policy, http.token) applies live.
    needs_restart = [
        name
        for name, before, after in (
            ("sensors", old.sensors, config.sensors),
            ("actuators", old.actuators, config.actuators),
            ("http.addr", old.http.addr, config.http.addr),
            ("http.enabled", old.http.enabled, config.http.enabled),
            ("state.path", old.state.path, config.state.path),
            ("cluster", old.cluster, config.cluster),
        )
        if before != after
    ]
    if config.log_level != old.log_level:
        logs.configure(
            config.log_level, json={"json": True, "console": False}.get(args.log_format or "")
        )
    controller.stage_reload(config)
    metrics.on_reload(True)
    log.info("reloaded", config=args.config, needs_restart=needs_restart)
    if needs_restart:
        log.warning(
            "reload_needs_restart",
            settings=needs_restart,
            hint="these keep their old values until autoscalerd restarts "
            "(systemctl restart autoscalerd)",
        )
    notifier.ready("reloaded")
