"""The namespace everything of one platform lives in. Pure."""

from __future__ import annotations

from components.render import common
from components.render.common import Manifest
from components.spec import IngressKind, PlatformSpec

READINESS_GATE_LABEL = "elbv2.k8s.aws/pod-readiness-gate-inject"
"""The AWS Load Balancer Controller injects its target-health readiness gate into the pods of a namespace so
labelled (kubernetes-sigs/aws-load-balancer-controller docs/deploy/pod_readiness_gate.md): with ``target-type: ip``
a new router pod is Ready only once the ALB sends it traffic, so a rollout never takes away the old pods while
the ALB has no healthy target (502s)."""


def namespace(spec: PlatformSpec) -> Manifest:
    name = spec.cluster.namespace
    meta = common.metadata(spec, name, "namespace")
    meta.pop("namespace")
    # Engines need nothing beyond the restricted Pod Security Standard; enforce it.
    meta["labels"].update(
        {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
    )
    if spec.gateway.ingress is IngressKind.ALB:  # the router behind an ALB sending to pod IPs
        meta["labels"][READINESS_GATE_LABEL] = "enabled"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
