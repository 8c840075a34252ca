"""Cluster Autoscaler for managed node groups: adds GPU nodes when engines are pending, removes idle ones.

Only with ``cluster.node_provisioner: managed`` (Karpenter does this job otherwise). It discovers the
node groups by the tags EKS puts on their Auto Scaling groups and never leaves a group's min/max.

This layer creates its AWS identity (a Pod Identity role that may only scale this cluster's groups);
the chart itself belongs with the cluster add-ons (``components.render.addons``), installed with
``chart_values`` below under the service account ``SERVICE_ACCOUNT``.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components.aws import decisions, identity, policies
from components.spec import PlatformSpec

CHART = "cluster-autoscaler"
CHART_REPO = "https://kubernetes.github.io/autoscaler"
CHART_VERSION = "9.46.6"
SERVICE_ACCOUNT = ("kube-system", "cluster-autoscaler")
# GPU nodes are slow to come back: wait before removing an idle one.
SCALE_DOWN_UNNEEDED = "15m"


def image_tag(spec: PlatformSpec) -> str:
    """The autoscaler's minor version must match the cluster's."""
    return f"v{spec.cluster.kubernetes_version}.0"


def chart_values(spec: PlatformSpec) -> dict[str, Any]:
    return {
        "autoDiscovery": {"clusterName": spec.cluster_name},
        "awsRegion": spec.cluster.region,
        "cloudProvider": "aws",
        "image": {"tag": image_tag(spec)},
        "rbac": {"serviceAccount": {"create": True, "name": SERVICE_ACCOUNT[1]}},
        "nodeSelector": {decisions.ROLE_LABEL: decisions.SYSTEM_POOL},
        "extraArgs": {
            "balance-similar-node-groups": True,
            "skip-nodes-with-system-pods": False,
            "expander": "least-waste",
            "scale-down-unneeded-time": SCALE_DOWN_UNNEEDED,
        },
    }


class ClusterAutoscaler(pulumi.ComponentResource):
    def __init__(
        self,
        spec: PlatformSpec,
        cluster_name: pulumi.Input[str],
        tags: dict[str, str],
        aws_opts: pulumi.ResourceOptions,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = spec.cluster_name
        super().__init__("inferstack:aws:ClusterAutoscaler", name, None, opts)
        on_aws = pulumi.ResourceOptions.merge(aws_opts, pulumi.ResourceOptions(parent=self))
        role = identity.ServiceRole(
            f"{name}-autoscaler",
            policies.pod_identity_trust(),
            spec.cluster.region,
            tags,
            on_aws,
            inline={"scale": policies.dumps(policies.cluster_autoscaler(spec.cluster.region, name))},
            description=f"Cluster Autoscaler of {name}",
        )
        association = identity.pod_identity(
            f"{name}-autoscaler", cluster_name, SERVICE_ACCOUNT, role, tags, on_aws
        )
        self.association = association
        self.register_outputs({})
