"""The cluster section, one per target: what every cluster has, and each target's own fields and facts.

``target`` chooses the section (``SECTIONS``): ``EksClusterSpec`` holds the AWS fields (region, network, API
endpoint access, node provisioning, log retention), a cluster you bring (``KubernetesClusterSpec``) and this
machine (``LocalClusterSpec``) only the common ones. A field of another target's section is refused, naming the
field and the target (``parse``). The stack file is unchanged: the fields sit under ``cluster`` as before.

Each section also answers the questions pure code asks about its target without a profile in hand (validation
and placement are called with the spec alone): whether the stack launches the GPU nodes, where the model store's
bucket is, what the target's own rules find. The base class answers for a cluster the stack finds and does not
create; the EKS section answers for what the stack creates on AWS.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from components.base.enums import NodeProvisioner, Target
from components.base.problems import Problem
from components.spec.base import MAX_EKS_CLUSTER_NAME, AwsAccount, DnsLabel, Ipv4Cidr, _all_match, _Spec

if TYPE_CHECKING:
    from components.spec.platform import PlatformSpec

# Retention periods CloudWatch Logs accepts, in days.
_RETENTION = "1 3 5 7 14 30 60 90 120 150 180 365 400 545 731 1096 1827 2192 2557 2922 3288 3653"
CLOUDWATCH_RETENTION_DAYS = tuple(int(d) for d in _RETENTION.split())


class ApiAccess(StrEnum):
    PRIVATE = "private"
    PUBLIC = "public"


ANYWHERE_IPV4 = "0.0.0.0/0"

EKS_SERVICE_CIDR = "172.20.0.0/16"
"""The Service range a stack's EKS cluster gets unless cluster.service_cidr says otherwise: the one EKS itself
picks for a VPC in 10.0.0.0/8 (the default vpc_cidr's), so pinning it replaces no existing cluster."""
EKS_SERVICE_CIDR_ALTERNATIVE = "10.100.0.0/16"
"""EKS's other default Service range: the one to suggest when a VPC overlaps ``EKS_SERVICE_CIDR``."""
_SERVICE_CIDR_PRIVATE = tuple(
    ipaddress.IPv4Network(c) for c in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)


def kubernetes_service_ip(service_cidr: str) -> str:
    """The address pods dial for the Kubernetes API: the ``kubernetes`` Service's ClusterIP, which the API server
    takes as the first address of its Service range (kubernetes/kubernetes pkg/controlplane/services.go,
    ``ServiceIPRange``: ``GetIndexedIP(&serviceClusterIPRange, 1)``): 172.20.0.1 for 172.20.0.0/16."""
    return str(ipaddress.IPv4Network(service_cidr)[1])


class ApiEndpointSpec(_Spec):
    """How `pulumi up` reaches the EKS API server: the Kubernetes provider applies every manifest through it."""

    access: ApiAccess
    """private: the API answers only inside the VPC and networks connected to it, so `pulumi up` runs there (a CI
    runner in the VPC, or over a VPN), from deployer_cidrs or deployer_security_group_ids; the VPC must exist before
    the first `pulumi up` (existing_vpc_id). public: it also answers on the internet, to public_cidrs only."""
    public_cidrs: list[Ipv4Cidr] = Field(default_factory=list)
    """access public: the IPv4 ranges that may reach the public endpoint (your CI runners' egress addresses, an
    office range); '0.0.0.0/0' is the whole internet, which the policy pack refuses in production."""
    deployer_cidrs: list[Ipv4Cidr] = Field(default_factory=list)
    """access private: IPv4 ranges inside the VPC or a network connected to it (a CI runner's subnet, a VPN's client
    range) where `pulumi up` and kubectl run; the API's security group admits HTTPS from them."""
    deployer_security_group_ids: list[str] = Field(default_factory=list)
    """access private: security groups of the machines in the VPC that run `pulumi up` (a CI runner's, a
    bastion's); the API's security group admits HTTPS from them."""

    @field_validator("deployer_security_group_ids")
    @classmethod
    def _security_groups(cls, value: list[str]) -> list[str]:
        return _all_match(
            value, r"sg-[0-9a-f]{8}([0-9a-f]{9})?", "a security group id", "e.g. 'sg-0123456789abcdef0'"
        )

    @model_validator(mode="after")
    def _a_way_in(self) -> ApiEndpointSpec:
        deployers = self.deployer_cidrs or self.deployer_security_group_ids
        if self.access is ApiAccess.PUBLIC:
            if not self.public_cidrs:
                raise ValueError(
                    "access public needs public_cidrs: the addresses `pulumi up` and kubectl come from (e.g. your CI "
                    f"runners' egress, ['203.0.113.0/28']); '{ANYWHERE_IPV4}' opens the API to the whole internet"
                )
            if deployers:
                raise ValueError(
                    "deployer_cidrs and deployer_security_group_ids reach a private endpoint: with access public, "
                    "list the deployers' public addresses in public_cidrs instead"
                )
        elif not deployers:
            raise ValueError(
                "access private needs a stated way in: deployer_cidrs (e.g. your CI runner's subnet or VPN range) or "
                "deployer_security_group_ids (the runner's security group), inside the VPC or a network connected to it"
            )
        elif self.public_cidrs:
            raise ValueError("public_cidrs limit a public endpoint: set access: public or drop them")
        return self


_OLD_ENDPOINT_FIELDS = frozenset({"endpoint_public_access", "api_public_cidrs"})


def _endpoint_migration(old: dict[str, Any]) -> str:
    """The api_endpoint block that keeps what the old endpoint fields said, as one line of advice."""
    cidrs = old.get("api_public_cidrs") or []
    if old.get("endpoint_public_access"):
        listed = ", ".join(map(str, cidrs)) if cidrs else ANYWHERE_IPV4
        return (
            "endpoint_public_access and api_public_cidrs were replaced by api_endpoint; write "
            f"`api_endpoint: {{access: public, public_cidrs: [{listed}]}}`"
            + ("" if cidrs else f" ({ANYWHERE_IPV4} is what no api_public_cidrs meant; narrow it)")
        )
    return (
        "endpoint_public_access and api_public_cidrs were replaced by api_endpoint; for a private endpoint write "
        "`api_endpoint: {access: private, deployer_cidrs: [<where pulumi up runs in the VPC>]}` (with existing_vpc_id), "
        "or `api_endpoint: {access: public, public_cidrs: [<your CI egress>]}`"
    )


class ClusterSpecBase(_Spec):
    """What every cluster has: its name, Kubernetes version and namespace. As a target's section, a cluster the
    stack finds and does not create (its facts below answer so)."""

    name: str | None = None
    """Cluster name; defaults to '<platform name>-<environment>'."""
    kubernetes_version: Annotated[str, Field(pattern=r"^1\.(2[5-9]|3[0-7])$")] = "1.33"
    """Kubernetes minor version, e.g. '1.33'; manifests are validated against it."""
    namespace: DnsLabel = "inferstack"
    """Namespace for engines and the gateway."""
    account_id: AwsAccount | None = None
    """AWS account the stack deploys into (12 digits): on eks pulumi up refuses the credentials of any other
    account; the model store must belong to it."""

    launches_nodes: ClassVar[bool] = False
    """The stack launches the GPU nodes (node groups, Karpenter), so it decides where they come from: capacity
    reservations and fallback instance types (``components.core.capacity``). False: the cluster's nodes are yours."""
    on_this_machine: ClassVar[bool] = False
    """No cluster: ``make local`` runs the data plane here (engines on the CPU, weights and tokenizers from local
    paths, no Pulumi program, one version per model). False: a cluster that pulls from the hub or a store."""

    def model_store_bucket(self, spec: PlatformSpec) -> str | None:
        """The model store's bucket: an existing one the stack file names (model_store.bucket)."""
        return spec.model_store.bucket

    @property
    def store_region(self) -> str | None:
        """The region the model store's clients name (AWS_REGION); None: the store's endpoint decides."""
        return None

    def platform_problems(self, spec: PlatformSpec) -> Iterator[Problem]:
        """The target's own rules across sections (``components.spec.rules``); none here."""
        return iter(())

    def api_endpoint_problems(self) -> list[Problem]:
        """How `pulumi up` reaches the API server, when the stack says (``components.core.endpoint``); a cluster
        the stack finds is reached through the kubeconfig."""
        return []

    def api_endpoint_note(self) -> str | None:
        return None

    @property
    def service_range(self) -> str | None:
        """The cluster's Kubernetes Service range, where the section knows it; None: not known."""
        return None

    @property
    def api_service_ip(self) -> str | None:
        """The ``kubernetes`` Service's ClusterIP, where the Service range is known; None: not known (the
        NetworkPolicies then admit the API in the private ranges: ``components.render.flows``)."""
        return kubernetes_service_ip(self.service_range) if self.service_range else None

    def reservation_zone_problem(self, zone: str) -> str | None:
        """Why the stack cannot launch a pool's reserved capacity in ``zone`` (``components.core.capacity``)."""
        return None

    def multi_node_problem(self, pool: str) -> Problem | None:
        """Why the target cannot link the nodes of a pool whose replicas span nodes (EFA, placement group)."""
        return None

    def placement_group_problem(self) -> str | None:
        """Why the target cannot keep a pool's nodes in one cluster placement group."""
        return None


class KubernetesClusterSpec(ClusterSpecBase):
    """target kubernetes: a cluster you bring, reached through the kubeconfig; the stack creates no cloud
    resources, so it has nothing of a cloud to say."""

    service_cidr: Ipv4Cidr | None = None
    """The cluster's Service range (kube-apiserver's --service-cluster-ip-range: kubeadm's default is 10.96.0.0/12,
    kind's 10.96.0.0/16, k3s's 10.43.0.0/16): the NetworkPolicies let the router, health monitor and batcher reach the API
    at its first address, the ``kubernetes`` Service's, on 443. Unset: they admit the API anywhere in the private
    ranges on 443 and 6443, which holds only while the Service range is private (the plan says so)."""

    @property
    def service_range(self) -> str | None:
        return self.service_cidr

    def api_endpoint_note(self) -> str | None:
        """How pods reach the API: through the ``kubernetes`` Service, whose range only the stack file can say."""
        if self.service_cidr:
            return (
                f"Kubernetes API from pods: the `kubernetes` Service at {self.api_service_ip} (cluster.service_cidr "
                f"{self.service_cidr}) on 443, and the private ranges on 443 and 6443 behind it"
            )
        return (
            "Kubernetes API from pods: the NetworkPolicies assume the `kubernetes` Service's ClusterIP is in a "
            "private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16) and admit those on 443 and 6443; set "
            "cluster.service_cidr to your cluster's Service range if it is elsewhere (a CNI that checks policy "
            "before translating a Service address blocks the API otherwise)"
        )


LOCAL_BUCKET = "inferstack-local"
"""The loopback store of `make local S3=1`."""


class LocalClusterSpec(ClusterSpecBase):
    """target local: no cluster; `make local` runs the data plane on this machine."""

    on_this_machine: ClassVar[bool] = True

    def model_store_bucket(self, spec: PlatformSpec) -> str:
        """`make local S3=1`'s loopback store."""
        return LOCAL_BUCKET


class EksClusterSpec(ClusterSpecBase):
    """target eks: the EKS cluster the stack creates, its network and how `pulumi up` reaches its API server."""

    region: str = "us-east-1"
    """AWS region of the cluster and everything the stack creates."""
    api_endpoint: ApiEndpointSpec | None = None
    """How `pulumi up` and kubectl reach the EKS API server (required): private, from inside the VPC, or public to
    listed addresses. Nodes always use the private endpoint."""
    vpc_cidr: str = "10.0.0.0/16"
    """IPv4 range of the VPC the stack creates, /16 to /20: three quarters go to private subnets."""
    service_cidr: Ipv4Cidr = EKS_SERVICE_CIDR
    """The cluster's Kubernetes Service range (EKS's kubernetesNetworkConfig.serviceIpv4Cidr), pinned when the
    cluster is created and fixed for its life: a private /12 to /24 outside the VPC (EKS's rules). Pods reach the
    API at its first address, the ``kubernetes`` Service's (172.20.0.1 for the default), and the NetworkPolicies
    admit exactly that: vpc-cni checks a pod's egress before the Service address is translated."""
    availability_zones: list[str] = Field(default_factory=list)
    """Zones for subnets and nodes (2-4, e.g. ['us-east-1a', 'us-east-1b']); defaults to three of the region's."""
    existing_private_subnet_ids: list[str] = Field(default_factory=list)
    """Use these private subnets (in at least two zones, with NAT egress) instead of creating a VPC."""
    existing_public_subnet_ids: list[str] = Field(default_factory=list)
    """Public subnets for internet-facing load balancers, used with existing_private_subnet_ids."""
    existing_vpc_id: str | None = None
    """The VPC of existing_private_subnet_ids (the AWS Load Balancer Controller is told it; pods reach no IMDS)."""
    single_nat_gateway: bool = False
    """One NAT gateway for every zone (cheaper, not zone-redundant); the default is one per zone."""
    admin_role_arns: list[str] = Field(default_factory=list)
    """IAM roles granted cluster-admin by EKS access entries (the identity running pulumi up is admin already)."""
    system_nodes: Annotated[int, Field(ge=1, le=50)] = 2
    """CPU nodes (components.clouds.aws.prices.SYSTEM_INSTANCE_TYPE) for the gateway and monitoring; the group
    may grow to twice this."""
    control_plane_log_retention_days: int = 90
    """Days CloudWatch keeps the EKS control-plane logs (a CloudWatch retention value: 1, 3, 5, 7, 14, 30, 60,
    90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653)."""
    model_bucket: str | None = None
    """Name of the S3 bucket the stack creates for the model store; defaults to '<cluster>-<region>-models'
    (bucket names are global: set another if that one is taken)."""
    batch_bucket: str | None = None
    """Name of the S3 bucket the stack creates for the batch service's files (batch.enabled), with a KMS key of
    its own: tenants' batch inputs and outputs never share the model bucket, which engines read. Defaults to
    '<cluster>-<region>-batches'; it must differ from the model bucket."""
    node_provisioner: NodeProvisioner = NodeProvisioner.MANAGED
    """GPU nodes from 'managed' EKS node groups (one per pool, min/max nodes from the models), or from
    'karpenter' NodePools (nodes of the pool's type launched for pending engines, up to the pool's GPUs)."""
    karpenter_ami_version: str = "v20250620"
    """The EKS-optimized AL2023 AMI release Karpenter launches GPU nodes from ('v20250620' is
    amazon-eks-node-al2023-x86_64-nvidia-1.33-v20250620), with node_provisioner karpenter. Pinned like a chart
    version: a new AMI reaches nodes when you change it here, never by drift."""

    launches_nodes: ClassVar[bool] = True
    """EKS node groups (the Cluster Autoscaler's priority expander tries a reservation's group first, EC2's
    prioritized allocation the fallbacks in order) or Karpenter NodePools."""

    def model_store_bucket(self, spec: PlatformSpec) -> str:
        """The bucket the stack creates: cluster.model_bucket, or '<cluster>-<region>-models'."""
        return self.model_bucket or f"{spec.cluster_name}-{self.region}-models"

    def batch_files_bucket(self, spec: PlatformSpec) -> str:
        """The batch service's bucket the stack creates: cluster.batch_bucket, or '<cluster>-<region>-batches'."""
        return self.batch_bucket or f"{spec.cluster_name}-{self.region}-batches"

    @property
    def store_region(self) -> str:
        """The cluster's: EKS Pod Identity gives the credentials, the region says where the bucket is."""
        return self.region

    def platform_problems(self, spec: PlatformSpec) -> Iterator[Problem]:
        """The batch service's files and the model store are two buckets; AWS names derive from the cluster's."""
        if spec.batch.enabled and self.batch_files_bucket(spec) == self.model_store_bucket(spec):
            yield Problem(
                "cluster.batch_bucket",
                f"{self.batch_files_bucket(spec)!r} is also the model bucket: engines read the model bucket, and "
                "tenants' batch files must not be in it; name two different buckets (cluster.batch_bucket and "
                "cluster.model_bucket)",
            )
        # IAM role names (64 characters) are the cluster name, a job suffix and Pulumi's random suffix.
        if len(spec.cluster_name) > MAX_EKS_CLUSTER_NAME:
            yield Problem(
                "cluster.name",
                f"{spec.cluster_name!r} is {len(spec.cluster_name)} characters; AWS names derived from it allow at "
                f"most {MAX_EKS_CLUSTER_NAME}: set a shorter cluster.name",
            )

    def api_endpoint_problems(self) -> list[Problem]:
        """The way in must be stated, and a private one must lead into a VPC that already exists."""
        endpoint = self.api_endpoint
        if endpoint is None:
            return [
                Problem(
                    "cluster.api_endpoint",
                    "say how `pulumi up` reaches the EKS API: `{access: public, public_cidrs: [<your CI egress>]}`, "
                    "or `{access: private, deployer_cidrs: [...]}` from inside an existing VPC",
                )
            ]
        if endpoint.access is ApiAccess.PRIVATE and not self.existing_vpc_id:
            return [
                Problem(
                    "cluster.api_endpoint.access",
                    "a private endpoint answers only inside its VPC, and this stack creates that VPC, so nothing can "
                    "reach the API on the first `pulumi up`: bring the VPC your runner or VPN is in (existing_vpc_id, "
                    "existing_private_subnet_ids), or use access: public with public_cidrs",
                )
            ]
        return []

    def api_endpoint_note(self) -> str | None:
        """Where `pulumi up` must run from."""
        endpoint = self.api_endpoint
        if endpoint is None:
            return None
        if endpoint.access is ApiAccess.PUBLIC:
            return (
                f"API endpoint: public to {', '.join(endpoint.public_cidrs)} only (and private for the nodes): run "
                "`pulumi up` from there"
            )
        sources = [*endpoint.deployer_cidrs, *endpoint.deployer_security_group_ids]
        return (
            f"API endpoint: private, in VPC {self.existing_vpc_id}; HTTPS from {', '.join(sources)}: run "
            "`pulumi up` there (a CI runner in the VPC, or over the VPN)"
        )

    @property
    def service_range(self) -> str:
        return self.service_cidr

    def reservation_zone_problem(self, zone: str) -> str | None:
        """The stack needs a subnet in the reservation's zone: one of the zones it creates subnets in."""
        if self.existing_private_subnet_ids:
            return (
                "with existing_private_subnet_ids the stack cannot tell which subnet is in the reservation's zone; "
                "reserve capacity in a stack that creates its VPC, or leave capacity_reservation out"
            )
        if zone not in self.availability_zones:
            zones = ", ".join(self.availability_zones) or "the default ones"
            return (
                f"{zone} is not one of the stack's zones ({zones}); list it in "
                "cluster.availability_zones so the stack has a subnet there"
            )
        return None

    def multi_node_problem(self, pool: str) -> Problem | None:
        """Karpenter's launch templates carry no EFA interfaces and no placement group; node groups' do."""
        if self.node_provisioner is not NodeProvisioner.KARPENTER:
            return None
        return Problem(
            "cluster.node_provisioner",
            f"pool {pool!r} runs a model across nodes, which needs EFA interfaces and a cluster placement "
            "group in its nodes' launch template: use node_provisioner managed (EKS node groups) for it",
        )

    def placement_group_problem(self) -> str | None:
        """A placement group is in one zone, and the zones of existing subnets are not known here."""
        if not self.existing_private_subnet_ids:
            return None
        return (
            "a cluster placement group keeps its nodes in one zone, and the zones of existing_private_subnet_ids "
            "are not known here; set placement_group: false, or let the stack create the VPC"
        )

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_cidr(cls, value: str) -> str:
        match = re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})/(\d{1,2})", value)
        if not match or any(int(octet) > 255 for octet in match.groups()[:4]):
            raise ValueError(f"{value!r} is not an IPv4 CIDR block; write e.g. '10.0.0.0/16'")
        if not 16 <= int(match.group(5)) <= 20:
            raise ValueError(
                f"{value!r}: use a /16 to /20 block (EKS pods take VPC addresses), e.g. '10.0.0.0/16'"
            )
        return value

    @field_validator("service_cidr")
    @classmethod
    def _service_cidr(cls, value: str) -> str:
        """EKS's rules for serviceIpv4Cidr (its API reference, KubernetesNetworkConfigRequest): a /12 to /24 in the
        private ranges."""
        network = ipaddress.IPv4Network(value)
        if not any(network.subnet_of(p) for p in _SERVICE_CIDR_PRIVATE):
            raise ValueError(
                f"{value!r}: EKS takes a Service range inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16, "
                f"e.g. '{EKS_SERVICE_CIDR}'"
            )
        if not 12 <= network.prefixlen <= 24:
            raise ValueError(f"{value!r}: EKS takes a /12 to /24 Service range, e.g. '{EKS_SERVICE_CIDR}'")
        return value

    @field_validator("karpenter_ami_version")
    @classmethod
    def _pinned_ami(cls, value: str) -> str:
        if not re.fullmatch(r"v\d{8}", value):
            raise ValueError(
                f"{value!r} is not an AMI release: pin one such as 'v20250620' (an amazon-eks-ami release); "
                "al2023@latest would replace every GPU node with each new AMI"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _replaced_endpoint_fields(cls, data: Any) -> Any:
        """The endpoint fields before api_endpoint: say exactly what to write instead."""
        if isinstance(data, dict) and _OLD_ENDPOINT_FIELDS & data.keys():
            raise ValueError(_endpoint_migration(data))
        return data

    @field_validator("existing_private_subnet_ids", "existing_public_subnet_ids")
    @classmethod
    def _subnet_ids(cls, value: list[str]) -> list[str]:
        return _all_match(value, r"subnet-[0-9a-f]{8,17}", "a subnet id", "e.g. 'subnet-0123456789abcdef0'")

    @field_validator("admin_role_arns")
    @classmethod
    def _role_arns(cls, value: list[str]) -> list[str]:
        arn = r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+"
        return _all_match(value, arn, "an IAM role ARN", "'arn:aws:iam::<account>:role/<name>'")

    @field_validator("control_plane_log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        allowed = CLOUDWATCH_RETENTION_DAYS
        if value not in allowed:
            nearest = min(allowed, key=lambda a: abs(a - value))
            raise ValueError(
                f"CloudWatch keeps logs for one of {', '.join(map(str, allowed))} days; use e.g. {nearest}"
            )
        return value

    @field_validator("model_bucket", "batch_bucket")
    @classmethod
    def _bucket(cls, value: str | None) -> str | None:
        if value is not None and (
            not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value) or ".." in value
        ):
            raise ValueError(
                f"{value!r} is not an S3 bucket name: 3-63 lowercase letters, digits, '.' and '-'"
            )
        return value

    @model_validator(mode="after")
    def _network(self) -> EksClusterSpec:
        zones = self.availability_zones
        if zones and not 2 <= len(zones) <= 4:
            raise ValueError(f"availability_zones: give 2 to 4 zones, not {len(zones)}")
        if len(set(zones)) != len(zones):
            raise ValueError("availability_zones: a zone is listed twice")
        foreign = [z for z in zones if not re.fullmatch(re.escape(self.region) + r"[a-z]", z)]
        if foreign:
            raise ValueError(
                f"availability_zones {foreign} are not zones of region {self.region} (e.g. '{self.region}a')"
            )
        if len(self.existing_private_subnet_ids) == 1:
            raise ValueError(
                "existing_private_subnet_ids: EKS needs subnets in at least two zones; list two or more"
            )
        if self.existing_public_subnet_ids and not self.existing_private_subnet_ids:
            raise ValueError(
                "existing_public_subnet_ids needs existing_private_subnet_ids (nodes run in private subnets)"
            )
        if bool(self.existing_private_subnet_ids) != bool(self.existing_vpc_id):
            raise ValueError(
                "existing_private_subnet_ids and existing_vpc_id go together: set both or neither"
            )
        if self.existing_vpc_id and not re.fullmatch(r"vpc-[0-9a-f]{8,17}", self.existing_vpc_id):
            raise ValueError(
                f"existing_vpc_id {self.existing_vpc_id!r} is not a VPC id; write e.g. 'vpc-0123456789abcdef0'"
            )
        service = ipaddress.IPv4Network(self.service_cidr)
        vpc = ipaddress.IPv4Network(self.vpc_cidr, strict=False)
        # An existing VPC's range is not known here: EKS refuses an overlap when it creates the cluster.
        if not self.existing_private_subnet_ids and service.overlaps(vpc):
            other = next(
                c
                for c in (EKS_SERVICE_CIDR, EKS_SERVICE_CIDR_ALTERNATIVE)
                if not ipaddress.IPv4Network(c).overlaps(vpc)
            )
            raise ValueError(
                f"service_cidr {self.service_cidr} overlaps vpc_cidr {self.vpc_cidr}: EKS refuses a Service range "
                f"inside the VPC, and a pod could not tell a Service from a node; set service_cidr to e.g. '{other}'"
            )
        return self


ClusterSpec = EksClusterSpec | KubernetesClusterSpec | LocalClusterSpec
"""The cluster section of a stack: the one ``SECTIONS`` names for its target."""

SECTIONS: dict[Target, type[ClusterSpecBase]] = {
    Target.EKS: EksClusterSpec,
    Target.KUBERNETES: KubernetesClusterSpec,
    Target.LOCAL: LocalClusterSpec,
}
"""Each target's cluster section. A target without an entry (one a test adds) reads the common fields only, as a
cluster the stack finds."""


def section_for(target: Target) -> type[ClusterSpecBase]:
    return SECTIONS.get(target, KubernetesClusterSpec)


def eks_section(spec: PlatformSpec) -> EksClusterSpec:
    """The EKS section of a stack of target eks (the AWS code's way to its fields)."""
    if not isinstance(spec.cluster, EksClusterSpec):
        raise TypeError(f"target {spec.target.value} has no EKS cluster section")
    return spec.cluster


def parse(target: Target, value: Any) -> ClusterSpecBase:
    """``value`` (the stack file's ``cluster``) as ``target``'s section. A key that only another target's section
    has is refused naming the field and both targets, an unknown key listing the section's keys; every other
    mistake as pydantic reports it, all at once."""
    section = section_for(target)
    if isinstance(value, section):
        return value
    if isinstance(value, ClusterSpecBase):  # the default, or another target's section: what it was given
        value = value.model_dump(exclude_unset=True)
    try:
        return section.model_validate(value)
    except ValidationError as err:
        raise ValidationError.from_exception_data(
            section.__name__, [_located(target, section, e) for e in err.errors()]
        ) from None


def _located(target: Target, section: type[ClusterSpecBase], error: Any) -> InitErrorDetails:
    """One of pydantic's errors as it was, but a top-level key the section does not have, said plainly."""
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden" and len(loc) == 1:
        key = str(loc[0])
        owners = [t.value for t, s in SECTIONS.items() if key in s.model_fields]
        message = (
            f"{key} is a field of target {' and '.join(owners)}; target {target.value} has no such field: remove it"
            if owners
            else f"unknown key {key!r}; known keys here: {', '.join(sorted(section.model_fields))}"
        )
        return InitErrorDetails(
            type=PydanticCustomError("value_error", message), loc=loc, input=error["input"]
        )
    return InitErrorDetails(type=error["type"], loc=loc, input=error["input"], ctx=error.get("ctx", {}))
