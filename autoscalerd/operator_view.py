"""What the operator commands print, from the daemon's JSON alone: the status table, a
decision explained stage by stage, and the one line that confirms a pause, resume or
override. Pure: the JSON in, text out; nothing here talks to the daemon."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

# Below this a clock reading is not a Unix time (a test's virtual clock): shown as is.
_EPOCH_FLOOR_S = 1e9
_LABEL_WIDTH = 28

# One sentence per reason code (autoscalerd.model.Reason), with the decision's numbers.
REASON_TEXT: dict[str, str] = {
    "capacity": "The replica model's sizing set the count: {replicas_capacity} replicas keep "
    "the predicted wait tail within the tail share at the target rate of {target_rate}.",
    "concurrency": "Ray Serve's concurrency rule set the count: (ongoing + queued) / "
    "target_ongoing_requests = {replicas_concurrency} replicas.",
    "burst": "The measured burstiness set the count: one tick's requests at {peak_to_mean}x "
    "the mean, and each clump of several ticks ({clumps}), must be served within their "
    "window plus the wait budget of {wait_budget}.",
    "surge_released": "A surge of the last hour has not recurred for twice its span: its "
    "clumps no longer count, and the sizing reads the traffic since ({clumps}).",
    "headroom_tightened": "More requests missed the SLO than the model predicted "
    "(calibration {calibration}), so the sizing aims at a smaller tail share ({tail_share}).",
    "headroom_relaxed": "Fewer requests missed the SLO than the model predicted "
    "(calibration {calibration}), so the sizing aims at a larger tail share ({tail_share}).",
    "ray_compatible": "Decided by Ray Serve's default autoscaling policy, exactly "
    "(mode: ray-compatible).",
    "model_mismatch": "The observed and predicted waits disagree beyond the guard's bounds: "
    "the model is not trusted to scale down.",
    "backlog": "{queued} queued requests, {backlog} by the time new replicas can serve "
    "(arrivals outrunning what runs over the lead time), added replicas to drain them "
    "within capacity.drain_s ({drain_s}).",
    "forecast_leads": "The forecast's upper bound ({upper_rate}), not the short-window rate "
    "({short_rate}), set the target rate (by at least one request over the lead time).",
    "slo_breach": "The wait SLO is broken ({breached}; fast burn {burn_fast}): replicas "
    "are added at once, or a scale-down is blocked.",
    "upscale_delayed": "More replicas are wanted, but not yet for the whole upscale_delay_s "
    "({upscale_delay_s}).",
    "downscale_delayed": "Fewer replicas would do, but not yet for the whole "
    "downscale_delay_s ({downscale_delay_s}).",
    "step_limited": "Ray's upscaling_factor / downscaling_factor ({factors}) scaled the step "
    "from {previous} (a gain on the delta, as in Ray).",
    "step_capped": "stabilize.max_step_up_ratio / min_step_down_ratio ({step_caps}) capped "
    "the step from {previous}.",
    "cooldown": "An action happened less than cooldown_s ({cooldown_s}) ago: the target holds.",
    "bounded_min": "Held at min_replicas ({min_replicas}).",
    "bounded_max": "Capped at max_replicas ({max_replicas}).",
    "scale_to_zero": "No requests for downscale_to_zero_delay_s: scaled to zero.",
    "activate_from_zero": "A request arrived while at zero: a replica starts at once, "
    "bypassing the delays.",
    "stale_data": "Inputs are missing or older than max_metric_age_s ({max_metric_age_s}): "
    "the target holds (fail static).",
    "gpu_failed": "A replica's GPU failed: its capacity ({gpu_lost} replicas' worth) is "
    "replaced at once.",
    "gpu_degraded": "A replica's GPU is slowed: counted at its measured share "
    "({gpu_lost} replicas' worth lost), added at once.",
    "partial_data": "Some metrics endpoints did not answer: the load readings are lower "
    "bounds, so there is no scale-down.",
    "warmup": "Less than a downscale_delay_s ({downscale_delay_s}) of fresh data since the "
    "start: no scale-down yet.",
    "steady": "Nothing to change.",
    "scale_up": "The policy asked for more replicas than the previous target ({previous}).",
    "scale_down": "The policy asked for fewer replicas than the previous target ({previous}).",
    "paused": "An operator paused the deployment: the running count holds while the policy "
    "keeps learning.",
    "override": "An operator pinned the target at {target}.",
}
_UNKNOWN_REASON = "A reason code this client does not know; see the daemon's README."

# Fail-static and bounds reasons: what held or clipped the knobs' result.
_HOLD_REASONS = (
    "stale_data",
    "warmup",
    "partial_data",
    "slo_breach",
    "cooldown",
    "bounded_min",
    "bounded_max",
    "scale_to_zero",
    "activate_from_zero",
)


# ---------------------------------------------------------------- values


def number(value: Any, digits: int = 2, unit: str = "") -> str:
    """A JSON number for people: '-' when unknown (null), never a made-up zero."""
    if value is None or isinstance(value, bool):
        return "-"
    if isinstance(value, int):
        return f"{value}{unit}"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return str(value)


def seconds(value: Any) -> str:
    """A configured duration: as written (300 s, 0.5 s), '-' when unknown."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return f"{value:g} s"


def when(at_s: Any, now_s: Any = None) -> str:
    """A daemon clock reading as UTC ISO-8601, with how far from `now_s` when given."""
    if not isinstance(at_s, int | float) or isinstance(at_s, bool):
        return "-"
    if at_s >= _EPOCH_FLOOR_S:
        shown = datetime.fromtimestamp(at_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    else:
        shown = f"t={at_s:.1f}s"
    if not isinstance(now_s, int | float):
        return shown
    delta_s = at_s - now_s
    if abs(delta_s) < 0.5:
        return f"{shown} (now)"
    ahead = duration(abs(delta_s))
    return f"{shown} (in {ahead})" if delta_s > 0 else f"{shown} ({ahead} ago)"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def replicas(count: Any) -> str:
    return f"{number(count)} replica" + ("" if count == 1 else "s")


def _input(entry: Mapping[str, Any], name: str) -> Any:
    inputs = (entry.get("last_observation") or {}).get("inputs") or {}
    return (inputs.get(name) or {}).get("value")


def operator_line(operator: Mapping[str, Any] | None, now_s: Any) -> str:
    """The pause or override in force, in words: what, by whom, until when, why."""
    if not operator:
        return "none"
    if operator.get("action") == "override":
        words = f"override {replicas(operator.get('replicas'))}"
    else:
        words = "paused"
    if operator.get("by"):
        words += f" by {operator['by']}"
    if operator.get("since_s") is not None:
        words += f" since {when(operator['since_s'], now_s)}"
    until = operator.get("until_s")
    words += f", until {when(until, now_s)}" if until is not None else ", until resumed"
    if operator.get("reason"):
        words += f": {operator['reason']}"
    return words


def action_line(action: Mapping[str, Any], now_s: Any = None) -> str:
    """One entry of the audit trail."""
    kind = action.get("action")
    words = f"{when(action.get('at_s'), now_s)}  {kind}"
    if kind == "override":
        words += f" {action.get('replicas')}"
    words += f" by {action.get('by')}"
    if action.get("until_s") is not None:
        words += f" until {when(action['until_s'])}"
    return f"{words}: {action.get('reason')}"


# ---------------------------------------------------------------- status


def table(columns: Sequence[tuple[str, bool]], rows: Iterable[Sequence[str]]) -> str:
    """A plain-text table: `columns` are (header, right-aligned); cells three spaces
    apart, a rule under the header, no line wrapped (a pipe and grep read what a terminal
    shows), lines without trailing blanks."""
    body = [list(row) for row in rows]
    widths = [
        max(len(header), *(len(row[i]) for row in body)) for i, (header, _) in enumerate(columns)
    ]

    def line(cells: Sequence[str]) -> str:
        return "   ".join(
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, (_, right) in zip(cells, widths, columns, strict=True)
        ).rstrip()

    rule = "─" * (sum(widths) + 3 * (len(widths) - 1))
    return "\n".join([line([header for header, _ in columns]), rule, *map(line, body)])


def status_text(status: Mapping[str, Any], deployment: str | None = None) -> str:
    """`autoscalerd status`: a summary line, one table row per deployment, then the lines
    a row has no room for (operator, errors, GPUs not healthy, conflicts)."""
    now_s = status.get("now_s")
    deployments: Mapping[str, Any] = status.get("deployments") or {}
    if deployment is not None:
        deployments = {deployment: deployments[deployment]}
    lines = [_summary(status)]
    for name, sensor in sorted((status.get("sensors") or {}).items()):
        if not sensor.get("ok", True):
            lines.append(f"sensor {name}: {sensor.get('error')}")
    for name, why in sorted((status.get("waiting") or {}).items()):
        if deployment is None or name == deployment:
            lines.append(f"waiting: {name} ({why})")
    lines.append("")
    if not deployments:
        lines.append("no deployments managed yet")
        return "\n".join(lines)
    lines.append(_table(deployments))
    notes = [line for name, entry in deployments.items() for line in _notes(name, entry, now_s)]
    for gpu in status.get("gpus_unattributed") or ():
        if gpu.get("state") != "healthy":
            notes.append(f"GPU {gpu.get('gpu')} (on no known replica): {_gpu_state(gpu)}")
    if notes:
        lines.extend(["", *notes])
    if deployment is not None:
        history = deployments[deployment].get("operator_history") or []
        lines.extend(["", "operator actions, oldest first:"])
        lines.extend(f"  {action_line(a, now_s)}" for a in history)
        if not history:
            lines.append("  none")
    return "\n".join(lines)


def _summary(status: Mapping[str, Any]) -> str:
    state = [
        "healthy" if status.get("healthy") else "NOT HEALTHY",
        "ready" if status.get("ready") else "NOT READY",
        f"{status.get('ticks_completed')} ticks of {seconds(status.get('tick_s'))}",
    ]
    if status.get("dry_run"):
        state.append("dry run")
    version = status.get("version", "?")
    return f"autoscalerd {version} at {when(status.get('now_s'))}: {', '.join(state)}"


_COLUMNS = (
    ("DEPLOYMENT", False),
    ("LOAD/S", True),
    ("UPPER/S", True),
    ("DESIRED", True),
    ("APPLIED", True),
    ("RUNNING", True),
    ("WAIT P99/BUDGET", True),
    ("BURN FAST/SLOW", True),
    ("SLO", False),
    ("OPERATOR", False),
    ("REASONS", False),
)


def _table(deployments: Mapping[str, Any]) -> str:
    rows = []
    for name, entry in deployments.items():
        decision = entry.get("last_decision") or {}
        unit = "" if decision.get("load_unit", "requests") == "requests" else " tok"
        operator = entry.get("operator")
        if not operator:
            operator_cell = "-"
        elif operator.get("action") == "override":
            operator_cell = f"override {operator.get('replicas')}"
        else:
            operator_cell = "paused"
        if not decision:
            slo = "-"
        elif decision.get("slo_breached"):
            slo = "BREACHED " + ",".join(decision["slo_breached"])
        else:
            slo = "ok"
        rows.append(
            (
                name,
                number(decision.get("arrival_rate_obs_per_s")) + unit,
                number(decision.get("arrival_rate_upper_per_s")) + unit,
                number(entry.get("target_replicas")),
                number(entry.get("applied_replicas")),
                number(_input(entry, "running_replicas"), 0),
                f"{number(_input(entry, 'queue_wait_p99_s'))}/"
                f"{number(decision.get('wait_budget_s'))} s",
                f"{number(decision.get('burn_rate_fast'))}/{number(decision.get('burn_rate_slow'))}",
                slo,
                operator_cell,
                " ".join(decision.get("reasons") or ()) or "-",
            )
        )
    return table(_COLUMNS, rows)


def _notes(name: str, entry: Mapping[str, Any], now_s: Any) -> list[str]:
    notes = []
    if entry.get("operator"):
        notes.append(f"{name}: {operator_line(entry['operator'], now_s)}")
    if entry.get("last_error"):
        notes.append(f"{name}: error: {entry['last_error']}")
    conflicts = entry.get("conflicts") or {}
    if conflicts.get("count"):
        last = f", last: {conflicts['last']}" if conflicts.get("last") else ""
        notes.append(f"{name}: {conflicts['count']} changes of its target by others{last}")
    for gpu in entry.get("gpus") or ():
        if gpu.get("state") != "healthy":
            where = f"replica {gpu.get('replica')}"
            if gpu.get("node_ip"):
                where += f" on {gpu['node_ip']}"
            notes.append(f"{name}: GPU {gpu.get('gpu')} ({where}): {_gpu_state(gpu)}")
    return notes


def _gpu_state(gpu: Mapping[str, Any]) -> str:
    reason = f" ({gpu['reason']})" if gpu.get("reason") else ""
    share = gpu.get("capacity_share")
    capacity = f", {share:.0%} of its capacity" if isinstance(share, int | float) else ""
    return f"{gpu.get('state')}{reason}{capacity}"


# ---------------------------------------------------------------- explain


def explain_text(
    decision: Mapping[str, Any],
    entry: Mapping[str, Any] | None = None,
    operator_history: Iterable[Mapping[str, Any]] = (),
    now_s: Any = None,
) -> str:
    """`autoscalerd explain`: one decision stage by stage, in the pipeline's order (rates,
    replica model, forecast, sizing, SLO guard, knobs, bounds and fail-static, GPU,
    operator), then each reason code in a sentence. `entry` is the deployment's
    /v1/status entry, for its config (as configured now) and the operator in force;
    `operator_history` places a past decision's operator action."""
    config: Mapping[str, Any] = (entry or {}).get("config") or {}
    autoscaling = config.get("autoscaling") or {}
    unit = "tok/s" if decision.get("load_unit") == "tokens" else "/s"

    def rate(field: str) -> str:
        return number(decision.get(field), 2, unit)

    target, previous = decision.get("target_replicas"), decision.get("previous_replicas")
    if target == previous:
        change = f"{replicas(target)}, unchanged"
    else:
        change = f"{number(previous)} -> {replicas(target)}"
    out = [
        f"{decision.get('deployment') or '-'}: {change}, decided at "
        f"{when(decision.get('decided_at_s'), now_s)}",
        f"mode {config.get('mode', '-')}, sizing "
        f"{(config.get('capacity') or {}).get('sizing', '-')}, load in "
        f"{decision.get('load_unit', 'requests')} per second",
    ]

    def section(title: str, rows: Iterable[tuple[str, str]]) -> None:
        out.append("")
        out.append(title)
        out.extend(f"  {label:<{_LABEL_WIDTH}}{value}".rstrip() for label, value in rows)

    section(
        "1. rates",
        [
            ("observed (look-back mean)", rate("arrival_rate_obs_per_s")),
            ("short window", rate("arrival_rate_short_per_s")),
            ("scale-down window", rate("arrival_rate_down_per_s")),
            (
                "forecast point / upper",
                f"{number(decision.get('arrival_rate_forecast_per_s'))} / "
                f"{rate('arrival_rate_upper_per_s')}"
                + (f" ({decision['forecast_method']})" if decision.get("forecast_method") else ""),
            ),
            (
                "target",
                f"{rate('arrival_rate_target_per_s')}  the larger of the forecast's upper "
                "bound and the short-window rate",
            ),
            ("service rate per replica", rate("service_rate_per_replica_per_s")),
            (
                "ongoing / queued",
                f"{number(decision.get('ongoing_requests'), 1)} / "
                f"{number(decision.get('queued_requests'), 1)}",
            ),
        ],
    )
    model: Mapping[str, Any] = decision.get("replica_model") or {}
    model_rows = [("parameter", "value       samples  age")]
    for name, estimate in model.items():
        age = estimate.get("age_s")
        model_rows.append(
            (
                name,
                f"{_estimate(estimate.get('value')):<12}{estimate.get('samples', 0):>7}  "
                + ("prior" if age is None else duration(age) + " old"),
            )
        )
    if not model:
        model_rows = [("estimates", "none (not used by this mode)")]
    section("2. replica model", model_rows)
    binding = decision.get("sizing_binding")
    section(
        "3. sizing",
        [
            (
                "replicas for the load",
                f"{number(decision.get('replicas_capacity'))} (concurrency rule: "
                f"{number(decision.get('replicas_concurrency'))})",
            ),
            ("binding condition", f"{binding or '-'}" + _binding_text(binding)),
            (
                "predicted wait tail",
                f"{number(decision.get('predicted_wait_tail'), 4)}  share of requests over "
                f"the wait budget, aimed at most {number(decision.get('tail_share'), 4)}",
            ),
            ("peak-to-mean", number(decision.get("peak_to_mean"))),
            ("clumps", _clumps(decision.get("clumps"))),
            ("wait budget", number(decision.get("wait_budget_s"), 3, " s")),
            ("tail share", number(decision.get("tail_share"), 4)),
        ],
    )
    breached = decision.get("slo_breached") or []
    section(
        "4. SLO guard",
        [
            (
                "burn rate fast / slow",
                f"{number(decision.get('burn_rate_fast'))} / "
                f"{number(decision.get('burn_rate_slow'))}  (1 spends the error budget "
                "exactly over its window)",
            ),
            (
                "model calibration",
                f"{number(decision.get('model_calibration'))}  observed / predicted misses",
            ),
            ("breached", ", ".join(breached) if breached else "none"),
            (
                "scale-down floor",
                f"{number(decision.get('slo_floor_replicas'))}  (while the budget burns: one "
                "more than the replicas that ran when it burnt)",
            ),
        ],
    )
    section(
        "5. knobs",
        [
            ("raw", f"{number(decision.get('replicas_raw'))}  from the short-window rate"),
            (
                "smoothed",
                f"{number(decision.get('replicas_smoothed'), 1)}  stabilize.ema_weight "
                f"{number((config.get('stabilize') or {}).get('ema_weight'), 2)}",
            ),
            (
                "sustained",
                f"{number(decision.get('replicas_sustained'))}  from the scale-down rate "
                f"(the {seconds(autoscaling.get('look_back_period_s'))} look-back mean, "
                "less its noise)",
            ),
            (
                "stabilized",
                f"{number(decision.get('replicas_stabilized'))}  after the delay windows "
                f"(up {seconds(autoscaling.get('upscale_delay_s'))}, down "
                f"{seconds(autoscaling.get('downscale_delay_s'))}), Ray's factors "
                f"({'/'.join(number(f) for f in _factors(autoscaling))}) and step caps",
            ),
        ],
    )
    reasons: list[str] = list(decision.get("reasons") or ())
    held = [r for r in reasons if r in _HOLD_REASONS]
    section(
        "6. bounds and fail-static",
        [
            (
                "bounds",
                f"[{number(autoscaling.get('min_replicas'))}, "
                f"{number(autoscaling.get('max_replicas'))}] as configured now",
            ),
            ("held or clipped by", ", ".join(held) if held else "nothing"),
        ],
    )
    gpus = decision.get("gpu_replicas") or []
    section(
        "7. GPU",
        [
            ("lost replicas", number(decision.get("gpu_lost_replicas"))),
            (
                "GPUs not healthy",
                "; ".join(
                    f"{g.get('gpu')} on {g.get('replica')}: {g.get('state')}"
                    + (f" ({g['reason']})" if g.get("reason") else "")
                    for g in gpus
                )
                or "none",
            ),
        ],
    )
    section("8. operator", [("in force", _operator_at(decision, entry, operator_history))])
    section(
        "result",
        [
            ("target", f"{number(target)} (previous {number(previous)})"),
        ],
    )
    values = _reason_values(decision, config)
    out.append("")
    out.append("reasons")
    width = max((len(r) for r in reasons), default=0) + 2
    for reason in reasons:
        text = REASON_TEXT.get(reason, _UNKNOWN_REASON).format_map(values)
        out.append(f"  {reason:<{width}}{text}")
    if not reasons:
        out.append("  none recorded")
    return "\n".join(out)


def _estimate(value: Any) -> str:
    """A replica-model parameter: a count as a count, tiny and huge values in 3 digits."""
    if not isinstance(value, float):
        return number(value)
    if value.is_integer() and abs(value) < 1e5:
        return str(int(value))
    if abs(value) < 0.01 or abs(value) >= 1e5:
        return f"{value:.3g}"
    return number(value, 4 if abs(value) < 1 else 2)


def _clumps(clumps: object) -> str:
    """'64 in 4 s, 120 in 8 s': the clump per window the sizing held capacity for."""
    if not isinstance(clumps, list) or not clumps:
        return "none measured yet"
    shown = []
    for entry in clumps:
        if isinstance(entry, Mapping):
            requests, window = entry.get("requests"), entry.get("window_s")
            shown.append(f"{number(requests, 0)} in {number(window, 0, ' s')}")
    return ", ".join(shown) or "none measured yet"


def _binding_text(binding: str | None) -> str:
    return {
        "prefill": ": the prefill queue's wait tail set the count",
        "slots": ": the slots' wait (square-root staffing) set the count",
        "burst": ": serving a tick's burst or a clump within its window plus the wait "
        "budget set the count",
        "minimum": ": one replica is enough",
    }.get(binding or "", "")


def _operator_at(
    decision: Mapping[str, Any],
    entry: Mapping[str, Any] | None,
    history: Iterable[Mapping[str, Any]],
) -> str:
    """The operator action behind a decision: the last one recorded at or before it when
    the decision was paused or overridden, else none."""
    reasons = decision.get("reasons") or ()
    if "paused" not in reasons and "override" not in reasons:
        return "none"
    at_s = decision.get("decided_at_s")
    earlier = [
        a
        for a in history
        if isinstance(at_s, int | float)
        and isinstance(a.get("at_s"), int | float)
        and a["at_s"] <= at_s + 1e-3  # decided_at_s is rounded to 4 digits
        and a.get("action") in ("pause", "override")
    ]
    if earlier:
        return action_line(earlier[-1])
    current = (entry or {}).get("operator")
    if current:
        return operator_line(current, None)
    return "paused" if "paused" in reasons else "override"


class _Missing(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "-"


def _factors(autoscaling: Mapping[str, Any]) -> tuple[Any, Any]:
    """Ray's effective (upscaling, downscaling) factors: each field, then its deprecated
    per-direction fallback, then `smoothing_factor` (default 1)."""
    shared = autoscaling.get("smoothing_factor", 1.0)

    def first(*names: str) -> Any:
        return next((autoscaling[n] for n in names if autoscaling.get(n) is not None), shared)

    return (
        first("upscaling_factor", "upscale_smoothing_factor"),
        first("downscaling_factor", "downscale_smoothing_factor"),
    )


def _reason_values(decision: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, str]:
    autoscaling = config.get("autoscaling") or {}
    capacity = config.get("capacity") or {}
    unit = "tok/s" if decision.get("load_unit") == "tokens" else "/s"
    stabilize = config.get("stabilize") or {}
    factors = "/".join(number(f) for f in _factors(autoscaling))
    step_caps = "/".join(
        number(stabilize.get(k)) for k in ("max_step_up_ratio", "min_step_down_ratio")
    )
    return _Missing(
        replicas_capacity=number(decision.get("replicas_capacity")),
        replicas_concurrency=number(decision.get("replicas_concurrency")),
        target_rate=number(decision.get("arrival_rate_target_per_s"), 2, unit),
        upper_rate=number(decision.get("arrival_rate_upper_per_s"), 2, unit),
        short_rate=number(decision.get("arrival_rate_short_per_s"), 2, unit),
        peak_to_mean=number(decision.get("peak_to_mean")),
        clumps=_clumps(decision.get("clumps")),
        wait_budget=number(decision.get("wait_budget_s"), 3, " s"),
        calibration=number(decision.get("model_calibration")),
        tail_share=number(decision.get("tail_share"), 4),
        queued=number(decision.get("queued_requests"), 0),
        backlog=number(decision.get("backlog_at_landing_requests"), 0),
        drain_s=seconds(capacity.get("drain_s")),
        breached=", ".join(decision.get("slo_breached") or ()) or "burning",
        burn_fast=number(decision.get("burn_rate_fast")),
        upscale_delay_s=seconds(autoscaling.get("upscale_delay_s")),
        downscale_delay_s=seconds(autoscaling.get("downscale_delay_s")),
        factors=factors,
        step_caps=step_caps,
        previous=number(decision.get("previous_replicas")),
        target=number(decision.get("target_replicas")),
        cooldown_s=seconds(config.get("cooldown_s")),
        min_replicas=number(autoscaling.get("min_replicas")),
        max_replicas=number(autoscaling.get("max_replicas")),
        max_metric_age_s=seconds(config.get("max_metric_age_s")),
        gpu_lost=number(decision.get("gpu_lost_replicas")),
    )


# ---------------------------------------------------------------- operator changes


def change_text(answer: Mapping[str, Any], requested: int | None = None) -> str:
    """The line confirming a pause, resume or override, from the daemon's answer."""
    name = answer.get("deployment")
    recorded = answer.get("recorded") or {}
    action = recorded.get("action")
    now_s = recorded.get("at_s")
    if action == "resume":
        return f"{name}: resumed by {recorded.get('by')}: {recorded.get('reason')}"
    line = f"{name}: {operator_line(answer.get('operator'), now_s)}"
    pinned = (answer.get("operator") or {}).get("replicas")
    if requested is not None and pinned is not None and pinned != requested:
        line += f" (asked {requested}, clipped to the bounds)"
    return line
