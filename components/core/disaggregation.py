"""Where a disaggregated model's two roles run, and whether the KV cache has a fast path between them.

The prefill role runs in the model's pool unless ``disaggregation.prefill.pool`` names another
(``components.core.placement.members``). In one pool both roles' nodes are alike and, on a pool with a cluster placement
group, in one group. Across two pools the KV crosses whatever network joins them; it is a fast path only where
NIXL can use RDMA between them:

- both pools' nodes have EFA interfaces (``gpu_pools[].efa``): libfabric's EFA provider, or UCX over it;
- the transport may use it (``disaggregation.transport`` ucx or libfabric; tcp is UCX over TCP sockets only);
- both pools launch in one zone: EFA's RDMA (SRD) does not leave a subnet, hence a zone (AWS EFA user guide, "EFA
  limitations": OS-bypass traffic is not routable). The one setting of a pool that pins its nodes to a zone is its
  cluster placement group (``gpu_pools[].placement_group``: the stack launches such a pool in its first zone,
  ``components.clouds.aws.decisions.gpu_node_group``); the spec has no other "place these together" setting, and a
  placement group is per pool, so two pools are never in one group: one zone is what two pools can share.

Without all three, each prompt's KV (hundreds of MiB for a long prompt on a large model) crosses the VPC over TCP,
possibly between zones (cross-zone transfer is billed), and the decode waits for it. The plan says which path a
model has; in the environments of ``FAST_PATH_ENVIRONMENTS`` (prod) the stack refuses a cross-pool model without a
fast path (``cross_pool_needs_a_fast_path``), and so does the policy pack, from the rendered resources
(policies/inference/rules/disaggregation.py), with the same ``KvPath``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from components.base.problems import Problem
from components.core.placement import Layout, PoolPlan
from components.core.planned import Planned
from components.spec import ModelSpec
from components.spec.model import Transport

FAST_PATH_ENVIRONMENTS: tuple[str, ...] = ("prod",)
"""Environments where a disaggregated model's roles in two pools must have a fast path between them (the stack's
rule; the policy pack's rule ``pd-cross-pool-fast-path`` takes it as its default)."""


@dataclass(frozen=True)
class KvPath:
    """The network a disaggregated model's KV crosses, from what both sides know: the plan's pools, or the rendered
    node groups (the policy pack)."""

    prefill_pool: str | None
    decode_pool: str | None
    rdma_transport: bool
    """The engines may use RDMA (NIXL over UCX or libfabric; not UCX restricted to TCP)."""
    prefill_efa: bool = False
    decode_efa: bool = False
    prefill_zoned: bool = False
    """The prefill pool's nodes launch in one zone (its cluster placement group)."""
    decode_zoned: bool = False

    @property
    def same_pool(self) -> bool:
        return self.prefill_pool == self.decode_pool

    @property
    def fast(self) -> bool:
        return self.same_pool or not self.missing()

    @property
    def where(self) -> str:
        if self.same_pool:
            return f"in pool {self.decode_pool}" if self.decode_pool else "on the general nodes (CPU)"
        return f"across pools {self.prefill_pool} (prefill) and {self.decode_pool} (decode)"

    def missing(self) -> list[str]:
        """What the path between two pools lacks to be a fast one (nothing within one pool)."""
        if self.same_pool:
            return []
        out = []
        no_efa = [
            p
            for p, efa in ((self.prefill_pool, self.prefill_efa), (self.decode_pool, self.decode_efa))
            if not efa
        ]
        if no_efa:
            out.append(f"EFA on pool {' and '.join(str(p) for p in no_efa)}")
        if not self.rdma_transport:
            out.append("an RDMA transport (transport tcp keeps UCX on TCP sockets)")
        if not (self.prefill_zoned and self.decode_zoned):
            out.append("both pools in one zone (placement_group on each)")
        return out

    def describe(self) -> str:
        if self.same_pool:
            return "within one pool"
        missing = self.missing()
        if not missing:
            return "fast path: EFA on both pools, one zone"
        return (
            f"no fast path between the pools, the KV crosses the VPC over TCP: without {', '.join(missing)}"
        )

    def problem(self) -> str | None:
        """Why the path does not do for an environment that needs a fast path (None: it does)."""
        missing = self.missing()
        if not missing:
            return None
        return (
            f"the prefill role runs in pool {self.prefill_pool} and the decode role in pool {self.decode_pool}, "
            f"without {', '.join(missing)}: every prompt's KV would cross the VPC over TCP, maybe between zones, "
            "while the decode waits for it. Put the prefill role in the model's pool (remove "
            "disaggregation.prefill.pool), or give both pools an EFA instance type with efa and placement_group "
            "on, and transport ucx, libfabric or auto"
        )


def rdma(transport: Transport) -> bool:
    """The transport may use RDMA where the nodes have it (``ModelSpec.transport``: auto is resolved)."""
    return transport is not Transport.TCP


def role_pool(layout: Layout, model: ModelSpec, unit: ModelSpec) -> PoolPlan | None:
    """The pool a role of ``model`` runs in (None: CPU, the general nodes): the prefill role's own placement where
    it has one, else the model's."""
    placed = layout.placements.get(unit.name) or layout.placements.get(model.name)
    return layout.pools.get(placed.pool) if placed is not None and placed.pool is not None else None


def path(model: ModelSpec, prefill: PoolPlan | None, decode: PoolPlan | None) -> KvPath:
    """The path between a disaggregated model's roles in the pools the plan gave them."""
    return KvPath(
        prefill_pool=prefill.name if prefill is not None else None,
        decode_pool=decode.name if decode is not None else None,
        rdma_transport=rdma(model.transport()),
        prefill_efa=prefill is not None and prefill.efa_interfaces > 0,
        decode_efa=decode is not None and decode.efa_interfaces > 0,
        prefill_zoned=prefill is not None and prefill.placement_group,
        decode_zoned=decode is not None and decode.placement_group,
    )


def model_path(layout: Layout, model: ModelSpec) -> KvPath:
    decode, prefill = model.pd_roles()
    return path(model, role_pool(layout, model, prefill), role_pool(layout, model, decode))


def cross_pool_needs_a_fast_path(planned: Planned) -> Iterator[Problem]:
    """In prod a disaggregated model whose roles run in two pools needs a fast path between them (``KvPath``)."""
    spec, layout = planned.spec, planned.layout
    if layout is None or spec.environment not in FAST_PATH_ENVIRONMENTS:
        return
    for i, model in enumerate(spec.models):
        if model.disaggregation is None or model.prefill_pool is None:
            continue
        problem = model_path(layout, model).problem()
        if problem is not None:
            yield Problem(f"models[{i}].disaggregation.prefill.pool", f"in {spec.environment}, {problem}")


RULES = (cross_pool_needs_a_fast_path,)
"""The plan-time rules of disaggregated models (``components.core.plan_rules``)."""
