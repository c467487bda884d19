"""The Ray dashboard's token never leaves DashboardClient: a dashboard (here a real aiohttp
server on loopback) whose error bodies echo the request's Authorization header back, in
the shapes real servers use, gets its answers scrubbed before they reach an error
message, the log or /v1/status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from autoscalerd.dashboard import REDACTED, DashboardClient, DashboardError, TokenSource

TOKEN = "ray-Tok3n-0123456789abcdef"


def echoes(request: web.Request) -> str:
    return request.headers.get("Authorization", "")


async def text_echo(request: web.Request) -> web.Response:
    return web.Response(status=500, text=f"bad request\nAuthorization: {echoes(request)}\n")


async def json_echo(request: web.Request) -> web.Response:
    body = {"error": f"rejected {dict(request.headers)!r}", "headers": dict(request.headers)}
    return web.json_response(body, status=400)


async def nested_echo(request: web.Request) -> web.Response:
    token = echoes(request).partition(" ")[2]
    body = {"error": {"detail": [f"token={token} is not allowed", {"sent": token}]}}
    return web.json_response(body, status=503)


async def bare_token(request: web.Request) -> web.Response:
    return web.Response(status=502, text=f"upstream said no to {echoes(request).split()[-1]}")


async def other_bearer(request: web.Request) -> web.Response:
    # A credential the client never sent, shaped like one: also scrubbed.
    return web.Response(status=500, text="proxy: Authorization: Basic dXNlcjpwYXNz; Bearer abc.def")


ROUTES = {
    "/text": text_echo,
    "/json": json_echo,
    "/nested": nested_echo,
    "/bare": bare_token,
    "/other": other_bearer,
}


@pytest.fixture
async def dashboard() -> AsyncIterator[DashboardClient]:
    app = web.Application()
    for path, handler in ROUTES.items():
        app.router.add_route("*", path, handler)
    async with TestServer(app, host="127.0.0.1") as server:
        client = DashboardClient(
            str(server.make_url("")), lambda: TokenSource(TOKEN, "cluster.token"), timeout_s=5
        )
        try:
            yield client
        finally:
            await client.close()


def shown(value: Any) -> str:
    return json.dumps(value) + repr(value)


@pytest.mark.parametrize("path", list(ROUTES))
async def test_no_error_message_holds_the_token(dashboard: DashboardClient, path: str) -> None:
    with pytest.raises(DashboardError) as caught:
        await dashboard.get_json(path)
    message = str(caught.value)
    assert TOKEN not in message and "\n" not in message, message
    assert "HTTP " in message


@pytest.mark.parametrize("path", list(ROUTES))
async def test_no_response_body_holds_the_token(dashboard: DashboardClient, path: str) -> None:
    response = await dashboard.post_json(path, {"replicas": 3})
    assert response.status >= 400
    assert TOKEN not in shown(response.body)
    assert REDACTED in shown(response.body)


async def test_credentials_shaped_like_one_are_scrubbed_too(dashboard: DashboardClient) -> None:
    response = await dashboard.post_json("/other", None)
    assert "dXNlcjpwYXNz" not in response.body and "abc.def" not in response.body
    assert response.body.startswith("proxy: ")


async def test_a_json_answer_keeps_its_shape(dashboard: DashboardClient) -> None:
    response = await dashboard.post_json("/nested", None)
    assert response.body == {
        "error": {"detail": [f"token={REDACTED} is not allowed", {"sent": REDACTED}]}
    }


async def test_the_actuators_detail_of_an_answer_holds_no_token(dashboard: DashboardClient) -> None:
    from autoscalerd_plugins.ray_serve import _detail

    for path in ROUTES:
        detail = _detail(await dashboard.post_json(path, {"replicas": 3}))
        assert TOKEN not in detail and detail, (path, detail)
