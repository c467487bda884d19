"""The HTTP API against bytes no well-behaved client sends, over a real socket to the
server `autoscalerd run` starts (`server.start`): each gets a 4xx, never a 500 or a
traceback, and the log gets at most one line per client per minute about them."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from autoscalerd.clock import VirtualClock
from autoscalerd.loop import Controller
from autoscalerd.metrics import Metrics
from autoscalerd.server import (
    MAX_OVERRIDE_TTL_S,
    REJECTIONS,
    ApiError,
    HealthRule,
    RejectionLog,
    check_bearer,
    create_app,
    json_body,
    parse_override,
    start,
)
from tests.test_server import NAME, TOKEN, RateSensor, config

PAUSE = f"/v1/deployments/{NAME}/pause".encode()
OVERRIDE = f"/v1/deployments/{NAME}/override".encode()
BEARER = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"


@dataclass
class Served:
    port: int
    app: web.Application
    controller: Controller
    now_s: list[float]

    async def send(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        """Write `raw` as is, read the whole answer (the server closes after it)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), headers, body

    async def post(self, path: bytes, headers: bytes, body: bytes = b"") -> tuple[int, Any]:
        status, answer_headers, raw = await self.send(
            b"POST " + path + b" HTTP/1.1\r\nHost: test\r\nConnection: close\r\n" + headers
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )  # fmt: skip
        assert answer_headers["content-type"].startswith("application/json"), raw
        return status, json.loads(raw)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    controller = Controller(config(token=TOKEN), [RateSensor(40.0)], [], VirtualClock(0.0))
    await controller.tick(1.0)
    app = create_app(controller, Metrics(), HealthRule())
    now_s = [1000.0]
    app[REJECTIONS].clock = lambda: now_s[0]
    port = free_port()
    runner = await start(app, f"127.0.0.1:{port}")
    try:
        yield Served(port, app, controller, now_s)
    finally:
        await runner.cleanup()


async def test_an_authorization_header_that_is_not_utf8_is_refused(served: Served) -> None:
    status, body = await served.post(PAUSE, b"Authorization: Bearer \xff\xfe\x80\r\n")
    assert status == 403 and body == {"error": "wrong token"}
    status, body = await served.post(PAUSE, b"Authorization: \xff\xfe\r\n")
    assert status == 401 and "authorization required" in body["error"]
    assert served.controller.deployments[NAME].paused is False


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"replicas": "\xff\xfe"}', 400, "body: not UTF-8"),
        (b"[" * 5000, 400, "body: JSON nested too deeply"),
        (b'{"replicas": ' + b"9" * 5000 + b"}", 400, "body: a number too long"),
        (b"[" * 200_000, 413, "request entity too large"),
    ],
)
async def test_a_body_that_cannot_be_json_is_a_4xx(
    served: Served, body: bytes, status: int, message: str
) -> None:
    got, answer = await served.post(OVERRIDE, BEARER, body)
    assert got == status and message in answer["error"], answer
    assert served.controller.deployments[NAME].override_replicas is None


async def test_rejections_are_logged_once_per_client_per_minute(served: Served) -> None:
    with capture_logs() as events:
        for _ in range(5):
            assert (await served.post(PAUSE, b"Authorization: Bearer \xff\r\n"))[0] == 403
            assert (await served.post(OVERRIDE, BEARER, b"\xff"))[0] == 400
        served.now_s[0] += 61.0
        assert (await served.post(OVERRIDE, BEARER, b"[" * 5000))[0] == 400
    rejected = [e for e in events if e["event"] == "http_rejected"]
    assert [e["log_level"] for e in rejected] == ["warning", "warning"], events
    assert rejected[0]["peer"] == "127.0.0.1" and rejected[0]["status"] == 403
    assert rejected[1]["suppressed"] == 9 and "nested too deeply" in rejected[1]["reason"]
    assert not [e for e in events if e["log_level"] == "error"]


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: test\r\nBad Header\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: -5\r\n\r\n",
        b"GET /\xff HTTP/1.1\r\nHost: test\r\n\r\n",
        b"GET /healthz HTTP/9.9\r\nHost: test\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",  # TLS on the HTTP port
    ],
)
async def test_a_malformed_request_is_a_400_without_a_traceback(
    served: Served,
    raw: bytes,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with capture_logs() as events:
        assert 400 <= (await served.send(raw))[0] < 500
        # Also after a well-formed request on the same connection, where aiohttp logs even
        # what it keeps quiet about on a connection's first request.
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert head.startswith(b"HTTP/1.1 200")
        length = re.search(rb"Content-Length: (\d+)", head)
        assert length is not None
        await reader.readexactly(int(length.group(1)))
        writer.write(raw)
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
        assert answer.startswith(b"HTTP/1.") and b" 4" in answer.split(b"\r\n")[0], answer
    assert "Traceback" not in capsys.readouterr().err
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert [e["log_level"] for e in events if e["event"] == "http_rejected"] in (
        [],
        ["warning"],
    ), events


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/deployments/%ff%fe/pause",
        b"/v1/decisions?deployment=%ff",
        b"/v1/decisions?limit=%ff%fe",
        b"/v1/decisions?limit=99999999999999999999999999",
        b"/v1/deployments/" + b"a" * 4000 + b"/pause",
    ],
)
async def test_odd_paths_and_queries_are_never_a_500(served: Served, target: bytes) -> None:
    method = b"POST " if target.endswith(b"/pause") else b"GET "
    status, headers, raw = await served.send(
        method + target + b" HTTP/1.1\r\nHost: test\r\nConnection: close\r\n" + BEARER
        + b"Content-Length: 0\r\n\r\n"
    )  # fmt: skip
    assert 400 <= status < 500, raw
    assert headers["content-type"].startswith("application/json")


def test_the_rejection_log_is_bounded_in_addresses() -> None:
    now_s = [0.0]
    rejections = RejectionLog(interval_s=60.0, max_peers=2, clock=lambda: now_s[0])
    with capture_logs() as events:
        assert rejections.note("10.0.0.1", 400, "bad") and rejections.note("10.0.0.2", 400, "bad")
        # A third address while two are remembered: it shares one line with any others.
        assert rejections.note("10.0.0.3", 400, "bad")
        assert not rejections.note("10.0.0.4", 400, "bad")
        now_s[0] = 61.0  # the first two are forgotten: room again
        assert rejections.note("10.0.0.5", 400, "bad")
    assert [e["peer"] for e in events] == ["10.0.0.1", "10.0.0.2", "other addresses", "10.0.0.5"]


# ---------------------------------------------------------------- the parsers, fuzzed

JSONISH = st.one_of(
    st.binary(max_size=200),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    ).map(lambda value: json.dumps(value).encode()),
    st.sampled_from(
        [
            b"[" * 5000,
            b"{" * 5000,
            b'{"replicas": ' + b"9" * 5000 + b"}",
            b'{"replicas": 1e999}',
            b'{"replicas": 3, "ttl_s": NaN}',
            b'{"replicas": 3, "ttl_s": -Infinity}',
            b"\xef\xbb\xbf{}",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    JSONISH, st.dictionaries(st.sampled_from(["replicas", "ttl_s"]), st.integers() | st.floats())
)
def test_an_override_body_parses_or_is_a_400(raw: bytes, fields: dict[str, Any]) -> None:
    for body in (raw, json.dumps(fields).encode()):
        try:
            replicas, ttl_s = parse_override(json_body(body))
        except ApiError as exc:
            assert exc.status == 400 and "\n" not in exc.message
            continue
        assert isinstance(replicas, int) and replicas >= 0
        assert ttl_s is None or 0 < ttl_s <= MAX_OVERRIDE_TTL_S


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=60)
    | st.binary(max_size=60).map(lambda b: b.decode("utf-8", "surrogateescape"))
)
def test_any_authorization_value_is_checked_without_an_exception(header: str) -> None:
    for value in (header, "Bearer " + header):
        try:
            check_bearer(value, TOKEN)
        except ApiError as exc:
            assert exc.status in (401, 403)
        else:
            assert value.split(None, 1)[1].strip() == TOKEN
