"""Which cloud each deployment target runs on: the picker of the cloud seam (``components.core.cloud``)."""

from __future__ import annotations

from components.clouds.aws.cloud import EKS
from components.clouds.own_cluster import OWN_CLUSTER
from components.core.cloud import Cloud, FixedInfrastructure
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


def fixed_infrastructure(spec: PlatformSpec, layout: Layout) -> FixedInfrastructure:
    """What the stack's target runs besides GPU nodes, for the bill; nothing on this machine (target local)."""
    cloud = CLOUDS.get(spec.target)
    return cloud.fixed_infrastructure(spec, layout) if cloud is not None else FixedInfrastructure()
