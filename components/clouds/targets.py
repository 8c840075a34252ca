"""The deployment targets: one registry of profiles (``components.core.cloud.Profile``), picked by ``spec.target``.

A target is its package under ``components/clouds/`` (a cloud, a cluster layer) and one entry here. Target local
has none: `make local` runs the data plane on this machine, without a cluster, a cloud or a bill.
"""

from __future__ import annotations

from components.base import catalog
from components.clouds import own_cluster
from components.clouds.aws import cloud as aws
from components.core import cloud, cost
from components.core.cloud import Cloud, Profile
from components.core.placement import Layout
from components.spec import PlatformSpec, Target

PROFILES: dict[Target, Profile] = {p.target: p for p in (aws.PROFILE, own_cluster.PROFILE)}


def profile_for(spec: PlatformSpec) -> Profile:
    """The profile of ``spec.target``; the callers never ask for target local (it has no cluster)."""
    try:
        return PROFILES[spec.target]
    except KeyError:
        raise ValueError(f"target {spec.target.value} runs without a cluster, so without a cloud") from None


def cloud_for(spec: PlatformSpec) -> Cloud:
    """The cloud of ``spec.target`` (see ``profile_for``)."""
    return profile_for(spec).cloud


def fixed_costs(spec: PlatformSpec, layout: Layout) -> tuple[cost.LineItem, ...]:
    """What the stack's target runs besides GPU nodes, priced; nothing on this machine (target local)."""
    profile = PROFILES.get(spec.target)
    return profile.cloud.fixed_costs(spec, layout) if profile is not None else ()


def prices_for(spec: PlatformSpec) -> cost.PriceList:
    """The price list of the stack's GPU instances. On this machine (target local) nothing is billed, and the
    plan quotes the catalog's EC2 prices as `inferstack size` does."""
    profile = PROFILES.get(spec.target)
    return profile.prices if profile is not None else catalog.EC2_PRICES


def stack_cost(spec: PlatformSpec, layout: Layout) -> cost.StackCost:
    """The stack's whole bill (``components.core.cloud.bill``) at its target's profile; a loaded stack has it
    already (``Stack.bill``)."""
    return cloud.bill(spec, layout, PROFILES.get(spec.target))
