"""How each model's replicas are replaced in a rolling update, from its pool's spare capacity. Pure.

A GPU pool's spare room is what is left when every model on it runs its max replicas: whole spare nodes (shared
out between the pool's models) and the empty slots of each model's last node. A model with spare room surges into
it and takes nothing away (``maxUnavailable: 0``), so its available replicas never drop below
``scaling.min_replicas``; one without replaces a replica at a time (``maxSurge: 0``, ``maxUnavailable: 1``), which
at min replicas is one fewer than the minimum for a whole cold start: the plan warns and names the pool's
``max_nodes``. Surging into room that is not there would leave the new replicas Pending and the rollout stuck, so
surge never exceeds the spare room.

A rollout takes ``steps`` rounds of up to one startup budget each; `pulumi up` waits for all of them
(``update_timeout_s``), while a single round must show progress within one budget (the progress deadline).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from components.core.placement import Layout, Placement, PoolPlan
from components.core.startup import StartupBudget, minutes
from components.spec import ModelSpec, PlatformSpec


@dataclass(frozen=True)
class Rollout:
    """One model's rolling-update strategy and how long it may take."""

    max_surge: int
    max_unavailable: int
    steps: int
    """Rounds of a rolling update at max replicas."""
    startup: StartupBudget
    keeps_minimum: bool
    reason: str

    @property
    def update_timeout_s(self) -> int:
        return self.steps * self.startup.budget_s

    def describe(self) -> str:
        return (
            f"maxSurge {self.max_surge}, maxUnavailable {self.max_unavailable} ({self.reason}); "
            f"{self.steps} round(s) at max replicas, up to {minutes(self.update_timeout_s)}"
        )


def _slots(placement: Placement) -> int:
    """Replicas of one model a node holds (1 for a replica that spans nodes)."""
    return placement.replicas_per_node


def spare_replicas(spec: PlatformSpec, layout: Layout, model: ModelSpec) -> int:
    """Replicas of ``model`` that fit beside every model of its pool at max replicas."""
    placement = layout.placements[model.name]
    if placement.pool is None:
        return 0
    pool: PoolPlan = layout.pools[placement.pool]
    members = [m for m in spec.models if m.name in pool.models]
    used = sum(
        math.ceil(m.scaling.max_replicas / _slots(layout.placements[m.name]))
        * layout.placements[m.name].nodes
        for m in members
    )
    spare_nodes = max(0, pool.max_nodes - used)
    slots = _slots(placement)
    own = (slots - model.scaling.max_replicas % slots) % slots
    # A multi-node replica (a group) needs all of its nodes spare.
    return own + (spare_nodes // len(members) // placement.nodes) * slots


def plan(spec: PlatformSpec, layout: Layout, model: ModelSpec, startup: StartupBudget) -> Rollout:
    """``startup``: the model's startup budget (a replacement may take that long to serve)."""
    placement = layout.placements[model.name]
    most = model.scaling.max_replicas
    if placement.pool is None:
        # CPU engines: the general nodes' room is not known here; one extra replica is assumed to fit.
        return Rollout(1, 0, most, startup, True, "CPU engine: one extra replica on the general nodes")
    surge = min(spare_replicas(spec, layout, model), most)
    if surge:
        reason = f"{surge} spare replica slot(s) in pool {placement.pool} at max replicas"
        return Rollout(surge, 0, math.ceil(most / surge), startup, True, reason)
    reason = f"pool {placement.pool} has no spare GPUs at max replicas"
    return Rollout(0, 1, most, startup, model.scaling.min_replicas == 0, reason)


def warnings(spec: PlatformSpec, layout: Layout, plans: Mapping[str, Rollout]) -> list[str]:
    """Rollouts that drop a model below its SLO minimum, with the pool size that would prevent it (``plans``: the
    models' rollouts)."""
    out: list[str] = []
    pool_index = {p.name: i for i, p in enumerate(spec.gpu_pools)}
    for i, model in enumerate(spec.models):
        rollout = plans[model.name]
        placement = layout.placements[model.name]
        if rollout.keeps_minimum or placement.pool is None:
            continue
        pool = layout.pools[placement.pool]
        least = model.scaling.min_replicas
        out.append(
            f"models[{i}] ({model.name}): a rolling update stops one replica before its replacement starts, so at "
            f"{least} replica(s) it serves with {least - 1}, below scaling.min_replicas, for up to "
            f"{minutes(rollout.startup.budget_s)} per replica ({rollout.reason}); set "
            f"gpu_pools[{pool_index[pool.name]}].max_nodes to {pool.max_nodes + 1} so a new replica starts first"
        )
    return out
