"""Cluster Autoscaler for managed node groups: adds GPU nodes when engines are pending, removes idle ones.

Only with ``cluster.node_provisioner: managed`` (Karpenter does this job otherwise). It discovers the
node groups by the tags EKS puts on their Auto Scaling groups and never leaves a group's min/max.

This layer creates its AWS identity (a Pod Identity role that may only scale this cluster's groups);
the chart is one of the AWS layer's add-ons (``components.clouds.aws.addons.cluster_autoscaler``), under the
service account ``addons.CLUSTER_AUTOSCALER_SERVICE_ACCOUNT`` that the role is handed to.
"""

from __future__ import annotations

import pulumi

from components.clouds.aws import addons, controller_policies, iam, identity
from components.spec import PlatformSpec, eks_section


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
            iam.pod_identity_trust(),
            eks_section(spec).region,
            tags,
            on_aws,
            inline={
                "scale": iam.dumps(controller_policies.cluster_autoscaler(eks_section(spec).region, name))
            },
            description=f"Cluster Autoscaler of {name}",
        )
        association = identity.pod_identity(
            f"{name}-autoscaler", cluster_name, addons.CLUSTER_AUTOSCALER_SERVICE_ACCOUNT, role, tags, on_aws
        )
        self.association = association
        self.register_outputs({})
