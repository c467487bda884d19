"""The `replay` sensor: feeds a request trace to the loop as if it were live traffic.

Reads the Azure LLM request-level CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`) as a
stream, one row at a time; each tick sees the requests that arrived since the last tick.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autoscalerd import logs
from autoscalerd.config import Config, ConfigError
from autoscalerd.model import Observation, Reading
from autoscalerd.sense.base import DeploymentInfo, SenseResult

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_timestamp_s(text: str) -> float:
    """Seconds since the epoch (UTC) of '2023-11-16 18:17:03.9799600' (any fraction digits)."""
    text = text.strip()
    whole, _, fraction = text.partition(".")
    moment = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc)
    seconds = moment.timestamp()
    if fraction:
        if not fraction.isdigit():
            raise ValueError(f"bad fractional seconds {fraction!r}")
        seconds += int(fraction) / 10 ** len(fraction)
    return seconds


class ReplaySensor:
    """Settings: `path` (trace file), `deployment` (name to report under, default 'replay')."""

    name = "replay"

    def __init__(self, settings: Mapping[str, Any], config: Config) -> None:
        unknown = set(settings) - {"path", "deployment"}
        if unknown:
            raise ConfigError(
                [f"unknown setting(s) {sorted(unknown)}; replay takes 'path' and 'deployment'"]
            )
        if "path" not in settings:
            raise ConfigError(["path: required; the trace file to replay"])
        self.path = Path(str(settings["path"]))
        self.deployment = str(settings.get("deployment", "replay"))
        self._log = logs.get("autoscalerd.sensor.replay").bind(path=str(self.path))
        try:
            self._file = self.path.open(newline="", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                [f"path: cannot open trace {self.path} ({exc.strerror}); check the path"]
            ) from None
        self._rows = self._read()
        self._line = 1
        self.malformed_rows = 0
        self.finished = False
        first = next(self._rows, None)
        if first is None:
            raise ConfigError([f"path: {self.path} holds no requests"])
        self.start_s = first[0]
        self._pending: tuple[float, int, int] | None = first
        self._last_s: float | None = None

    def _read(self) -> Iterator[tuple[float, int, int]]:
        reader = csv.reader(self._file)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != AZURE_HEADER:
            raise ConfigError(
                [
                    f"path: {self.path}:1: expected header {','.join(AZURE_HEADER)}, "
                    f"got {header!r}; "
                    "use an Azure LLM request trace (the backtest reads other formats)"
                ]
            )
        for row in reader:
            self._line = reader.line_num
            try:
                at_s = parse_timestamp_s(row[0])
                prompt_tokens, output_tokens = int(row[1]), int(row[2])
                if prompt_tokens < 0 or output_tokens < 0 or not math.isfinite(at_s):
                    raise ValueError("negative token count")
            except (ValueError, IndexError) as exc:
                self.malformed_rows += 1
                self._log.warning(
                    "malformed_row", line=reader.line_num, problem=str(exc), row=row[:3]
                )
                continue
            yield at_s, prompt_tokens, output_tokens

    async def sense(self, now_s: float) -> SenseResult:
        info = {self.deployment: DeploymentInfo(name=self.deployment)}
        if self._last_s is None:
            self._last_s = now_s
            return SenseResult(observations={}, deployments=info)
        interval_s = now_s - self._last_s
        requests = tokens = 0
        while self._pending is not None and self._pending[0] <= now_s:
            requests += 1
            tokens += self._pending[1] + self._pending[2]
            self._pending = next(self._rows, None)
        if self._pending is None and not self.finished:
            self.finished = True
            self._file.close()
        self._last_s = now_s
        if interval_s <= 0:
            return SenseResult(observations={}, deployments=info)
        obs = Observation(
            deployment=self.deployment,
            sensed_at_s=now_s,
            arrival_rate_per_s=Reading(requests / interval_s, now_s),
            token_rate_per_s=Reading(tokens / interval_s, now_s),
        )
        return SenseResult(observations={self.deployment: obs}, deployments=info)

    async def close(self) -> None:
        if not self._file.closed:
            self._file.close()
