"""Real inputs the mutations start from: shipped configs and traces, state files written by
the decision pipeline itself, Ray 2.60's Prometheus text and Serve API answers."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import yaml

from autoscalerd import state
from autoscalerd.config import Config, DeploymentConfig
from autoscalerd.decide import policy
from autoscalerd.decide.forgetting import Sums
from autoscalerd.forecast.holt_winters import FittedModel, ForecasterState
from autoscalerd.model import DeploymentState, Histogram, Observation, Reading

REPO = Path(__file__).resolve().parents[2]
TRACE_HEAD_LINES = 50


# ---------------------------------------------------------------- config


@functools.cache
def configs() -> tuple[bytes, ...]:
    """The example configs, and the one the KubeRay manifest carries in its ConfigMap."""
    found = [
        (REPO / "config" / name).read_bytes()
        for name in ("backtest.yaml", "demo.yaml", "example.yaml", "ray.yaml", "replay.yaml")
    ]
    kuberay = REPO / "config" / "kubernetes" / "kuberay-sidecar.yaml"
    for document in yaml.safe_load_all(kuberay.read_text()):
        if isinstance(document, dict) and document.get("kind") == "ConfigMap":
            found.append(document["data"]["config.yaml"].encode())
    found.append(b"tick_s: 1\n")
    found.append(
        b"deployments:\n  - name: llm/chat\n    mode: ray-compatible\n"
        b"    autoscaling_config: {min_replicas: 0, max_replicas: 4, upscaling_factor: 2}\n"
    )
    return tuple(found)


# ---------------------------------------------------------------- state files


def _config(**settings: object) -> DeploymentConfig:
    return Config.model_validate({"deployments": [{"name": "app/dep", **settings}]}).deployment(
        "app/dep"
    )


def observation(
    now_s: float, rate_per_s: float, vllm: bool, deployment: str = "app/dep"
) -> Observation:
    """What the sensors report of a deployment in one tick; with `vllm`, every input of the
    replica model and the SLO guard too."""

    def reading(value: float) -> Reading:
        return Reading(value, now_s)

    fields: dict[str, object] = {
        "arrival_rate_per_s": reading(rate_per_s),
        "completion_rate_per_s": reading(rate_per_s * 0.95),
        "ongoing_requests": reading(rate_per_s * 0.5),
        "queued_requests": reading(1.0),
        "running_replicas": reading(2.0),
        "starting_replicas": reading(0.0),
        "platform_target_replicas": reading(2.0),
        "metrics_coverage_ratio": reading(1.0),
    }
    if vllm:
        fields |= {
            "ttft_p99_s": reading(0.6),
            "e2e_p99_s": reading(4.0),
            "queue_wait_p99_s": reading(0.2),
            "kv_cache_usage_ratio": reading(0.5),
            "max_ongoing_requests": reading(8.0),
            "prompt_token_rate_per_s": reading(rate_per_s * 900.0),
            "output_token_rate_per_s": reading(rate_per_s * 180.0),
            "prefill_seconds_per_s": reading(rate_per_s * 0.11),
            "prefilled_request_rate_per_s": reading(rate_per_s),
            "prompt_tokens_sq_mean": reading(1.2e6),
            "tpot_mean_s": reading(0.045),
            "decode_batch_mean": reading(3.0),
            "ttft_histogram": Histogram((0.1, 0.5, 1.0), (4.0, 6.0, 2.0, 1.0), now_s),
            "prompt_tokens_histogram": Histogram((100.0, 1000.0), (3.0, 8.0, 1.0), now_s),
            "router_wait_histogram": Histogram((0.01, 0.1), (9.0, 3.0, 0.0), now_s),
            "queue_wait_histogram": Histogram((0.05, 0.5), (7.0, 4.0, 1.0), now_s),
        }
    return Observation(deployment, now_s, **fields)


def _run(cfg: DeploymentConfig, ticks: int, vllm: bool) -> DeploymentState:
    """The state `decide` leaves after `ticks` one-second ticks of a tide of traffic."""
    current = policy.initial_state(cfg, 0.0, 2)
    for tick in range(1, ticks + 1):
        now_s = float(tick)
        rate_per_s = 20.0 + 15.0 * ((tick // 20) % 2)
        _, current = policy.decide(observation(now_s, rate_per_s, vllm), current, cfg, now_s)
        current = policy.refit_forecaster(current, cfg, now_s)
    return current


def _fitted(decided: DeploymentState) -> DeploymentState:
    model = FittedModel(
        method="holt_winters",
        alpha=0.3,
        level=12.5,
        beta=0.1,
        phi=0.98,
        trend=-0.25,
        gamma=0.05,
        seasonal="add",
        season=(1.0, -1.0, 0.5),
        buckets_seen=40,
        fitted_buckets=36,
        residual_rms_per_s=0.7,
        fit_errors=(0.1, -0.2),
        history_tail=(2.0, 3.5),
    )
    forecaster = ForecasterState(
        bucket_start_s=120.0,
        bucket_arrivals=33.0,
        bucket_covered_s=3.0,
        history=(1.0, 2.0, 3.5),
        closed_buckets=40,
        model=model,
        last_fit_at_s=100.0,
        errors=(0.5, -0.5),
        ewma_rate_per_s=2.25,
    )
    return decided.with_(forecaster=forecaster)


@functools.cache
def state_files() -> tuple[bytes, ...]:
    """State files as the daemon writes them, from states the pipeline itself produced."""
    small_buckets = {"bucket_s": 5, "season_length": 4, "history_seasons": 2}
    plain = _run(_config(), 40, vllm=False)
    # Long enough for every learned sum to exist (the burst ratio needs a 64-tick window);
    # this tide overloads the model's prefill, which stretches nothing: a path stretch
    # learned elsewhere is set by hand, so the fuzzer mutates its sums too.
    learned = _run(_config(slo={"ttft_s": 1.0, "e2e_s": 10.0}), 80, vllm=True)
    learned = learned.with_(
        replica_model=dataclasses.replace(
            learned.replica_model, stretch=Sums((40.0, 52.0), 60, 80.0)
        )
    )
    forecast = _run(_config(forecast={**small_buckets, "refit_interval_s": 20}), 120, vllm=False)
    ray = _run(_config(mode="ray-compatible"), 40, vllm=False)
    snapshots = [
        state.Snapshot(40.0, 1.7e9, None, {"app/dep": state.SavedDeployment(40.0, plain)}),
        state.Snapshot(
            80.0,
            1.7e9,
            0.0,
            {
                "app/dep": state.SavedDeployment(
                    80.0,
                    learned,
                    paused=True,
                    override_replicas=4,
                    override_until_s=900.0,
                    applied_replicas=2,
                )
            },
        ),
        state.Snapshot(
            120.0,
            1.7e9,
            None,
            {
                "app/dep": state.SavedDeployment(120.0, forecast, applied_replicas=3),
                "app/other": state.SavedDeployment(100.0, _fitted(plain)),
            },
        ),
        state.Snapshot(40.0, 1.7e9, None, {"app/dep": state.SavedDeployment(40.0, ray)}),
        state.Snapshot(0.0, 0.0, None, {}),
    ]
    return tuple(state.encode(snapshot).encode() for snapshot in snapshots)


# ---------------------------------------------------------------- traces


@functools.cache
def traces() -> tuple[bytes, ...]:
    """The heads of the shipped traces, and every format tests/test_traces.py writes."""
    heads = []
    for path in sorted((REPO / "data" / "traces").iterdir()):
        if path.suffix in (".csv", ".jsonl"):
            with path.open("rb") as handle:
                heads.append(b"".join(next(handle) for _ in range(TRACE_HEAD_LINES)))
    written = [
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,100,20,120,Conversation log\n6.5,GPT-4,300,0,300,API log\n",
        '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1500, "input_length": 100, "output_length": 7, "hash_ids": []}\n',
        "timestamp,prompt_tokens,output_tokens\n10.5,5,6\n12,7,8\n",
        "timestamp,prompt_tokens,output_tokens\n"
        "2024-05-10T00:00:00Z,5,6\n2024-05-10T00:00:02.25Z,7,8\n",
        "period,count\n2024-01-01 00:00,3\n2024-01-01 00:01,0\n2024-01-01 00:02,5\n",
        "Time,n\n2024-05-10 00:00:00,1\n2024-05-10 00:00:10,1\n2024-05-10 00:00:20,4\n",
        "Time,n\n1677-01-01,1\n1677-01-02,2\n",
        " timestamp , prompt_tokens , output_tokens \n1,2,3\n2,3,4\n",
    ]
    return tuple(heads) + tuple(text.encode() for text in written)


# ---------------------------------------------------------------- Prometheus text

# Labels Ray 2.60 puts on every series of a node's metrics port.
_COMMON = 'Component="core_worker",NodeAddress="192.0.2.2",SessionName="s",Version="2.60.0"'
_REPLICA = f'{_COMMON},WorkerId="w-rep",application="llm",deployment="LlmReplica",replica="r1"'
# Copied from a Ray 2.60 node (tests/ray/test_prometheus_text.py), values filled in.
RAY_TEXT = f"""# HELP ray_node_cpu_utilization Total CPU usage
# TYPE ray_node_cpu_utilization gauge
ray_node_cpu_utilization{{ip="192.0.2.2"}} 12.5
# HELP ray_serve_num_router_requests_total The number of requests processed by the router.
# TYPE ray_serve_num_router_requests_total counter
ray_serve_num_router_requests_total{{{_COMMON},WorkerId="w-proxy",application="llm",deployment="LlmReplica",handle="h1",route="/llm"}} 31.0
# TYPE ray_serve_replica_processing_queries gauge
ray_serve_replica_processing_queries{{{_REPLICA}}} 2.0
# TYPE ray_serve_deployment_processing_latency_ms histogram
ray_serve_deployment_processing_latency_ms_bucket{{{_REPLICA},le="100.0",route="/llm"}} 4.0
ray_serve_deployment_processing_latency_ms_bucket{{{_REPLICA},le="1000.0",route="/llm"}} 9.0
ray_serve_deployment_processing_latency_ms_bucket{{{_REPLICA},le="+Inf",route="/llm"}} 9.0
ray_serve_deployment_processing_latency_ms_count{{{_REPLICA},route="/llm"}} 9.0
ray_serve_deployment_processing_latency_ms_sum{{{_REPLICA},route="/llm"}} 1.0
# TYPE ray_serve_http_request_latency_ms histogram
ray_serve_http_request_latency_ms_bucket{{{_COMMON},WorkerId="w-proxy",application="llm",le="+Inf",method="POST",route="/llm",status_code="200"}} 0.0
# TYPE ray_vllm_num_requests_running gauge
ray_vllm_num_requests_running{{{_COMMON},WorkerId="w-rep",model_name="m"}} 3.0
"""
# What tests/faults/fake_ray.py serves from each node.
_FAKE = f'{_COMMON},WorkerId="proxy-n1",application="app",deployment="Dep"'
FAKE_RAY_TEXT = f"""# TYPE ray_serve_num_router_requests_total counter
ray_serve_num_router_requests_total{{{_FAKE},route="/"}} 123.5
# TYPE ray_serve_deployment_request_counter_total counter
ray_serve_deployment_request_counter_total{{{_FAKE}}} 120.25
# TYPE ray_serve_num_ongoing_requests_at_replicas gauge
ray_serve_num_ongoing_requests_at_replicas{{{_FAKE}}} 38.0
# TYPE ray_serve_deployment_queued_queries gauge
ray_serve_deployment_queued_queries{{{_FAKE}}} 0.0
"""
# vLLM's own families, as a replica in a Serve app exports them through Ray.
_VLLM = f'{_COMMON},WorkerId="w-rep",ReplicaId="llm#LlmReplica#abc",model_name="m"'
VLLM_TEXT = f"""# TYPE ray_vllm_time_to_first_token_seconds histogram
ray_vllm_time_to_first_token_seconds_bucket{{{_VLLM},le="0.1"}} 5.0
ray_vllm_time_to_first_token_seconds_bucket{{{_VLLM},le="1.0"}} 11.0
ray_vllm_time_to_first_token_seconds_bucket{{{_VLLM},le="+Inf"}} 12.0
ray_vllm_time_to_first_token_seconds_count{{{_VLLM}}} 12.0
ray_vllm_time_to_first_token_seconds_sum{{{_VLLM}}} 3.5
# TYPE ray_vllm_request_prompt_tokens histogram
ray_vllm_request_prompt_tokens_bucket{{{_VLLM},le="100.0"}} 2.0
ray_vllm_request_prompt_tokens_bucket{{{_VLLM},le="1000.0"}} 10.0
ray_vllm_request_prompt_tokens_bucket{{{_VLLM},le="+Inf"}} 12.0
# TYPE ray_vllm_prompt_tokens_total counter
ray_vllm_prompt_tokens_total{{{_VLLM}}} 9000.0
ray_vllm_prompt_tokens_created{{{_VLLM}}} 1.7e9
# TYPE ray_vllm_generation_tokens_total counter
ray_vllm_generation_tokens_total{{{_VLLM}}} 1800.0
# TYPE ray_vllm_time_per_output_token_seconds histogram
ray_vllm_time_per_output_token_seconds_count{{{_VLLM}}} 1800.0
ray_vllm_time_per_output_token_seconds_sum{{{_VLLM}}} 72.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{_VLLM}}} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{_VLLM}}} 0.42
"""


def prometheus() -> tuple[bytes, ...]:
    return tuple(text.encode() for text in (RAY_TEXT, FAKE_RAY_TEXT, VLLM_TEXT))


# ---------------------------------------------------------------- Serve's JSON

APPLICATIONS = {
    "controller_info": {"actor_id": "ctrl-1", "node_id": "n1"},
    "applications": {
        "llm": {
            "external_scaler_enabled": True,
            "deployment_topology": {"ingress_deployment": "LlmReplica"},
            "deployments": {
                "LlmReplica": {
                    "target_num_replicas": 2,
                    "required_resources": {"CPU": 0, "GPU": 1.0},
                    "deployment_config": {
                        "max_ongoing_requests": 8,
                        "ray_actor_options": {"num_cpus": 0, "num_gpus": 1, "resources": {}},
                    },
                    "replicas": [
                        {"state": "RUNNING", "replica_id": "r1", "worker_id": "w1", "node_id": "n1"},
                        {"state": "STARTING", "replica_id": "r2", "worker_id": "w2", "node_id": "n2"},
                        {"state": "STOPPING", "replica_id": "r0", "worker_id": "w0", "node_id": "n1"},
                    ],
                },
                "Router": {
                    "deployment_config": {
                        "max_ongoing_requests": 100,
                        "ray_actor_options": {
                            "num_cpus": 0.5,
                            "memory": 1e9,
                            "resources": {"custom": 2},
                        },
                    },
                    "replicas": [{"state": "RUNNING", "replica_id": "r3"}],
                },
            },
        }
    },
}  # fmt: skip
NODES = {
    "result": True,
    "data": {
        "summary": [
            {"raylet": {"state": "ALIVE", "nodeId": "n1", "nodeManagerAddress": "192.0.2.2",
                        "metricsExportPort": 8080}},
            {"raylet": {"state": "ALIVE", "nodeId": "n2", "nodeManagerAddress": "2001:db8::2",
                        "metricsExportPort": 8080}},
            {"raylet": {"state": "DEAD", "nodeId": "n3", "nodeManagerAddress": "192.0.2.3",
                        "metricsExportPort": 8080}},
        ]
    },
}  # fmt: skip
SERVICE_DISCOVERY = [
    {"labels": {"job": "ray"}, "targets": ["192.0.2.2:8080", "192.0.2.3:8080"]},
    {"labels": {"job": "ray"}, "targets": []},
]


def serve_json() -> tuple[bytes, ...]:
    return tuple(json.dumps(body).encode() for body in (APPLICATIONS, NODES, SERVICE_DISCOVERY))


# ---------------------------------------------------------------- Prometheus' HTTP API

# Instant-query answers as Prometheus writes them: a vector of the deployment's series
# (Ray's labels), a histogram's buckets, a scalar, an error, and an empty result.
_SERIES = {"application": "llm", "deployment": "LlmReplica", "replica": "r1"}
PROMETHEUS_ANSWERS = [
    {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": _SERIES, "value": [1796150000.123, "4.25"]},
                {"metric": {**_SERIES, "replica": "r2"}, "value": [1796150000.123, "0"]},
            ],
        },
    },
    {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {**_SERIES, "le": le}, "value": [1796150000.5, count]}
                for le, count in (("0.1", "3"), ("0.5", "7"), ("1", "9"), ("+Inf", "10"))
            ],
        },
    },
    {"status": "success", "data": {"resultType": "scalar", "result": [1796150000.5, "1"]}},
    {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"},
    {"status": "success", "data": {"resultType": "vector", "result": []}},
]


def prometheus_answers() -> tuple[bytes, ...]:
    return tuple(json.dumps(body).encode() for body in PROMETHEUS_ANSWERS)


# ---------------------------------------------------------------- the HTTP API

# An input is the Authorization header's value, a newline, and the request body.
HTTP_TOKEN = "s3cr3t-t0ken"


def http_requests() -> tuple[bytes, ...]:
    bodies = [
        b'{"replicas": 4, "ttl_s": 600}',
        b'{"replicas": 0}',
        b'{"replicas": 3, "ttl_s": null}',
        b'{"replicas": 2, "ttl_s": 0.5}',
        b"",
    ]
    headers = [f"Bearer {HTTP_TOKEN}".encode(), b"bearer wrong", b"Basic dXNlcjpwdw==", b""]
    return tuple(h + b"\n" + b for h in headers for b in bodies)
