"""The backtest: replay one trace through the simulated cluster under each policy.

Every policy sees the same requests (a trace replays identically), the same bounds, the
same warm start (the replicas the opening load needs), and only what the simulated
sensor reports each tick. Results: one row per policy, plus the time series the report
plots. Cost ratios are against the oracle and static-peak runs, which always run.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from autoscalerd.config import DeploymentConfig
from autoscalerd.decide.baselines.base import Bounds, Policy
from autoscalerd.sim.cluster import Cluster, ReplicaModel, RequestRecords
from autoscalerd.sim.policies import (
    POLICIES,
    REFERENCE_POLICIES,
    AutoscalerdPolicy,
    OraclePolicy,
    PolicyContext,
    StaticPolicy,
    initial_replicas,
    make_policy,
)
from autoscalerd.sim.reference import (
    DemandProfile,
    oracle_plan,
    profile,
    work_bound_replica_seconds,
)
from autoscalerd.sim.runs import Runs
from autoscalerd.sim.sensor import SimSensor
from autoscalerd.sim.traces import RequestBatch, Trace, TraceError

WORK_BOUND = "work-bound"
# The rows that are references, not policies that scale.
REFERENCES = (WORK_BOUND, "oracle", "static-peak")


@dataclass(frozen=True, slots=True)
class BacktestSettings:
    replica: ReplicaModel = field(default_factory=ReplicaModel)
    tick_s: float = 1.0
    ttft_slo_s: float = 1.0
    # The oracle plans per bucket of this width, at this utilisation of each replica.
    oracle_bucket_s: float = 60.0
    oracle_utilization: float = 0.8
    # Time series for the plot are cut to about this many points.
    series_points: int = 2000
    # The reference frontiers (one simulation per point): static counts up to static
    # peak (at most `static_points` of them) and the oracle at these utilisations.
    frontiers: bool = True
    static_points: int = 12
    oracle_utilizations: tuple[float, ...] = (
        0.05,
        0.1,
        0.15,
        0.2,
        0.3,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        0.95,
    )


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    label: str  # "static-3", "oracle@0.8"
    replicas: int | None
    target_utilization: float | None
    slo_attainment_ttft: float
    replica_seconds: float


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """One row of the results table (and of the JSON `results`)."""

    policy: str
    requests: int
    slo_attainment_ttft: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    tpot_p99_s: float | None
    replica_seconds: float
    gpu_seconds: float
    cost_vs_oracle: float | None
    cost_vs_static_peak: float | None
    scale_actions: int | None
    max_queue: int | None
    unfinished: int = 0
    # Replica-seconds over the cheapest oracle-frontier point with at least this
    # attainment (over the highest-attainment point when none reaches it).
    cost_vs_oracle_at_equal_attainment: float | None = None
    # Peers and static-N points with at least this attainment for at most this cost.
    dominated_by: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 6)
        return out


@dataclass(frozen=True)
class PolicySeries:
    """What one policy did over time, cut to plot resolution."""

    time_s: np.ndarray
    target_replicas: np.ndarray  # mean over each point's span
    replicas: np.ndarray  # replicas costing (starting, ready, draining), mean
    ttft_time_s: np.ndarray
    ttft_p99_s: np.ndarray  # by arrival time, NaN where no request arrived
    # autoscalerd only: its forecast of the load (in its load unit) over the lead time.
    forecast_per_s: np.ndarray | None = None
    forecast_upper_per_s: np.ndarray | None = None


@dataclass(frozen=True)
class BacktestResult:
    trace: dict[str, Any]
    settings: BacktestSettings
    demand: DemandProfile
    load_unit: str
    rows: tuple[PolicyResult, ...]
    series: dict[str, PolicySeries]
    wall_s: dict[str, float]  # wall-clock seconds each policy's simulation took
    attainable_ttft: float | None = None  # share of requests whose prefill alone meets the SLO
    static_frontier: tuple[FrontierPoint, ...] = ()
    oracle_frontier: tuple[FrontierPoint, ...] = ()

    def row(self, policy: str) -> PolicyResult:
        return next(r for r in self.rows if r.policy == policy)

    def as_json(self) -> dict[str, Any]:
        model = self.settings.replica
        return {
            "trace": {
                **self.trace,
                "requests": self.demand.requests,
                "duration_s": round(self.demand.duration_s, 3),
                "mean_prompt_tokens": round(self.demand.mean_prompt_tokens, 1),
                "mean_output_tokens": round(self.demand.mean_output_tokens, 1),
            },
            "simulator": {
                **asdict(model),
                "tick_s": self.settings.tick_s,
                "ttft_slo_s": self.settings.ttft_slo_s,
                "oracle_bucket_s": self.settings.oracle_bucket_s,
                "oracle_utilization": self.settings.oracle_utilization,
                "service_rate_per_replica_per_s": round(
                    model.service_rate_per_s(
                        self.demand.mean_prompt_tokens, self.demand.mean_output_tokens
                    ),
                    4,
                ),
            },
            "results": [row.as_dict() for row in self.rows],
            "attainable_ttft": _round(self.attainable_ttft),
            "static_frontier": [
                {
                    "replicas": p.replicas,
                    "slo_attainment_ttft": _round(p.slo_attainment_ttft),
                    "replica_seconds": _round(p.replica_seconds),
                }
                for p in self.static_frontier
            ],
            "oracle_frontier": [
                {
                    "target_utilization": p.target_utilization,
                    "slo_attainment_ttft": _round(p.slo_attainment_ttft),
                    "replica_seconds": _round(p.replica_seconds),
                }
                for p in self.oracle_frontier
            ],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


ProgressCallback = Callable[[str, int], None]


def run_backtest(
    trace: Trace,
    policies: Sequence[str],
    cfg: DeploymentConfig,
    settings: BacktestSettings | None = None,
    on_progress: ProgressCallback | None = None,
    on_policy_start: Callable[[str, int], None] | None = None,
    jobs: int = 1,
) -> BacktestResult:
    """Run `policies` (plus static-peak and the oracle) over `trace`.

    `cfg` is autoscalerd's deployment config; its min/max replicas bound every policy.
    `on_policy_start(name, requests)` and `on_progress(name, requests_done)` report
    progress (with `jobs` > 1, a policy's progress comes when it is done). `jobs` runs that
    many simulations at once in worker processes (`runs.Runs`); the results are the same.
    """
    settings = settings or BacktestSettings()
    for name in policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    demand = profile(trace.batches(), settings.oracle_bucket_s, trace.window.duration_s)
    if demand.requests == 0:
        raise TraceError(
            f"{trace.path}: no requests in the window replayed; check --start and --duration"
        )
    bounds = Bounds(cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas)
    plan = oracle_plan(
        demand,
        settings.replica,
        settings.oracle_utilization,
        settings.replica.cold_start_s,
        bounds.min_replicas,
        bounds.max_replicas,
    )
    opening = opening_replicas(
        trace,
        settings,
        plan.target_at(0.0),
        bounds,
        cfg.autoscaling.look_back_period_s,
        cfg.slo.attainment_target,
    )
    ctx = PolicyContext(cfg=cfg, bounds=bounds, initial_replicas=opening, plan=plan)
    names = [n for n in POLICIES if n in policies or n in REFERENCE_POLICIES]
    look_back_s = cfg.autoscaling.look_back_period_s
    # Every simulation that depends on no other's result is handed out at once: the
    # policies, the static counts up to static peak and the oracle at each utilisation.
    counts = _static_counts(plan.peak, settings) if settings.frontiers else []
    tasks: list[_Task] = [
        *(("policy", name) for name in names),
        *(("static", replicas) for replicas in counts),
        *(("oracle", u) for u in (settings.oracle_utilizations if settings.frontiers else ())),
    ]

    def started(task: _Task) -> None:
        if task[0] == "policy" and on_policy_start is not None:
            on_policy_start(str(task[1]), demand.requests)

    def finished(task: _Task, outcome: _Outcome) -> None:
        # In this process the simulation reported its progress as it ran.
        if task[0] == "policy" and on_progress is not None and jobs > 1:
            on_progress(str(task[1]), demand.requests)

    shared = _Shared(trace, ctx, demand, settings, look_back_s, on_progress if jobs == 1 else None)
    rows: list[PolicyResult] = []
    series: dict[str, PolicySeries] = {}
    wall_s: dict[str, float] = {}
    sampled: dict[int, FrontierPoint] = {}
    oracles: list[FrontierPoint] = []
    with Runs(_execute, shared, jobs) as runs:
        outcomes = runs.map(tasks, started, finished)
        for (kind, value), (row, policy_series, run_s) in zip(tasks, outcomes, strict=True):
            if kind == "policy":
                rows.append(row)
                if policy_series is not None:
                    series[row.policy] = policy_series
                wall_s[row.policy] = run_s
            elif kind == "static":
                sampled[int(value)] = _point(row, int(value), None)
            else:
                oracles.append(_point(row, None, float(value)))

        work_s = work_bound_replica_seconds(demand, settings.replica)
        rows.append(
            PolicyResult(
                policy=WORK_BOUND,
                requests=demand.requests,
                slo_attainment_ttft=None,
                ttft_p50_s=None,
                ttft_p99_s=None,
                e2e_p99_s=None,
                tpot_p99_s=None,
                replica_seconds=work_s,
                gpu_seconds=work_s * settings.replica.gpus_per_replica,
                cost_vs_oracle=None,
                cost_vs_static_peak=None,
                scale_actions=None,
                max_queue=None,
            )
        )
        oracle_s = next(r.replica_seconds for r in rows if r.policy == "oracle")
        static_s = next(r.replica_seconds for r in rows if r.policy == "static-peak")
        rows = [
            _with_ratios(row, oracle_s, static_s)
            for row in sorted(rows, key=lambda r: _order(r.policy))
        ]
        static_frontier: tuple[FrontierPoint, ...] = ()
        oracle_frontier: tuple[FrontierPoint, ...] = ()
        attainable = attainable_share(trace, settings)
        if settings.frontiers:
            static_frontier = _complete_statics(
                runs, ctx, demand, bounds, rows, sampled, counts, attainable
            )
            oracle_frontier = tuple(oracles)
            rows = compare_with_frontiers(rows, static_frontier, oracle_frontier)
    return BacktestResult(
        trace=trace.describe(),
        settings=settings,
        demand=demand,
        load_unit="requests",
        rows=tuple(rows),
        series=series,
        wall_s=wall_s,
        attainable_ttft=attainable,
        static_frontier=static_frontier,
        oracle_frontier=oracle_frontier,
    )


# A simulation of the backtest: a policy by name, a static count, or the oracle's plan at
# a utilisation target.
_Task = tuple[str, str | int | float]
# What one returns: its row, the policy's time series (policies only), its wall seconds.
_Outcome = tuple["PolicyResult", "PolicySeries | None", float]


@dataclass(frozen=True)
class _Shared:
    """What every simulation of one backtest reads: sent once to each worker process."""

    trace: Trace
    ctx: PolicyContext
    demand: DemandProfile
    settings: BacktestSettings
    look_back_s: float
    on_progress: ProgressCallback | None = None  # in this process only


def _execute(shared: _Shared, task: _Task) -> _Outcome:
    """One simulation (`runs.Runs` calls it here or in a worker)."""
    kind, value = task
    started = time.perf_counter()
    series: PolicySeries | None = None
    if kind == "policy":
        row, series = simulate(
            str(value),
            shared.trace,
            shared.ctx,
            shared.demand,
            shared.settings,
            shared.look_back_s,
            shared.on_progress,
        )
    elif kind == "static":
        replicas = int(value)
        row, _ = simulate_policy(
            StaticPolicy(f"static-{replicas}", replicas),
            replicas,
            shared.trace,
            shared.demand,
            shared.settings,
            shared.look_back_s,
        )
    else:
        ctx, settings = shared.ctx, shared.settings
        plan = oracle_plan(
            shared.demand,
            settings.replica,
            float(value),
            settings.replica.cold_start_s,
            ctx.bounds.min_replicas,
            ctx.bounds.max_replicas,
        )
        row, _ = simulate_policy(
            OraclePolicy(plan),
            plan.target_at(0.0),
            shared.trace,
            shared.demand,
            settings,
            shared.look_back_s,
        )
    return row, series, time.perf_counter() - started


def _point(row: PolicyResult, replicas: int | None, utilization: float | None) -> FrontierPoint:
    label = f"static-{replicas}" if replicas is not None else f"oracle@{utilization:g}"
    return FrontierPoint(
        label, replicas, utilization, row.slo_attainment_ttft or 0.0, row.replica_seconds
    )


# The opening window: the first five minutes, or twice the cold start where longer; a
# policy started below what that load needs cannot correct it sooner.
OPENING_MIN_S = 300.0


def opening_replicas(
    trace: Trace,
    settings: BacktestSettings,
    start: int,
    bounds: Bounds,
    look_back_s: float,
    attainment_target: float,
) -> int:
    """The warm start of every adaptive policy: the fewest replicas that, held static over
    the opening window, meet the SLO for `attainment_target` of the requests that can meet
    it there (never fewer than `start`, the oracle plan's opening count). A cluster that
    was serving this load before the replay began ran what it needed, as the static-N
    points of the frontier do from their first second; starting the policies below it
    would charge each of them a cold start that no steady operation has."""
    window_s = max(OPENING_MIN_S, 2.0 * settings.replica.cold_start_s)
    opening = replace(trace, _batches=lambda: _until(trace.batches(), window_s))
    demand = profile(opening.batches(), settings.oracle_bucket_s, window_s)
    attainable = attainable_share(opening, settings)
    low = max(start, bounds.min_replicas, 1)
    if demand.requests == 0 or not attainable or low >= bounds.max_replicas:
        return low

    def meets(replicas: int) -> bool:
        row, _ = simulate_policy(
            StaticPolicy(f"static-{replicas}", replicas),
            replicas,
            opening,
            demand,
            settings,
            look_back_s,
        )
        return (row.slo_attainment_ttft or 0.0) >= attainment_target * attainable - 1e-12

    if meets(low):
        return low
    high = low
    while high < bounds.max_replicas and not meets(high):
        low = high + 1
        high = min(bounds.max_replicas, 2 * high)
    while low < high:  # the first count that meets it lies in [low, high]
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle + 1
    return high


def _until(batches: Iterator[RequestBatch], end_s: float) -> Iterator[RequestBatch]:
    """The requests that arrive before `end_s`."""
    for batch in batches:
        if batch.arrival_s.size and batch.arrival_s[-1] >= end_s:
            cut = int(np.searchsorted(batch.arrival_s, end_s, "left"))
            if cut:
                yield RequestBatch(
                    batch.arrival_s[:cut], batch.prompt_tokens[:cut], batch.output_tokens[:cut]
                )
            return
        yield batch


def attainable_share(trace: Trace, settings: BacktestSettings) -> float | None:
    """Requests whose TTFT meets the SLO with zero queueing: their prefill alone."""
    met = total = 0
    limit = settings.ttft_slo_s * settings.replica.prefill_tokens_per_s + 1e-6
    for batch in trace.batches():
        total += len(batch)
        met += int(np.count_nonzero(batch.prompt_tokens <= limit))
    return met / total if total else None


def _static_counts(peak: int, settings: BacktestSettings) -> list[int]:
    """The static frontier's first counts: every count from 1 to static peak, or a dense
    geometric subset of `settings.static_points` when there are more."""
    peak = max(1, peak)
    return sorted(
        {
            max(1, round(peak ** (i / max(1, settings.static_points - 1))))
            for i in range(settings.static_points)
        }
        | ({*range(1, peak + 1)} if peak <= settings.static_points else set())
    )


def _complete_statics(
    runs: Runs[_Shared, _Task, _Outcome],
    ctx: PolicyContext,
    demand: DemandProfile,
    bounds: Bounds,
    rows: Sequence[PolicyResult],
    sampled: dict[int, FrontierPoint],
    counts: list[int],
    attainable: float | None,
) -> tuple[FrontierPoint, ...]:
    """The static frontier, from the points of `counts` in `sampled`.

    Where static peak misses the SLO's attainment target on the attainable share, higher
    counts down to the smallest that meets it (doubling, then bisection: static peak is
    sized for the busiest oracle bucket's mean rate, far below what a fixed count needs to
    hold the SLO on bursty traffic); and per policy the largest count costing no more than
    it (the static point that would dominate it if any does). Each depends on the one
    before, so they run one at a time."""

    def static(replicas: int) -> FrontierPoint:
        row, _, _ = runs.map([("static", replicas)])[0]
        return _point(row, replicas, None)

    def meets(replicas: int) -> bool:
        if replicas not in sampled:
            sampled[replicas] = static(replicas)
        return sampled[replicas].slo_attainment_ttft >= goal

    goal = ctx.cfg.slo.attainment_target * (attainable or 1.0)
    # The smallest count above static peak that meets the goal: doubling, then bisection.
    failing, meeting = counts[-1], None
    if not meets(failing):
        while meeting is None and failing < bounds.max_replicas:
            probe = min(bounds.max_replicas, 2 * failing)
            failing, meeting = (failing, probe) if meets(probe) else (probe, None)
        while meeting is not None and meeting - failing > 1:
            probe = (failing + meeting) // 2
            failing, meeting = (failing, probe) if meets(probe) else (probe, meeting)
    _add_points_below(rows, sampled, static, bounds.max_replicas, demand.duration_s)
    return tuple(sampled[replicas] for replicas in sorted(sampled))


def _static_point(
    replicas: int,
    trace: Trace,
    demand: DemandProfile,
    settings: BacktestSettings,
    look_back_s: float,
) -> FrontierPoint:
    """`replicas` held from the first second to the last: a static frontier point."""
    row, _ = simulate_policy(
        StaticPolicy(f"static-{replicas}", replicas),
        replicas,
        trace,
        demand,
        settings,
        look_back_s,
    )
    return _point(row, replicas, None)


def _add_points_below(
    rows: Sequence[PolicyResult],
    sampled: dict[int, FrontierPoint],
    static: Callable[[int], FrontierPoint],
    max_replicas: int,
    duration_s: float,
) -> None:
    """Per policy, the largest count that costs no more than it, simulated into `sampled`
    where missing: with attainment rising in the count, the static point most likely to
    dominate it. A count holds its replicas for the whole trace, so it costs at least its
    replicas times the trace's duration (more where a backlog outlasts the trace): the
    walk starts at the policy's cost over the duration and goes down."""
    if duration_s <= 0:
        return
    for row in rows:
        if row.policy in REFERENCES:
            continue
        replicas = min(max_replicas, int(row.replica_seconds // duration_s))
        while replicas >= 1:
            if replicas not in sampled:
                sampled[replicas] = static(replicas)
            if sampled[replicas].replica_seconds <= row.replica_seconds:
                break
            replicas -= 1


def complete_static_frontier(
    trace: Trace,
    result: BacktestResult,
    static_frontier: Sequence[FrontierPoint],
    cfg: DeploymentConfig,
) -> tuple[FrontierPoint, ...]:
    """`static_frontier` (a reference computed with other rows: the peers, or another
    version of a policy) with the static point most likely to dominate each of
    `result`'s rows added, simulated over `trace` where the frontier lacks it. Without
    it, a policy whose cost changed since the reference was computed is compared with no
    count between the reference's samples, and a fixed count that dominates it can go
    unseen."""
    sampled = {p.replicas: p for p in static_frontier if p.replicas is not None}
    look_back_s = cfg.autoscaling.look_back_period_s

    def static(replicas: int) -> FrontierPoint:
        return _static_point(replicas, trace, result.demand, result.settings, look_back_s)

    _add_points_below(
        result.rows, sampled, static, cfg.autoscaling.max_replicas, result.demand.duration_s
    )
    return tuple(sampled[replicas] for replicas in sorted(sampled))


def compare_with_frontiers(
    rows: list[PolicyResult],
    static_frontier: Sequence[FrontierPoint],
    oracle_frontier: Sequence[FrontierPoint],
) -> list[PolicyResult]:

    measured = [r for r in rows if r.slo_attainment_ttft is not None]
    out = []
    for row in rows:
        attained = row.slo_attainment_ttft
        if attained is None or row.policy in REFERENCES:
            out.append(row)
            continue
        reaching = [p for p in oracle_frontier if p.slo_attainment_ttft >= attained - 1e-12]
        reference = (
            min(reaching, key=lambda p: p.replica_seconds)
            if reaching
            else max(oracle_frontier, key=lambda p: p.slo_attainment_ttft, default=None)
        )
        ratio = (
            row.replica_seconds / reference.replica_seconds
            if reference is not None and reference.replica_seconds > 0
            else None
        )
        dominators = [
            other.policy
            for other in measured
            if other.policy not in (row.policy, "oracle", WORK_BOUND)
            and _dominates(other.slo_attainment_ttft, other.replica_seconds, row)
        ] + [
            p.label
            for p in static_frontier
            if _dominates(p.slo_attainment_ttft, p.replica_seconds, row)
        ]
        out.append(
            replace(row, cost_vs_oracle_at_equal_attainment=ratio, dominated_by=tuple(dominators))
        )
    return out


def _dominates(attainment: float | None, cost_s: float, row: PolicyResult) -> bool:
    """At least the attainment for at most the cost, better in one of the two."""
    mine = row.slo_attainment_ttft
    if attainment is None or mine is None:
        return False
    return (
        attainment >= mine
        and cost_s <= row.replica_seconds
        and (attainment > mine or cost_s < row.replica_seconds)
    )


def _order(policy: str) -> int:
    order = [*POLICIES, WORK_BOUND]
    return order.index(policy) if policy in order else len(order)


def _with_ratios(row: PolicyResult, oracle_s: float, static_s: float) -> PolicyResult:

    return replace(
        row,
        cost_vs_oracle=row.replica_seconds / oracle_s if oracle_s > 0 else None,
        cost_vs_static_peak=row.replica_seconds / static_s if static_s > 0 else None,
    )


def simulate(
    name: str,
    trace: Trace,
    ctx: PolicyContext,
    demand: DemandProfile,
    settings: BacktestSettings,
    look_back_s: float,
    on_progress: ProgressCallback | None = None,
    wrap: Callable[[Policy], Policy] | None = None,
) -> tuple[PolicyResult, PolicySeries]:
    """One policy over the whole trace. `wrap` may put a proxy around the policy (the
    speed benchmark times its calls)."""
    policy = make_policy(name, ctx)
    if wrap is not None:
        policy = wrap(policy)
    return simulate_policy(
        policy,
        initial_replicas(name, ctx),
        trace,
        demand,
        settings,
        look_back_s,
        on_progress,
        ctx.cfg.name,
    )


def simulate_policy(
    policy: Policy,
    initial: int,
    trace: Trace,
    demand: DemandProfile,
    settings: BacktestSettings,
    look_back_s: float,
    on_progress: ProgressCallback | None = None,
    deployment: str = "llm/backtest",
) -> tuple[PolicyResult, PolicySeries]:
    """Any policy object over the whole trace, starting warm with `initial` replicas."""
    name = policy.name
    cluster = Cluster(settings.replica, initial)
    sensor = SimSensor(cluster, deployment, look_back_s, settings.tick_s)
    targets = array("i")
    costing = array("i")
    forecasts = array("d")
    uppers = array("d")
    inner = getattr(policy, "inner", policy)
    autoscalerd = inner if isinstance(inner, AutoscalerdPolicy) else None

    def on_tick(now_s: float) -> None:
        obs = sensor.observe(now_s)
        target = policy.step(obs, now_s)
        cluster.set_target(target, now_s)
        targets.append(cluster.target_replicas)
        costing.append(cluster.replicas_costing())
        if autoscalerd is not None:
            decision = autoscalerd.last_decision
            point = decision.arrival_rate_forecast_per_s if decision else None
            upper = decision.arrival_rate_upper_per_s if decision else None
            forecasts.append(math.nan if point is None else point)
            uppers.append(math.nan if upper is None else upper)

    done = 0

    def on_batch(requests: int) -> None:
        nonlocal done
        done += requests
        if on_progress is not None:
            on_progress(name, done)

    cluster.run(trace.batches(), settings.tick_s, demand.duration_s, on_tick, on_batch=on_batch)
    records = cluster.records()
    row = _summarise(name, demand.requests, records, cluster, settings)
    series = _series(
        records,
        settings,
        demand.duration_s,
        np.frombuffer(targets, dtype=np.int32),
        np.frombuffer(costing, dtype=np.int32),
        np.frombuffer(forecasts, dtype=np.float64) if autoscalerd is not None else None,
        np.frombuffer(uppers, dtype=np.float64) if autoscalerd is not None else None,
    )
    return row, series


def _summarise(
    name: str,
    requests: int,
    records: RequestRecords,
    cluster: Cluster,
    settings: BacktestSettings,
) -> PolicyResult:
    finished = len(records)
    # float64 for the arithmetic; the records are float32 to fit a week in memory.
    ttft_s = records.ttft_s.astype(np.float64)
    met = int(np.count_nonzero(ttft_s <= settings.ttft_slo_s + 1e-9))
    tpot_s = records.tpot_s[~np.isnan(records.tpot_s)].astype(np.float64)

    def pct(values: np.ndarray, q: float) -> float | None:
        return float(np.percentile(values, q)) if values.size else None

    return PolicyResult(
        policy=name,
        requests=requests,
        # Unfinished requests count as misses.
        slo_attainment_ttft=met / requests if requests else None,
        ttft_p50_s=pct(ttft_s, 50),
        ttft_p99_s=pct(ttft_s, 99),
        e2e_p99_s=pct(records.e2e_s.astype(np.float64), 99),
        tpot_p99_s=pct(tpot_s, 99),
        replica_seconds=cluster.replica_seconds,
        gpu_seconds=cluster.replica_seconds * settings.replica.gpus_per_replica,
        cost_vs_oracle=None,
        cost_vs_static_peak=None,
        scale_actions=cluster.scale_actions,
        max_queue=cluster.max_queue,
        unfinished=requests - finished,
    )


def _series(
    records: RequestRecords,
    settings: BacktestSettings,
    duration_s: float,
    targets: np.ndarray,
    costing: np.ndarray,
    forecasts: np.ndarray | None,
    uppers: np.ndarray | None,
) -> PolicySeries:
    # Per-tick series, averaged over spans of `per` ticks.
    ticks = targets.size
    per = max(1, math.ceil(ticks / settings.series_points))
    time_s = (np.arange(0, ticks, per) + per / 2) * settings.tick_s

    def reduce(values: np.ndarray) -> np.ndarray:
        pad = (-values.size) % per
        padded = np.concatenate((values.astype(np.float64), np.full(pad, np.nan)))
        with np.errstate(invalid="ignore"):
            blocks = padded.reshape(-1, per)
            counts = np.sum(~np.isnan(blocks), axis=1)
            sums = np.nansum(blocks, axis=1)
            return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)

    ttft_bin_s = ttft_bin_width_s(duration_s)
    ttft_time_s, ttft_p99_s = quantile_by_time(
        records.arrival_s, records.ttft_s, ttft_bin_s, duration_s, 0.99
    )
    return PolicySeries(
        time_s=time_s,
        target_replicas=reduce(targets),
        replicas=reduce(costing),
        ttft_time_s=ttft_time_s,
        ttft_p99_s=ttft_p99_s,
        forecast_per_s=reduce(forecasts) if forecasts is not None else None,
        forecast_upper_per_s=reduce(uppers) if uppers is not None else None,
    )


def ttft_bin_width_s(duration_s: float) -> float:
    """A round bin width giving at most about 500 bins."""
    for minutes in (1, 2, 5, 10, 15, 20, 30, 60, 120, 240, 360, 720, 1440):
        if duration_s / (60.0 * minutes) <= 500:
            return 60.0 * minutes
    return 86400.0


def quantile_by_time(
    at_s: np.ndarray, values: np.ndarray, bin_s: float, duration_s: float, quantile: float
) -> tuple[np.ndarray, np.ndarray]:
    """The `quantile` of `values` per whole time bin of `at_s`; NaN for empty bins.

    A last bin cut short by the end of the trace is left out: the few requests in it
    make a noisy quantile.
    """
    bins = max(1, math.floor(duration_s / bin_s))
    centres = (np.arange(bins) + 0.5) * bin_s
    out = np.full(bins, np.nan)
    if at_s.size == 0:
        return centres, out
    index = (at_s.astype(np.float64) // bin_s).astype(np.int64)
    inside = index < bins
    index, values = index[inside], values[inside]
    order = np.lexsort((values, index))
    sorted_index = index[order]
    sorted_values = values[order]
    starts = np.searchsorted(sorted_index, np.arange(bins), "left")
    stops = np.searchsorted(sorted_index, np.arange(bins), "right")
    sizes = stops - starts
    has = sizes > 0
    # Nearest-rank quantile within each bin.
    rank = starts[has] + np.ceil(quantile * sizes[has]).astype(np.int64) - 1
    out[has] = sorted_values[np.clip(rank, starts[has], stops[has] - 1)]
    return centres, out
