"""Prometheus' HTTP API: instant queries, with auth and TLS, answers as plain values.

`GET /api/v1/query?query=...` answers `{"status": "success", "data": {"resultType":
"vector", "result": [{"metric": {...}, "value": [<time>, "<value>"]}]}}`, or `"status":
"error"` with `errorType` and `error`. The time of an instant query's sample is the
evaluation time, not when the data was scraped: freshness has to be asked for with
`timestamp(...)`.

Credentials (a bearer token or basic auth) are read from their file or environment
variable before each request, so a rotated secret is picked up, and they never reach a
message: every failure is a `PrometheusError` of one line, scrubbed of what was sent and
of anything shaped like a credential (`autoscalerd.dashboard.scrubbed`).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from autoscalerd.dashboard import AUTH, ERROR, TIMEOUT, UNAVAILABLE, scrubbed
from autoscalerd.dashboard import _reason as connection_reason

QUERY_PATH = "/api/v1/query"
# How much of an error answer a message quotes.
_DETAIL_CHARS = 200


class PrometheusError(Exception):
    """A query that got no usable answer. `str()` is one line without secrets; `kind` is
    one of autoscalerd.dashboard's error kinds (auth, unavailable, timeout, error)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Credentials:
    """What to send with each request: a header value, and the secrets to scrub."""

    authorization: str | None = None
    secrets: tuple[str, ...] = ()
    # Where they came from (safe to show), for the 401/403 message.
    where: str = "no credentials configured"


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector: its labels and value (NaN, ±Inf as floats)."""

    labels: Mapping[str, str]
    value: float


class PrometheusClient:
    def __init__(
        self,
        url: str,
        credentials: Callable[[], Credentials],
        timeout_s: float,
        ssl_context: ssl.SSLContext | bool = True,
        max_concurrency: int = 8,
    ) -> None:
        """`url` is Prometheus' base, e.g. http://prometheus:9090 or https://host/prom;
        `credentials` is asked before each request."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://HOST:PORT (got {url!r})")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._credentials = credentials
        self._ssl = ssl_context
        self._max_concurrency = max_concurrency
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: a session belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_concurrency, ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                raise_for_status=False,
            )
        return self._session

    async def query(self, promql: str) -> list[Sample]:
        """An instant query evaluated now; its vector (a scalar answer is one sample)."""
        try:
            credentials = self._credentials()
        except OSError as exc:  # a token or password file that cannot be read
            raise PrometheusError(AUTH, f"prometheus {self.url}: {exc}") from None
        headers = {"Accept": "application/json"}
        if credentials.authorization is not None:
            headers["Authorization"] = credentials.authorization
        try:
            async with self._client().get(
                self.url + QUERY_PATH, params={"query": promql}, headers=headers
            ) as answer:
                status = answer.status
                text = (await answer.read()).decode("utf-8", "replace")
                body = _json(text) if "json" in answer.content_type else None
        except (TimeoutError, asyncio.TimeoutError):
            raise PrometheusError(
                TIMEOUT, f"prometheus {self.url}: no answer within {self.timeout_s:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            reason = _scrub(_reason(exc), credentials)
            raise PrometheusError(
                UNAVAILABLE,
                f"prometheus {self.url} unreachable ({reason}); is Prometheus running there, "
                "and is the sensor's url right?",
            ) from None
        if status in (401, 403):
            word = "unauthorized" if status == 401 else "forbidden"
            raise PrometheusError(
                AUTH,
                f"prometheus {self.url}: {status} {word} (sent: {credentials.where}); set the "
                "sensor's bearer_token_file, bearer_token_env or basic_auth to what it accepts",
            )
        if isinstance(body, Mapping) and body.get("status") == "error":
            kind = str(body.get("errorType") or "error")
            detail = _one_line(_scrub(str(body.get("error") or ""), credentials))
            raise PrometheusError(ERROR, f"prometheus query {_short(promql)}: {kind}: {detail}")
        if status != 200 or not isinstance(body, Mapping):
            detail = _one_line(_scrub(text, credentials))
            raise PrometheusError(
                ERROR,
                f"prometheus {self.url}{QUERY_PATH}: HTTP {status}"
                + (f": {detail}" if detail else "")
                + ("" if status != 200 else " (not a Prometheus query answer)"),
            )
        return _vector(body, promql)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def _vector(body: Mapping[str, Any], promql: str) -> list[Sample]:
    """The samples of a success answer; PrometheusError if it is not in Prometheus' shape."""

    def bad(what: str) -> PrometheusError:
        return PrometheusError(ERROR, f"prometheus query {_short(promql)}: {what}")

    data = body.get("data")
    if body.get("status") != "success" or not isinstance(data, Mapping):
        raise bad("answer has no 'data'")
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "scalar" and isinstance(result, list):
        return [Sample({}, _value(result, bad))]
    if kind != "vector" or not isinstance(result, list):
        raise bad(f"answer is a {kind!r}, not an instant vector")
    samples: list[Sample] = []
    for item in result:
        if not isinstance(item, Mapping) or not isinstance(item.get("metric"), Mapping):
            raise bad("a series without labels")
        labels = {str(k): str(v) for k, v in item["metric"].items()}
        samples.append(Sample(labels, _value(item.get("value"), bad)))
    return samples


def _value(pair: Any, bad: Callable[[str], PrometheusError]) -> float:
    """A sample's value: Prometheus writes it as a string ("1.5", "NaN", "+Inf")."""
    if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
        raise bad('a sample that is not [time, "value"]')
    try:
        value = float(pair[1])
    except ValueError:
        raise bad(f"a sample value {pair[1][:40]!r} that is no number") from None
    return value


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _scrub(text: str, credentials: Credentials) -> str:
    for secret in credentials.secrets:
        text = str(scrubbed(text, secret))
    return str(scrubbed(text, None))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_DETAIL_CHARS]


def _short(promql: str) -> str:
    text = " ".join(promql.split())
    return text if len(text) <= 120 else text[:117] + "..."


def _reason(exc: BaseException) -> str:
    """A short cause: 'connection refused', a certificate not trusted; not aiohttp's repr."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate not trusted: {exc.certificate_error}"
    return connection_reason(exc)
