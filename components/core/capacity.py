"""Where a GPU pool's nodes come from, in order: a capacity reservation, the pool's own instance and capacity type,
then fallback instance types. Checks and the plan's sentence. Pure.

The order is what `pulumi up` renders (``components.clouds.aws.decisions.gpu_node_groups``): the reservation is a node
group of its own that the Cluster Autoscaler's priority expander tries first; the fallback types follow the pool's
type in its node group, where EC2's prioritized allocation takes them in order. A fallback has the pool type's
node shape (GPUs, vCPUs, memory): the autoscaler sizes a group by one shape, and every model must fit it; where
the pool's node-level model cache is on local NVMe, a fallback needs room for it there too.
"""

from __future__ import annotations

from components.base import catalog
from components.base.problems import Problem
from components.core.placement import Layout, PoolPlan, misfits
from components.core.planned import Planned, PlanRule
from components.core.weights import fetch
from components.spec import GpuPoolSpec, PlatformSpec, ReservationKind


def _shape(instance: catalog.InstanceType) -> tuple[int, int, int]:
    return instance.gpus, instance.vcpus, instance.memory_gib


def _fallback_problems(
    spec: PlatformSpec, layout: Layout, index: int, pool: GpuPoolSpec, table: catalog.Instances
) -> list[Problem]:
    plan = layout.pools[pool.name]
    out: list[Problem] = []
    for j, name in enumerate(pool.fallback_instance_types):
        fallback = table[name]  # placement refused a name the target does not know
        path = f"gpu_pools[{index}].fallback_instance_types[{j}]"
        if _shape(fallback) != _shape(plan.instance):
            gpus, vcpus, memory = _shape(plan.instance)
            out.append(
                Problem(
                    path,
                    f"{name} has {fallback.gpus} GPUs, {fallback.vcpus} vCPUs and {fallback.memory_gib} GiB; the pool's "
                    f"{plan.instance.name} has {gpus}, {vcpus} and {memory} GiB: a fallback needs the same node shape",
                )
            )
            continue
        for model in spec.models:
            placement = layout.placements[model.name]
            if placement.pool == pool.name:
                why = misfits(model, placement.arch, fallback, table)
                if why:
                    out.append(Problem(path, f"{model.name} does not fit {name}: {why[0]}"))
        nvme = fetch.nvme_gib(fallback)
        if plan.cache_medium is fetch.CacheMedium.NVME and nvme < plan.model_cache_gib:
            out.append(
                Problem(
                    path,
                    f"the pool's {plan.model_cache_gib:,} GiB node cache is on local NVMe, and {name} has "
                    f"{nvme:,.0f} GiB of it: use a fallback with at least that much NVMe, or stream the models "
                    "(weights.fetch: streamer, vLLM)",
                )
            )
    return out


def _reservation_problems(spec: PlatformSpec, index: int, pool: GpuPoolSpec) -> list[Problem]:
    """The reservation's zone must be one where the target can launch the pool's nodes (its section says)."""
    reservation = pool.capacity_reservation
    if reservation is None:
        return []
    why = spec.cluster.reservation_zone_problem(reservation.availability_zone)
    return [Problem(f"gpu_pools[{index}].capacity_reservation.availability_zone", why)] if why else []


def node_sources(planned: Planned) -> list[Problem]:
    """Fallbacks that do not match the pool's shape or fit its models; reservations in a zone without a subnet.
    Only where the stack launches the GPU nodes (on a cluster you bring, they are yours)."""
    spec, layout = planned.spec, planned.layout
    if layout is None or not spec.cluster.launches_nodes:
        return []
    table = planned.instances if planned.instances is not None else catalog.INSTANCE_TYPES
    out: list[Problem] = []
    for i, pool in enumerate(spec.gpu_pools):
        if pool.name in layout.pools:
            out += _fallback_problems(spec, layout, i, pool, table) + _reservation_problems(spec, i, pool)
    return out


def steps(pool: GpuPoolSpec, plan: PoolPlan) -> list[str]:
    """The pool's sources of nodes, in the order they are tried, for people."""
    out: list[str] = []
    reservation = pool.capacity_reservation
    if reservation is not None:
        kind = (
            "Capacity Block" if reservation.kind is ReservationKind.CAPACITY_BLOCK else "capacity reservation"
        )
        out.append(f"{kind} {reservation.id} ({plan.instance.name}, {reservation.availability_zone})")
    for name in [plan.instance.name, *pool.fallback_instance_types]:
        out.append(f"{name} {plan.capacity_type.value}")
    return out


def notes(spec: PlatformSpec, layout: Layout) -> list[str]:
    """One sentence per pool with more than one source of nodes, and one per pool in a cluster placement group
    (where the stack launches them)."""
    if not spec.cluster.launches_nodes:
        return []
    out = []
    for pool in spec.gpu_pools:
        plan = layout.pools.get(pool.name)
        if plan is not None and (pool.capacity_reservation or pool.fallback_instance_types):
            out.append(f"pool {pool.name} capacity, in order: {' -> '.join(steps(pool, plan))}")
        if plan is not None and plan.placement_group and not pool.capacity_reservation:
            out.append(placement_zone_note(pool.name, plan.instance.name))
    return out


def placement_zone_note(pool: str, instance: str) -> str:
    """A cluster placement group keeps a pool's nodes in one zone, which the stack names (the first of the
    cluster's zones). A zone name maps to a different physical zone in each account, so whether that zone offers
    the instance type is known only in the account: the plan says how to check (a reservation's zone is its own)."""
    return (
        f"pool {pool}: one cluster placement group, so one zone, the first of cluster.availability_zones; zone names "
        "map to different physical zones in each account, so check yours offers it (`aws ec2 "
        f"describe-instance-type-offerings --location-type availability-zone --filters Name=instance-type,Values={instance}`) "
        "and list that zone first, or the node group's launches fail with InsufficientInstanceCapacity"
    )


RULES: tuple[PlanRule, ...] = (node_sources,)
"""The pools' node sources' plan-time rule (``components.core.plan_rules``)."""
