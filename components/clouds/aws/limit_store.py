"""The shared rate-limit store on AWS: ElastiCache for Redis OSS, in the private subnets.

Two nodes in two zones with automatic failover (a store that is down only degrades limits to each
router's share, but a primary that fails over in seconds keeps them exact); encrypted in transit (TLS:
the router speaks ``rediss://``) and at rest with its own customer-managed key, AUTH token from the Pulumi
secret ``gateway.limit_store_auth_config_key``; reachable on 6379 from the VPC only (the router's pods,
by their NetworkPolicy). No snapshots: limits are seconds of state.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.clouds.aws import decisions, iam, key_policies
from components.clouds.aws.cloud import EKS
from components.clouds.aws.keys import rotating_key
from components.render.limit_store import PORT
from components.spec import PlatformSpec, eks_section


class ManagedLimitStore(pulumi.ComponentResource):
    """``url`` is ``rediss://<primary endpoint>:6379``."""

    def __init__(
        self,
        spec: PlatformSpec,
        vpc_id: pulumi.Input[str] | None,
        subnet_ids: list[pulumi.Input[str]],
        account_id: pulumi.Output[str],
        token: pulumi.Output[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = f"{spec.cluster_name}-limits"
        super().__init__("inferstack:aws:ManagedLimitStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        region = eks_section(spec).region
        self.key = rotating_key(
            name,
            alias=f"alias/{name}",
            description=f"{spec.cluster_name}: {decisions.LIMITS_KEY_PURPOSE}",
            policy=account_id.apply(lambda a: iam.dumps(key_policies.service_key(region, a, "elasticache"))),
            tags=tags,
            parent=self,
        )
        self.security_group = aws.ec2.SecurityGroup(
            name,
            description=f"{spec.cluster_name}: the routers' rate-limit store, from the VPC only",
            vpc_id=vpc_id,
            ingress=[
                aws.ec2.SecurityGroupIngressArgs(
                    description="Redis (TLS) from the cluster's pods",
                    protocol="tcp",
                    from_port=PORT,
                    to_port=PORT,
                    cidr_blocks=EKS.cluster_network(spec),
                )
            ],
            tags={**tags, "Name": name},
            opts=child,
        )
        self.subnets = aws.elasticache.SubnetGroup(
            name,
            description=f"{spec.cluster_name}: private subnets",
            subnet_ids=subnet_ids,
            tags=tags,
            opts=child,
        )
        self.store = aws.elasticache.ReplicationGroup(
            name,
            description=f"{spec.cluster_name}: per-key rate limits shared by the router replicas",
            engine="redis",
            engine_version=decisions.LIMIT_STORE_ENGINE_VERSION,
            node_type=spec.gateway.limit_store_node_type,
            num_cache_clusters=2,
            automatic_failover_enabled=True,
            multi_az_enabled=True,
            port=PORT,
            transit_encryption_enabled=True,
            at_rest_encryption_enabled=True,
            kms_key_id=self.key.arn,
            auth_token=token,
            subnet_group_name=self.subnets.name,
            security_group_ids=[self.security_group.id],
            snapshot_retention_limit=0,
            auto_minor_version_upgrade=True,
            apply_immediately=True,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["authToken"]),
        )
        self.url = pulumi.Output.concat("rediss://", self.store.primary_endpoint_address, f":{PORT}")
        self.register_outputs({"endpoint": self.store.primary_endpoint_address})
