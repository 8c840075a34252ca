"""Which cloud each deployment target runs on: the picker of the cloud seam (``components.core.cloud``)."""

from __future__ import annotations

from components.clouds.aws.cloud import EKS
from components.clouds.own_cluster import OWN_CLUSTER
from components.core import catalog, cost
from components.core.cloud import Cloud
from components.core.placement import Layout
from components.spec import PlatformSpec, Target

CLOUDS: dict[Target, Cloud] = {Target.EKS: EKS, Target.KUBERNETES: OWN_CLUSTER}
"""Target local has none: `make local` runs the data plane on this machine, without a cluster."""


def cloud_for(spec: PlatformSpec) -> Cloud:
    """The cloud of ``spec.target``; the callers never ask for target local (it has no cluster)."""
    try:
        return CLOUDS[spec.target]
    except KeyError:
        raise ValueError(f"target {spec.target.value} runs without a cluster, so without a cloud") from None


def fixed_costs(spec: PlatformSpec, layout: Layout) -> tuple[cost.LineItem, ...]:
    """What the stack's target runs besides GPU nodes, priced; nothing on this machine (target local)."""
    cloud = CLOUDS.get(spec.target)
    return cloud.fixed_costs(spec, layout) if cloud is not None else ()


def prices_for(spec: PlatformSpec) -> cost.PriceList:
    """The price list of the stack's GPU instances: EC2's, whose instance types every target sizes with."""
    return catalog.EC2_PRICES


def stack_cost(spec: PlatformSpec, layout: Layout) -> cost.StackCost:
    """The stack's whole bill: its GPU pools at its prices and what its cloud runs besides them."""
    return cost.stack_cost(spec, layout, fixed_costs(spec, layout), prices_for(spec))
