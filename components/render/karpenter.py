"""Karpenter's objects: per GPU pool a NodePool and an EC2NodeClass, and the controller's chart values. Pure.

A NodePool asks for nodes of exactly the pool's instance and capacity type, labelled and tainted like a
managed node group's (``components.core.nodes``), with a GPU limit from the models' max replicas. Its
EC2NodeClass launches them the way the AWS layer decides (``NodeLaunch``: role, subnets, IMDSv2, root
device) with the pool's root disk. ``components.clouds.aws.karpenter`` registers these with the controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.core import nodes
from components.core.cloud import RootDisk
from components.core.placement import PoolPlan
from components.render.common import Manifest
from components.spec import PlatformSpec

CHART = "oci://public.ecr.aws/karpenter/karpenter"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = (NAMESPACE, "karpenter")
"""The controller's service account: the chart creates it, EKS Pod Identity gives it the controller's role."""
AMI_FAMILY = "al2023"  # Karpenter picks the NVIDIA variant of AL2023 for GPU instance types
NODE_EXPIRY = "720h"
CONSOLIDATE_AFTER = "10m"  # only empty GPU nodes go: engines take minutes to load their weights


@dataclass(frozen=True)
class NodeLaunch:
    """How every EC2NodeClass of the cluster launches nodes (``components.clouds.aws.decisions.karpenter_launch``)."""

    role: str
    subnets: list[Manifest]
    """subnetSelectorTerms: where the private subnets are."""
    security_groups: list[Manifest]
    """securityGroupSelectorTerms: the cluster's security group."""
    imds_hop_limit: int
    root_device: str
    tags: dict[str, str]
    ami_version: str
    """The EKS-optimized AMI release every node launches from (``cluster.karpenter_ami_version``): pinned, so a
    new AMI reaches GPU nodes only when the stack says so, never through drift."""


def ami_alias(version: str) -> str:
    """``al2023@v20250620``: Karpenter's alias for one AMI release (never ``@latest``; see
    https://karpenter.sh/docs/tasks/managing-amis/)."""
    return f"{AMI_FAMILY}@{version}"


RESERVED = "reserved"
"""Karpenter's capacity type for nodes in a capacity reservation (an ODCR or a Capacity Block); it prefers them."""


def node_class(
    pool: str,
    disk: RootDisk,
    launch: NodeLaunch,
    volume_key_arn: Any,
    reservation_id: str | None = None,
    user_data: str | None = None,
) -> Manifest:
    """The EC2NodeClass of one GPU pool: IMDSv2 and the pool's root disk, encrypted with ``volume_key_arn``
    (a string or a Pulumi Output), the pool's capacity reservation if it has one
    (https://karpenter.sh/docs/tasks/odcrs/), and with ``user_data`` (the node cache's) the instance NVMe as
    RAID0."""
    reservations = {"capacityReservationSelectorTerms": [{"id": reservation_id}]} if reservation_id else {}
    cache: Manifest = {"instanceStorePolicy": "RAID0", "userData": user_data} if user_data else {}
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": pool},
        "spec": {
            "role": launch.role,
            "amiSelectorTerms": [{"alias": ami_alias(launch.ami_version)}],
            "subnetSelectorTerms": launch.subnets,
            "securityGroupSelectorTerms": launch.security_groups,
            "metadataOptions": {
                "httpEndpoint": "enabled",
                "httpTokens": "required",
                "httpPutResponseHopLimit": launch.imds_hop_limit,
                "httpProtocolIPv6": "disabled",
            },
            "blockDeviceMappings": [
                {
                    "deviceName": launch.root_device,
                    "ebs": {
                        "volumeSize": f"{disk.gib}Gi",
                        "volumeType": "gp3",
                        "iops": disk.iops,
                        "throughput": disk.throughput_mibps,
                        "encrypted": True,
                        "kmsKeyID": volume_key_arn,
                        "deleteOnTermination": True,
                    },
                }
            ],
            "tags": launch.tags,
            **reservations,
            **cache,
        },
    }


def _taint(taint: nodes.Taint) -> Manifest:
    return {"key": taint.key, "effect": taint.effect, **({"value": taint.value} if taint.value else {})}


def node_pool(
    pool: PoolPlan, max_nodes: int, fallback_instance_types: tuple[str, ...] = (), reserved: bool = False
) -> Manifest:
    """Nodes of the pool's instance type (or its fallbacks, which Karpenter weighs by price and availability) and
    capacity type (after its reservation, which Karpenter uses first), never more GPUs than ``max_nodes`` of the
    pool's type hold."""
    capacity_types = [*([RESERVED] if reserved else []), pool.capacity_type.value]
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool.name},
        "spec": {
            "template": {
                # Not the Cluster Autoscaler's GPU label (k8s.amazonaws.com/accelerator, on managed node groups):
                # Karpenter reads an instance type's GPUs from EC2 and waits on its own NodeClaims.
                "metadata": {"labels": nodes.gpu_node_labels(pool)},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": pool.name},
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": [pool.instance.name, *fallback_instance_types],
                        },
                        {
                            "key": "karpenter.sh/capacity-type",
                            "operator": "In",
                            "values": capacity_types,
                        },
                    ],
                    "taints": [_taint(nodes.gpu_taint())],
                    "expireAfter": NODE_EXPIRY,
                },
            },
            "limits": {nodes.GPU_RESOURCE: str(max_nodes * pool.instance.gpus)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": CONSOLIDATE_AFTER},
        },
    }


def chart_values(spec: PlatformSpec, queue_name: str) -> Manifest:
    """The controller: this cluster, its interruption queue, two replicas on the system nodes; reserved capacity
    on when a pool has a reservation (the ReservedCapacity feature gate)."""
    settings: Manifest = {"clusterName": spec.cluster_name, "interruptionQueue": queue_name}
    if any(p.capacity_reservation for p in spec.gpu_pools):
        settings["featureGates"] = {"reservedCapacity": True}
    return {
        "settings": settings,
        "serviceAccount": {"name": SERVICE_ACCOUNT[1]},
        "replicas": 2,
        # The controller runs on the system nodes, never on the nodes it manages.
        "nodeSelector": nodes.system_node_selector(),
        "controller": {
            "resources": {
                "requests": {"cpu": "500m", "memory": "512Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            }
        },
    }
