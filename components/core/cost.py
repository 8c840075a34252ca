"""Money: monthly cost per model and per stack, and an estimated price per million tokens.

Pure functions over a spec's layout and a price list (the target profile's, ``components.clouds.targets``).
GPU nodes are the bill; a replica is charged its share of a node (the GPUs it takes), and a pool is charged whole
nodes. What a target runs besides GPU nodes comes priced from its cloud (``Cloud.fixed_costs``) as line items:
this module sums them and knows no cloud's prices. Throughput, and so USD per million tokens, is an estimate
from a decode roofline, and is always labelled as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from components.base import catalog, sizing
from components.base.enums import CapacityType

if TYPE_CHECKING:  # annotations only: `inferstack size` prices instance types without loading the spec
    from components.core.placement import Layout, Placement, PoolPlan, Share
    from components.spec import PlatformSpec

# The throughput assumption behind USD per million tokens, stated once and printed with the figure.
ROOFLINE_BANDWIDTH_EFFICIENCY = 0.6
ROOFLINE_AVG_CONTEXT_TOKENS = 1024
THROUGHPUT_ASSUMPTION = (
    f"decode-bound estimate: each step reads the weights and the batch's KV cache at "
    f"{ROOFLINE_BANDWIDTH_EFFICIENCY:.0%} of memory bandwidth, {ROOFLINE_AVG_CONTEXT_TOKENS:,}-token average context, "
    "batch = min(max_num_seqs, what the KV cache holds)"
)
DEFAULT_INPUT_SHARE = 0.75
"""Prompt tokens as a share of all tokens: 3 prompt tokens per generated one (chat with context, RAG). Here, not
in ``components.core.compare``: `inferstack cost` shows it as an option default without loading the spec."""


class PriceList(Protocol):
    """What one target's GPU instances cost an hour, and where the figures come from (a profile's price list;
    ``catalog.EC2_PRICES`` is EC2's)."""

    @property
    def source(self) -> str: ...

    @property
    def read_on(self) -> str: ...

    @property
    def region(self) -> str: ...

    def hourly(self, instance: catalog.InstanceType, capacity: CapacityType) -> float:
        """USD an hour for one node of ``instance`` bought as ``capacity``."""
        ...


GPU_POOL = "gpu-pool"
"""The kind of a GPU pool's line item; every other item is what the target runs besides GPU nodes."""


@dataclass(frozen=True)
class ModelCost:
    model: str
    capacity: CapacityType
    usd_per_replica_month: float
    min_usd_month: float
    max_usd_month: float
    on_demand_max_usd_month: float
    spot_max_usd_month: float
    tokens_per_second_per_replica: float | None  # estimate; None for CPU engines and pooling models
    usd_per_million_tokens: float | None  # estimate at full utilisation
    unshared_usd_per_replica_month: float = 0.0  # the same replica on a whole GPU of its pool's type

    @property
    def sharing_saves_usd_month(self) -> float:
        """What sharing a GPU saves at max replicas, against whole GPUs (0 when it shares none)."""
        return max(0.0, (self.unshared_usd_per_replica_month - self.usd_per_replica_month)) * (
            self.max_usd_month / self.usd_per_replica_month if self.usd_per_replica_month else 0
        )


def decode_tokens_per_second(placement: Placement) -> float | None:
    """Roofline estimate of one replica's generated tokens/s (see THROUGHPUT_ASSUMPTION)."""
    return roofline_tokens_per_second(placement.arch, placement.instance, placement.fit, placement.share)


def roofline_tokens_per_second(
    arch: catalog.ModelArch,
    instance: catalog.InstanceType | None,
    fit: sizing.MemoryFit | None,
    share: Share | None = None,
) -> float | None:
    """One replica's generated tokens/s on ``instance`` by the roofline (None where it has no GPU fit)."""
    if fit is None or instance is None or arch.pooling:
        return None
    per_token_kv = fit.kv_per_token_kib * 1024
    batch = max(1, min(fit.max_num_seqs, fit.kv_capacity_tokens // ROOFLINE_AVG_CONTEXT_TOKENS))
    # Mixture-of-experts reads only the active experts' weights per token (upper bound: all of them at batch 1).
    active = arch.params_per_token_b / arch.params_b
    bytes_per_step = (
        fit.weights_gib * sizing.GIB * active + batch * ROOFLINE_AVG_CONTEXT_TOKENS * per_token_kv
    )
    bandwidth = instance.gpu_spec.memory_bandwidth_gbps * 1e9 * ROOFLINE_BANDWIDTH_EFFICIENCY
    if share is not None and share.profile is not None:  # a MIG instance has its slices of the bandwidth
        bandwidth *= share.profile.memory_slices / catalog.MIG_MEMORY_SLICES
    elif share is not None:  # time slices take turns: with every slice busy, each gets its turn's worth
        bandwidth /= share.slots_per_gpu
    steps_per_second = bandwidth / bytes_per_step
    return steps_per_second * batch


def _replica_month(layout: Layout, placement: Placement, prices: PriceList) -> tuple[float, float, float]:
    """One replica's month on its placement: at its pool's capacity type, on demand, on spot."""
    assert placement.instance is not None and placement.pool is not None
    share = placement.gpu_fraction / placement.instance.gpus * catalog.HOURS_PER_MONTH
    capacity = layout.pools[placement.pool].capacity_type
    instance = placement.instance
    return (
        prices.hourly(instance, capacity) * share,
        prices.hourly(instance, CapacityType.ON_DEMAND) * share,
        prices.hourly(instance, CapacityType.SPOT) * share,
    )


def model_cost(spec: PlatformSpec, layout: Layout, name: str, prices: PriceList) -> ModelCost:
    """A model's bill: its replicas (each version's, or both roles of a disaggregated model where they share its
    pool) on its placement, plus a prefill role in a pool of its own on that pool's placement."""
    model = next(m for m in spec.models if m.name == name)
    placement = layout.placements[name]
    if placement.instance is None or placement.pool is None:
        return ModelCost(name, CapacityType.ON_DEMAND, 0.0, 0.0, 0.0, 0.0, 0.0, None, None)
    pool = layout.pools[placement.pool]
    per_replica, on_demand, spot = _replica_month(layout, placement, prices)
    unshared = (
        prices.hourly(placement.instance, pool.capacity_type)
        * catalog.HOURS_PER_MONTH
        / placement.instance.gpus
        if placement.share is not None
        else per_replica
    )
    low, high = model.unit_replicas("min_replicas"), model.unit_replicas("max_replicas")
    extra_min = extra_max = extra_on_demand = extra_spot = 0.0
    if model.prefill_pool is not None:  # the prefill role's own placement (``placement.members``)
        prefill = model.pd_roles()[1]
        own, own_on_demand, own_spot = _replica_month(layout, layout.placements[prefill.name], prices)
        extra_min, extra_max = own * prefill.scaling.min_replicas, own * prefill.scaling.max_replicas
        extra_on_demand = own_on_demand * prefill.scaling.max_replicas
        extra_spot = own_spot * prefill.scaling.max_replicas
    tps = decode_tokens_per_second(placement)
    per_million = (per_replica / catalog.HOURS_PER_MONTH / 3600) / tps * 1e6 if tps else None
    return ModelCost(
        model=name,
        capacity=pool.capacity_type,
        usd_per_replica_month=per_replica,
        min_usd_month=per_replica * low + extra_min,
        max_usd_month=per_replica * high + extra_max,
        on_demand_max_usd_month=on_demand * high + extra_on_demand,
        spot_max_usd_month=spot * high + extra_spot,
        tokens_per_second_per_replica=tps,
        usd_per_million_tokens=per_million,
        unshared_usd_per_replica_month=unshared,
    )


@dataclass(frozen=True)
class LineItem:
    """One row of the stack's bill."""

    name: str
    kind: str  # gpu-pool, or the cloud's: eks, system-nodes, nat, ebs, kms on AWS
    min_usd_month: float
    max_usd_month: float
    pool: str | None = None
    """The GPU pool it bills (a ``GPU_POOL`` item), by name; None for the rest."""


def pool_cost(pool: PoolPlan, prices: PriceList, fallbacks: Sequence[catalog.InstanceType] = ()) -> LineItem:
    """At min the pool's own type; at max the dearest of it and its fallbacks (the pool may end up on those)."""
    per_node = prices.hourly(pool.instance, pool.capacity_type) * catalog.HOURS_PER_MONTH
    dearest = (
        max(prices.hourly(i, pool.capacity_type) for i in [pool.instance, *fallbacks])
        * catalog.HOURS_PER_MONTH
    )
    return LineItem(
        f"pool {pool.name} ({pool.min_nodes}-{pool.max_nodes} x {pool.instance.name}, {pool.capacity_type.value})",
        GPU_POOL,
        per_node * pool.min_nodes,
        dearest * pool.max_nodes,
        pool=pool.name,
    )


@dataclass(frozen=True)
class StackCost:
    items: tuple[LineItem, ...]
    models: tuple[ModelCost, ...]
    prices: PriceList
    """What priced the GPU instances (its source and date go with every bill)."""

    @property
    def min_usd_month(self) -> float:
        return sum(i.min_usd_month for i in self.items)

    @property
    def max_usd_month(self) -> float:
        return sum(i.max_usd_month for i in self.items)


def _fallbacks(
    spec: PlatformSpec, pool: str, instances: Mapping[str, catalog.InstanceType]
) -> list[catalog.InstanceType]:
    found = spec.pool(pool)
    return [instances[name] for name in found.fallback_instance_types] if found is not None else []


def stack_cost(
    spec: PlatformSpec,
    layout: Layout,
    fixed: Sequence[LineItem],
    prices: PriceList,
    instances: Mapping[str, catalog.InstanceType],
) -> StackCost:
    """The whole bill: GPU pools at ``prices``, what the target runs besides them (``fixed``, priced by its
    cloud), and each model's share. ``instances``: the target's instance types, which a pool's fallbacks name."""
    pools = [pool_cost(p, prices, _fallbacks(spec, p.name, instances)) for p in layout.pools.values()]
    models = [model_cost(spec, layout, m.name, prices) for m in spec.models]
    return StackCost((*pools, *fixed), tuple(models), prices)


def monthly(usd: float) -> str:
    return f"${usd:,.0f}" if usd >= 1 or usd == 0 else f"${usd:,.2f}"
