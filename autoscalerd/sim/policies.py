"""The policies a backtest can run, by name, all behind the one `Policy` seam.

`autoscalerd` is the project's decision core itself (`decide.policy`), called exactly as
the daemon calls it; the peers live in `decide/baselines/`; `static-peak` and `oracle` are
the reference policies built from the trace's demand profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide.baselines.base import Bounds, Policy
from autoscalerd.decide.baselines.hpa import HpaPolicy, HpaSettings
from autoscalerd.decide.baselines.kpa import KpaPolicy, KpaSettings
from autoscalerd.decide.baselines.ray_serve import RayServePolicy, RayServeSettings
from autoscalerd.decide.baselines.threshold import ThresholdPolicy, ThresholdSettings
from autoscalerd.model import Decision, DeploymentState, Observation
from autoscalerd.sim.reference import OraclePlan

POLICIES = ("autoscalerd", "ray-serve", "hpa", "kpa", "threshold", "static-peak", "oracle")
# Always run: the cost ratios of every row are against these two.
REFERENCE_POLICIES = ("static-peak", "oracle")


class AutoscalerdPolicy:
    """The daemon's decision core: refit when due, then decide, carrying its state."""

    name = "autoscalerd"

    def __init__(self, cfg: DeploymentConfig, initial_replicas: int, now_s: float = 0.0) -> None:
        from autoscalerd.decide import policy

        self._decide = policy.decide
        self._refit = policy.refit_forecaster
        self._cfg = cfg
        self.state: DeploymentState = policy.initial_state(cfg, now_s, initial_replicas)
        self.last_decision: Decision | None = None

    def step(self, obs: Observation, now_s: float) -> int:
        # The daemon refits off the event loop; in virtual time the refit is inline.
        self.state = self._refit(self.state, self._cfg, now_s)
        decision, self.state = self._decide(obs, self.state, self._cfg, now_s)
        self.last_decision = decision
        return decision.target_replicas


class StaticPolicy:
    """A fixed replica count."""

    def __init__(self, name: str, replicas: int) -> None:
        self.name = name
        self._replicas = replicas

    def step(self, obs: Observation, now_s: float) -> int:
        return self._replicas


class OraclePolicy:
    """Follows a plan made from the future: it ignores what it observes."""

    name = "oracle"

    def __init__(self, plan: OraclePlan) -> None:
        self._plan = plan

    def step(self, obs: Observation, now_s: float) -> int:
        return self._plan.target_at(now_s)


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may be built from."""

    cfg: DeploymentConfig  # autoscalerd's config; its min/max are every policy's bounds
    bounds: Bounds
    initial_replicas: int
    plan: OraclePlan


def _autoscalerd(ctx: PolicyContext) -> Policy:
    return AutoscalerdPolicy(ctx.cfg, ctx.initial_replicas)


def _ray_serve(ctx: PolicyContext) -> Policy:
    return RayServePolicy(ctx.bounds, ctx.initial_replicas, RayServeSettings(), ctx.cfg.name)


def _hpa(ctx: PolicyContext) -> Policy:
    return HpaPolicy(ctx.bounds, ctx.initial_replicas, HpaSettings())


def _kpa(ctx: PolicyContext) -> Policy:
    return KpaPolicy(ctx.bounds, ctx.initial_replicas, KpaSettings())


def _threshold(ctx: PolicyContext) -> Policy:
    return ThresholdPolicy(ctx.bounds, ctx.initial_replicas, ThresholdSettings())


def _static_peak(ctx: PolicyContext) -> Policy:
    return StaticPolicy("static-peak", ctx.plan.peak)


def _oracle(ctx: PolicyContext) -> Policy:
    return OraclePolicy(ctx.plan)


_FACTORIES: dict[str, Callable[[PolicyContext], Policy]] = {
    "autoscalerd": _autoscalerd,
    "ray-serve": _ray_serve,
    "hpa": _hpa,
    "kpa": _kpa,
    "threshold": _threshold,
    "static-peak": _static_peak,
    "oracle": _oracle,
}


def make_policy(name: str, ctx: PolicyContext) -> Policy:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(ctx)


def initial_replicas(name: str, ctx: PolicyContext) -> int:
    """Every policy starts warm with what the opening load needs; static-peak with its peak."""
    return ctx.plan.peak if name == "static-peak" else ctx.initial_replicas
