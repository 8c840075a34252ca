"""Replicas bigger than one node: how many nodes a group takes, what links them, what it costs. Pure.

A replica whose tensor x pipeline parallel GPUs exceed one node's runs as one group of whole nodes (a
LeaderWorkerSet group on Kubernetes: leader plus workers, restarted together). The rules, in one place:

- a group fills whole nodes: GPUs = nodes x GPUs per node, exactly; anything else leaves GPUs idle that no other
  engine can use (the group's pods take whole nodes);
- a model that fits one node is never split: sizing proposes a multi-node group for an instance type only when
  no single node of that type holds it;
- across nodes, tensor parallelism stays inside a node (NVLink) and pipeline stages cross nodes (vLLM's own advice
  for multi-node serving): a proposed group is TP = GPUs per node, PP = nodes;
- a group costs its nodes: nodes x node price per replica.

What links the nodes comes from the catalog: EFA interfaces per instance type and cluster placement groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.base import catalog, sizing
from components.base.problems import Problem

if TYPE_CHECKING:  # `inferstack size` ranks groups without loading the spec's models or the engine table
    from components.spec import ModelSpec

MAX_GROUP_NODES = 4
"""Largest group `inferstack size` proposes: beyond it, pipeline bubbles and the blast radius of one bad node grow
faster than the memory a group gains (a spec may still ask for more)."""
MIN_GPUS_FOR_GROUPS = 4
"""Instance types with fewer GPUs are not proposed for groups: a replica across many small nodes spends its time on
the network, not on the GPUs."""


@dataclass(frozen=True)
class Interconnect:
    """What links the nodes of an instance type."""

    efa_interfaces: int
    network_gbps: float | None
    cluster_placement: bool

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    def describe(self) -> str:
        link = f"EFA x{self.efa_interfaces}" if self.has_efa else "TCP only (no EFA)"
        speed = f", {self.network_gbps:,} Gbps" if self.network_gbps else ""
        return link + speed + (", cluster placement group" if self.cluster_placement else "")


def interconnect(instance: catalog.InstanceType) -> Interconnect:
    return Interconnect(
        efa_interfaces=instance.efa_interfaces,
        network_gbps=instance.network_gbps,
        cluster_placement=instance.family_facts.cluster_placement,
    )


def group_nodes(gpus_per_replica: int, gpus_per_node: int) -> int | None:
    """Nodes one replica takes: 1 when it fits a node, else the whole nodes it fills; None when it fills no whole
    number of nodes (GPUs would be stranded)."""
    if gpus_per_replica <= gpus_per_node:
        return 1
    if gpus_per_replica % gpus_per_node:
        return None
    return gpus_per_replica // gpus_per_node


def whole_node_sizes(gpus_per_node: int, count: int = 4) -> list[int]:
    """GPU counts that fill whole nodes of this size: what a multi-node TP x PP may be."""
    return [gpus_per_node * n for n in range(2, count + 2)]


def efa_instance_types(
    gpu: str | None = None, table: catalog.Instances = catalog.INSTANCE_TYPES
) -> list[str]:
    """Instance types of ``table`` with EFA (of one GPU model, when given), by name."""
    return sorted(
        name
        for name, instance in table.items()
        if instance.efa_interfaces and (gpu is None or instance.gpu == gpu)
    )


def _group_candidate(
    arch: catalog.ModelArch, shape: sizing.EngineShape, instance: catalog.InstanceType, nodes: int
) -> sizing.Candidate | None:
    trial = sizing.EngineShape(
        **{**shape.__dict__, "tensor_parallel_size": instance.gpus, "pipeline_parallel_size": nodes}
    )
    fit = sizing.memory_fit(arch, trial, instance.gpu_spec)
    return sizing.Candidate(instance, instance.gpus, nodes, fit) if fit.fits else None


def candidates(
    arch: catalog.ModelArch,
    shape: sizing.EngineShape,
    instances: list[catalog.InstanceType] | None = None,
    max_nodes: int = MAX_GROUP_NODES,
) -> list[sizing.Candidate]:
    """Single-node candidates (``sizing.candidates``) and, for every instance type where no single node holds the
    model, the smallest group of its nodes that does; ranked by monthly cost per replica, then fewer GPUs."""
    pool = list(instances if instances is not None else catalog.INSTANCE_TYPES.values())
    single = sizing.candidates(arch, shape, fixed_parallelism=False, instances=pool)
    fits_one = {c.instance.name for c in single}
    groups: list[sizing.Candidate] = []
    for instance in pool:
        if instance.name in fits_one or instance.gpus < MIN_GPUS_FOR_GROUPS:
            continue
        if sizing.gpu_supports(instance.gpu_spec, shape) is not None:
            continue
        for nodes in range(2, max_nodes + 1):
            found = _group_candidate(arch, shape, instance, nodes)
            if found is not None:
                groups.append(found)
                break
    return sorted(
        single + groups, key=lambda c: (c.usd_per_replica_month, c.gpus_per_replica, c.instance.name)
    )


def _divisors(gpus: int) -> str:
    return ", ".join(str(d) for d in (1, 2, 4, 8) if d <= gpus and gpus % d == 0)


def group_problems(path: str, model: ModelSpec, instance: catalog.InstanceType) -> list[Problem]:
    """Why ``model``'s replica cannot be a group of ``instance`` nodes (or one node); empty when it can."""
    from runtime.engines import facts  # noqa: PLC0415 - `inferstack size` imports this module, not the engine table

    e = model.engine
    gpus = e.tensor_parallel_size * e.pipeline_parallel_size
    nodes = group_nodes(gpus, instance.gpus)
    if nodes is None:
        sizes = ", ".join(map(str, whole_node_sizes(instance.gpus)))
        return [
            Problem(
                f"{path}.engine.tensor_parallel_size",
                f"tensor_parallel_size x pipeline_parallel_size = {e.tensor_parallel_size} x "
                f"{e.pipeline_parallel_size} = {gpus} GPUs fills no whole number of {instance.name} nodes "
                f"({instance.gpus} GPUs each); use {_divisors(instance.gpus)} GPUs on one node, or whole nodes "
                f"({sizes}, ...), e.g. tensor_parallel_size {instance.gpus} x pipeline_parallel_size "
                f"{max(2, -(-gpus // instance.gpus))}",
            )
        ]
    problems = []
    if e.nodes is not None and e.nodes != nodes:
        problems.append(
            Problem(
                f"{path}.engine.nodes",
                f"{e.nodes} node(s) stated, but {e.tensor_parallel_size} x {e.pipeline_parallel_size} = {gpus} GPUs "
                f"on {instance.name} ({instance.gpus} GPUs each) take {nodes}; set nodes to {nodes}, or "
                f"pipeline_parallel_size to {max(1, e.nodes * instance.gpus // e.tensor_parallel_size)} for "
                f"{e.nodes} node(s), or leave nodes out",
            )
        )
    if nodes > 1 and not facts(e.kind).cli.multi_node_supported:
        problems.append(
            Problem(
                f"{path}.engine.kind",
                f"{facts(e.kind).display_name} ({e.resolved_image}) cannot span nodes here: "
                f"{facts(e.kind).cli.multi_node_note}; use kind vllm or sglang for a replica of {nodes} nodes, "
                f"or fit it on one node (quantize, or a larger GPU)",
            )
        )
    return problems
