"""Every AWS decision as a pure function: zones, subnet ranges, NAT, node group shapes, names, tags.

No Pulumi SDK here, so ``components.clouds.aws.cloud`` (the seam's answers for EKS) and the tests read the same
decisions the components register. The components in this package only turn these values into resources.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from typing import Any

from components.base import catalog
from components.clouds.aws import prices
from components.core import nodes
from components.core.cloud import RootDisk
from components.core.placement import Layout, PoolPlan
from components.render import weights
from components.render.karpenter import NodeLaunch
from components.spec import (
    CapacityReservationSpec,
    CapacityType,
    GpuPoolSpec,
    PlatformSpec,
    ReservationKind,
    eks_section,
)

# Tag keys every AWS resource carries (plus the spec's cost-allocation tags).
STACK_TAG = "inferstack:stack"
ENVIRONMENT_TAG = "inferstack:environment"

# Zones per region where "<region>a, b, c" is wrong (letters that new accounts do not get).
_ZONE_LETTERS: dict[str, str] = {"us-west-1": "bc", "ap-northeast-1": "acd", "ca-central-1": "abd"}
DEFAULT_ZONES = 3

GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"  # drivers included; the device plugin is installed in-cluster
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
SYSTEM_POOL = nodes.SYSTEM_ROLE  # the system node group is named after its nodes' role
SYSTEM_ROOT_DISK_GIB = 50
"""The system nodes' own use: the OS, the images of what runs there, logs; the model store's Jobs' disk is added on
top (``system_root_disk_gib``)."""
# The kubelet's allocatable ephemeral storage leaves out its hard-eviction margin of the whole disk and its
# reservation: nodeadm's kubelet defaults (awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go:
# evictionHard nodefs.available 10%, kubeReserved ephemeral-storage 1Gi).
NODEFS_EVICTION_FRACTION = 0.10
KUBE_RESERVED_EPHEMERAL_GIB = 1
DISK_STEP_GIB = 10
GP3_MAX_GIB = 16_384
ROOT_DEVICE = "/dev/xvda"  # AL2023 EKS AMIs boot from xvda
# GPU nodes pull ~10 GiB engine images and stage weights on the root disk: buy gp3 throughput (at most
# iops / 4 MiB/s) so a cold start is not disk-bound; it costs tens of dollars a month next to thousands.
GPU_DISK_IOPS = 4000
GPU_DISK_THROUGHPUT_MIBPS = catalog.GPU_ROOT_DISK_THROUGHPUT_MIBPS
# IMDSv2 only, one hop: node daemons on the host network reach the instance metadata service; pods do
# not (they get credentials from EKS Pod Identity), so a compromised pod cannot take the node's role.
IMDS_HOP_LIMIT = 1

# Kubernetes taint effects in the EKS API's spelling.
EKS_TAINT_EFFECT: dict[str, str] = {
    "NoSchedule": "NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
}
EKS_CAPACITY_TYPE: dict[CapacityType, str] = {CapacityType.ON_DEMAND: "ON_DEMAND", CapacityType.SPOT: "SPOT"}
# A managed node group in a Capacity Block is of capacity type CAPACITY_BLOCK, and its launch template targets the
# reservation with market type capacity-block; one in an On-Demand Capacity Reservation is ON_DEMAND and targets
# it (https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html).
EKS_RESERVATION_CAPACITY_TYPE: dict[ReservationKind, str] = {
    ReservationKind.CAPACITY_BLOCK: "CAPACITY_BLOCK",
    ReservationKind.ON_DEMAND: "ON_DEMAND",
}
CAPACITY_BLOCK_MARKET = "capacity-block"
RESERVED_SUFFIX = "reserved"

CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
# Managed add-ons; the first group runs as DaemonSets and goes before any node, the rest need nodes.
ADDONS_BEFORE_NODES = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
ADDONS_AFTER_NODES = ("coredns", "aws-ebs-csi-driver")
# vpc-cni enforces NetworkPolicies only when told to: its network policy agent then runs on every node (the
# add-on's configuration schema key, `aws eks describe-addon-configuration --addon-name vpc-cni`; see
# https://docs.aws.amazon.com/eks/latest/userguide/cni-network-policy-configure.html). Without it every
# NetworkPolicy the stack renders would be decoration.
ADDON_CONFIGURATION: dict[str, dict[str, Any]] = {"vpc-cni": {"enableNetworkPolicy": "true"}}

# Customer-managed KMS keys, one per purpose, each with rotation on. One per purpose rather than one platform
# key: a key policy can then name the one service (and principals) that purpose needs, so the engines' decrypt
# grant, the Auto Scaling role and CloudWatch Logs never reach each other's data, and disabling one key (say,
# an incident on the logs) leaves the rest running. Each costs a dollar a month. "secrets" is the EKS cluster's.
KMS_KEYS: dict[str, str] = {
    "secrets": "Kubernetes Secrets in the EKS cluster (envelope encryption)",
    "logs": "CloudWatch log groups: VPC flow logs and the EKS control plane",
    "models": "model weights in the S3 bucket (SSE-KMS)",
    "images": "runtime images in ECR",
    "disks": "EBS volumes: the nodes' root disks and the platform's persistent volumes (its StorageClass)",
}
LIMITS_KEY = "limits"
LIMITS_KEY_PURPOSE = "the shared rate-limit store (ElastiCache, at rest)"
LIMIT_STORE_ENGINE_VERSION = "7.1"  # ElastiCache for Redis OSS 7.1: the last Redis OSS major it offers


BATCHES_KEY = "batches"
BATCHES_KEY_PURPOSE = "the batch service's files in their own S3 bucket (SSE-KMS)"


def kms_keys(spec: PlatformSpec) -> tuple[str, ...]:
    """Every key the stack creates: the platform's, the batch files' with batch.enabled, and the rate-limit
    store's with gateway.shared_limits."""
    return (
        *KMS_KEYS,
        *((BATCHES_KEY,) if spec.batch.enabled else ()),
        *((LIMITS_KEY,) if spec.gateway.shared_limits else ()),
    )


KMS_DELETION_WINDOW_DAYS = 30
# Flow logs are kept one year: the least checkov accepts for a log group (CKV_AWS_338).
FLOW_LOG_RETENTION_DAYS = 365
FLOW_LOG_AGGREGATION_S = 60  # one-minute records (the other choice is ten): incidents need the finer grain


def control_plane_log_group(spec: PlatformSpec) -> str:
    """EKS writes control-plane logs to this exact name; creating it first sets retention, key and tags."""
    return f"/aws/eks/{spec.cluster_name}/cluster"


def flow_log_group(spec: PlatformSpec) -> str:
    return f"/aws/vpc/{spec.cluster_name}/flow-logs"


# Service accounts that get AWS credentials through EKS Pod Identity (the controllers' are in
# ``components.clouds.aws.addons`` and ``components.render.karpenter``, beside the Helm values that name them).
EBS_CSI_SERVICE_ACCOUNT = ("kube-system", "ebs-csi-controller-sa")


def tags(spec: PlatformSpec, stack: str) -> dict[str, str]:
    """The tags on every taggable AWS resource: the spec's cost-allocation tags, then ours (ours win)."""
    return {**spec.tags, STACK_TAG: stack, ENVIRONMENT_TAG: spec.environment}


def zones(spec: PlatformSpec) -> list[str]:
    if eks_section(spec).availability_zones:
        return list(eks_section(spec).availability_zones)
    region = eks_section(spec).region
    letters = _ZONE_LETTERS.get(region, "abc")[:DEFAULT_ZONES]
    return [f"{region}{letter}" for letter in letters]


@dataclass(frozen=True)
class SubnetPlan:
    zone: str
    cidr: str
    public: bool


@dataclass(frozen=True)
class NetworkPlan:
    """The VPC the stack creates, or the existing subnets it uses (then ``create_vpc`` is False)."""

    create_vpc: bool
    vpc_cidr: str
    zones: list[str]
    public: list[SubnetPlan] = field(default_factory=list)
    private: list[SubnetPlan] = field(default_factory=list)
    nat_gateways: int = 0
    existing_private_subnet_ids: list[str] = field(default_factory=list)
    existing_public_subnet_ids: list[str] = field(default_factory=list)
    existing_vpc_id: str | None = None

    def nat_zone(self, index: int) -> int:
        """Which NAT gateway the private subnet of zone ``index`` routes through."""
        return index if self.nat_gateways > 1 else 0


def network_plan(spec: PlatformSpec) -> NetworkPlan:
    """Private subnets take three of the VPC's four quarters (pods get VPC addresses); public ones share the
    fourth in /(prefix+6) blocks: load balancers and NAT gateways need few addresses."""
    c = eks_section(spec)
    if c.existing_private_subnet_ids:
        return NetworkPlan(
            create_vpc=False,
            vpc_cidr="",
            zones=[],
            existing_private_subnet_ids=list(c.existing_private_subnet_ids),
            existing_public_subnet_ids=list(c.existing_public_subnet_ids),
            existing_vpc_id=c.existing_vpc_id,
        )
    vpc = ipaddress.IPv4Network(c.vpc_cidr, strict=False)
    names = zones(spec)
    quarters = list(vpc.subnets(prefixlen_diff=2))
    public_blocks = list(quarters[3].subnets(prefixlen_diff=4))
    return NetworkPlan(
        create_vpc=True,
        vpc_cidr=str(vpc),
        zones=names,
        public=[SubnetPlan(z, str(public_blocks[i]), True) for i, z in enumerate(names)],
        private=[SubnetPlan(z, str(quarters[i]), False) for i, z in enumerate(names)],
        nat_gateways=1 if c.single_nat_gateway else len(names),
    )


def subnet_tags(spec: PlatformSpec, public: bool) -> dict[str, str]:
    """Discovery tags: the AWS Load Balancer Controller finds subnets by role; Karpenter by discovery tag."""
    out = {f"kubernetes.io/cluster/{spec.cluster_name}": "shared"}
    if public:
        out["kubernetes.io/role/elb"] = "1"
    else:
        out["kubernetes.io/role/internal-elb"] = "1"
        out["karpenter.sh/discovery"] = spec.cluster_name
    return out


def karpenter_launch(spec: PlatformSpec, tags: dict[str, str]) -> NodeLaunch:
    """How Karpenter launches GPU nodes: with the node role, into the private subnets (found by the discovery
    tag the stack puts on the ones it creates, else by id), in the cluster's security group, IMDSv2 one hop."""
    net = network_plan(spec)
    if net.create_vpc:
        subnets: list[dict[str, Any]] = [{"tags": {"karpenter.sh/discovery": spec.cluster_name}}]
    else:
        subnets = [{"id": s} for s in net.existing_private_subnet_ids]
    return NodeLaunch(
        role=node_role_name(spec),
        subnets=subnets,
        # EKS tags the cluster security group it creates with the cluster name.
        security_groups=[{"tags": {"aws:eks:cluster-name": spec.cluster_name}}],
        imds_hop_limit=IMDS_HOP_LIMIT,
        root_device=ROOT_DEVICE,
        tags=tags,
        ami_version=eks_section(spec).karpenter_ami_version,
    )


def eks_taint(taint: nodes.Taint) -> dict[str, str]:
    """A taint in the EKS API's shape and spelling (``NO_SCHEDULE``)."""
    out = {"key": taint.key, "effect": EKS_TAINT_EFFECT[taint.effect]}
    if taint.value is not None:
        out["value"] = taint.value
    return out


@dataclass(frozen=True)
class NodeGroupPlan:
    """One managed node group: what ``aws.eks.NodeGroup`` and its launch template get."""

    pool: str
    node_group_name: str
    instance_types: list[str]
    ami_type: str
    capacity_type: str
    min_size: int
    desired_size: int
    max_size: int
    disk: RootDisk
    labels: dict[str, str]
    taints: list[nodes.Taint]
    user_data: str | None = None
    """EC2 user data (plain text; base64 when registered): readies the node-level model cache."""
    reservation: CapacityReservationSpec | None = None
    """The capacity reservation its launch template targets (then it launches only in the reservation's zone)."""
    priority: int = 0
    """The Cluster Autoscaler's priority expander tries higher first (a pool's reservation before the rest)."""
    efa_interfaces: int = 0
    """EFA network interfaces in its launch template, one per network card (0: the default interface only)."""
    placement_group: bool = False
    """Its nodes launch into one cluster placement group, so into one zone (``zone``)."""
    zone: str | None = None
    """The one zone of a placement group's nodes."""

    @property
    def zones(self) -> list[str] | None:
        """The zones its subnets are in; None: every private subnet of the stack."""
        if self.reservation is not None:
            return [self.reservation.availability_zone]
        return [self.zone] if self.zone is not None else None


AUTOSCALER_GPU_LABEL = "k8s.amazonaws.com/accelerator"
"""The Cluster Autoscaler's GPU label on AWS (kubernetes/autoscaler cluster-autoscaler-1.32.0, the app of chart
9.46.6: cloudprovider/aws/aws_cloud_provider.go ``GPULabel``). A node carrying it counts as a GPU node whose GPUs
have not registered yet (utils/gpu/gpu.go ``NodeHasGpu``), so the autoscaler waits for the device plugin instead
of adding a second node for the same pending engine (cloudprovider/aws/README.md, 'Special note on GPU
instances': label the node before it joins)."""
AUTOSCALER_GPU_TYPES: dict[str, str] = {
    "T4": "nvidia-tesla-t4",
    "A10G": "nvidia-a10g",
    "L4": "nvidia-l4",
    "L40S": "nvidia-l40s",
    "A100-40GB": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-tesla-a100",
    "H100": "nvidia-h100",
    "H200": "nvidia-h200",
    "B200": "nvidia-b200",
}
"""The label's value per catalog GPU: the spelling of the autoscaler's availableGPUTypes (same file) where it lists
the GPU; H100, H200 and B200 are not listed there, so its metrics call them unknown (the label's presence is
what the wait reads)."""


def autoscaler_gpu_type(pool: PoolPlan) -> str:
    """The GPU type of every node the pool launches; a pool whose fallbacks carry another GPU names each, sorted
    (its nodes are one of them: which, only the launched node knows)."""
    return "_".join(sorted({AUTOSCALER_GPU_TYPES[i.gpu_spec.name] for i in pool.instance_types}))


def gpu_node_labels(pool: PoolPlan) -> dict[str, str]:
    """A managed node group's labels: every GPU node's (``components.core.nodes``) and the Cluster Autoscaler's GPU
    label (Karpenter's NodePools do not carry it: Karpenter knows an instance type's GPUs from EC2 and launches
    for the pending pods it sees, with no template node to wait on)."""
    return {**nodes.gpu_node_labels(pool), AUTOSCALER_GPU_LABEL: autoscaler_gpu_type(pool)}


def node_role_name(spec: PlatformSpec) -> str:
    """A fixed name (Karpenter's node classes name the role): IAM is global, so the region is part of it."""
    return f"{spec.cluster_name}-{eks_section(spec).region}-node"[:64]


def node_group_name(spec: PlatformSpec, pool: str) -> str:
    return f"{spec.cluster_name}-{pool}"[:63]


RESERVED_PRIORITY = 20
POOL_PRIORITY = 10


def gpu_node_group(spec: PlatformSpec, pool: PoolPlan) -> NodeGroupPlan:
    """A GPU pool's node group, from the placement's plan (instance, bounds from replicas x GPUs, disk), with the
    pool's fallback instance types after its own, in the order EC2's prioritized allocation tries them."""
    fallbacks = pool_spec(spec, pool.name).fallback_instance_types
    # A cluster placement group lives in one zone: the pool's nodes launch in the first of the stack's.
    zone = zones(spec)[0] if pool.placement_group else None
    return NodeGroupPlan(
        pool=pool.name,
        node_group_name=node_group_name(spec, pool.name),
        instance_types=[pool.instance.name, *fallbacks],
        ami_type=GPU_AMI_TYPE,
        capacity_type=EKS_CAPACITY_TYPE[pool.capacity_type],
        min_size=pool.min_nodes,
        desired_size=pool.min_nodes,
        # EKS needs max >= 1 even for a pool that idles at zero.
        max_size=max(pool.max_nodes, 1),
        disk=RootDisk(pool.root_disk_gib, GPU_DISK_IOPS, GPU_DISK_THROUGHPUT_MIBPS),
        labels=gpu_node_labels(pool),
        taints=[nodes.gpu_taint()],
        user_data=weights.pool_user_data(pool),
        priority=POOL_PRIORITY,
        efa_interfaces=pool.efa_interfaces,
        placement_group=pool.placement_group,
        zone=zone,
    )


def pool_spec(spec: PlatformSpec, name: str) -> GpuPoolSpec:
    found = spec.pool(name)
    if found is None:  # a layout's pools come from the spec's
        raise ValueError(f"no gpu_pools entry named {name!r}")
    return found


def reserved_node_group(spec: PlatformSpec, pool: PoolPlan) -> NodeGroupPlan | None:
    """The node group in the pool's capacity reservation, tried first; it starts empty (a Capacity Block may not
    have begun) and the autoscaler fills it, up to the pool's max."""
    reservation = pool_spec(spec, pool.name).capacity_reservation
    if reservation is None:
        return None
    own = gpu_node_group(spec, pool)
    return NodeGroupPlan(
        pool=pool.name,
        node_group_name=node_group_name(spec, f"{pool.name}-{RESERVED_SUFFIX}"),
        instance_types=[pool.instance.name],
        ami_type=GPU_AMI_TYPE,
        capacity_type=EKS_RESERVATION_CAPACITY_TYPE[reservation.kind],
        min_size=0,
        desired_size=0,
        max_size=own.max_size,
        disk=own.disk,
        labels=own.labels,
        taints=own.taints,
        user_data=own.user_data,
        reservation=reservation,
        priority=RESERVED_PRIORITY,
        efa_interfaces=own.efa_interfaces,
        placement_group=own.placement_group,
    )


def gpu_node_groups(spec: PlatformSpec, pool: PoolPlan) -> list[NodeGroupPlan]:
    """A pool's node groups, in the order the autoscaler tries them."""
    reserved = reserved_node_group(spec, pool)
    return [*([reserved] if reserved else []), gpu_node_group(spec, pool)]


def autoscaler_priorities(groups: list[NodeGroupPlan]) -> dict[int, list[str]]:
    """The priority expander's table: priority -> node group (Auto Scaling group) name patterns, when a pool has a
    reservation to try first. EKS names a managed node group's Auto Scaling group
    'eks-<node group name>-<uuid>'; everything else ranks last."""
    if not any(g.reservation for g in groups):
        return {}  # one group per pool: nothing to order
    table: dict[int, list[str]] = {0: [".*"]}
    for group in groups:
        if group.priority:
            pattern = f"^eks-{group.node_group_name}-[0-9a-f]{{8}}(-[0-9a-f]{{4}}){{3}}-[0-9a-f]{{12}}$"
            table.setdefault(group.priority, []).append(pattern)
    return dict(sorted(table.items(), reverse=True))


def system_root_disk_gib(spec: PlatformSpec) -> int:
    """Each system node's root disk: its own use, and room for every store Job of the stack at once (they run on
    the untainted nodes, created together on the first `pulumi up`, each requesting its staging as
    ephemeral-storage: ``weights.staging_disks``), grown by the kubelet's eviction margin and reservation, in
    10 GiB steps. Sized for all of them so a single system node still runs them all before their deadlines."""
    jobs = sum(weights.staging_disks(spec).values())
    allocatable = (jobs + KUBE_RESERVED_EPHEMERAL_GIB) / (1 - NODEFS_EVICTION_FRACTION) if jobs else 0
    return SYSTEM_ROOT_DISK_GIB + math.ceil(allocatable / DISK_STEP_GIB) * DISK_STEP_GIB


def system_node_group(spec: PlatformSpec) -> NodeGroupPlan:
    """CPU nodes for the gateway, monitoring, CoreDNS and controllers; untainted."""
    n = eks_section(spec).system_nodes
    return NodeGroupPlan(
        pool=SYSTEM_POOL,
        node_group_name=node_group_name(spec, SYSTEM_POOL),
        instance_types=[prices.SYSTEM_INSTANCE_TYPE],
        ami_type=SYSTEM_AMI_TYPE,
        capacity_type="ON_DEMAND",
        min_size=n,
        desired_size=n,
        max_size=2 * n,
        disk=RootDisk(
            system_root_disk_gib(spec),
            prices.EBS_GP3_BASELINE_IOPS,
            prices.EBS_GP3_BASELINE_THROUGHPUT_MIBPS,
        ),
        labels={nodes.ROLE_LABEL: nodes.SYSTEM_ROLE},
        taints=[],
    )


# EFA (docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): the primary interface is network card 0,
# device index 0; each further card carries one EFA at device index 1. Every interface type is "efa" (EFA with ENA),
# as eksctl's efaEnabled node groups have them.
EFA_INTERFACE_TYPE = "efa"


@dataclass(frozen=True)
class EfaInterface:
    network_card_index: int
    device_index: int
    interface_type: str = EFA_INTERFACE_TYPE


def efa_interfaces(count: int) -> list[EfaInterface]:
    """The launch template's network interfaces of a node with ``count`` EFA interfaces (none when 0)."""
    return [EfaInterface(card, 0 if card == 0 else 1) for card in range(count)]


def efa_security_group_name(spec: PlatformSpec) -> str:
    return f"{spec.cluster_name}-efa"


def placement_group_name(spec: PlatformSpec, pool: str) -> str:
    return f"{spec.cluster_name}-{pool}"[:255]


def node_groups(spec: PlatformSpec, layout: Layout) -> list[NodeGroupPlan]:
    """The system group first, then each GPU pool's in stack-file order."""
    return [system_node_group(spec), *(g for p in layout.pools.values() for g in gpu_node_groups(spec, p))]
