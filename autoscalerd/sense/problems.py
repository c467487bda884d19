"""A sensor's problems in the log: once when one starts or changes, once when it ends.

A sensor polls every tick or two; a dashboard that stays down for an hour must be one
warning and one recovery, not thousands of lines.
"""

from __future__ import annotations

from typing import Any


class ProblemLog:
    def __init__(self, log: Any) -> None:
        """`log`: a bound structlog logger (`autoscalerd.logs.get(...)`)."""
        self._log = log
        self._reported: dict[str, str] = {}

    def report(self, part: str, error: str) -> None:
        """`error` is the problem of `part` now, one line without secrets; "" for none."""
        previous = self._reported.get(part, "")
        if error == previous:
            return
        self._reported[part] = error
        if error:
            self._log.warning("sensor_problem", part=part, error=error)
        else:
            self._log.info("sensor_recovered", part=part)
