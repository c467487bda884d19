"""An LLM-emulating Ray Serve app: replicas that take as long as a continuous-batching server.

A request `{"prompt_tokens": N, "output_tokens": M}` waits for the replica's one prefill
engine (first come, first served), is prefilled in `N / prefill_tokens_per_s`, then
decodes M tokens at `tpot(b) = tpot_s · (1 + tpot_slope · (b − 1))`, b the requests
decoding when its decode starts: the simulator's service model, so a demo on real Ray and
a backtest agree. Replicas ask for logical GPUs, so more replicas need more (fake) GPU
nodes.

Replicas export the vLLM series a vLLM engine in a Serve replica exports through Ray
(`ray_vllm_num_requests_running`, `ray_vllm_time_to_first_token_seconds`,
`ray_vllm_prompt_tokens_total`, `ray_vllm_request_queue_time_seconds`,
`ray_vllm_request_prefill_time_seconds`, `ray_vllm_request_prompt_tokens`,
`ray_vllm_time_per_output_token_seconds`, `ray_vllm_request_success_total`), so the
sensor's replica-model and TTFT paths run against a real cluster too.

Deploy with external scaling, so autoscalerd owns the replica count:

    serve.run(build_app({"num_gpus": 1}), name="llm", route_prefix="/llm",
              external_scaler_enabled=True)

or from a Serve config: `import_path: autoscalerd.emulator.llm_app:build_app`,
`external_scaler_enabled: true`, and no `autoscaling_config`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ray import serve
from ray.serve import Application
from ray.util import metrics
from starlette.requests import Request
from starlette.responses import JSONResponse

DEPLOYMENT_NAME = "LlmReplica"
MODEL_NAME = "emulated-llm"
# vLLM's default TTFT buckets (seconds), trimmed to the emulator's range.
_LATENCY_BUCKETS_S = [0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0]
# vLLM's 1-2-5 token buckets and its time-per-output-token buckets.
_TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]
_TPOT_BUCKETS_S = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0]


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """How long one emulated replica takes, in the simulator's terms."""

    prefill_tokens_per_s: float = 20_000.0
    tpot_s: float = 0.01
    tpot_slope: float = 0.0
    # Upper bounds on one request, so a stray body cannot hold a replica for long.
    max_prompt_tokens: int = 32_768
    max_output_tokens: int = 4_096

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> ServiceModel:
        unknown = set(args) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown service model setting(s) {sorted(unknown)}")
        model = cls()
        return cls(
            prefill_tokens_per_s=float(
                args.get("prefill_tokens_per_s", model.prefill_tokens_per_s)
            ),
            tpot_s=float(args.get("tpot_s", model.tpot_s)),
            tpot_slope=float(args.get("tpot_slope", model.tpot_slope)),
            max_prompt_tokens=int(args.get("max_prompt_tokens", model.max_prompt_tokens)),
            max_output_tokens=int(args.get("max_output_tokens", model.max_output_tokens)),
        )


class LlmReplica:
    """One emulated inference server; its batch is the requests it holds right now."""

    def __init__(self, model: Mapping[str, Any] | None = None) -> None:
        self._model = ServiceModel.from_args(model or {})
        self._ongoing = 0
        self._decoding = 0
        # The one prefill engine; asyncio's lock hands over first come, first served.
        self._engine = asyncio.Lock()
        tags = {"model_name": MODEL_NAME}
        # Names as vLLM's Ray metrics wrapper spells them; Ray adds the `ray_` prefix.
        self._running = metrics.Gauge("vllm_num_requests_running", tag_keys=("model_name",))
        self._waiting = metrics.Gauge("vllm_num_requests_waiting", tag_keys=("model_name",))
        self._prompt_tokens = metrics.Counter("vllm_prompt_tokens", tag_keys=("model_name",))
        self._generation_tokens = metrics.Counter(
            "vllm_generation_tokens", tag_keys=("model_name",)
        )

        def histogram(name: str, bounds: list[float] | list[int]) -> metrics.Histogram:
            return metrics.Histogram(
                name, boundaries=[float(b) for b in bounds], tag_keys=("model_name",)
            )

        self._ttft = histogram("vllm_time_to_first_token_seconds", _LATENCY_BUCKETS_S)
        self._queue_time = histogram("vllm_request_queue_time_seconds", _LATENCY_BUCKETS_S)
        self._prefill_time = histogram("vllm_request_prefill_time_seconds", _LATENCY_BUCKETS_S)
        self._prompt_length = histogram("vllm_request_prompt_tokens", _TOKEN_BUCKETS)
        self._tpot = histogram("vllm_time_per_output_token_seconds", _TPOT_BUCKETS_S)
        self._success = metrics.Counter("vllm_request_success", tag_keys=("model_name",))
        for metric in (
            self._running,
            self._waiting,
            self._prompt_tokens,
            self._generation_tokens,
            self._ttft,
            self._queue_time,
            self._prefill_time,
            self._prompt_length,
            self._tpot,
            self._success,
        ):
            metric.set_default_tags(tags)
        self._running.set(0)
        self._waiting.set(0)

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
            prompt_tokens = int(body.get("prompt_tokens", 0))
            output_tokens = int(body.get("output_tokens", 0))
        except (ValueError, TypeError, AttributeError):
            return JSONResponse({"error": "body must be JSON with integer token counts"}, 400)
        if not (0 <= prompt_tokens <= self._model.max_prompt_tokens) or not (
            0 <= output_tokens <= self._model.max_output_tokens
        ):
            return JSONResponse({"error": "token counts out of range"}, 400)
        started_s = time.monotonic()
        model = self._model
        self._ongoing += 1
        self._waiting.set(self._ongoing - self._decoding)
        self._prompt_tokens.inc(prompt_tokens)
        prefill_s = prompt_tokens / model.prefill_tokens_per_s
        try:
            async with self._engine:
                queued_s = time.monotonic() - started_s
                await asyncio.sleep(prefill_s)
            ttft_s = time.monotonic() - started_s
            self._queue_time.observe(queued_s)
            self._prefill_time.observe(prefill_s)
            self._prompt_length.observe(float(prompt_tokens))
            self._ttft.observe(ttft_s)
            self._decoding += 1
            self._running.set(self._decoding)
            self._waiting.set(self._ongoing - self._decoding)
            try:
                tpot_s = model.tpot_s * (1.0 + model.tpot_slope * max(0, self._decoding - 1))
                await asyncio.sleep(output_tokens * tpot_s)
            finally:
                self._decoding -= 1
            if output_tokens:
                self._generation_tokens.inc(output_tokens)
                self._tpot.observe(tpot_s)
            self._success.inc()
        finally:
            self._ongoing -= 1
            self._running.set(self._decoding)
            self._waiting.set(self._ongoing - self._decoding)
        return JSONResponse(
            {
                "prompt_tokens": prompt_tokens,
                "output_tokens": output_tokens,
                "ttft_s": round(ttft_s, 6),
                "e2e_s": round(time.monotonic() - started_s, 6),
            }
        )


LLM_DEPLOYMENT = serve.deployment(name=DEPLOYMENT_NAME)(LlmReplica)


def build_app(args: Mapping[str, Any] | None = None) -> Application:
    """The Serve application; `args` as in a Serve config's `args` block.

    Keys: num_replicas (initial, default 1), max_ongoing_requests (default 8), num_gpus
    and num_cpus per replica (default 1 and 0; the GPUs are logical on the fake cluster),
    and the ServiceModel fields (prefill_tokens_per_s, tpot_s, tpot_slope, ...).
    """
    args = dict(args or {})
    num_replicas = int(args.pop("num_replicas", 1))
    max_ongoing_requests = int(args.pop("max_ongoing_requests", 8))
    num_gpus = float(args.pop("num_gpus", 1))
    num_cpus = float(args.pop("num_cpus", 0))
    ServiceModel.from_args(args)  # reject unknown keys here, not inside a replica
    return LLM_DEPLOYMENT.options(
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
    ).bind(args)
