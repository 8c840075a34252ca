"""Managed node groups: the CPU system group and one per GPU pool, each with an IMDSv2-only launch template.

Thin: ``decisions.node_groups`` derived instance types, bounds (from the models' replicas x GPUs), disk
(from their weights), labels and taints; this registers a launch template and a node group per plan.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from components.clouds.aws import decisions
from components.spec import ReservationKind

TAGGED_AT_LAUNCH = ("instance", "volume", "network-interface")


def _reservation_target(
    plan: decisions.NodeGroupPlan,
) -> aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs | None:
    """Launch into the pool's capacity reservation and nowhere else."""
    if plan.reservation is None:
        return None
    return aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
        capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
            capacity_reservation_id=plan.reservation.id
        )
    )


def _capacity_block_market(
    plan: decisions.NodeGroupPlan,
) -> aws.ec2.LaunchTemplateInstanceMarketOptionsArgs | None:
    """A Capacity Block is bought in the capacity-block market (EC2's LaunchTemplateData.InstanceMarketOptions)."""
    if plan.capacity_type != decisions.EKS_RESERVATION_CAPACITY_TYPE[ReservationKind.CAPACITY_BLOCK]:
        return None
    return aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type=decisions.CAPACITY_BLOCK_MARKET)


def _efa_interfaces(
    plan: decisions.NodeGroupPlan, security_group_ids: Sequence[pulumi.Input[str]]
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs] | None:
    """One EFA per network card (``decisions.efa_interfaces``), in the cluster's and the EFA security groups."""
    if not plan.efa_interfaces:
        return None
    return [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            network_card_index=i.network_card_index,
            device_index=i.device_index,
            interface_type=i.interface_type,
            security_groups=list(security_group_ids),
            delete_on_termination="true",
        )
        for i in decisions.efa_interfaces(plan.efa_interfaces)
    ]


class NodeGroup(pulumi.ComponentResource):
    """One ``aws.eks.NodeGroup`` and the launch template that fixes IMDSv2, the root disk (encrypted with the
    platform's disks key, ``disks_key_arn``) and launch tags."""

    node_group: aws.eks.NodeGroup

    def __init__(
        self,
        plan: decisions.NodeGroupPlan,
        cluster_name: pulumi.Input[str],
        node_role_arn: pulumi.Input[str],
        subnet_ids: Sequence[pulumi.Input[str]],
        disks_key_arn: pulumi.Input[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
        efa_security_group_ids: Sequence[pulumi.Input[str]] = (),
        placement_group: pulumi.Input[str] | None = None,
    ) -> None:
        """``efa_security_group_ids``: the groups of the EFA interfaces (the cluster's, and one that admits all
        traffic within itself), for a plan with EFA; ``placement_group``: the cluster placement group's name."""
        super().__init__("inferstack:aws:NodeGroup", plan.node_group_name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        named = {**tags, "Name": plan.node_group_name}
        template = aws.ec2.LaunchTemplate(
            plan.node_group_name,
            description=f"{plan.node_group_name}: IMDSv2 only, gp3 root disk under the disks key, cost tags at launch",
            update_default_version=True,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=decisions.IMDS_HOP_LIMIT,
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=decisions.ROOT_DEVICE,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=plan.disk.gib,
                        volume_type="gp3",
                        iops=plan.disk.iops,
                        throughput=plan.disk.throughput_mibps,
                        encrypted="true",
                        kms_key_id=disks_key_arn,
                        delete_on_termination="true",
                    ),
                )
            ],
            capacity_reservation_specification=_reservation_target(plan),
            network_interfaces=_efa_interfaces(plan, efa_security_group_ids),
            placement=(
                aws.ec2.LaunchTemplatePlacementArgs(group_name=placement_group)
                if placement_group is not None
                else None
            ),
            instance_market_options=_capacity_block_market(plan),
            # Node group tags stay on the node group; these reach the instances and disks the bill is for.
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=named)
                for kind in TAGGED_AT_LAUNCH
            ],
            user_data=base64.b64encode(plan.user_data.encode()).decode() if plan.user_data else None,
            tags=tags,
            opts=child,
        )
        self.node_group = aws.eks.NodeGroup(
            plan.node_group_name,
            cluster_name=cluster_name,
            node_group_name=plan.node_group_name,
            node_role_arn=node_role_arn,
            subnet_ids=list(subnet_ids),
            instance_types=plan.instance_types,
            ami_type=plan.ami_type,
            capacity_type=plan.capacity_type,
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=plan.min_size, desired_size=plan.desired_size, max_size=plan.max_size
            ),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            labels=plan.labels,
            taints=[aws.eks.NodeGroupTaintArgs(**decisions.eks_taint(t)) for t in plan.taints] or None,
            # Replace nodes whose GPUs or kubelet fail health checks instead of leaving them cordoned.
            node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True),
            tags=tags,
            # The autoscaler owns the current size; a later `pulumi up` must not reset it.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["scalingConfig.desiredSize"]),
        )
        self.register_outputs({"node_group_name": self.node_group.node_group_name})
