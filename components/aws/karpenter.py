"""Karpenter instead of managed GPU node groups (``cluster.node_provisioner: karpenter``).

Per GPU pool an ``EC2NodeClass`` (IMDSv2, the pool's disk, subnets and security group by tag, cost tags)
and a ``NodePool`` (the pool's instance and capacity type, its labels and GPU taint, a GPU limit from the
models' max replicas). The renderers are pure; ``Karpenter`` registers them with the controller's
chart, its Pod Identity role and the interruption queue.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.aws import decisions, identity, policies
from components.kubernetes.manifests import apply
from components.placement import PoolPlan
from components.render.common import GPU_RESOURCE, Manifest
from components.spec import PlatformSpec

CHART = "oci://public.ecr.aws/karpenter/karpenter"
CHART_VERSION = "1.6.0"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = (NAMESPACE, "karpenter")
AMI_ALIAS = "al2023@latest"  # Karpenter picks the NVIDIA variant of AL2023 for GPU instance types
NODE_EXPIRY = "720h"
CONSOLIDATE_AFTER = "10m"  # only empty GPU nodes go: engines take minutes to load their weights
QUEUE_RETENTION_S = 300

# EventBridge events that mean a node is about to go; Karpenter drains it first.
INTERRUPTION_EVENTS: dict[str, dict[str, list[str]]] = {
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "spot": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
}


def node_class(
    spec: PlatformSpec,
    group: decisions.NodeGroupPlan,
    node_role: str,
    tags: dict[str, str],
    volume_key_arn: pulumi.Input[str],
) -> Manifest:
    """The EC2NodeClass of one GPU pool: IMDSv2, the root disk of a managed group's, under the disks key."""
    net = decisions.network_plan(spec)
    if net.create_vpc:
        subnets: list[dict[str, Any]] = [{"tags": {"karpenter.sh/discovery": spec.cluster_name}}]
    else:
        subnets = [{"id": s} for s in net.existing_private_subnet_ids]
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": group.pool},
        "spec": {
            "role": node_role,
            "amiSelectorTerms": [{"alias": AMI_ALIAS}],
            "subnetSelectorTerms": subnets,
            # EKS tags the cluster security group it creates with the cluster name.
            "securityGroupSelectorTerms": [{"tags": {"aws:eks:cluster-name": spec.cluster_name}}],
            "metadataOptions": {
                "httpEndpoint": "enabled",
                "httpTokens": "required",
                "httpPutResponseHopLimit": decisions.IMDS_HOP_LIMIT,
                "httpProtocolIPv6": "disabled",
            },
            "blockDeviceMappings": [
                {
                    "deviceName": decisions.ROOT_DEVICE,
                    "ebs": {
                        "volumeSize": f"{group.root_disk_gib}Gi",
                        "volumeType": "gp3",
                        "iops": group.disk_iops,
                        "throughput": group.disk_throughput_mibps,
                        "encrypted": True,
                        "kmsKeyID": volume_key_arn,
                        "deleteOnTermination": True,
                    },
                }
            ],
            "tags": tags,
        },
    }


def node_pool(group: decisions.NodeGroupPlan, pool: PoolPlan) -> Manifest:
    """Nodes of exactly the pool's instance and capacity type, labelled and tainted like a managed group's."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": group.pool},
        "spec": {
            "template": {
                "metadata": {"labels": dict(group.labels)},
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.k8s.aws",
                        "kind": "EC2NodeClass",
                        "name": group.pool,
                    },
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": group.instance_types,
                        },
                        {
                            "key": "karpenter.sh/capacity-type",
                            "operator": "In",
                            "values": [pool.capacity_type.value],
                        },
                    ],
                    "taints": [
                        {"key": t.key, "effect": t.effect, **({"value": t.value} if t.value else {})}
                        for t in group.taints
                    ],
                    "expireAfter": NODE_EXPIRY,
                },
            },
            # Never more GPUs than the pool's models need at their max replicas.
            "limits": {GPU_RESOURCE: str(group.max_size * pool.instance.gpus)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": CONSOLIDATE_AFTER},
        },
    }


def chart_values(spec: PlatformSpec, queue_name: str) -> dict[str, Any]:
    return {
        "settings": {"clusterName": spec.cluster_name, "interruptionQueue": queue_name},
        "serviceAccount": {"name": SERVICE_ACCOUNT[1]},
        "replicas": 2,
        # The controller runs on the system nodes, never on the nodes it manages.
        "nodeSelector": {decisions.ROLE_LABEL: decisions.SYSTEM_POOL},
        "controller": {
            "resources": {
                "requests": {"cpu": "500m", "memory": "512Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            }
        },
    }


class Karpenter(pulumi.ComponentResource):
    """The controller (chart, role, interruption queue, node access) and one NodeClass + NodePool per pool."""

    def __init__(
        self,
        spec: PlatformSpec,
        pools: dict[str, PoolPlan],
        node_role: identity.ServiceRole,
        node_role_name: str,
        volume_key_arn: pulumi.Output[str],
        cluster_name: pulumi.Input[str],
        kubernetes: k8s.Provider,
        tags: dict[str, str],
        aws_opts: pulumi.ResourceOptions,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = spec.cluster_name
        region = spec.cluster.region
        super().__init__("inferstack:aws:Karpenter", name, None, opts)
        on_aws = pulumi.ResourceOptions.merge(aws_opts, pulumi.ResourceOptions(parent=self))
        # The queue's name is what the chart is told; Karpenter reads interruption events from it.
        queue = aws.sqs.Queue(
            f"{name}-karpenter",
            name=f"{name}-karpenter",
            message_retention_seconds=QUEUE_RETENTION_S,
            sqs_managed_sse_enabled=True,
            tags=tags,
            opts=on_aws,
        )
        aws.sqs.QueuePolicy(
            f"{name}-karpenter",
            queue_url=queue.url,
            policy=queue.arn.apply(lambda arn: policies.dumps(policies.interruption_queue(arn))),
            opts=on_aws,
        )
        for event, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-karpenter-{event}", event_pattern=json.dumps(pattern), tags=tags, opts=on_aws
            )
            aws.cloudwatch.EventTarget(
                f"{name}-karpenter-{event}", rule=rule.name, arn=queue.arn, opts=on_aws
            )
        document = pulumi.Output.all(queue.arn, node_role.arn, volume_key_arn).apply(
            lambda arns: policies.dumps(
                policies.karpenter_controller(region, name, str(arns[0]), str(arns[1]), str(arns[2]))
            )
        )
        controller = identity.ServiceRole(
            f"{name}-karpenter",
            policies.pod_identity_trust(),
            region,
            tags,
            on_aws,
            inline={"controller": document},
            description=f"Karpenter controller of {name}",
        )
        association = identity.pod_identity(
            f"{name}-karpenter", cluster_name, SERVICE_ACCOUNT, controller, tags, on_aws
        )
        # Nodes Karpenter launches join with the node role; managed node groups get this entry implicitly.
        access = aws.eks.AccessEntry(
            f"{name}-karpenter-nodes",
            cluster_name=cluster_name,
            principal_arn=node_role.arn,
            type="EC2_LINUX",
            tags=tags,
            opts=on_aws,
        )
        on_cluster = pulumi.ResourceOptions(parent=self, provider=kubernetes)
        self.chart = k8s.helm.v4.Chart(
            f"{name}-karpenter",
            chart=CHART,
            version=CHART_VERSION,
            namespace=NAMESPACE,
            values=queue.name.apply(lambda q: chart_values(spec, str(q))),
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[*depends_on, association, access])
            ),
        )
        with_crds = pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[self.chart]))
        self.node_pools: dict[str, str] = {}
        for pool in pools.values():
            group = decisions.gpu_node_group(spec, pool)
            apply(node_class(spec, group, node_role_name, tags, volume_key_arn), with_crds)
            apply(node_pool(group, pool), with_crds)
            self.node_pools[pool.name] = group.pool
        self.register_outputs({"node_pools": self.node_pools})
