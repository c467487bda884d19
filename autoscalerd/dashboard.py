"""HTTP to Ray: the dashboard (Serve REST API, scale endpoint) and the nodes' metrics ports.

One aiohttp session per client, a connection limit that bounds concurrency, a timeout on
every request, and failures as `DashboardError`: a kind the caller can act on and one
line a person can act on. The Bearer token goes to the dashboard only, never to metrics
endpoints, and never into a message or a log: a dashboard (or a proxy before it) may echo
the request's headers in an error body, so every answer is scrubbed of the token sent and
of anything shaped like a credential before a caller sees it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp

# Error kinds, shared with ActuationResult.error_kind.
AUTH = "auth"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
ERROR = "error"

REDACTED = "[redacted]"
# Credentials by their shape, whatever was sent: an Authorization header's value as a
# server echoes it (`Authorization: Basic ...`, `'authorization': 'Bearer ...'`), then any
# remaining `Bearer <token>`.
_CREDENTIALS = (
    re.compile(r"""(authorization['"]?\s*[:=]\s*['"]?)[^'"\r\n,;}]+""", re.IGNORECASE),
    re.compile(r"\b(bearer\s+)[^\s'\",;}]+", re.IGNORECASE),
)


class DashboardError(Exception):
    """A request that got no usable answer. `str()` is one line without secrets."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: Any  # parsed JSON when the answer was JSON, else the text


@dataclass(frozen=True, slots=True)
class TokenSource:
    """The dashboard token and where it came from (the latter is safe to show)."""

    token: str | None
    where: str


def find_token(cluster: Any) -> TokenSource:
    """The token by ClusterConfig's precedence: cluster.token, $RAY_AUTH_TOKEN, token_file."""
    token = cluster.resolve_token()
    if token is None:
        return TokenSource(
            None, f"none found (cluster.token, $RAY_AUTH_TOKEN, {cluster.token_file})"
        )
    if cluster.token:
        return TokenSource(token, "cluster.token")
    if os.environ.get("RAY_AUTH_TOKEN"):
        return TokenSource(token, "$RAY_AUTH_TOKEN")
    return TokenSource(token, str(Path(cluster.token_file).expanduser()))


class DashboardClient:
    def __init__(
        self,
        base_url: str,
        token: Callable[[], TokenSource],
        timeout_s: float,
        max_concurrency: int = 8,
    ) -> None:
        """`token` is asked before each request, so a rotated token file is picked up."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"dashboard_url must be http(s)://HOST:PORT (got {base_url!r})")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token = token
        self._max_concurrency = max_concurrency
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: a session belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_concurrency),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                raise_for_status=False,
            )
        return self._session

    def _headers(self, token: TokenSource) -> dict[str, str]:
        if token.token is None:
            return {}
        return {"Authorization": f"Bearer {token.token}"}

    async def get_json(self, path: str) -> Any:
        """GET a dashboard path; the JSON body of a 200, else DashboardError."""
        response = await self._request("GET", path)
        if response.status != 200:
            raise DashboardError(
                ERROR, self._describe_status("GET", path, response), status=response.status
            )
        if isinstance(response.body, str):
            raise DashboardError(ERROR, f"dashboard {self.base_url}{path}: answer is not JSON")
        return response.body

    async def post_json(self, path: str, body: Any) -> Response:
        """POST JSON to a dashboard path; any HTTP status is returned except 401/403."""
        return await self._request("POST", path, body)

    async def get_text(self, url: str) -> str:
        """GET an absolute URL (a metrics endpoint) without the dashboard's token."""
        try:
            async with self._client().get(url) as answer:
                # Bytes that are not UTF-8 stay visible as such, and fail the parse.
                text = (await answer.read()).decode("utf-8", "replace")
                if answer.status != 200:
                    raise DashboardError(
                        ERROR, f"{url}: HTTP {answer.status}", status=answer.status
                    )
                return text
        except (TimeoutError, asyncio.TimeoutError):
            raise DashboardError(TIMEOUT, f"{url}: no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise DashboardError(UNAVAILABLE, f"{url}: {_reason(exc)}") from None

    async def _request(self, method: str, path: str, body: Any = None) -> Response:
        url = f"{self.base_url}{path}"
        token = self._token()
        try:
            async with self._client().request(
                method, url, json=body, headers=self._headers(token)
            ) as answer:
                text = (await answer.read()).decode("utf-8", "replace")
                status = answer.status
        except (TimeoutError, asyncio.TimeoutError):
            raise DashboardError(
                TIMEOUT, f"dashboard {self.base_url}: no answer within {self.timeout_s:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise DashboardError(
                UNAVAILABLE,
                f"dashboard {self.base_url} unreachable ({scrubbed(_reason(exc), token.token)}); "
                "is Ray running, and is cluster.dashboard_url right?",
            ) from None
        if status in (401, 403):
            raise DashboardError(AUTH, self._auth_message(status, token), status=status)
        try:
            parsed: Any = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            parsed = text
        # Error answers are where a server echoes the request; a success's data is left as is.
        return Response(status, parsed if status < 300 else scrubbed(parsed, token.token))

    def _auth_message(self, status: int, token: TokenSource) -> str:
        fix = (
            "set cluster.token, $RAY_AUTH_TOKEN or cluster.token_file to the cluster's token "
            "(`ray get-auth-token` on the head prints it)"
        )
        where = token.where
        if token.token is None:
            return f"dashboard {self.base_url}: {status} token required, {where}; {fix}"
        return f"dashboard {self.base_url}: {status} token rejected (from {where}); {fix}"

    def _describe_status(self, method: str, path: str, response: Response) -> str:
        detail = response.body.get("error") if isinstance(response.body, dict) else response.body
        text = " ".join(str(detail or "").split())[:200]
        return f"dashboard {method} {path}: HTTP {response.status}" + (f": {text}" if text else "")

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def scrubbed(value: Any, token: str | None) -> Any:
    """`value` (an answer's text or parsed JSON, or a message) with `token` and anything
    shaped like a credential replaced by REDACTED, in every string, keys included."""
    if isinstance(value, str):
        if token:
            # As sent, percent-encoded (echoed in a URL) and JSON-escaped (in raw JSON).
            forms = {token, quote(token, safe=""), json.dumps(token)[1:-1]}
            for form in sorted(forms, key=len, reverse=True):
                value = value.replace(form, REDACTED)
        for pattern in _CREDENTIALS:
            value = pattern.sub(rf"\1{REDACTED}", value)
        return value
    if isinstance(value, dict):
        return {scrubbed(k, token): scrubbed(v, token) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v, token) for v in value]
    return value


def _reason(exc: BaseException) -> str:
    """A short cause: 'connection refused', not aiohttp's nested repr."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        errno = exc.os_error.errno if exc.os_error is not None else None
        return os.strerror(errno).lower() if errno else "cannot connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    text = " ".join(str(exc).split())
    return text[:160] or type(exc).__name__
