"""The VPC: public and private subnets per zone, an internet gateway, NAT, flow logs; or the spec's existing subnets.

Thin: ``decisions.network_plan`` chose every range and count; this registers them.

Flow logs go to CloudWatch Logs rather than S3: checkov (CKV2_AWS_11) and the Well-Architected security
pillar ask for flow logs on every VPC and accept either, but an S3 destination is one more bucket that
must itself be logged, versioned, KMS-encrypted and expired, while a log group takes the platform's
logs key and a retention in one resource, and is queryable (Logs Insights) during an incident. An
existing VPC keeps whatever flow logs its owner set up.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.clouds.aws import data_policies, decisions, iam
from components.clouds.aws.identity import ServiceRole
from components.spec import PlatformSpec, eks_section


class Network(pulumi.ComponentResource):
    """``private_subnet_ids`` host nodes and internal load balancers; ``public_subnet_ids`` internet-facing ones."""

    private_subnet_ids: list[pulumi.Input[str]]
    public_subnet_ids: list[pulumi.Input[str]]
    vpc_id: pulumi.Input[str] | None

    flow_log: aws.ec2.FlowLog | None = None

    def __init__(
        self,
        spec: PlatformSpec,
        account_id: pulumi.Output[str],
        logs_key_arn: pulumi.Input[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("inferstack:aws:Network", spec.cluster_name, None, opts)
        plan = decisions.network_plan(spec)
        self.plan = plan
        self.vpc_id = plan.existing_vpc_id
        if not plan.create_vpc:
            self.private_subnet_ids = list(plan.existing_private_subnet_ids)
            self.public_subnet_ids = list(plan.existing_public_subnet_ids)
            self.register_outputs({"private_subnet_ids": self.private_subnet_ids})
            return
        name = spec.cluster_name
        child = pulumi.ResourceOptions(parent=self)
        vpc = aws.ec2.Vpc(
            name,
            cidr_block=plan.vpc_cidr,
            enable_dns_hostnames=True,  # EKS nodes register by their private DNS names
            enable_dns_support=True,
            tags={**tags, "Name": name},
            opts=child,
        )
        self.vpc_id = vpc.id
        self.flow_log = self._flow_log(spec, vpc, account_id, logs_key_arn, tags)
        igw = aws.ec2.InternetGateway(name, vpc_id=vpc.id, tags={**tags, "Name": name}, opts=child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags={**tags, "Name": f"{name}-public"},
            opts=child,
        )
        public: list[aws.ec2.Subnet] = []
        for s in plan.public:
            subnet_name = f"{name}-public-{s.zone}"
            subnet = aws.ec2.Subnet(
                subnet_name,
                vpc_id=vpc.id,
                cidr_block=s.cidr,
                availability_zone=s.zone,
                map_public_ip_on_launch=False,  # only load balancers and NAT gateways live here
                tags={**tags, **decisions.subnet_tags(spec, public=True), "Name": subnet_name},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                subnet_name, subnet_id=subnet.id, route_table_id=public_rt.id, opts=child
            )
            public.append(subnet)
        nats: list[aws.ec2.NatGateway] = []
        for i in range(plan.nat_gateways):
            zone = plan.zones[i]
            eip = aws.ec2.Eip(
                f"{name}-nat-{zone}", domain="vpc", tags={**tags, "Name": f"{name}-nat-{zone}"}, opts=child
            )
            nats.append(
                aws.ec2.NatGateway(
                    f"{name}-{zone}",
                    allocation_id=eip.id,
                    subnet_id=public[i].id,
                    tags={**tags, "Name": f"{name}-{zone}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
                )
            )
        private: list[aws.ec2.Subnet] = []
        private_tables: list[aws.ec2.RouteTable] = []
        for i, s in enumerate(plan.private):
            subnet_name = f"{name}-private-{s.zone}"
            subnet = aws.ec2.Subnet(
                subnet_name,
                vpc_id=vpc.id,
                cidr_block=s.cidr,
                availability_zone=s.zone,
                tags={**tags, **decisions.subnet_tags(spec, public=False), "Name": subnet_name},
                opts=child,
            )
            rt = aws.ec2.RouteTable(
                subnet_name,
                vpc_id=vpc.id,
                routes=[
                    aws.ec2.RouteTableRouteArgs(
                        cidr_block="0.0.0.0/0", nat_gateway_id=nats[plan.nat_zone(i)].id
                    )
                ],
                tags={**tags, "Name": subnet_name},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(subnet_name, subnet_id=subnet.id, route_table_id=rt.id, opts=child)
            private.append(subnet)
            private_tables.append(rt)
        # S3 without NAT: weights and ECR image layers come from S3, and a gateway endpoint is free where
        # NAT charges per GB processed.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{eks_section(spec).region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[rt.id for rt in private_tables],
            tags={**tags, "Name": f"{name}-s3"},
            opts=child,
        )
        self.private_subnet_ids = [s.id for s in private]
        self.public_subnet_ids = [s.id for s in public]
        self.register_outputs({"vpc_id": vpc.id, "private_subnet_ids": self.private_subnet_ids})

    def subnets_in(self, zones: list[str] | None) -> list[pulumi.Input[str]]:
        """The private subnets of ``zones`` (None: all of them); the stack knows zones only of subnets it makes."""
        if zones is None:
            return list(self.private_subnet_ids)
        return [
            s
            for s, plan in zip(self.private_subnet_ids, self.plan.private, strict=True)
            if plan.zone in zones
        ]

    def _flow_log(
        self,
        spec: PlatformSpec,
        vpc: aws.ec2.Vpc,
        account_id: pulumi.Output[str],
        logs_key_arn: pulumi.Input[str],
        tags: dict[str, str],
    ) -> aws.ec2.FlowLog:
        """Accepted and rejected traffic of the whole VPC into a KMS-encrypted log group kept a year."""
        name = f"{spec.cluster_name}-flow-logs"
        region = eks_section(spec).region
        child = pulumi.ResourceOptions(parent=self)
        group = aws.cloudwatch.LogGroup(
            name,
            name=decisions.flow_log_group(spec),
            retention_in_days=decisions.FLOW_LOG_RETENTION_DAYS,
            kms_key_id=logs_key_arn,
            tags=tags,
            opts=child,
        )
        role = ServiceRole(
            name,
            account_id.apply(lambda a: data_policies.flow_logs_trust(region, a)),
            region,
            tags,
            child,
            inline={"deliver": group.arn.apply(lambda arn: iam.dumps(data_policies.flow_logs_delivery(arn)))},
            description=f"VPC flow logs of {spec.cluster_name}",
        )
        return aws.ec2.FlowLog(
            name,
            vpc_id=vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=group.arn,
            iam_role_arn=role.arn,
            max_aggregation_interval=decisions.FLOW_LOG_AGGREGATION_S,
            tags={**tags, "Name": name},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[role]),
        )
