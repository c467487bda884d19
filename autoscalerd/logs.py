"""Logging: structlog events, JSON lines for machines (journald, containers), console for people.

A console line leads with what an operator looks for: the logger, the event, the
deployment, then the decision's target, previous count and reasons, then the rest in the
order the call site gave them. Colour only on a terminal and never under NO_COLOR
(https://no-color.org: any non-empty value) or TERM=dumb.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

# structlog imports rich when it is installed, for its tracebacks: rich is the backtest's
# and the demo's, one of the modules the daemon must not load, and its tracebacks print
# local variables, where a token may be. Hidden while structlog is first imported
# (`import rich` then fails at once), so tracebacks are plain.
if "structlog" in sys.modules or "rich" in sys.modules:
    import structlog
else:
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog
    finally:
        del sys.modules["rich"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# Console keys shown first, after the event, in this order.
_LEADING_KEYS = ("target", "previous", "reasons")


def colour_wanted(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """Colour on a terminal only, and not when NO_COLOR is set to anything or TERM=dumb."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def configure(level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    """JSON when `stream` is not a TTY, unless told otherwise."""
    stream = stream or sys.stdout
    if json is None:
        json = not stream.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if json
        else console_renderer(colour_wanted(stream))
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def console_renderer(colour: bool) -> Any:
    """`2026-01-05T10:00:00Z [info     ] [autoscalerd.loop] decision llm/chat target=5
    previous=3 reasons=['capacity', 'scale_up'] dry_run=False ...`: the deployment as a
    bare value, the leading keys next, the others in the call's order."""
    dev = structlog.dev
    styles = dev.ConsoleRenderer.get_default_column_styles(colour)
    levels = {
        name: style + styles.bright
        for name, style in dev.ConsoleRenderer.get_default_level_styles(colour).items()
    }

    def bare(style: str, prefix: str = "", postfix: str = "") -> Any:
        return dev.KeyValueColumnFormatter(
            None, style, styles.reset, str, prefix=prefix, postfix=postfix
        )

    pair = dev.KeyValueColumnFormatter(styles.kv_key, styles.kv_value, styles.reset, _value)
    columns = [
        dev.Column("timestamp", bare(styles.timestamp)),
        dev.Column("level", dev.LogLevelColumnFormatter(levels, styles.reset)),
        dev.Column("logger", bare(styles.bright + styles.logger_name, prefix="[", postfix="]")),
        dev.Column("event", bare(styles.bright)),
        dev.Column("deployment", bare(styles.bright)),
        *(dev.Column(key, pair) for key in _LEADING_KEYS),
        dev.Column("", pair),
    ]
    return dev.ConsoleRenderer(
        columns=columns, sort_keys=False, exception_formatter=dev.plain_traceback
    )


def _value(value: object) -> str:
    """A value as structlog's console shows it: text bare unless a space, quote, `=` or
    line break in it needs quotes (so that the line stays one line), the rest as repr."""
    if isinstance(value, str) and not set(value) & {" ", "\t", "=", "\r", "\n", '"', "'"}:
        return value
    return repr(value)


def get(name: str = "autoscalerd") -> Any:
    """A logger whose every event carries `logger=name` (the module or plugin it is from):
    bind further context (`.bind(deployment=...)`) once, where it is known."""
    return structlog.get_logger().bind(logger=name)
