"""Logging: structlog events, JSON lines for machines (journald, containers), console for people."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    """JSON when `stream` is not a TTY, unless told otherwise."""
    stream = stream or sys.stdout
    if json is None:
        json = not stream.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if json
        else structlog.dev.ConsoleRenderer(colors=True)
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


def get(name: str = "autoscalerd") -> Any:
    """A logger whose every event carries `logger=name` (the module or plugin it is from):
    bind further context (`.bind(deployment=...)`) once, where it is known."""
    return structlog.get_logger().bind(logger=name)
