"""The HTTP API over real HTTP (aiohttp's test server on localhost), against a real
Controller fed by a sensor that reports a fixed rate: every error path, quickly."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from autoscalerd import server, state
from autoscalerd.clock import VirtualClock
from autoscalerd.config import Config
from autoscalerd.loop import Controller
from autoscalerd.metrics import Metrics
from autoscalerd.model import Observation, Reading
from autoscalerd.sense.base import DeploymentInfo, SenseResult
from autoscalerd.server import HealthRule, create_app

TOKEN = "t0ken-for-tests"
NAME = "llm/chat"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WHY = '{"reason": "tests"}'


class RateSensor:
    name = "rate"

    def __init__(self, rate_per_s: float) -> None:
        self.rate_per_s = rate_per_s
        self.fail = False
        self.fail_with: str | None = None

    async def sense(self, now_s: float) -> SenseResult:
        if self.fail:
            raise ConnectionError("dashboard unreachable")
        if self.fail_with is not None:
            raise ConnectionError(self.fail_with)
        obs = Observation(NAME, now_s, arrival_rate_per_s=Reading(self.rate_per_s, now_s))
        return SenseResult({NAME: obs}, {NAME: DeploymentInfo(name=NAME)})

    async def close(self) -> None:
        return None


def config(**http: Any) -> Config:
    return Config.model_validate(
        {
            "discovery": {"enabled": False},
            "http": {"token_env": "AUTOSCALERD_TEST_UNSET_TOKEN", **http},
            "deployments": [
                {
                    "name": NAME,
                    "autoscaling": {"min_replicas": 2, "max_replicas": 6, "upscale_delay_s": 0},
                    "capacity": {
                        "sizing": "utilization",
                        "service_rate_per_replica": 10,
                        "target_utilization": 1.0,
                    },
                    "forecast": {"enabled": False},
                }
            ],
        }
    )


class Api:
    def __init__(self, client: TestClient[Any, Any], controller: Controller, sensor: RateSensor):
        self.client = client
        self.controller = controller
        self.sensor = sensor
        self.now_s = 0.0

    async def tick(self, count: int = 1) -> None:
        for _ in range(count):
            self.now_s += 1.0
            self.controller.clock = VirtualClock(self.now_s)
            await self.controller.tick(self.now_s)

    async def call(
        self, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        response = await self.client.request(method, path, data=body, headers=headers)
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


async def make_api(cfg: Config) -> AsyncIterator[Api]:
    sensor = RateSensor(40.0)
    controller = Controller(cfg, [sensor], [], VirtualClock(0.0))
    metrics = Metrics()
    controller.listeners.append(metrics.on_tick)
    app = create_app(controller, metrics, HealthRule())
    async with TestClient(TestServer(app)) as client:
        yield Api(client, controller, sensor)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async for value in make_api(config(token=TOKEN)):
        yield value


async def test_health_and_readiness_follow_the_ticks(api: Api) -> None:
    status, body = await api.call("GET", "/readyz")
    assert status == 503 and "no tick completed yet" in body["problems"]
    assert (await api.call("GET", "/healthz"))[0] == 200  # starting, within the window
    await api.tick(2)
    assert (await api.call("GET", "/readyz"))[0] == 200
    api.sensor.fail = True
    await api.tick()
    status, body = await api.call("GET", "/readyz")
    assert status == 503
    assert "sensor rate: ConnectionError: dashboard unreachable" in body["problems"]
    # No tick for longer than 3 tick periods: stalled.
    api.controller.last_tick_monotonic_s = time.monotonic() - 10.0
    status, body = await api.call("GET", "/healthz")
    assert status == 503 and body["status"] == "stalled"


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "authorization required"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 401, "authorization required"),
        ({"Authorization": "Bearer"}, 401, "authorization required"),
        ({"Authorization": "Bearer wrong"}, 403, "wrong token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, 403, "wrong token"),
        ({"Authorization": "Bearer caf\u00e9"}, 403, "wrong token"),  # non-ASCII: no 500
        ({"Authorization": f"bearer {TOKEN}"}, 200, None),
    ],
)
async def test_bearer_token_rules(
    api: Api, headers: dict[str, str], status: int, message: str | None
) -> None:
    await api.tick()
    got, body = await api.call("POST", f"/v1/deployments/{NAME}/pause", WHY, headers)
    assert got == status, body
    if message:
        assert message in body["error"]
        assert api.controller.deployments[NAME].paused is False


async def test_writes_are_disabled_without_a_token() -> None:
    async for api in make_api(config()):
        await api.tick()
        status, body = await api.call("POST", f"/v1/deployments/{NAME}/pause", headers=AUTH)
        assert status == 403
        assert "disabled: no token configured" in body["error"]
        assert "AUTOSCALERD_TEST_UNSET_TOKEN" in body["error"]


async def test_token_from_the_named_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALERD_TEST_UNSET_TOKEN", TOKEN)
    async for api in make_api(config()):
        await api.tick()
        status, _ = await api.call("POST", f"/v1/deployments/{NAME}/pause", WHY, AUTH)
        assert status == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"replicas": 3', "malformed JSON"),
        ("", "must be a JSON object"),
        ("[3]", "must be a JSON object"),
        ("{}", "replicas: required"),
        ('{"replicas": "3"}', "replicas: must be an integer"),
        ('{"replicas": 3.5}', "replicas: must be an integer"),
        ('{"replicas": true}', "replicas: must be an integer"),
        ('{"replicas": -1}', "replicas: must be >= 0"),
        ('{"replicas": 3, "ttl_s": 0}', "ttl_s: must be"),
        ('{"replicas": 3, "ttl_s": -5}', "ttl_s: must be"),
        ('{"replicas": 3, "ttl_s": "600"}', "ttl_s: must be"),
        ('{"replicas": 3, "ttl_s": Infinity}', "ttl_s: must be"),
        ('{"replicas": 3, "ttl_s": 1e12}', "ttl_s: must be"),
        ('{"replicas": 3, "ttl_s": 1' + "0" * 400 + "}", "ttl_s: must be"),  # no float fits
        ('{"replicas": 3, "until": 5}', "unknown field; known: replicas, ttl_s, reason, by"),
        ('{"replicas": 3, "replcas": 5}', "unknown field 'replcas'; did you mean 'replicas'?"),
        # A secret pasted where a key goes is not echoed back (or logged).
        ('{"replicas": 3, "Bearer s3cr3t": 1}', "unknown field; known:"),
    ],
)
async def test_bad_override_bodies_are_400_with_a_reason(api: Api, body: str, message: str) -> None:
    await api.tick()
    status, answer = await api.call(
        "POST", f"/v1/deployments/{NAME}/override", body=body, headers=AUTH
    )
    assert status == 400 and message in answer["error"], answer
    assert api.controller.deployments[NAME].override_replicas is None


async def test_override_is_clipped_applied_and_expires(api: Api) -> None:
    await api.tick()
    status, body = await api.call(
        "POST",
        f"/v1/deployments/{NAME}/override",
        '{"replicas": 50, "ttl_s": 3, "reason": "tests"}',
        AUTH,
    )
    assert status == 200 and body["override"]["replicas"] == 6  # clipped to max_replicas
    await api.tick()
    decision = api.controller.deployments[NAME].last_decision
    assert decision is not None and decision.target_replicas == 6
    assert "override" in [r.value for r in decision.reasons]
    await api.tick(3)  # past the ttl: the policy decides again (and waits to scale down)
    runtime = api.controller.deployments[NAME]
    assert runtime.override_replicas is None
    assert runtime.last_decision is not None
    assert "override" not in [r.value for r in runtime.last_decision.reasons]
    status, body = await api.call(
        "POST", f"/v1/deployments/{NAME}/override", '{"replicas": 0, "reason": "tests"}', AUTH
    )
    # Clipped to min_replicas; without ttl_s it ends after http.override_default_ttl_s.
    assert body["override"] == {"replicas": 2, "until_s": api.now_s + 3600, "remaining_s": 3600}
    status, body = await api.call("POST", f"/v1/deployments/{NAME}/resume", WHY, AUTH)
    assert status == 200 and body["paused"] is False
    assert body["override"] is None and body["operator"] is None
    assert body["recorded"]["action"] == "resume" and body["recorded"]["by"] == "token"


async def test_pause_holds_the_target_and_is_still_decided(api: Api) -> None:
    await api.tick()
    # The name's slash may also be percent-encoded.
    status, body = await api.call("POST", "/v1/deployments/llm%2Fchat/pause", WHY, AUTH)
    assert status == 200 and body["paused"] is True
    api.sensor.rate_per_s = 60.0
    await api.tick()
    status, body = await api.call("GET", f"/v1/decisions?deployment={NAME}&limit=1")
    [decision] = body["decisions"]
    assert decision["target_replicas"] == 4 and "paused" in decision["reasons"]
    metrics = await (await api.client.get("/metrics")).text()
    assert 'autoscalerd_paused{application="llm",deployment="chat"} 1.0' in metrics
    # Ray Serve's two labels, and the process collectors alongside.
    assert "process_cpu_seconds_total" in metrics and "python_info{" in metrics
    assert 'reason="paused"' in metrics
    await api.call("POST", f"/v1/deployments/{NAME}/resume", WHY, AUTH)
    await api.tick()
    status, body = await api.call("GET", "/v1/status")
    assert body["deployments"][NAME]["last_decision"]["target_replicas"] == 6


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("POST", "/v1/deployments/llm/other/pause", 404, "'llm/other' is not managed"),
        ("GET", f"/v1/deployments/{NAME}/pause", 405, "method not allowed"),
        ("GET", "/v1/nothing", 404, "not found"),
        ("GET", "/v1/decisions?limit=ten", 400, "limit: must be an integer"),
        ("GET", "/v1/decisions?limit=0", 400, "limit: must be within"),
        ("GET", "/v1/decisions?limit=5000", 400, "limit: must be within"),
        ("GET", "/v1/decisions?deployment=x/y", 404, "'x/y' is not managed"),
        ("GET", "/v1/decisions?changed=maybe", 400, "changed: must be true or false"),
        ("GET", "/v1/decisions?deploymnet=x", 400, "did you mean 'deployment'"),
    ],
)
async def test_bad_requests_get_json_errors(
    api: Api, method: str, path: str, status: int, message: str
) -> None:
    await api.tick()
    got, body = await api.call(method, path, headers=AUTH)
    assert got == status and message in body["error"], body


async def test_decisions_ring_filters_and_limits(api: Api) -> None:
    await api.tick(5)
    status, body = await api.call("GET", "/v1/decisions?limit=3")
    assert status == 200 and body["count"] == 3
    times = [d["decided_at_s"] for d in body["decisions"]]
    assert times == sorted(times) and times[-1] == api.now_s
    status, body = await api.call("GET", "/v1/decisions?changed=true")
    assert [d["target_replicas"] for d in body["decisions"]] == [4]


# ---------------------------------------------------------------- the audit trail


@pytest.mark.parametrize(
    ("action", "body", "message"),
    [
        ("pause", None, "reason: required; say why in the body"),
        ("pause", "{}", "reason: required"),
        ("pause", '{"reason": "   "}', "reason: required"),
        ("pause", '{"reason": null}', "reason: required"),
        ("resume", None, 'reason: required; say why in the body, e.g. {"reason": "failover done"}'),
        ("override", '{"replicas": 3}', "reason: required"),
        ("override", '{"replicas": 3, "ttl_s": 60, "by": "alice"}', "reason: required"),
        ("pause", '{"reason": 7}', "reason: must be a string, got 7"),
        ("pause", '{"reason": "a\\nb"}', "reason: must be one line of printable text"),
        ("pause", '{"reason": "\\ud800"}', "reason: must be one line of printable text"),
        ("pause", '{"reason": "' + "x" * 301 + '"}', "reason: at most 300 characters, got 301"),
        ("pause", '{"reason": "r", "by": ["alice"]}', "by: must be a string"),
        ("pause", '{"reason": "r", "by": "' + "b" * 65 + '"}', "by: at most 64 characters"),
        ("pause", '{"reason": "r", "ttl_s": 0}', "ttl_s: must be a number of seconds"),
        ("pause", '{"reason": "r", "replicas": 3}', "unknown field; known: reason, by, ttl_s"),
        ("resume", '{"reason": "r", "ttl_s": 5}', "unknown field; known: reason, by"),
        ("pause", "[1]", 'body: must be a JSON object, e.g. {"reason"'),
    ],
)
async def test_an_operator_change_without_a_good_reason_is_a_400(
    api: Api, action: str, body: str | None, message: str
) -> None:
    await api.tick()
    status, answer = await api.call("POST", f"/v1/deployments/{NAME}/{action}", body, AUTH)
    assert status == 400 and message in answer["error"], answer
    assert list(answer) == ["error"] and "\n" not in answer["error"]
    runtime = api.controller.deployments[NAME]
    assert not runtime.paused and runtime.override_replicas is None
    assert runtime.operator_history == ()


async def test_who_why_since_and_until_are_shown_logged_and_expire(api: Api) -> None:
    await api.tick()
    pause = '{"by": "alice", "reason": "incident 4711: failover", "ttl_s": 3}'
    with capture_logs() as events:
        status, body = await api.call("POST", f"/v1/deployments/{NAME}/pause", pause, AUTH)
    assert status == 200
    since_s = api.now_s
    current = {
        "action": "pause",
        "replicas": None,
        "by": "alice",
        "reason": "incident 4711: failover",
        "since_s": since_s,
        "until_s": since_s + 3,
        "remaining_s": 3.0,
    }
    assert body["operator"] == current and body["paused"] is True
    [event] = [e for e in events if e["event"] == "operator_pause"]
    assert {k: event[k] for k in ("deployment", "by", "reason", "until_s")} == {
        "deployment": NAME,
        "by": "alice",
        "reason": "incident 4711: failover",
        "until_s": since_s + 3,
    }
    await api.tick()
    chat = (await api.call("GET", "/v1/status"))[1]["deployments"][NAME]
    assert chat["operator"] == {**current, "remaining_s": 2.0}
    assert chat["operator_history"] == [
        {
            "action": "pause",
            "by": "alice",
            "reason": "incident 4711: failover",
            "at_s": since_s,
            "until_s": since_s + 3,
            "replicas": None,
        }
    ]
    with capture_logs() as events:
        await api.tick(2)  # the pause's time is up: the tick ends it
    runtime = api.controller.deployments[NAME]
    assert runtime.paused is False and runtime.operator_action is None
    assert runtime.last_decision is not None
    assert "paused" not in [r.value for r in runtime.last_decision.reasons]
    [expired] = [e for e in events if e["event"] == "operator_expired"]
    assert expired["deployment"] == NAME and expired["ended"] == ["pause"]
    assert expired["reason"] == "pause reached its until_s (set by alice: incident 4711: failover)"
    chat = (await api.call("GET", "/v1/status"))[1]["deployments"][NAME]
    assert chat["operator"] is None
    assert [(a["action"], a["by"]) for a in chat["operator_history"]] == [
        ("pause", "alice"),
        ("expire", "autoscalerd"),
    ]


async def test_the_newest_instruction_wins_and_the_trail_keeps_the_last_ten(api: Api) -> None:
    await api.tick()
    path = f"/v1/deployments/{NAME}"
    await api.call("POST", f"{path}/override", '{"replicas": 5, "reason": "load test"}', AUTH)
    status, body = await api.call("POST", f"{path}/pause", '{"reason": "hold it"}', AUTH)
    assert status == 200 and body["paused"] is True and body["override"] is None
    assert body["operator"]["action"] == "pause" and body["operator"]["until_s"] is None
    status, body = await api.call(
        "POST", f"{path}/override", '{"replicas": 3, "reason": "r"}', AUTH
    )
    assert status == 200 and body["operator"]["action"] == "override"
    assert body["paused"] is False and body["operator"]["replicas"] == 3
    assert body["operator"]["by"] == "token"
    for index in range(12):
        await api.call("POST", f"{path}/resume", f'{{"reason": "resume {index}"}}', AUTH)
    history = (await api.call("GET", "/v1/status"))[1]["deployments"][NAME]["operator_history"]
    assert len(history) == 10 and history[-1]["reason"] == "resume 11"


async def test_the_token_label_and_the_default_override_ttl_come_from_the_config() -> None:
    async for api in make_api(
        config(token=TOKEN, token_label="ops-bot", override_default_ttl_s=30)
    ):
        await api.tick()
        # A token pasted into a reason is not kept.
        body = f'{{"replicas": 3, "reason": "asked with {TOKEN}"}}'
        status, answer = await api.call("POST", f"/v1/deployments/{NAME}/override", body, AUTH)
        assert status == 200, answer
        operator = answer["operator"]
        assert operator["by"] == "ops-bot" and operator["until_s"] == api.now_s + 30
        assert operator["reason"] == "asked with [redacted]"


async def test_the_trail_survives_a_restart_and_old_state_files_still_load(api: Api) -> None:
    await api.tick()
    body = '{"replicas": 4, "ttl_s": 600, "by": "bob", "reason": "launch"}'
    await api.call("POST", f"/v1/deployments/{NAME}/override", body, AUTH)
    await api.tick()
    text = state.encode(state.Snapshot(api.now_s, 0.0, None, api.controller.snapshot(api.now_s)))
    restarted = Controller(api.controller.config, [api.sensor], [], VirtualClock(api.now_s))
    restarted.restored = dict(state.decode(text).deployments)
    await restarted.tick(api.now_s + 1)
    runtime = restarted.deployments[NAME]
    assert runtime.override_replicas == 4 and runtime.override_until_s == api.now_s - 1 + 600
    assert runtime.operator_action is not None and runtime.operator_action.by == "bob"
    assert [a.action for a in runtime.operator_history] == ["override"]
    # A file written before the trail was kept: the same format, the pause without its record.
    raw = json.loads(text)
    saved = raw["deployments"][NAME]
    for key in ("paused_until_s", "operator_action", "operator_history"):
        del saved[key]
    saved.update(paused=True, override_replicas=None, override_until_s=None)
    old = state.decode(json.dumps(raw)).deployments[NAME]
    assert old.paused and old.operator_action is None and old.operator_history == ()
    restarted = Controller(api.controller.config, [api.sensor], [], VirtualClock(api.now_s))
    restarted.restored = {NAME: old}
    await restarted.tick(api.now_s + 1)
    shown = server._operator(restarted.deployments[NAME], api.now_s + 1)
    assert shown is not None and shown["action"] == "pause"
    assert shown["by"] is None and shown["until_s"] is None


# ---------------------------------------------------------------- reads behind the token


async def test_reads_need_the_token_when_configured() -> None:
    async for api in make_api(config(token=TOKEN, require_token_for_reads=True)):
        await api.tick()
        for path in ("/v1/status", "/v1/decisions", "/v1/nothing"):
            status, body = await api.call("GET", path)
            assert status == 401 and "authorization required" in body["error"], (path, body)
            status, body = await api.call("GET", path, headers={"Authorization": "Bearer no"})
            assert status == 403 and body == {"error": "wrong token"}
        assert (await api.call("GET", "/v1/status", headers=AUTH))[0] == 200
        metrics = await api.client.get("/metrics")
        assert metrics.status == 401 and "authorization required" in (await metrics.json())["error"]
        assert (await api.client.head("/metrics")).status == 401
        metrics = await api.client.get("/metrics", headers=AUTH)
        assert metrics.status == 200 and "autoscalerd_ticks_total" in await metrics.text()
        # Probes cannot send tokens: health and readiness stay open.
        assert (await api.call("GET", "/healthz"))[0] == 200
        assert (await api.call("GET", "/readyz"))[0] == 200


async def test_reads_are_refused_when_they_need_a_token_and_none_is_configured() -> None:
    async for api in make_api(config(require_token_for_reads=True)):
        status, body = await api.call("GET", "/v1/status", headers=AUTH)
        assert status == 403
        assert "require_token_for_reads" in body["error"]
        assert "AUTOSCALERD_TEST_UNSET_TOKEN" in body["error"]


async def test_no_configured_token_is_ever_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    ray_token = "ray-s3cret-from-the-cluster"
    monkeypatch.setenv("AUTOSCALERD_TEST_UNSET_TOKEN", "env-s3cret")
    cfg = config(token=TOKEN)
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"token": ray_token})})
    async for api in make_api(cfg):
        await api.tick()
        # A sensor whose error echoes what the dashboard sent back.
        api.sensor.fail_with = f"dashboard said: Authorization: Bearer {ray_token} ({TOKEN})"
        await api.tick()
        for path in ("/v1/status", "/readyz", "/v1/decisions", "/metrics", "/healthz"):
            text = await (await api.client.get(path, headers=AUTH)).text()
            for secret in (ray_token, TOKEN, "env-s3cret"):
                assert secret not in text, (path, secret)
        body = (await api.call("GET", "/v1/status"))[1]
        assert "[redacted]" in body["sensors"]["rate"]["error"]


def test_the_kuberay_sidecar_keeps_reads_behind_the_token() -> None:
    import yaml

    from autoscalerd.config import parse_config

    path = Path(__file__).resolve().parents[1] / "config" / "kubernetes" / "kuberay-sidecar.yaml"
    configmap = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ConfigMap")
    http = parse_config(configmap["data"]["config.yaml"], source="kuberay-sidecar").http
    assert http.addr.startswith("0.0.0.0:") and http.require_token_for_reads is True
