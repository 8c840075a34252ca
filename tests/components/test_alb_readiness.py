"""Router rollouts behind an ALB: the namespace asks the Load Balancer Controller for its readiness gate."""

from __future__ import annotations

import pytest

from components.core.stackfile import STACKS_DIR, available_stacks
from components.render import namespace
from components.spec import IngressKind, Target
from tests.stacks import load, synthesized

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target is not Target.LOCAL]


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_namespace_behind_an_alb_with_ip_targets_gets_the_target_health_readiness_gate(name: str) -> None:
    """With target-type ip and no readiness gate, a router pod is Ready before the ALB registers it, so a rollout
    removes old targets while the new ones are still 'initial': 502s (the controller's
    docs/deploy/pod_readiness_gate.md). The label is what makes its webhook inject the gate."""
    manifests = synthesized(name).kubernetes_manifests()
    [ns] = [
        m
        for m in manifests
        if m["kind"] == "Namespace" and m["metadata"]["name"] == load(name).spec.cluster.namespace
    ]
    ingresses = [m for m in manifests if m["kind"] == "Ingress"]
    by_ip = [
        i
        for i in ingresses
        if i["metadata"]["annotations"].get("alb.ingress.kubernetes.io/target-type") == "ip"
    ]
    labels = ns["metadata"]["labels"]
    assert (labels.get(namespace.READINESS_GATE_LABEL) == "enabled") == bool(by_ip)
    assert bool(by_ip) == (load(name).spec.gateway.ingress is IngressKind.ALB)
