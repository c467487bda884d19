"""Configuration: pydantic models, YAML loading, and one-line errors that name the YAML path.

The `autoscaling` block takes Ray Serve's `autoscaling_config` field names unchanged, so a
Ray user can paste theirs; everything else is autoscalerd's own.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)


class ConfigError(Exception):
    """A bad configuration. `problems` holds one line per problem: where, what, how to fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Model(BaseModel):
    # NaN and ±Inf are never a setting: `tick_s: .inf` would stop the loop, and
    # `max_metric_age_s: .inf` would turn stale-data protection off.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


MAX_REPLICAS = 1_000_000


class AutoscalingConfig(_Model):
    """Ray Serve's `autoscaling_config`, field for field (the ones that shape a decision)."""

    # Ray sets no upper bound; past a million replicas a count is a typo, and one of
    # hundreds of digits would overflow the sizing's float arithmetic.
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(10, ge=1, le=MAX_REPLICAS)
    initial_replicas: int | None = Field(None, ge=0, le=MAX_REPLICAS)
    # Ray accepts any value > 0; below a thousandth of a request per replica the
    # division overflows, and no deployment means it.
    target_ongoing_requests: float = Field(16.0, ge=0.001)
    upscale_delay_s: float = Field(10.0, ge=0)
    downscale_delay_s: float = Field(300.0, ge=0)
    downscale_to_zero_delay_s: float | None = Field(None, ge=0)
    # Ray's gain on the delta in either mode: a step goes to
    # ceil(current + factor·(wanted − current)), with Ray's one-down rule when a decrease
    # rounds back to the current count (decide/ray_compat.apply_scaling_factors). Ray
    # takes any factor > 0; past a thousand the step overflows, and no one means it.
    upscaling_factor: float | None = Field(None, gt=0, le=1000)
    downscaling_factor: float | None = Field(None, gt=0, le=1000)
    # Ray's deprecated fallback for both factors (after the per-direction ones below):
    # any factor > 0, as Ray takes it (2 doubles each step's delta).
    smoothing_factor: float = Field(1.0, gt=0, le=1000)
    look_back_period_s: float = Field(30.0, gt=0)
    # How Ray reduces the request count over look_back_period_s before its rule sees it
    # (Ray accepts the names in any case). The Ray-compatible mode applies it; in
    # autoscalerd's mode the concurrency rule is only a reading, and it has no effect.
    aggregation_function: Literal["mean", "max", "min"] = "mean"
    # Accepted so that Ray configs paste unchanged; autoscalerd senses every tick instead.
    metrics_interval_s: float | None = Field(None, gt=0)
    upscale_smoothing_factor: float | None = Field(None, gt=0, le=1000)
    downscale_smoothing_factor: float | None = Field(None, gt=0, le=1000)

    @field_validator("aggregation_function", mode="before")
    @classmethod
    def _aggregation(cls, value: Any) -> Any:
        # Ray lower-cases the name (AggregationFunction(str(v).lower())).
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas: must be >= min_replicas ({self.min_replicas})")
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ValueError(
                f"initial_replicas: must lie within [min_replicas, max_replicas] "
                f"([{self.min_replicas}, {self.max_replicas}])"
            )
        return self


class StabilizeConfig(_Model):
    """autoscalerd's own damping of the sized count (its own mode only), under names of
    its own: the Ray fields above keep Ray's meaning."""

    # EMA weight of the newest raw count: R_s = w·R_raw + (1 − w)·R_s(previous); 1: off.
    ema_weight: float = Field(1.0, gt=0, le=1)
    # A step up goes to at most ⌈current·ratio⌉ (always at least one more); null: no cap.
    max_step_up_ratio: float | None = Field(None, ge=1, le=1000)
    # A step down goes to at least ⌊current·ratio⌋ (always at least one fewer); null: no cap.
    min_step_down_ratio: float | None = Field(None, ge=0, le=1)


class CapacityConfig(_Model):
    """The lead time, and the fallbacks for deployments that export no token metrics."""

    # `model`: the smallest count whose predicted wait tail meets the SLO (sizing.py).
    # `utilization`: ⌈λ / (ρ·μ)⌉ with the model's μ, the classic rule, kept to compare.
    sizing: Literal["model", "utilization"] = "model"
    # Fallback μ: requests/s one replica sustains, used only until the replica model has
    # seen completions (plain Serve apps without vLLM metrics), and for the node headroom.
    service_rate_per_replica: float = Field(1.0, gt=0)
    target_utilization: float = Field(0.8, gt=0, le=1)
    cold_start_s: float = Field(60.0, ge=0)
    actuation_delay_s: float = Field(5.0, ge=0)
    # Backlog Q must drain within this time: adds ⌈Q / (μ·drain_s)⌉ replicas.
    drain_s: float = Field(30.0, gt=0)
    # The reactive floor: the arrival rate over this short window counts even when the
    # forecast missed a burst; 0 means the last tick alone.
    reactive_window_s: float = Field(0.0, ge=0)
    # Below this KV-cache usage no derating; above, μ shrinks linearly to half at 100%.
    kv_cache_derate_above: float = Field(0.9, gt=0, le=1)


class ReplicaModelConfig(_Model):
    """Priors of the replica model; every one is corrected online once traffic flows."""

    learn: bool = True
    # Slots per replica: Serve reports each deployment's max_ongoing_requests; this is
    # used only where it does not (Ray Serve's own default is 5).
    max_ongoing_requests: int = Field(5, ge=1, le=1_000_000)
    prefill_tokens_per_s: float = Field(8000.0, gt=0)
    tpot_batch1_s: float = Field(0.03, gt=0)
    tpot_full_batch_s: float = Field(0.06, gt=0)
    # The token mix until requests have been seen.
    prompt_tokens: float = Field(1000.0, gt=0, le=1e8)
    output_tokens: float = Field(200.0, ge=0, le=1e8)
    # How fast old evidence fades (e-folding time): the hardware changes rarely, the
    # traffic's token mix within minutes.
    hardware_memory_s: float = Field(600.0, gt=0)
    mix_memory_s: float = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _tpot(self) -> ReplicaModelConfig:
        if self.tpot_full_batch_s < self.tpot_batch1_s:
            raise ValueError("tpot_full_batch_s: must be >= tpot_batch1_s")
        return self


class ForecastConfig(_Model):
    enabled: bool = True
    # 300 s buckets and a one-day season: on the Azure week, Holt-Winters beats a tuned EWMA
    # by 7% (MASE) at this granularity, and only by 1% with 60 s buckets.
    # At least a second: the history holds one bucket per bucket_s since the start.
    bucket_s: float = Field(300.0, ge=1.0)
    # At most a million buckets a season (a week of 1 s buckets is 604,800), 100 seasons
    # kept: the history is kept in memory, and a count of hundreds of digits would
    # overflow the forecaster's float arithmetic.
    season_length: int = Field(
        288, ge=2, le=1_000_000, description="buckets per season (288 x 300 s = a day)"
    )
    seasonal: Literal["add", "mul"] = "add"
    refit_interval_s: float = Field(3600.0, gt=0)
    history_seasons: int = Field(3, ge=2, le=100, description="seasons kept for the rolling refit")
    z: float = Field(
        1.0, ge=0, description="upper bound = forecast + the recent errors' Φ(z) quantile"
    )


class SloConfig(_Model):
    """Latency objectives, met by `attainment_target` of requests.

    `ttft_p99_s` and `e2e_p99_s` are the names before the attainment target existed and
    are read as `ttft_s` and `e2e_s`.
    """

    # Under half of requests is no objective (and 1 − target must leave the normal
    # quantiles of the sizing a probability strictly inside (0, 1)).
    attainment_target: float = Field(0.99, ge=0.5, lt=1)
    ttft_s: float | None = Field(None, gt=0, validation_alias=AliasChoices("ttft_s", "ttft_p99_s"))
    e2e_s: float | None = Field(None, gt=0, validation_alias=AliasChoices("e2e_s", "e2e_p99_s"))
    # The wait (router queue + engine queue) a request may spend before its prefill starts;
    # by default the TTFT SLO less the mean prefill time, at least half the TTFT SLO.
    queue_wait_s: float | None = Field(None, gt=0)
    # Error-budget burn-rate windows (SRE practice: a short and a long one).
    burn_fast_window_s: float = Field(300.0, gt=0)
    burn_slow_window_s: float = Field(3600.0, gt=0)


class DeploymentSettings(_Model):
    """Everything that shapes one deployment's decisions (also the `defaults` block)."""

    # `autoscalerd`: the replica model and the SLO size the deployment. `ray-compatible`:
    # exactly Ray Serve's default policy on the autoscaling block (decide/ray_compat.py).
    mode: Literal["autoscalerd", "ray-compatible"] = "autoscalerd"
    # Ray's key `autoscaling_config` is read as it is; `autoscaling` is the older name.
    autoscaling: AutoscalingConfig = Field(
        AutoscalingConfig(), validation_alias=AliasChoices("autoscaling", "autoscaling_config")
    )
    stabilize: StabilizeConfig = StabilizeConfig()
    capacity: CapacityConfig = CapacityConfig()
    replica_model: ReplicaModelConfig = ReplicaModelConfig()
    forecast: ForecastConfig = ForecastConfig()
    slo: SloConfig = SloConfig()
    max_metric_age_s: float = Field(30.0, gt=0)
    cooldown_s: float = Field(0.0, ge=0)


class DeploymentConfig(DeploymentSettings):
    # "app/deployment" for Ray Serve; any label for the replay sensor.
    name: str = Field(min_length=1)


class PluginConfig(BaseModel):
    """A sensor or actuator: `type` picks the plugin, the other keys are its settings."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str = Field(min_length=1)

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# A worker group's name is a Kubernetes label value, as KubeRay's groupName is one.
_GROUP_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class WorkerGroupConfig(_Model):
    """One worker group's node shape (a KubeRay workerGroupSpec, a Ray node type): what
    `autoscalerd_desired_workers` packs the replicas onto (decide/workers.py)."""

    # The group's name as its scaler knows it (KubeRay's groupName): the metric's label.
    name: str
    # The Ray resources one worker node offers, as Ray counts them: {"CPU": 8, "GPU": 4,
    # "memory": bytes, custom: n}. KubeRay takes CPU, GPU and memory from the Ray
    # container's limits, and custom resources from rayStartParams.
    resources_per_worker: dict[str, float]
    min_workers: int = Field(0, ge=0, le=100_000)
    max_workers: int | None = Field(None, ge=0, le=100_000)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if (
            not 0 < len(value) <= 63
            or not set(value) <= _GROUP_NAME_CHARS
            or not (value[0].isalnum() and value[-1].isalnum())
        ):
            raise ValueError(
                "must be the group's name (KubeRay's groupName): up to 63 letters, digits, "
                "'-', '_' or '.', starting and ending with a letter or digit"
            )
        return value

    @field_validator("resources_per_worker")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if not name.strip():
                raise ValueError("a resource name is empty")
            if not 0 <= amount <= 1e18:
                raise ValueError(f"{name}: must be between 0 and 1e18 (got {amount})")
        if not any(amount > 0 for amount in value.values()):
            raise ValueError('must offer some resource, e.g. {"CPU": 8, "GPU": 4}')
        return value

    @model_validator(mode="after")
    def _bounds(self) -> WorkerGroupConfig:
        if self.max_workers is not None and self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})"
            )
        return self


class ClusterConfig(_Model):
    dashboard_url: str = "http://127.0.0.1:8265"
    # Bearer token for the dashboard: this value, else $RAY_AUTH_TOKEN, else token_file.
    token: str | None = None
    token_file: str = "~/.ray/auth_token"
    # Ray's GCS address for the ray_autoscaler actuator (`ray.init(address=...)`).
    address: str = "auto"
    # Extra Prometheus endpoints; by default every alive node's MetricsExportPort.
    metrics_urls: tuple[str, ...] = ()
    request_timeout_s: float = Field(5.0, gt=0)
    max_gpus: int | None = Field(None, ge=0, le=10_000_000)
    # Worker node shapes for autoscalerd_desired_workers (for KEDA or another scaler of
    # worker nodes); none: the metric is not exported.
    worker_groups: tuple[WorkerGroupConfig, ...] = ()

    @field_validator("worker_groups")
    @classmethod
    def _unique_groups(cls, value: tuple[WorkerGroupConfig, ...]) -> tuple[WorkerGroupConfig, ...]:
        names = [group.name for group in value]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"worker group {twice[0]!r} is listed twice")
        return value

    def resolve_token(self) -> str | None:
        if self.token:
            return self.token
        env = os.environ.get("RAY_AUTH_TOKEN")
        if env:
            return env.strip()
        path = Path(self.token_file).expanduser()
        try:
            return path.read_text().strip() or None
        except OSError:
            return None


class DiscoveryConfig(_Model):
    # Manage every Serve application deployed with external_scaler_enabled.
    enabled: bool = True


class HttpConfig(_Model):
    addr: str = "127.0.0.1:8270"
    enabled: bool = True
    # Bearer token for POST /v1/...; this value, else the named env var; none disables them.
    token: str | None = None
    token_env: str = "AUTOSCALERD_TOKEN"
    # The same token for GET /v1/... and /metrics too; /healthz and /readyz stay open.
    require_token_for_reads: bool = False
    # Who the audit trail names for a pause, resume or override whose body gives no "by".
    token_label: str = Field("token", min_length=1, max_length=64)
    # How long an override without ttl_s lasts: a forgotten pin must not outlive the day.
    override_default_ttl_s: float = Field(3600.0, gt=0, le=7 * 24 * 3600.0)

    @field_validator("addr")
    @classmethod
    def _addr(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:8270")
        return value


class GpuConfig(_Model):
    """How GPU health reaches the decision (the nvml sensor and the GPU series of the
    nodes' metrics report the facts)."""

    # Hardware clock slowdown counts as lost capacity once it has lasted this long.
    throttle_sustain_s: float = Field(30.0, ge=0)
    # Addresses of this host besides its resolved hostname: NVML's GPUs are this host's,
    # and a replica is on them when Serve reports one of these as its node_ip.
    node_ips: tuple[str, ...] = ()
    # Stop a failed replica's actor so that Serve replaces it (opt-in): without it, the
    # extra replica added for the lost capacity stays until the failed one is gone.
    replace_failed: bool = False
    # At most one replacement per deployment per this many seconds.
    replace_every_s: float = Field(300.0, gt=0)


class StateConfig(_Model):
    # File for restart-safe state; default $STATE_DIRECTORY/state.json (systemd), else none.
    path: str | None = None
    every_ticks: int = Field(30, ge=1, le=1_000_000_000)


class Config(_Model):
    tick_s: float = Field(1.0, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    cluster: ClusterConfig = ClusterConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    http: HttpConfig = HttpConfig()
    state: StateConfig = StateConfig()
    gpu: GpuConfig = GpuConfig()
    defaults: DeploymentSettings = DeploymentSettings()
    deployments: tuple[DeploymentConfig, ...] = ()
    sensors: tuple[PluginConfig, ...] = (PluginConfig(type="ray_serve"),)
    actuators: tuple[PluginConfig, ...] = (PluginConfig(type="log"),)

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        seen: set[str] = set()
        for deployment in self.deployments:
            if deployment.name in seen:
                raise ValueError(f"deployment {deployment.name!r} is listed twice")
            seen.add(deployment.name)
        return self

    def deployment(self, name: str) -> DeploymentConfig:
        """The configured deployment, or one built from `defaults` for a discovered one."""
        for deployment in self.deployments:
            if deployment.name == name:
                return deployment
        return DeploymentConfig(name=name, **dict(self.defaults))


_Settings = TypeVar("_Settings", bound=BaseModel)


def plugin_settings(model: type[_Settings], settings: Mapping[str, Any]) -> _Settings:
    """Validate a plugin's settings block; ConfigError with one line per problem, each
    starting with the setting's path inside the block (`retry.max_attempts: ...`; a
    problem of the whole block starts with `(settings)`).

    For sensor and actuator plugins (first- and third-party): declare the settings as a
    pydantic model with `extra="forbid"` and call this from the constructor.
    """
    try:
        return model.model_validate(dict(settings))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            loc = list(error["loc"])
            where = _path(loc) if loc else "(settings)"
            if error["type"] == "extra_forbidden":
                known = _model_at(loc[:-1], model)
                hint = _did_you_mean(str(loc[-1]), list(known.model_fields) if known else [])
                problems.append(_one_line(f"{where}: unknown setting; {hint or 'remove it'}"))
            elif error["type"] == "missing":
                problems.append(f"{where}: field required; add it")
            else:
                message = str(error["msg"]).removeprefix("Value error, ").lower()
                problems.append(_one_line(f"{where}: {message} (got {_shown(error['input'])})"))
        raise ConfigError(problems) from None


def _did_you_mean(name: str, known: list[str], *, word: str = "known") -> str:
    """'did you mean X?' for a near miss of a known name, else the known names; '' when
    none are known."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"{word}: {', '.join(known)}" if known else ""


def _shown(value: Any) -> str:
    """A value in an error: scalars as written, a mapping or a list by its type only, and
    an integer too long to print (YAML reads `0x` and `0o` integers of any length) by
    its size."""
    if isinstance(value, dict | list):
        return type(value).__name__
    if isinstance(value, int) and value.bit_length() > _PRINTABLE_INT_BITS:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return repr(value)


# Python prints integers of up to 4,300 digits (sys.get_int_max_str_digits()); this many
# bits stays under that.
_PRINTABLE_INT_BITS = 14_000


# ---------------------------------------------------------------- loading and error text


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML config file; raise ConfigError with one line per problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{file}: no such file; pass the path of a YAML config"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            [f"{file}: cannot read ({exc}); check the path and permissions"]
        ) from None
    return parse_config(text, source=str(file))


# libyaml's safe loader where PyYAML was built with it (ten times the pure-Python speed;
# it also refuses nesting past 1,000 levels itself), else the pure-Python one.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Deeper than this, a config is not a config (YAML's parser and the merge would recurse).
MAX_DEPTH = 64


def parse_config(text: str, source: str = "<config>") -> Config:
    try:
        return _parse_config(text, source)
    except RecursionError:
        raise ConfigError(
            [
                f"{source}: nested too deeply (over {MAX_DEPTH} levels); "
                "a config is a few levels deep"
            ]
        ) from None


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of parsed YAML, counting at most to `limit` (iteratively)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _parse_config(text: str, source: str) -> Config:
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER)
    except ValueError as exc:  # e.g. an integer of thousands of digits
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise ConfigError([f"{source}: a value YAML cannot read ({first})"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "maximum nesting depth" in problem:  # libyaml's own limit
            raise RecursionError from None
        if "single document" in str(getattr(exc, "context", None)):  # `---` between two
            raise ConfigError([_one_line(f"{where}: {_several_documents(text)}")]) from None
        raise ConfigError(
            [f"{where}: YAML syntax error: {problem}; fix the indentation or quoting there"]
        ) from None
    if raw is None:
        raise ConfigError(
            [
                f"{source}: empty; a config names at least its sensors or deployments "
                "(see config/replay.yaml); defaults alone are `tick_s: 1`"
            ]
        )
    if _depth(raw, MAX_DEPTH) > MAX_DEPTH:
        raise RecursionError
    if not isinstance(raw, dict):
        raise ConfigError([_one_line(f"{source}: {_not_a_mapping(raw)}")])
    foreign = _foreign_format(raw)
    if foreign is not None:
        raise ConfigError([_one_line(f"{source}: {foreign}")])
    merged = _apply_defaults(raw)
    try:
        return Config.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(
            [_one_line(f"{source}: {line}") for line in _describe(exc, merged)]
        ) from None


# ---------------------------------------------------------------- the wrong file

_SEE_EXAMPLE = "see config/example.yaml"
_IN_A_CONFIGMAP = (
    "autoscalerd's config is the config.yaml in a ConfigMap's data "
    "(config/kubernetes/kuberay-sidecar.yaml shows one): check that on its own"
)
# Top-level keys that only another tool's file has, by what that file is.
_SERVE_KEYS = frozenset({"applications", "proxy_location", "http_options", "grpc_options"})
_RAY_CLUSTER_KEYS = frozenset(
    {"cluster_name", "available_node_types", "head_node_type", "max_workers", "provider"}
)


def _foreign_format(raw: dict[Any, Any]) -> str | None:
    """What another tool's file (Ray Serve's, KubeRay's, Ray's cluster launcher's) was
    given as a config, in one sentence; None when it may be autoscalerd's own (any of
    its top-level keys present, or none of another format's)."""
    keys = {key for key in raw if isinstance(key, str)}
    if keys & set(Config.model_fields):
        return None
    if {"apiVersion", "kind"} <= keys:
        return (
            f"this looks like a Kubernetes manifest ({_kind(raw.get('kind'))}), not an "
            f"autoscalerd config; {_IN_A_CONFIGMAP}; {_SEE_EXAMPLE}"
        )
    if keys & _SERVE_KEYS:
        return (
            "this looks like a Ray Serve config (serve deploy), not an autoscalerd config; "
            "an autoscalerd config names its sensors, actuators and deployments; " + _SEE_EXAMPLE
        )
    if len(keys & _RAY_CLUSTER_KEYS) >= 2:
        return (
            "this looks like a Ray cluster launcher config (ray up), not an autoscalerd "
            "config; an autoscalerd config names its sensors, actuators and deployments; "
            + _SEE_EXAMPLE
        )
    return None


def _kind(kind: Any) -> str:
    """A manifest's kind for an error: `kind: RayService`, if it is a plain name."""
    if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 64:
        return f"kind: {kind}"
    return "apiVersion and kind at the top"


def _several_documents(text: str) -> str:
    """The line for a file of several YAML documents (`---` between them)."""
    try:
        documents = [d for d in yaml.load_all(text, Loader=_YAML_LOADER) if d is not None]
    except (yaml.YAMLError, ValueError, RecursionError):
        documents = []
    kinds = [
        d["kind"]
        for d in documents
        if isinstance(d, dict) and "apiVersion" in d and isinstance(d.get("kind"), str)
    ]
    if documents and len(kinds) == len(documents):
        shown = ", ".join(k if k.isidentifier() and len(k) <= 64 else "?" for k in kinds)
        return (
            f"this looks like Kubernetes manifests (kinds: {shown}), not an autoscalerd "
            f"config; {_IN_A_CONFIGMAP}; {_SEE_EXAMPLE}"
        )
    return (
        "several YAML documents (separated by ---); an autoscalerd config is one document: "
        f"keep one, or put each in its own file; {_SEE_EXAMPLE}"
    )


def _not_a_mapping(raw: Any) -> str:
    """The line for a top level that is a list or a single value."""
    if not isinstance(raw, list):
        return (
            f"top level must be a mapping of settings, not a value (got {type(raw).__name__}); "
            + _SEE_EXAMPLE
        )
    entries = [entry for entry in raw if isinstance(entry, dict)]
    if entries and all("name" in entry for entry in entries):
        hint = "a list of deployments goes under `deployments:`"
    elif entries and all("type" in entry for entry in entries):
        hint = "a list of plugins goes under `sensors:` or `actuators:`"
    else:
        hint = "it starts with keys such as `sensors:`, `actuators:` and `deployments:`"
    return f"top level must be a mapping of settings, not a list; {hint}; {_SEE_EXAMPLE}"


def _one_line(text: str) -> str:
    """A problem as one line: keys and values may hold line breaks."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _apply_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge the `defaults` block under each listed deployment."""
    defaults = raw.get("defaults")
    deployments = raw.get("deployments")
    if not isinstance(defaults, dict) or not isinstance(deployments, list):
        return raw
    out = dict(raw)
    out["deployments"] = [
        _deep_merge(defaults, entry) if isinstance(entry, dict) else entry for entry in deployments
    ]
    return out


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _describe(exc: ValidationError, raw: Any) -> list[str]:
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        loc = list(error["loc"])
        if error["type"] == "extra_forbidden":
            lines.append(_unknown_key(loc, raw))
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        # Model validators report "field: problem"; move the field into the path.
        if error["type"] == "value_error" and ": " in message:
            head, _, rest = message.partition(": ")
            if head.isidentifier():
                loc.append(head)
                message = rest
        lines.append(f"{_path(loc)}: {_fix_hint(error['type'], message, error.get('input'))}")
    return lines


def _unknown_key(loc: list[Any], raw: Any) -> str:
    key = str(loc[-1])
    parent = _model_at(loc[:-1])
    hint = "remove it"
    if parent is AutoscalingConfig and key == "policy":
        # Ray's custom policy is code Ray's controller imports; autoscalerd cannot run it.
        return (
            f"{_path(loc)}: Ray's custom autoscaling policy does not run in autoscalerd; "
            "remove it (autoscalerd's mode decides instead, or `mode: ray-compatible` for "
            "Ray's default policy)"
        )
    if parent is not None:
        hint = _did_you_mean(key, list(parent.model_fields), word="known keys") or hint
    return f"{_path(loc)}: unknown key; {hint}"


def _model_at(loc: list[Any], root: type[BaseModel] = Config) -> type[BaseModel] | None:
    """The model that validates the mapping at `loc` (list indices skipped), or None."""
    model: type[BaseModel] = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) or _field_by_alias(model, str(part))
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nxt = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nxt is None:
            return None
        model = nxt
    return model


def _field_by_alias(model: type[BaseModel], name: str) -> Any:
    """The field that `name` reaches by one of its alias choices (`autoscaling_config`)."""
    for field in model.model_fields.values():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices) and name in alias.choices:
            return field
    return None


def _path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _fix_hint(kind: str, message: str, value: Any) -> str:
    shown = _shown(value)
    if kind == "missing":
        return "required; add it"
    if kind == "finite_number":
        return f"input should be a finite number (got {shown}); NaN and infinity are not settings"
    if kind.startswith(("greater_than", "less_than")) or kind in {"int_parsing", "float_parsing"}:
        return f"{message.lower()} (got {shown}); change the value"
    if kind in {"literal_error", "enum"}:
        return f"{message.lower()} (got {shown})"
    if kind in {"model_type", "model_attributes_type", "dict_type"}:
        return f"must be a mapping of settings (got {shown})"
    if kind in {"tuple_type", "list_type"}:
        return f"must be a list (got {shown})"
    return message
