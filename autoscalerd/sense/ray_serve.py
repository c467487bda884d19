"""The `ray_serve` sensor: Serve's REST API for replicas, the nodes' Prometheus for load.

A poller runs beside the loop: every tick it reads `GET /api/serve/applications/`, every
`metrics_interval_s` it scrapes every alive node's metrics port (found through
`GET /nodes?view=summary`, refreshed every `nodes_refresh_s` and whenever a replica lands
on a node not yet scraped). `sense()` answers at once from what the poller last fetched,
so a slow dashboard makes readings older (each Reading's `at_s` is when its value was
fetched) instead of making the loop wait.

When the dashboard does not answer, every field is unknown and `error` says why: without
the platform's view a load reading cannot be trusted to mean "no traffic".
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autoscalerd import logs
from autoscalerd.config import Config, plugin_settings
from autoscalerd.dashboard import DashboardError
from autoscalerd.decide.gpu_health import GpuReading
from autoscalerd.model import Observation
from autoscalerd.sense import gpu_series
from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.background import Rounds
from autoscalerd.sense.base import SenseResult
from autoscalerd.sense.problems import ProblemLog
from autoscalerd.sense.prometheus import MetricsParseError, parse
from autoscalerd.sense.serve_api import (
    MetricsTarget,
    ServeDeployment,
    ServeState,
    ShapeError,
    parse_metrics_targets,
    parse_service_discovery,
)
from autoscalerd.sense.serve_platform import ServePlatform, dashboard_client
from autoscalerd.sense.serve_readings import (
    Windows,
    load_fields,
    platform_fields,
)

_FAMILIES = sm.FAMILY_NAMES | gpu_series.GPU_FAMILIES
NODES_PATH = "/nodes?view=summary"


class RayServeSettings(BaseModel):
    """The sensor's own settings (cluster address and token live in `cluster`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Ray exports metrics every 10 s by default (RAY_metrics_report_interval_ms); scraping
    # much faster than that only re-reads the same values.
    metrics_interval_s: float = Field(2.0, gt=0)
    # Arrival and completion rates are averaged over this window; keep it at least as long
    # as Ray's export interval, or rates alternate between zero and bursts.
    rate_window_s: float = Field(15.0, gt=0)
    nodes_refresh_s: float = Field(30.0, gt=0)
    max_concurrency: int = Field(8, ge=1)
    # Scrape every alive node's metrics port; off: only cluster.metrics_urls.
    scrape_nodes: bool = True
    # Fallback when the dashboard's node list is unavailable (readable on the head only).
    service_discovery_file: str | None = "/tmp/ray/prom_metrics_service_discovery.json"


def _settings(settings: Mapping[str, Any]) -> RayServeSettings:
    return plugin_settings(RayServeSettings, settings)


class RayServeSensor:
    name = "ray_serve"
    settings_model = RayServeSettings

    def __init__(
        self,
        settings: Mapping[str, Any],
        config: Config,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = _settings(settings)
        self._config = config
        self._cluster = config.cluster
        self._wall = wall_clock
        self._client = dashboard_client(self._cluster, self.settings.max_concurrency)
        keep_s = max(
            self.settings.rate_window_s,
            config.defaults.autoscaling.look_back_period_s,
            *(d.autoscaling.look_back_period_s for d in config.deployments),
        )
        self._book = sm.MetricsBook(
            keep_s=keep_s + 2 * self.settings.metrics_interval_s,
            gap_s=max(5.0, 3 * self.settings.metrics_interval_s),
        )
        self._problems = ProblemLog(
            logs.get("autoscalerd.sensor.ray_serve").bind(dashboard=self._cluster.dashboard_url)
        )
        # What the poller last fetched.
        self._platform = ServePlatform(
            self._client, self._cluster.dashboard_url, self.name, self._wall, self._problems
        )
        self._metrics_error: str | None = None
        self._targets: list[MetricsTarget] = []
        self._targets_at_s: float | None = None
        self._last_success_s: dict[str, float] = {}
        # The GPUs each endpoint's last scrape described (Ray's node series, DCGM).
        self._gpus: dict[str, list[GpuReading]] = {}
        self._gpu_track = gpu_series.GpuTrack()
        # url -> the book's round count after the last round it answered cleanly in.
        self._answered_last_round: dict[str, int] = {}
        self._last_scrape_s: float | None = None
        self._rounds = Rounds.every_tick(
            "ray_serve-poller", config.tick_s, self.poll_once, self._platform.failed
        )
        self.rounds = 0

    # ------------------------------------------------------------------ Sensor protocol

    async def sense(self, now_s: float) -> SenseResult:
        try:
            await self._rounds.ready()
            return self._result()
        except Exception as exc:  # a sensor never raises into the loop
            return SenseResult({}, {}, error=f"ray_serve sensor: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        await self._rounds.close()
        await self._client.close()

    # ------------------------------------------------------------------ the poller

    async def poll_once(self) -> None:
        """One round: the applications, the node list when due, the metrics when due."""
        now_s = self._wall()
        scrape = (
            self._last_scrape_s is None
            or now_s - self._last_scrape_s >= self.settings.metrics_interval_s
        )
        if self._targets_at_s is None and not self._targets:
            # Nothing to scrape yet: learn the endpoints first, so this round has metrics.
            self._use_targets(await self._fetch_targets())
        refresh = self._targets_due(now_s)
        apps_task = asyncio.ensure_future(self._platform.fetch())
        nodes_task = asyncio.ensure_future(self._fetch_targets()) if refresh else None
        scrape_task = asyncio.ensure_future(self._scrape(list(self._targets))) if scrape else None
        pending = [t for t in (apps_task, nodes_task, scrape_task) if t is not None]
        await asyncio.gather(*pending, return_exceptions=True)
        if nodes_task is not None:
            self._use_targets(nodes_task.result())

        state = self._platform.keep(apps_task.result())
        if state is None:
            # Scrapes are not ingested: without the platform's view they cannot be
            # attributed, and skipping them makes the windows restart after the outage.
            return
        if scrape_task is not None:
            self._ingest(state, scrape_task.result())
            self._last_scrape_s = now_s
        self.rounds += 1

    def _use_targets(self, found: list[MetricsTarget] | None) -> None:
        if found is None:
            return
        self._targets = found
        self._targets_at_s = self._wall()
        self._book.keep_targets(t.url for t in found)

    def _targets_due(self, now_s: float) -> bool:
        if self._targets_at_s is None:
            return True
        if now_s - self._targets_at_s >= self.settings.nodes_refresh_s:
            return True
        # A replica on a node we do not scrape yet: a node just joined.
        if self._platform.state is not None and self.settings.scrape_nodes:
            scraped = {t.node_id for t in self._targets}
            for dep in self._platform.state.deployments.values():
                if not dep.node_ids <= scraped:
                    return now_s - self._targets_at_s >= self.settings.metrics_interval_s
        return False

    async def _fetch_targets(self) -> list[MetricsTarget] | None:
        extra = [MetricsTarget("", url) for url in self._cluster.metrics_urls]
        if not self.settings.scrape_nodes:
            return extra
        try:
            nodes = parse_metrics_targets(await self._client.get_json(NODES_PATH))
            return nodes + extra
        except (DashboardError, ShapeError) as exc:
            from_file = self._service_discovery()
            if from_file is not None:
                return from_file + extra
            self._problems.report("nodes", f"cannot list nodes' metrics ports: {exc}")
            return None

    def _service_discovery(self) -> list[MetricsTarget] | None:
        path = self.settings.service_discovery_file
        if not path:
            return None
        try:
            return parse_service_discovery(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            return None

    async def _scrape(self, targets: list[MetricsTarget]) -> dict[str, tuple[float, str] | str]:
        async def one(target: MetricsTarget) -> tuple[float, str] | str:
            try:
                text = await self._client.get_text(target.url)
                return self._wall(), text
            except DashboardError as exc:
                return str(exc)

        answers = await asyncio.gather(*(one(t) for t in targets))
        return {t.url: answer for t, answer in zip(targets, answers, strict=True)}

    def _ingest(self, state: ServeState, answers: Mapping[str, tuple[float, str] | str]) -> None:
        attribution = sm.Attribution(state)
        failures: list[str] = []
        # Failed endpoints of nodes that run none of the replicas: a node the Ray
        # autoscaler is removing. What it did not say hid no Serve traffic, so the round
        # is not partial for it (the head's and extra endpoints always count).
        harmless = 0
        latest_s: float | None = None
        serving_nodes = {n for dep in state.deployments.values() for n in dep.node_ids}
        node_of = {t.url: t.node_id for t in self._targets}
        for url, answer in answers.items():
            if isinstance(answer, str):
                failures.append(answer)
                node = node_of.get(url, "")
                if node and node not in serving_nodes and not self._head_like(url):
                    harmless += 1
                self._book.forget_gauges(url)  # its last values are not what runs now
                self._gpus.pop(url, None)
                continue
            fetched_at_s, text = answer
            try:
                samples = parse(text, _FAMILIES)
            except MetricsParseError as exc:
                failures.append(f"{url}: not Prometheus text ({exc})")
                self._book.forget_gauges(url)
                self._gpus.pop(url, None)
                continue
            self._gpus[url] = self._gpu_track.update(
                gpu_series.readings_from(samples, url, fetched_at_s)
            )
            previous_s = self._last_success_s.get(url)
            # Growth counts only for endpoints watched without a gap: answered in the
            # previous round too. One that missed a round (down, garbage) starts again
            # from its current values, or what it counted meanwhile would read as a burst
            # now; the window over its outage stays marked incomplete instead.
            count = (
                previous_s is not None
                and fetched_at_s - previous_s <= self._book.gap_s
                and self._answered_last_round.get(url) == self._book.rounds
                and url not in self._book.bad_last_round
            )
            self._book.ingest(url, samples, fetched_at_s, attribution, count)
            self._last_success_s[url] = fetched_at_s
            self._answered_last_round[url] = self._book.rounds + 1
            latest_s = fetched_at_s if latest_s is None else max(latest_s, fetched_at_s)
        if answers:
            # A round in which nothing answered still counts as a round: the endpoints
            # then start again from their values, and the window records the hole.
            self._book.end_round(
                latest_s if latest_s is not None else self._wall(),
                endpoints=len(answers) - harmless,
                failed=len(failures) - harmless,
            )
        if failures:
            # A failed endpoint may be a node that just left: look again next round.
            self._targets_at_s = None
        answered = len(answers) - len(failures)
        if not answers:
            self._metrics_error = "metrics: no endpoint to scrape (no alive node listed)"
        elif answered == 0:
            self._metrics_error = f"metrics: no endpoint answered ({failures[0]})"
        else:
            self._metrics_error = None
        partial = (
            f"{len(failures)} of {len(answers)} endpoints failed: {failures[0]}" if failures else ""
        )
        # A total failure is SenseResult.error; a partial one only reaches the log.
        self._problems.report("metrics", "" if self._metrics_error else partial)

    def _head_like(self, url: str) -> bool:
        """The dashboard's own host: the head, where Serve's proxy and controller run."""
        from urllib.parse import urlsplit

        return urlsplit(url).hostname == urlsplit(self._cluster.dashboard_url).hostname

    # ------------------------------------------------------------------ the answer

    def _result(self) -> SenseResult:
        gpus = tuple(gpu for readings in self._gpus.values() for gpu in readings)
        return self._platform.result(self._observation, self._metrics_error, gpus)

    def _observation(self, dep: ServeDeployment, state_at_s: float) -> Observation:
        fields = platform_fields(dep, state_at_s)
        book = self._book
        round_s = book.last_mark_s
        # Load only from a metrics pipeline that is alive: with no Serve series at all,
        # "nothing reported" would wrongly read as "no traffic".
        if round_s is None or self._metrics_error is not None or book.serve_samples_last_round == 0:
            return Observation(deployment=dep.name, sensed_at_s=self._wall(), **fields)
        window_s = self.settings.rate_window_s
        look_back_s = self._config.deployment(dep.name).autoscaling.look_back_period_s
        # Any window inside the last round's gap reaches back to the previous round.
        tick_s = 0.5 * book.round_s if book.round_s else window_s
        coverage = book.coverage_ratio(max(window_s, look_back_s))
        windows = Windows(rate_s=window_s, look_back_s=look_back_s, tick_s=tick_s)
        fields.update(load_fields(book, dep, round_s, windows, coverage))
        return Observation(deployment=dep.name, sensed_at_s=self._wall(), **fields)
