"""The cluster section: where the platform runs, its network and how `pulumi up` reaches the API server."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from components.core.enums import NodeProvisioner
from components.spec.base import AwsAccount, DnsLabel, Ipv4Cidr, _all_match, _Spec

# Retention periods CloudWatch Logs accepts, in days.
_RETENTION = "1 3 5 7 14 30 60 90 120 150 180 365 400 545 731 1096 1827 2192 2557 2922 3288 3653"
CLOUDWATCH_RETENTION_DAYS = tuple(int(d) for d in _RETENTION.split())


class ApiAccess(StrEnum):
    PRIVATE = "private"
    PUBLIC = "public"


ANYWHERE_IPV4 = "0.0.0.0/0"


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


class ClusterSpec(_Spec):
    """Where the platform runs."""

    name: str | None = None
    """Cluster name; defaults to '<platform name>-<environment>'."""
    region: str = "us-east-1"
    """AWS region (target eks); also the region prices are read for."""
    kubernetes_version: Annotated[str, Field(pattern=r"^1\.(2[5-9]|3[0-7])$")] = "1.33"
    """Kubernetes minor version, e.g. '1.33'; manifests are validated against it."""
    namespace: DnsLabel = "inferstack"
    """Namespace for engines and the gateway."""
    api_endpoint: ApiEndpointSpec | None = None
    """How `pulumi up` and kubectl reach the EKS API server (target eks, where it is required): private, from
    inside the VPC, or public to listed addresses. Nodes always use the private endpoint."""
    vpc_cidr: str = "10.0.0.0/16"
    """IPv4 range of the VPC the stack creates (target eks), /16 to /20: three quarters go to private subnets."""
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
    """CPU nodes (catalog SYSTEM_INSTANCE_TYPE) for the gateway and monitoring; the group may grow to twice this."""
    control_plane_log_retention_days: int = 90
    """Days CloudWatch keeps the EKS control-plane logs (a CloudWatch retention value: 1, 3, 5, 7, 14, 30, 60,
    90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653)."""
    model_bucket: str | None = None
    """Name of the S3 bucket the stack creates for the model store (target eks); defaults to
    '<cluster>-<region>-models' (bucket names are global: set another if that one is taken)."""
    account_id: AwsAccount | None = None
    """AWS account the stack deploys into (12 digits, target eks): pulumi up refuses the credentials of any other
    account, and the model store must belong to it."""
    node_provisioner: NodeProvisioner = NodeProvisioner.MANAGED
    """GPU nodes from 'managed' EKS node groups (one per pool, min/max nodes from the models), or from
    'karpenter' NodePools (nodes of the pool's type launched for pending engines, up to the pool's GPUs)."""
    karpenter_ami_version: str = "v20250620"
    """The EKS-optimized AL2023 AMI release Karpenter launches GPU nodes from ('v20250620' is
    amazon-eks-node-al2023-x86_64-nvidia-1.33-v20250620), with node_provisioner karpenter. Pinned like a chart
    version: a new AMI reaches nodes when you change it here, never by drift."""

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

    @field_validator("model_bucket")
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
    def _network(self) -> ClusterSpec:
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
        return self
