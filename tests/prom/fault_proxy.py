"""An HTTP proxy in front of the real Prometheus that a test can make misbehave.

Prometheus itself takes only basic auth (`--web.config.file`), so a bearer token is
checked here, the way an authenticating reverse proxy before Prometheus would, echoing
the request's Authorization header in its 401 as careless proxies do. Everything else
is forwarded to the real server; a test can make the queries that mention a name fail
with Prometheus' own error shape, or answer NaN.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import aiohttp
from aiohttp import web

from tests.ray.ray_helpers import free_port


class FaultProxy:
    def __init__(self, upstream: str, bearer_token: str | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.bearer_token = bearer_token
        self.port = free_port()
        # Queries mentioning one of these names: an error answer / NaN values.
        self.fail: set[str] = set()
        self.nan: set[str] = set()
        self.seen_authorization: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_get("/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        self.seen_authorization.append(header)
        if self.bearer_token is not None and header != f"Bearer {self.bearer_token}":
            return web.Response(
                status=401, text=f"401 Unauthorized: rejected Authorization: {header}"
            )
        query = request.query.get("query", "")
        if any(name in query for name in self.fail):
            # Echoing the request's credentials, as a careless proxy or server might.
            error = f"injected failure (request had Authorization: {header})"
            body = {"status": "error", "errorType": "execution", "error": error}
            return web.json_response(body, status=422)
        assert self._session is not None
        async with self._session.get(
            self.upstream + request.path, params=dict(request.query)
        ) as answer:
            text = await answer.text()
            status = answer.status
        if status == 200 and any(name in query for name in self.nan):
            text = json.dumps(_with_nan(json.loads(text)))
        return web.Response(status=status, text=text, content_type="application/json")

    def close(self) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def _with_nan(body: dict[str, Any]) -> dict[str, Any]:
    for item in body.get("data", {}).get("result", []):
        item["value"] = [item["value"][0], "NaN"]
    return body
