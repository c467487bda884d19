"""The `prometheus` sensor: load from a Prometheus that scrapes Ray, replicas from Serve.

`ray_serve` scrapes every Ray node itself. Where SREs already run a Prometheus that
scrapes those nodes (Ray's `prom_metrics_service_discovery.json`, or KubeRay's
PodMonitors), this sensor asks it instead, with instant queries through
`GET /api/v1/query` that aggregate in Prometheus (`prometheus_queries.py`), and turns the
answers into the same Observation fields the direct sensor produces: the same signals,
the same fallbacks, the same code (`serve_readings.load_fields`).

Why it still reads Serve's REST API (`cluster.dashboard_url`, with `cluster`'s token, as
`ray_serve` does): the daemon actuates a deployment only once it has read the platform's
current target (`DeploymentInfo.watches_platform`), and that, `max_ongoing_requests`,
`external_scaler_enabled`, the resources per replica and which replica runs on which
worker (vLLM's series through Ray carry only `WorkerId`) are not in Prometheus, or only
a scrape late. So Prometheus supplies load, and the platform is read where it is kept;
while the dashboard does not answer every field is unknown, as with `ray_serve`.

Staleness: each reading is as old as the newest sample of the oldest series it is made
of (`timestamp(...)`, on Prometheus' clock, which must agree with the daemon's), never
the query's evaluation time; older than `max_metric_age_s`, the decision holds.

Fail static: a failed query, a NaN, infinite or negative answer, or a Ray target that
missed a scrape within the window make what they feed unknown or partial
(`metrics_coverage_ratio` below 1: lower bounds, no scale-down), never zero. A
deployment that runs replicas but exports none of Serve's replica series has no load
readings at all. One failing query costs only the fields it feeds; Prometheus down is
the sensor's error, with every load field unknown.

Credentials (a bearer token, or basic auth's password) come from a file or an
environment variable, read before each round, and never reach a log line or an error.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscalerd import logs
from autoscalerd.config import Config, ConfigError, plugin_settings
from autoscalerd.model import Observation, Reading
from autoscalerd.sense import prometheus_queries as pq
from autoscalerd.sense import serve_metrics as sm
from autoscalerd.sense.background import Rounds
from autoscalerd.sense.base import SenseResult
from autoscalerd.sense.problems import ProblemLog
from autoscalerd.sense.prometheus_http import (
    Credentials,
    PrometheusClient,
    PrometheusError,
    Sample,
)
from autoscalerd.sense.serve_api import ServeDeployment
from autoscalerd.sense.serve_platform import ServePlatform, dashboard_client
from autoscalerd.sense.serve_readings import Windows, load_fields, platform_fields

# Prometheus' rate() needs two samples in its range; four scrape intervals survive a
# missed scrape or two (Prometheus' own advice for rate ranges).
_SCRAPES_PER_WINDOW = 4
_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
# What stands for credentials found in the url, in its error message.
_HIDDEN = "redacted"


class BasicAuthSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    username: str = Field(min_length=1)
    password_file: str | None = None
    password_env: str | None = None

    @model_validator(mode="after")
    def _one_password(self) -> BasicAuthSettings:
        if (self.password_file is None) == (self.password_env is None):
            raise ValueError("password_file or password_env: set exactly one")
        return self


class PrometheusSettings(BaseModel):
    """The sensor's settings (the dashboard's address and token live in `cluster`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Prometheus' base URL: http://prometheus:9090, or https://host/prometheus behind a proxy.
    url: str
    # Extra equality matchers on every selector, so that one Prometheus that scrapes
    # several Ray clusters serves each daemon its own: {job: ray, cluster: prod}.
    matchers: dict[str, str] = {}
    # How often Prometheus scrapes the Ray nodes (its scrape_interval): windows are at
    # least four of them.
    scrape_interval_s: float = Field(15.0, gt=0)
    # The window of rates and latency histograms; default each deployment's
    # look_back_period_s, raised to four scrape intervals.
    window_s: float | None = Field(None, gt=0)
    # Seconds between rounds of queries; Prometheus' data changes once a scrape.
    query_interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(5.0, gt=0)
    max_concurrency: int = Field(8, ge=1)
    # Credentials, never inline: a bearer token from a file or an environment variable,
    # or basic auth with its password from one.
    bearer_token_file: str | None = None
    bearer_token_env: str | None = None
    basic_auth: BasicAuthSettings | None = None
    # TLS: the CA bundle that signed Prometheus' certificate (else the system's), or no
    # verification at all (testing only).
    ca_file: str | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_credentials_in_url(cls, data: Any) -> Any:
        # Redact before validation: an error message quotes the value it rejects.
        if isinstance(data, Mapping) and isinstance(data.get("url"), str):
            parts = urlsplit(data["url"])
            if "@" in parts.netloc:
                host = parts.netloc.rpartition("@")[2]
                # Not REDACTED: its brackets would read as an IPv6 address.
                url = urlunsplit(parts._replace(netloc=f"{_HIDDEN}@{host}"))
                return {**data, "url": url}
        return data

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.netloc.startswith(f"{_HIDDEN}@"):
            raise ValueError("credentials in the URL are not used; set basic_auth instead")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be http(s)://HOST:PORT, e.g. http://127.0.0.1:9090")
        return value

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, value: dict[str, str]) -> dict[str, str]:
        for label in value:
            if not re.match(_LABEL_NAME, label) or label == "__name__":
                raise ValueError(f"{label!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        return value

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, value: str | None) -> str | None:
        # Needed to build the TLS context at start-up; token files are read every round
        # (a rotated token is picked up), so they may appear later.
        if value is not None and not Path(value).expanduser().is_file():
            raise ValueError(
                "no such file; give the PEM file of the CA that signed Prometheus' certificate"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PrometheusSettings:
        if self.bearer_token_file is not None and self.bearer_token_env is not None:
            raise ValueError("bearer_token_file, bearer_token_env: set one, not both")
        bearer = self.bearer_token_file is not None or self.bearer_token_env is not None
        if bearer and self.basic_auth is not None:
            raise ValueError(
                "basic_auth: one kind of credentials at a time; drop it or the bearer token"
            )
        if self.window_s is not None and self.window_s < 2 * self.scrape_interval_s:
            least_s = 2 * self.scrape_interval_s
            raise ValueError(
                f"window_s: must be at least two scrape intervals ({least_s:g} s), "
                "or rate() has no two samples to work with"
            )
        if self.ca_file is not None and self.insecure_skip_verify:
            raise ValueError("ca_file, insecure_skip_verify: verify with the CA or not at all")
        return self


class PrometheusSensor:
    name = "prometheus"
    settings_model = PrometheusSettings

    def __init__(
        self,
        settings: Mapping[str, Any],
        config: Config,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = s = plugin_settings(PrometheusSettings, settings)
        self._config = config
        cluster = config.cluster
        self._wall = wall_clock
        self._dashboard = dashboard_client(cluster, s.max_concurrency)
        self._prometheus = PrometheusClient(
            s.url, self._credentials, s.timeout_s, _tls(s), s.max_concurrency
        )
        self._problems = ProblemLog(
            logs.get("autoscalerd.sensor.prometheus").bind(prometheus=s.url)
        )
        self._platform = ServePlatform(
            self._dashboard, cluster.dashboard_url, self.name, self._wall, self._problems
        )
        # Per-tick histograms need two samples as well.
        self._tick_window_s = max(s.query_interval_s, 2 * s.scrape_interval_s)
        self._plan = pq.plan(
            s.matchers, self._windows_s(), self._tick_window_s, max(self._windows_s())
        )
        self._answers: pq.Answers | None = None
        self._load_error: str | None = None
        self._last_query_s: float | None = None
        self._rounds = Rounds.every_tick(
            "prometheus-poller", config.tick_s, self.poll_once, self._platform.failed
        )

    def window_s(self, deployment: str) -> float:
        """The window of `deployment`'s rates and histograms."""
        return self._window_s(self._config.deployment(deployment).autoscaling.look_back_period_s)

    def _window_s(self, look_back_s: float) -> float:
        s = self.settings
        if s.window_s is not None:
            return s.window_s
        return max(look_back_s, _SCRAPES_PER_WINDOW * s.scrape_interval_s)

    def _windows_s(self) -> list[float]:
        """Every window a deployment may need: the defaults' (discovered ones) and each
        listed deployment's."""
        look_backs = [
            self._config.defaults.autoscaling.look_back_period_s,
            *(d.autoscaling.look_back_period_s for d in self._config.deployments),
        ]
        return sorted({self._window_s(look_back_s) for look_back_s in look_backs})

    def _credentials(self) -> Credentials:
        s = self.settings
        if s.bearer_token_file is not None or s.bearer_token_env is not None:
            token, where = _secret(s.bearer_token_file, s.bearer_token_env, "bearer token")
            return Credentials(f"Bearer {token}", (token,), where)
        if s.basic_auth is not None:
            auth = s.basic_auth
            password, where = _secret(auth.password_file, auth.password_env, "password")
            pair = base64.b64encode(f"{auth.username}:{password}".encode()).decode()
            return Credentials(f"Basic {pair}", (password, pair), f"basic auth {where}")
        return Credentials()

    # ------------------------------------------------------------------ Sensor protocol

    async def sense(self, now_s: float) -> SenseResult:
        try:
            await self._rounds.ready()
            return self._platform.result(self._observation, self._load_error)
        except Exception as exc:  # a sensor never raises into the loop
            return SenseResult({}, {}, error=f"prometheus sensor: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        await self._rounds.close()
        await self._prometheus.close()
        await self._dashboard.close()

    # ------------------------------------------------------------------ the poller

    async def poll_once(self) -> None:
        """One round: the applications every tick, the queries every query_interval_s."""
        now_s = self._wall()
        due = (
            self._last_query_s is None
            or now_s - self._last_query_s >= self.settings.query_interval_s
        )
        apps_task = asyncio.ensure_future(self._platform.fetch())
        queries_task = asyncio.ensure_future(self._query_all()) if due else None
        await asyncio.gather(*(t for t in (apps_task, queries_task) if t is not None))
        state = self._platform.keep(apps_task.result())
        if state is None or queries_task is None:
            return
        self._answers = pq.answers(
            self._plan, queries_task.result(), sm.Attribution(state), self._wall()
        )
        self._last_query_s = now_s
        self._report(self._answers)

    async def _query_all(self) -> list[list[Sample] | PrometheusError]:
        async def one(query: pq.Query) -> list[Sample] | PrometheusError:
            try:
                return await self._prometheus.query(query.promql)
            except PrometheusError as exc:
                return exc

        return list(await asyncio.gather(*(one(q) for q in self._plan)))

    def _report(self, answers: pq.Answers) -> None:
        """Prometheus down fails the sensor; a few failed queries are a logged problem."""
        failures = answers.failures
        self._load_error = failures[0] if answers.dead else None
        partial = (
            f"{len(failures)} of {answers.queries} queries failed: {failures[0]}"
            if failures and not answers.dead
            else ""
        )
        self._problems.report("queries", partial)

    # ------------------------------------------------------------------ the answer

    def _observation(self, dep: ServeDeployment, state_at_s: float) -> Observation:
        fields = platform_fields(dep, state_at_s)
        answers = self._answers
        if answers is None or answers.dead:
            return Observation(deployment=dep.name, sensed_at_s=self._wall(), **fields)
        at_s = answers.as_of(dep.name)
        if at_s is None and not dep.running_replicas:
            at_s = answers.evaluated_at_s  # nothing runs, so nothing can be late
        if at_s is None or (
            dep.running_replicas and not answers.has(dep.name, sm.REPLICA_PROCESSING)
        ):
            # Replicas run, but none of their series is in Prometheus (not scraped, not
            # yet exported, or the freshness query failed): no load reading, and the
            # missing data says so.
            fields["metrics_coverage_ratio"] = Reading(0.0, answers.evaluated_at_s)
            return Observation(deployment=dep.name, sensed_at_s=self._wall(), **fields)
        window_s = self.window_s(dep.name)
        windows = Windows(rate_s=window_s, look_back_s=window_s, tick_s=self._tick_window_s)
        coverage = answers.coverage(dep.name, dep.running_replicas)
        load = load_fields(answers, dep, at_s, windows, coverage)
        fields.update(answers.known_fields(dep.name, load))
        return Observation(deployment=dep.name, sensed_at_s=self._wall(), **fields)


def _secret(path: str | None, env: str | None, what: str) -> tuple[str, str]:
    """A credential and where it came from (the place, never the value)."""
    if path is not None:
        value = Path(path).expanduser().read_text().strip()
        where = f"{what} from {path}"
    else:
        assert env is not None
        value = os.environ.get(env, "").strip()
        where = f"{what} from ${env}"
    if not value:
        raise OSError(f"{where.replace(' from ', ' in ')} is empty or unset")
    return value, where


def _tls(settings: PrometheusSettings) -> ssl.SSLContext | bool:
    if settings.insecure_skip_verify:
        return False
    if settings.ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(Path(settings.ca_file).expanduser()))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            [f"ca_file: not a CA bundle ({exc}); give a PEM file of CA certificates"]
        ) from None
