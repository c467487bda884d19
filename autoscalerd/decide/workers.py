"""Worker nodes per worker group: the replicas' resource bundles packed onto node shapes.

The `ray_autoscaler` actuator asks Ray for one bundle per replica (`merged_bundles`) and
Ray's autoscaler packs them onto its node types. A cluster whose worker nodes something
else scales (KEDA on `autoscalerd_desired_workers`) needs that count from autoscalerd:
`desired_workers` packs the same bundles onto `cluster.worker_groups` as Ray's autoscaler
packs them (`get_bin_pack_residual` in Ray's `resource_demand_scheduler.py`): bundles in
Ray's order (more kinds of resource first, then heavier, then by name), each onto the
first node counted so far with room, group by group in config order. Where none has
room, a new node of the first group whose shape holds the bundle and that is below its
`max_workers`, groups without GPUs first for a bundle that asks for none (Ray's "conserve
GPU nodes"). Ray chooses between node types by a utilisation score; autoscalerd takes
the configured order, which the operator controls.

Identical bundles and identical nodes are counted, not listed one by one, so that the
count stays cheap at any replica count (first-fit places a run of identical bundles as
it would one at a time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoscalerd.config import WorkerGroupConfig

Bundle = dict[str, float]

# Amounts this close count as equal: ten 0.1-GPU replicas fill one GPU. (Ray counts in
# fixed point, to a ten-thousandth, for the same reason.)
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """Worker nodes each group needs, and the replicas no group can hold."""

    # Every configured group, in config order: at least its min_workers.
    workers: Mapping[str, int]
    # Bundles that fit no group's node shape, or that only groups at max_workers fit.
    unplaced_replicas: int
    # Deployments whose resources per replica hold an amount that is no number (NaN,
    # infinite): left out, so the counts are a lower bound and not to be acted on.
    unknown: tuple[str, ...] = ()


def bundle_runs(
    needs: Mapping[str, tuple[int, Mapping[str, float]]], max_gpus: int | None = None
) -> list[tuple[Bundle, int]]:
    """`merged_bundles` as (bundle, replicas) per deployment, in the same order."""
    runs: list[tuple[Bundle, int]] = []
    gpus = 0.0
    for name in sorted(needs):
        replicas, resources = needs[name]
        amounts = {k: float(v) for k, v in resources.items()}
        if not all(math.isfinite(v) for v in amounts.values()):
            continue  # an amount that is no number is unknown: as if none were known
        bundle = {k: v for k, v in amounts.items() if v > 0}
        if not bundle or replicas <= 0:
            continue
        count = replicas
        gpu = bundle.get("GPU", 0.0)
        if max_gpus is not None and gpu:
            # Compared as a float first: a tiny GPU share makes the ratio infinite.
            allowed = (max_gpus + _EPSILON - gpus) / gpu
            count = replicas if allowed >= replicas else max(0, math.floor(allowed))
            gpus += count * gpu
        if count:
            runs.append((bundle, count))
    return runs


def merged_bundles(
    needs: Mapping[str, tuple[int, Mapping[str, float]]], max_gpus: int | None = None
) -> list[Bundle]:
    """One bundle per replica, deployments in name order; zero resources dropped.

    With `max_gpus`, the bundles asking for GPUs stop at the budget (later deployments in
    name order lose first; the decision core shares the budget, this is the last guard).
    """
    return [dict(bundle) for bundle, count in bundle_runs(needs, max_gpus) for _ in range(count)]


@dataclass(slots=True)
class _Nodes:
    """`count` nodes of one group with the same resources left."""

    free: dict[str, float]
    count: int


def desired_workers(
    needs: Mapping[str, tuple[int, Mapping[str, float]]],
    groups: Sequence[WorkerGroupConfig],
    max_gpus: int | None = None,
) -> WorkerPlan:
    """The worker nodes per group that hold `needs` (deployment -> (replicas, resources
    per replica)): see the module docstring for the packing."""
    merged: dict[tuple[tuple[str, float], ...], int] = {}
    for bundle, count in bundle_runs(needs, max_gpus):
        key = tuple(sorted(bundle.items()))
        merged[key] = merged.get(key, 0) + count
    # Ray's order: more kinds of resource first, then heavier, then by name (descending).
    order = sorted(merged, key=lambda key: (len(key), sum(v for _, v in key), key), reverse=True)
    # The min_workers nodes exist before any bundle, as Ray launches them first.
    nodes = {g.name: [_Nodes(dict(g.resources_per_worker), g.min_workers)] for g in groups}
    opened = {g.name: g.min_workers for g in groups}
    unplaced = 0
    for key in order:
        bundle, count = dict(key), merged[key]
        for group in groups:
            count = _fill(nodes[group.name], bundle, count)
        for group in _new_node_order(groups, bundle):
            if count == 0:
                break
            per_node = _room(group.resources_per_worker, bundle, count)
            if per_node == 0:
                continue
            limit = group.max_workers
            room = count if limit is None else min(count, max(0, limit - opened[group.name]))
            new = min(-(-count // per_node), room)
            if new == 0:
                continue
            placed = min(count, new * per_node)
            full, last = divmod(placed, per_node)
            shape = group.resources_per_worker
            if full:
                nodes[group.name].append(_Nodes(_less(shape, bundle, per_node), full))
            if last:
                nodes[group.name].append(_Nodes(_less(shape, bundle, last), 1))
            opened[group.name] += new
            count -= placed
        unplaced += count
    unknown = tuple(
        name
        for name in sorted(needs)
        if not all(math.isfinite(float(v)) for v in needs[name][1].values())
    )
    return WorkerPlan(
        workers={g.name: opened[g.name] for g in groups},
        unplaced_replicas=unplaced,
        unknown=unknown,
    )


def _fill(nodes: list[_Nodes], bundle: Mapping[str, float], count: int) -> int:
    """First-fit `count` bundles onto `nodes` in order (in place); the count left over."""
    index = 0
    while index < len(nodes) and count > 0:
        run = nodes[index]
        per_node = _room(run.free, bundle, count)
        if per_node == 0 or run.count == 0:
            index += 1
            continue
        if count >= per_node * run.count:
            run.free = _less(run.free, bundle, per_node)
            count -= per_node * run.count
            index += 1
            continue
        # The first nodes of the run take per_node each, the next one the rest, and the
        # others keep what they had: the run splits in up to three, in node order.
        full, last = divmod(count, per_node)
        split = [_Nodes(_less(run.free, bundle, per_node), full)] if full else []
        if last:
            split.append(_Nodes(_less(run.free, bundle, last), 1))
        untouched = run.count - full - (1 if last else 0)
        if untouched:
            split.append(_Nodes(dict(run.free), untouched))
        nodes[index : index + 1] = split
        return 0
    return count


def _room(free: Mapping[str, float], bundle: Mapping[str, float], most: int) -> int:
    """How many bundles fit on one node with `free` left, at most `most`."""
    fit = float(most)
    for name, amount in bundle.items():
        fit = min(fit, (free.get(name, 0.0) + _EPSILON) / amount)
    return min(most, math.floor(fit)) if fit >= 1 else 0


def _less(free: Mapping[str, float], bundle: Mapping[str, float], times: int) -> dict[str, float]:
    left = dict(free)
    for name, amount in bundle.items():
        left[name] = max(0.0, left.get(name, 0.0) - times * amount)
    return left


def _new_node_order(
    groups: Sequence[WorkerGroupConfig], bundle: Mapping[str, float]
) -> list[WorkerGroupConfig]:
    """Config order; for a bundle that asks for no GPU, the groups without GPUs first."""
    if bundle.get("GPU", 0.0) > 0:
        return list(groups)
    return sorted(groups, key=lambda g: g.resources_per_worker.get("GPU", 0.0) > 0)
