"""Karpenter instead of managed GPU node groups (``cluster.node_provisioner: karpenter``).

The controller's chart, its Pod Identity role, the interruption queue (and the EventBridge rules that feed
it) and the node role's access entry; then per GPU pool the NodePool and EC2NodeClass that
``components.render.karpenter`` renders.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.clouds.aws import controller_policies, data_policies, decisions, iam, identity
from components.core.placement import PoolPlan
from components.kubernetes.manifests import apply
from components.render import karpenter, weights
from components.spec import PlatformSpec, eks_section

QUEUE_RETENTION_S = 300

# EventBridge events that mean a node is about to go; Karpenter drains it first.
INTERRUPTION_EVENTS: dict[str, dict[str, list[str]]] = {
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "spot": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
}


class Karpenter(pulumi.ComponentResource):
    """The controller (chart, role, interruption queue, node access) and one NodeClass + NodePool per pool."""

    def __init__(
        self,
        spec: PlatformSpec,
        pools: dict[str, PoolPlan],
        node_role: identity.ServiceRole,
        volume_key_arn: pulumi.Output[str],
        cluster_name: pulumi.Input[str],
        kubernetes: k8s.Provider,
        tags: dict[str, str],
        aws_opts: pulumi.ResourceOptions,
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = spec.cluster_name
        region = eks_section(spec).region
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
            policy=queue.arn.apply(lambda arn: iam.dumps(data_policies.interruption_queue(arn))),
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
            lambda arns: iam.dumps(
                controller_policies.karpenter_controller(
                    region, name, str(arns[0]), str(arns[1]), str(arns[2])
                )
            )
        )
        controller = identity.ServiceRole(
            f"{name}-karpenter",
            iam.pod_identity_trust(),
            region,
            tags,
            on_aws,
            inline={"controller": document},
            description=f"Karpenter controller of {name}",
        )
        association = identity.pod_identity(
            f"{name}-karpenter", cluster_name, karpenter.SERVICE_ACCOUNT, controller, tags, on_aws
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
            chart=karpenter.CHART,
            version=spec.addons.versions.karpenter,
            namespace=karpenter.NAMESPACE,
            values=queue.name.apply(lambda q: karpenter.chart_values(spec, str(q))),
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[*depends_on, association, access])
            ),
        )
        with_crds = pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[self.chart]))
        launch = decisions.karpenter_launch(spec, tags)
        self.node_pools: dict[str, str] = {}
        for pool in pools.values():
            group = decisions.gpu_node_group(spec, pool)
            own = decisions.pool_spec(spec, pool.name)
            reservation = own.capacity_reservation
            reservation_id = reservation.id if reservation is not None else None
            # Karpenter stripes the NVMe itself (instanceStorePolicy); the user data only readies the cache dir.
            user_data = weights.pool_user_data(pool, node_config=False)
            node_class = karpenter.node_class(
                pool.name, group.disk, launch, volume_key_arn, reservation_id, user_data
            )
            apply(node_class, with_crds)
            fallbacks = tuple(own.fallback_instance_types)
            apply(karpenter.node_pool(pool, group.max_size, fallbacks, reservation is not None), with_crds)
            self.node_pools[pool.name] = group.pool
        self.register_outputs({"node_pools": self.node_pools})
