"""Node labels and taints every layer agrees on, and Kubernetes' rule for which pod may land where.

Neutral: no cloud, no Pulumi, no renderer. The clouds label and taint the nodes they create with these
(``components.clouds.aws``), a cluster you bring must carry them, the engines select and tolerate them
(``components.render``), and the policy pack reads them back from resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.base.packing import Mechanism
from components.core.placement import PoolPlan, Share

POOL_LABEL = "inferstack.io/pool"
"""Which GPU pool a node belongs to; engines select their pool by it."""
ROLE_LABEL = "inferstack.io/node-role"
"""What a node is for: ``GPU_ROLE`` or ``SYSTEM_ROLE``."""
GPU_PRODUCT_LABEL = "inferstack.io/gpu-product"
"""The GPU model of a node, in the spelling of GPU feature discovery's ``nvidia.com/gpu.product``."""
GPU_ROLE = "gpu"
SYSTEM_ROLE = "system"
"""The CPU nodes for the gateway, monitoring and controllers (also the system pool's name)."""

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource the NVIDIA device plugin advertises; engines request it."""
SHARED_GPU_RESOURCE = f"{GPU_RESOURCE}.shared"
"""A time-sliced GPU replica: the device plugin renames ``nvidia.com/gpu`` so with ``renameByDefault`` (its README,
'Shared Access to GPUs'), so an engine that wants a whole GPU never lands on a shared one by accident."""
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""MIG instances under the device plugin's mixed strategy: ``nvidia.com/mig-<profile>``, e.g. ``nvidia.com/mig-1g.10gb``."""
TEAM_LABEL = "inferstack.io/team"
"""The team or tenant that owns an engine (spec ``models[].team``): who may share a GPU with whom."""
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
"""The node label that picks a named config of the device plugin's config map (the chart's config-manager)."""
EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""The extended resource the EFA device plugin advertises (one per EFA interface); pods of multi-node groups on
nodes with EFA request them."""
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_EFFECT = "NoSchedule"  # Kubernetes spelling; the EKS API spells it NO_SCHEDULE


@dataclass(frozen=True)
class Taint:
    """A node taint in Kubernetes' spelling."""

    key: str
    effect: str
    value: str | None = None


def gpu_taint() -> Taint:
    """The taint that keeps everything but GPU workloads off GPU nodes."""
    return Taint(GPU_TAINT_KEY, GPU_TAINT_EFFECT)


def gpu_toleration() -> dict[str, str]:
    """The toleration of ``gpu_taint`` that engines and GPU daemons (device plugin, DCGM) carry."""
    return {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}


def gpu_product(pool: PoolPlan) -> str | None:
    """The GPU product every node of the pool has; None when its fallback instance types carry another GPU (a
    pool of p5.48xlarge falling back to p5en.48xlarge has H100 or H200 nodes)."""
    products = {i.gpu_spec.product_label for i in pool.instance_types}
    return products.pop() if len(products) == 1 else None


def gpu_node_labels(pool: PoolPlan) -> dict[str, str]:
    """The labels of a GPU pool's nodes: the pool's own, then the pool, role and GPU product (ours win); a pool
    that shares its GPUs also names its device plugin config.

    Node group and NodePool labels are static, on every node whichever instance type EC2 or Karpenter launched, so
    the product is named only when every type of the pool has it: a fallback node must not claim the pool type's
    GPU. Nothing selects on it (engines select the pool); the node's own GPU is then read off it (Karpenter's
    karpenter.k8s.aws/instance-gpu-name, or GPU feature discovery's nvidia.com/gpu.product where it runs)."""
    labels = {**pool.labels, POOL_LABEL: pool.name, ROLE_LABEL: GPU_ROLE}
    product = gpu_product(pool)
    if product is not None:
        labels[GPU_PRODUCT_LABEL] = product
    if pool.sharing is not Mechanism.NONE:
        labels[DEVICE_PLUGIN_CONFIG_LABEL] = device_plugin_config_name(pool.name)
    return labels


def device_plugin_config_name(pool: str) -> str:
    """The device plugin config a shared pool's nodes run (a key of the chart's ``config.map``)."""
    return f"pool-{pool}"


def share_resource(share: Share) -> str:
    """The extended resource one replica of a shared GPU requests (one of it)."""
    if share.profile is not None:
        return f"{MIG_RESOURCE_PREFIX}{share.profile.name}"
    return SHARED_GPU_RESOURCE


def system_node_selector() -> dict[str, str]:
    """Where cluster controllers run: the system nodes, never the GPU nodes they manage."""
    return {ROLE_LABEL: SYSTEM_ROLE}


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    """Kubernetes' rule: does any toleration match this taint (key, operator, value, effect)?"""
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = t.get("key") or ""
        operator = t.get("operator") or "Equal"
        if not key and operator == "Exists":
            return True
        if key != taint.key:
            continue
        if operator == "Exists" or (t.get("value") or "") == (taint.value or ""):
            return True
    return False


def schedulable(pod_spec: Mapping[str, Any], labels: Mapping[str, str], taints: Sequence[Taint]) -> bool:
    """Whether a pod with this spec may land on nodes with these labels and taints: its nodeSelector
    matches and it tolerates every taint."""
    selector = pod_spec.get("nodeSelector") or {}
    tolerations = pod_spec.get("tolerations") or []
    if not isinstance(selector, Mapping) or not isinstance(tolerations, list):
        return False
    labels_ok = all(labels.get(k) == v for k, v in selector.items())
    return labels_ok and all(tolerates(tolerations, t) for t in taints)
