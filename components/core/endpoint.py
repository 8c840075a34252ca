"""How `pulumi up` reaches the cluster's API server: whether the way is possible, and what the plan says about
it. Pure.

The Kubernetes provider applies every manifest through the API, so a stack whose API nobody can reach stops
half-way through its first `pulumi up`. The target's cluster section knows its way in: on eks
``cluster.api_endpoint`` (a private endpoint answers only inside its VPC, and a VPC the stack itself creates does
not exist before that first `pulumi up`); a cluster the stack finds is reached through the kubeconfig.
"""

from __future__ import annotations

from components.base.problems import Problem
from components.core.planned import Planned, PlanRule
from components.spec import PlatformSpec


def api_reachable(planned: Planned) -> list[Problem]:
    """The way in must be stated where the stack creates the API, and lead somewhere that exists."""
    return planned.spec.cluster.api_endpoint_problems()


def note(spec: PlatformSpec) -> str | None:
    """What the plan says: where `pulumi up` must run from."""
    return spec.cluster.api_endpoint_note()


RULES: tuple[PlanRule, ...] = (api_reachable,)
"""The API endpoint's plan-time rule (``components.core.plan_rules``)."""
