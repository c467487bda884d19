"""A scriptable Ray head on loopback: the dashboard's Serve REST API, node list and scale
endpoint, and each node's Prometheus endpoint, in the shapes Ray 2.60 gives them.

It runs on its own event loop in a thread, so the test drives it with plain calls while
the real `autoscalerd run` process talks to it over real sockets. Load is a request rate
that routers on every node share evenly; counters grow with wall time as Ray's do.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

APP, DEPLOYMENT = "llm", "chat"
NAME = f"{APP}/{DEPLOYMENT}"
COMMON = 'Component="core_worker",SessionName="session_x",Version="2.60.0"'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Node:
    node_id: str
    port: int
    # Faults of this node's metrics endpoint.
    down: bool = False  # answers 500
    garbage: bool = False  # answers text that is not Prometheus exposition
    nan: bool = False  # every value NaN
    # What the node's router counter has counted (requests), and since when it grows.
    counted: float = 0.0
    counting_since_s: float = field(default_factory=time.monotonic)


@dataclass
class Scale:
    """One scale request as the dashboard received it."""

    at_s: float  # time.monotonic()
    target: int
    status: int


class FakeRay:
    def __init__(self, nodes: int = 2, replicas: int = 10, rate_per_s: float = 95.0) -> None:
        self.lock = threading.Lock()
        self.dashboard_port = free_port()
        self.nodes = [Node(f"node{i}", free_port()) for i in range(nodes)]
        self.target = replicas
        self.rate_per_s = rate_per_s
        self.external_scaler_enabled = True
        self.controller_id = "controller-1"
        self.first_pid = 41000  # replica i runs as process first_pid + i
        # Faults of the dashboard.
        self.dashboard_down = False  # refuse: answer 503 to everything
        self.nodes_delay_s = 0.0  # the node list answers this late
        self.scale_status = 200  # 503: the controller is unavailable; 412: not enabled
        self.scale_delay_s = 0.0  # longer than the actuator's deadline: a timeout
        self.scales: list[Scale] = []
        self._loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._ready = threading.Event()

    # ------------------------------------------------------------------ scripting

    def set_rate(self, rate_per_s: float) -> None:
        with self.lock:
            for node in self.nodes:
                self._settle(node)
            self.rate_per_s = rate_per_s

    def reset_counters(self) -> None:
        """Every process restarted: counters start again from zero."""
        with self.lock:
            for node in self.nodes:
                node.counted = 0.0
                node.counting_since_s = time.monotonic()

    def restart_head(self, replicas: int = 1) -> None:
        """The head restarted: a new Serve controller, apps redeployed at `replicas`,
        counters from zero."""
        self.reset_counters()
        with self.lock:
            self.controller_id = f"controller-{time.monotonic_ns()}"
            self.target = replicas

    def set_target(self, replicas: int) -> None:
        """Someone else scaled the deployment (an operator, another controller)."""
        with self.lock:
            self.target = replicas

    def scale_targets(self, since_s: float = 0.0) -> list[int]:
        with self.lock:
            return [s.target for s in self.scales if s.at_s >= since_s and s.status == 200]

    def scale_requests(self, since_s: float = 0.0) -> list[Scale]:
        with self.lock:
            return [s for s in self.scales if s.at_s >= since_s]

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeRay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake Ray did not start")
        return self

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner in self._runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start_sites())
        self._ready.set()
        self._loop.run_forever()

    async def _start_sites(self) -> None:
        dashboard = web.Application()
        dashboard.router.add_get("/api/serve/applications/", self._applications)
        dashboard.router.add_get("/nodes", self._node_list)
        dashboard.router.add_post(
            "/api/v1/applications/{app}/deployments/{deployment}/scale", self._scale
        )
        self.dashboard_port = await self._site(dashboard, self.dashboard_port)
        for node in self.nodes:
            app = web.Application()
            app.router.add_get("/metrics", self._metrics_of(node))
            node.port = await self._site(app, node.port)

    async def _site(self, app: web.Application, port: int) -> int:
        """Serve `app` on `port`, or on another free one if something took it since it was
        picked (the ports are read only once the fake has started)."""
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for _ in range(5):
            try:
                await web.TCPSite(runner, "127.0.0.1", port).start()
                break
            except OSError:
                port = free_port()
        else:
            await web.TCPSite(runner, "127.0.0.1", port).start()
        self._runners.append(runner)
        return port

    # ------------------------------------------------------------------ the dashboard

    async def _applications(self, request: web.Request) -> web.Response:
        if self.dashboard_down:
            return web.json_response({"error": "dashboard unavailable"}, status=503)
        with self.lock:
            replicas = [
                {
                    "state": "RUNNING",
                    "replica_id": f"r{i}",
                    "worker_id": f"w{i}",
                    "node_id": self.nodes[i % len(self.nodes)].node_id,
                    "node_ip": "127.0.0.1",
                    "pid": self.first_pid + i,
                }
                for i in range(self.target)
            ]
            body = {
                "controller_info": {"actor_id": self.controller_id},
                "applications": {
                    APP: {
                        "external_scaler_enabled": self.external_scaler_enabled,
                        "deployment_topology": {"ingress_deployment": DEPLOYMENT},
                        "deployments": {
                            DEPLOYMENT: {
                                "target_num_replicas": self.target,
                                "required_resources": {"CPU": 1.0},
                                "deployment_config": {"max_ongoing_requests": 8},
                                "replicas": replicas,
                            }
                        },
                    }
                },
            }
        return web.json_response(body)

    async def _node_list(self, request: web.Request) -> web.Response:
        if self.dashboard_down:
            return web.json_response({"error": "dashboard unavailable"}, status=503)
        if self.nodes_delay_s:
            await asyncio.sleep(self.nodes_delay_s)
        summary = [
            {
                "raylet": {
                    "state": "ALIVE",
                    "nodeId": node.node_id,
                    "nodeManagerAddress": "127.0.0.1",
                    "metricsExportPort": node.port,
                }
            }
            for node in self.nodes
        ]
        return web.json_response({"result": True, "data": {"summary": summary}})

    async def _scale(self, request: web.Request) -> web.Response:
        body = await request.json()
        target = int(body["target_num_replicas"])
        if self.scale_delay_s:
            await asyncio.sleep(self.scale_delay_s)
        status = 200 if self.dashboard_down is False else 503
        if self.scale_status != 200:
            status = self.scale_status
        elif not self.external_scaler_enabled:
            status = 412
        with self.lock:
            self.scales.append(Scale(time.monotonic(), target, status))
            if status == 200:
                self.target = target
        if status == 200:
            return web.json_response({"message": "ok"})
        return web.json_response({"error": f"HTTP {status}"}, status=status)

    # ------------------------------------------------------------------ node metrics

    def _settle(self, node: Node) -> None:
        now_s = time.monotonic()
        node.counted += (now_s - node.counting_since_s) * self.rate_per_s / len(self.nodes)
        node.counting_since_s = now_s

    def _metrics_of(self, node: Node) -> Callable[[web.Request], Any]:
        async def metrics(request: web.Request) -> web.Response:
            if node.down:
                return web.Response(status=500, text="internal error")
            if node.garbage:
                return web.Response(text="<html>\x00 this is not { prometheus\n")
            with self.lock:
                self._settle(node)
                counted = node.counted
                # Little: each request holds one of 8 slots for 0.8 s: 10 per s per replica.
                ongoing = self.rate_per_s * 0.8 / len(self.nodes)
            value: Callable[[float], str] = (
                (lambda _v: "NaN") if node.nan else (lambda v: repr(float(v)))
            )
            labels = f'{COMMON},WorkerId="proxy-{node.node_id}",application="{APP}"'
            labels += f',deployment="{DEPLOYMENT}"'
            text = (
                "# TYPE ray_serve_num_router_requests_total counter\n"
                f'ray_serve_num_router_requests_total{{{labels},route="/"}} {value(counted)}\n'
                "# TYPE ray_serve_deployment_request_counter_total counter\n"
                f"ray_serve_deployment_request_counter_total{{{labels}}} "
                f"{value(counted)}\n"
                "# TYPE ray_serve_num_ongoing_requests_at_replicas gauge\n"
                f"ray_serve_num_ongoing_requests_at_replicas{{{labels}}} {value(ongoing)}\n"
                "# TYPE ray_serve_deployment_queued_queries gauge\n"
                f"ray_serve_deployment_queued_queries{{{labels}}} {value(0.0)}\n"
            )
            return web.Response(text=text, content_type="text/plain")

        return metrics


def needed(rate_per_s: float, per_replica_per_s: float = 10.0) -> int:
    return max(1, math.ceil(rate_per_s / per_replica_per_s))
