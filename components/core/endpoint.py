"""How `pulumi up` reaches the EKS API server (``cluster.api_endpoint``): whether the way is possible, and what
the plan says about it. Pure.

The Kubernetes provider applies every manifest through the API, so a stack whose API nobody can reach stops
half-way through its first `pulumi up`. A private endpoint answers only inside its VPC and the networks connected
to it; a VPC the stack itself creates does not exist before that first `pulumi up`, so nothing can be inside it.
"""

from __future__ import annotations

from components.core.problems import Planned, PlanRule, Problem
from components.spec import ApiAccess, PlatformSpec, Target


def api_reachable(planned: Planned) -> list[Problem]:
    """target eks: the way in must be stated, and a private one must lead into a VPC that already exists."""
    spec = planned.spec
    endpoint = spec.cluster.api_endpoint
    if spec.target is not Target.EKS:
        return []  # other targets reach their cluster through the kubeconfig
    if endpoint is None:
        return [
            Problem(
                "cluster.api_endpoint",
                "say how `pulumi up` reaches the EKS API: `{access: public, public_cidrs: [<your CI egress>]}`, "
                "or `{access: private, deployer_cidrs: [...]}` from inside an existing VPC",
            )
        ]
    if endpoint.access is ApiAccess.PRIVATE and not spec.cluster.existing_vpc_id:
        return [
            Problem(
                "cluster.api_endpoint.access",
                "a private endpoint answers only inside its VPC, and this stack creates that VPC, so nothing can "
                "reach the API on the first `pulumi up`: bring the VPC your runner or VPN is in (existing_vpc_id, "
                "existing_private_subnet_ids), or use access: public with public_cidrs",
            )
        ]
    return []


def note(spec: PlatformSpec) -> str | None:
    """What the plan says: where `pulumi up` must run from."""
    endpoint = spec.cluster.api_endpoint
    if spec.target is not Target.EKS or endpoint is None:
        return None
    if endpoint.access is ApiAccess.PUBLIC:
        return (
            f"API endpoint: public to {', '.join(endpoint.public_cidrs)} only (and private for the nodes): run "
            "`pulumi up` from there"
        )
    sources = [*endpoint.deployer_cidrs, *endpoint.deployer_security_group_ids]
    return (
        f"API endpoint: private, in VPC {spec.cluster.existing_vpc_id}; HTTPS from {', '.join(sources)}: run "
        "`pulumi up` there (a CI runner in the VPC, or over the VPN)"
    )


RULES: tuple[PlanRule, ...] = (api_reachable,)
"""The API endpoint's plan-time rule (``components.core.plan_rules``)."""
