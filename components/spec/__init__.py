"""The platform spec: what a platform engineer writes in ``stacks/Pulumi.<env>.yaml``.

The one source of truth. Every knob is a documented field with a default and, where it has one, a unit
in its name. Structure and single-field rules live here (pydantic); rules that span sections live in
``components.spec.rules`` (all reported at once); rules that need the hardware catalog (fit, parallelism
against a node's GPUs, pool placement) live in ``components.placement``, which reports them with the same
field paths.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from enum import StrEnum
from functools import partial
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from components import catalog

# The spec's plain enums, re-exported: they live in components.enums so the CLI starts without pydantic.
from components.enums import CapacityType as CapacityType
from components.enums import Device as Device
from components.enums import DType as DType
from components.enums import KvCacheDType as KvCacheDType
from components.enums import NodeProvisioner as NodeProvisioner
from components.enums import Quantization as Quantization
from components.enums import Target as Target
from components.packing import MAX_TIME_SLICES, Mechanism, shared_memory_utilization
from runtime.config import (
    BuiltinScorerName,
    EngineKind,
    RouterSettings,
    StrategyName,
    Task,
    batches_field,
    reads_engine_events,
    routing_knobs_read,
    routing_scorers,
    strategy_field,
)
from runtime.defaults import DEFAULT_MAX_NUM_SEQS
from runtime.engines import ENGINES, facts

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
HUB_COMMIT = re.compile(r"^[0-9a-f]{40}$")
AWS_ACCOUNT = re.compile(r"^\d{12}$")
PINNED_IMAGE = re.compile(r"^[^\s@]+(@sha256:[0-9a-f]{64}|:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")
# Tags that move by convention; an image pinned to one of these is not pinned (the policy pack reuses this).
MOVING_TAGS = frozenset(
    {"latest", "main", "master", "stable", "edge", "nightly", "dev", "develop", "head", "canary"}
)
MAX_MODEL_NAME = 40  # leaves room for suffixes in 63-character Kubernetes names
MAX_EKS_CLUSTER_NAME = 40  # leaves room for suffixes in 64-character IAM role names


def is_local_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~"))


def is_hub_source(source: str) -> bool:
    """A Hugging Face repository id: not an S3 URI, not a local path (models, versions and adapters alike)."""
    return not source.startswith("s3://") and not is_local_path(source)


def hub_commit(revision: str) -> str:
    """A hub revision, which must be a commit: a branch or tag moves, and every replica must serve the same bytes."""
    if not HUB_COMMIT.match(revision):
        raise ValueError(
            f"{revision!r} is not a commit hash: pin the exact hub commit (40 hex digits, from the repository's "
            "commit history), never a branch or tag that moves"
        )
    return revision


HubCommit = Annotated[str, AfterValidator(hub_commit)]
"""The revision of a hub source (a model's, a version's, an adapter's): one rule for all three."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


AUTO = "auto"

DEFAULT_IMAGES: dict[EngineKind, str] = {
    EngineKind.VLLM: "vllm/vllm-openai:v0.32.0",
    EngineKind.SGLANG: "lmsysorg/sglang:v0.5.3-cu126",
    EngineKind.TRTLLM: "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
}
CPU_IMAGES: dict[EngineKind, str] = {
    EngineKind.VLLM: "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0",
}


def _dns_label(value: str) -> str:
    if not DNS_LABEL.match(value) or len(value) > MAX_MODEL_NAME:
        raise ValueError(
            f"{value!r} is not a DNS label: use lowercase letters, digits and '-', starting and ending "
            f"with a letter or digit, at most {MAX_MODEL_NAME} characters (e.g. 'llama-3-70b')"
        )
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]


def _pinned_image(value: str) -> str:
    last = value.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last and "@" not in value else ""
    if not PINNED_IMAGE.match(value) or tag.lower() in MOVING_TAGS:
        raise ValueError(
            f"image {value!r} is not pinned: give an immutable tag or a digest, "
            "e.g. 'vllm/vllm-openai:v0.32.0' or 'repo/image@sha256:<64 hex>' "
            f"(never a moving tag such as {', '.join(sorted(MOVING_TAGS)[:4])}, ...)"
        )
    return value


PinnedImage = Annotated[str, AfterValidator(_pinned_image)]


def _aws_account(value: str) -> str:
    if not AWS_ACCOUNT.match(value):
        raise ValueError(f"{value!r} is not an AWS account id; write its 12 digits, e.g. '123456789012'")
    return value


AwsAccount = Annotated[str, AfterValidator(_aws_account)]


# Retention periods CloudWatch Logs accepts, in days.
_RETENTION = "1 3 5 7 14 30 60 90 120 150 180 365 400 545 731 1096 1827 2192 2557 2922 3288 3653"
CLOUDWATCH_RETENTION_DAYS = tuple(int(d) for d in _RETENTION.split())


def _checked_cidr(value: str, *, ipv4_only: bool) -> str:
    try:
        (ipaddress.IPv4Network if ipv4_only else ipaddress.ip_network)(value)
    except ValueError:
        what, example = (
            ("an IPv4 CIDR block", "203.0.113.0/24") if ipv4_only else ("a CIDR block", "10.0.0.0/16")
        )
        raise ValueError(f"{value!r} is not {what}; write e.g. '{example}'") from None
    return value


def _all_match(values: list[str], pattern: str, what: str, example: str) -> list[str]:
    """``values`` when each matches ``pattern``; else one message listing those that do not."""
    bad = [v for v in values if not re.fullmatch(pattern, v)]
    if bad:
        raise ValueError(f"{', '.join(map(repr, bad))} not {what}; write {example}")
    return values


Cidr = Annotated[str, AfterValidator(partial(_checked_cidr, ipv4_only=False))]
Ipv4Cidr = Annotated[str, AfterValidator(partial(_checked_cidr, ipv4_only=True))]


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


class ReservationKind(StrEnum):
    CAPACITY_BLOCK = "capacity-block"
    ON_DEMAND = "on-demand"


CAPACITY_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
AVAILABILITY_ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


class CapacityReservationSpec(_Spec):
    """Reserved capacity a GPU pool launches into before anything else (target eks)."""

    id: str
    """The reservation's id, e.g. 'cr-0123456789abcdef0' (`aws ec2 describe-capacity-reservations`)."""
    kind: ReservationKind = ReservationKind.CAPACITY_BLOCK
    """capacity-block (EC2 Capacity Blocks for ML: nodes only while its window is active) or on-demand (an On-Demand
    Capacity Reservation)."""
    availability_zone: str
    """The reservation's zone, e.g. 'us-east-1a': its nodes launch only there, so list it in
    cluster.availability_zones too."""

    @field_validator("id")
    @classmethod
    def _reservation_id(cls, value: str) -> str:
        if not CAPACITY_RESERVATION_ID.match(value):
            raise ValueError(
                f"{value!r} is not a capacity reservation id; write 'cr-' and 17 hex digits, e.g. "
                "'cr-0123456789abcdef0'"
            )
        return value

    @field_validator("availability_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not AVAILABILITY_ZONE.match(value):
            raise ValueError(f"{value!r} is not an availability zone; write e.g. 'us-east-1a'")
        return value


GpuSharing = Mechanism
"""How a pool's GPUs are shared between engines: none, time-slicing or mig (``components.packing``)."""


class GpuPoolSpec(_Spec):
    """A group of identical GPU nodes that engines are placed on."""

    name: DnsLabel
    """Pool name, referenced by models' `pool`."""
    instance_type: str = AUTO
    """AWS instance type (e.g. 'p5.48xlarge'), or 'auto' for the cheapest type that fits its models."""
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    """on-demand or spot."""
    min_nodes: Annotated[int, Field(ge=0)] = 0
    """Nodes kept even when no engine needs them."""
    max_nodes: Annotated[int, Field(ge=1)] | None = None
    """Upper bound on nodes; defaults to what the models' max replicas need."""
    root_disk_gib: Annotated[int, Field(ge=20, le=16_384)] | None = None
    """Root volume per node; defaults to images plus, where the node cache has no local NVMe, one copy of the
    weights of each of the pool's models that use it."""
    model_cache_gib: Annotated[int, Field(ge=1)] | None = None
    """Node-level model cache per node (one copy of each model's weights, shared by every replica on the node);
    defaults to those weights plus 10%. Must fit the instance's local NVMe where the cache is on it."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra node labels."""
    capacity_reservation: CapacityReservationSpec | None = None
    """Reserved capacity for instance_type (a Capacity Block or an On-Demand Capacity Reservation) that nodes
    launch into first; the pool's own capacity_type comes after it (target eks)."""
    efa: bool | None = None
    """Elastic Fabric Adapter interfaces on the pool's nodes (as many as the instance type has) and EFA device
    requests on its engines; None: on when a model spans nodes and the instance type has EFA."""
    placement_group: bool | None = None
    """Launch the pool's nodes into one cluster placement group (one zone, lowest latency between nodes);
    None: on when a model spans nodes."""
    fallback_instance_types: list[str] = Field(default_factory=list)
    """Instance types tried in this order when instance_type has no capacity (e.g. ['p5en.48xlarge']); each must
    have its GPU count, vCPUs and memory (the autoscaler sizes the pool by one node shape) and fit every model on
    the pool (target eks)."""
    sharing: GpuSharing = GpuSharing.NONE
    """none: each engine takes whole GPUs. time-slicing: the NVIDIA device plugin advertises each GPU several
    times and engines share it with no memory isolation (each engine's gpu_memory_utilization is derived so
    they fit together); for dev and cheap sharing. mig: the GPUs are cut into MIG instances (A100, H100, H200,
    B200), isolated in memory and faults; each engine names its instance profile. Every model on a shared pool
    sets gpu_share."""
    engines_per_gpu: Annotated[int, Field(ge=2, le=MAX_TIME_SLICES)] | None = None
    """sharing time-slicing: engines one GPU takes (the device plugin's replicas per GPU). Defaults to what the
    largest gpu_share.fraction on the pool allows (1 / fraction, rounded down); more is refused, because
    Kubernetes may put any of them together."""

    @field_validator("fallback_instance_types")
    @classmethod
    def _known_fallbacks(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in catalog.INSTANCE_TYPES]
        if unknown:
            raise ValueError(
                f"unknown GPU instance type(s) {', '.join(map(repr, unknown))}; e.g. 'p5en.48xlarge'"
            )
        if len(set(value)) != len(value):
            raise ValueError("an instance type is listed twice")
        return value

    @model_validator(mode="after")
    def _reserved_type(self) -> GpuPoolSpec:
        if self.capacity_reservation is not None and self.instance_type == AUTO:
            raise ValueError(
                "capacity_reservation reserves one instance type: set instance_type to the reservation's "
                "(e.g. 'p5.48xlarge') instead of auto"
            )
        if self.instance_type in self.fallback_instance_types:
            raise ValueError(f"fallback_instance_types repeats instance_type {self.instance_type!r}")
        if self.engines_per_gpu is not None and self.sharing is not GpuSharing.TIME_SLICING:
            raise ValueError(
                f"engines_per_gpu counts time-sliced engines; with sharing {self.sharing.value} remove it "
                "(or set sharing: time-slicing)"
            )
        return self

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, value: str) -> str:
        if value != AUTO and value not in catalog.INSTANCE_TYPES:
            families = sorted({i.family for i in catalog.INSTANCE_TYPES.values()})
            raise ValueError(
                f"unknown GPU instance type {value!r}; use 'auto' or one of the families {', '.join(families)} "
                f"(e.g. 'g6.xlarge', 'p5.48xlarge')"
            )
        return value


class ArchitectureSpec(_Spec):
    """Model shape, for models the catalog does not know."""

    params_b: Annotated[float, Field(gt=0)]
    """Parameters, in billions (all experts for mixture-of-experts)."""
    layers: Annotated[int, Field(ge=1)]
    """Transformer layers (config.json num_hidden_layers); with kv_heads and head_dim, sizes the KV cache."""
    kv_heads: Annotated[int, Field(ge=1)]
    """Key/value heads (grouped-query attention)."""
    head_dim: Annotated[int, Field(ge=1)]
    """Width of one attention head (config.json head_dim, else hidden_size / num_attention_heads)."""
    hidden_size: Annotated[int, Field(ge=1)]
    """Model width (config.json hidden_size); sizes activation memory and the embedding table."""
    max_context_tokens: Annotated[int, Field(ge=1)] = 8192
    """Longest context the model supports, in tokens (config.json max_position_embeddings); the policy pack
    sizes an engine whose command line sets no maximum length with it."""
    vocab_size: Annotated[int, Field(ge=1)] = 32_000
    """Tokens in the vocabulary (config.json vocab_size); sizes the embedding table and the logits."""
    active_params_b: Annotated[float, Field(gt=0)] | None = None
    """Parameters used per token, for mixture-of-experts models."""
    pooling: bool = False
    """An embedding model."""

    def to_catalog(self) -> catalog.ModelArch:
        return catalog.ModelArch(
            params_b=self.params_b,
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            hidden_size=self.hidden_size,
            max_context_tokens=self.max_context_tokens,
            vocab_size=self.vocab_size,
            active_params_b=self.active_params_b,
            pooling=self.pooling,
            source="stack file",
        )


class LoraSpec(_Spec):
    """How many LoRA adapters a replica serves, and how large (for models with adapters)."""

    max_per_batch: Annotated[int, Field(ge=1, le=256)] = 4
    """Adapters one batch may mix: GPU memory is set aside for this many at max_rank (sizing counts it)."""
    max_rank: Annotated[int, Field(ge=1, le=512)] = 16
    """Largest adapter rank a replica serves; every slot is sized for it (vLLM accepts 1, 8, 16, 32, 64,
    128, 256, 320 or 512)."""
    max_loaded: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Adapters a replica holds loaded at once (host memory); the router unloads its least recently used
    one before loading another. Defaults to max_per_batch; at least max_per_batch."""

    @model_validator(mode="after")
    def _loaded_holds_a_batch(self) -> LoraSpec:
        if self.max_loaded is not None and self.max_loaded < self.max_per_batch:
            raise ValueError(
                f"max_loaded ({self.max_loaded}) is below max_per_batch ({self.max_per_batch}): a batch mixes "
                f"only loaded adapters; raise max_loaded to at least {self.max_per_batch}"
            )
        return self

    @property
    def loaded(self) -> int:
        return self.max_loaded or self.max_per_batch


class EngineSpec(_Spec):
    """The serving engine and every launch knob it takes."""

    kind: EngineKind = EngineKind.VLLM
    """vllm, sglang or trtllm."""
    image: PinnedImage | None = None
    """Container image pinned by tag or digest; defaults to the tested image for the engine and device."""
    device: Device = Device.GPU
    """gpu, or cpu for small models on CPU nodes (kind clusters, local)."""
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    """GPUs each layer of a replica is split across; a replica uses tensor x pipeline_parallel_size GPUs,
    which must divide the GPUs of one node of its pool, or fill whole nodes (a multi-node replica: one
    LeaderWorkerSet group, e.g. 8 x 2 on two 8-GPU nodes)."""
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=16)] = 1
    """Stages a replica's layers are split into, each on its own tensor-parallel group of GPUs; 1 = none. Across
    nodes, keep tensor_parallel_size at a node's GPUs and make this the node count (stages talk less than ranks)."""
    nodes: Annotated[int, Field(ge=1, le=64)] | None = None
    """Nodes one replica spans; derived from tensor x pipeline_parallel_size and the pool's GPUs per node (set
    it to state the intent: the plan fails when the two disagree)."""
    dtype: DType = DType.AUTO
    """Activation and weight precision before quantization."""
    quantization: Quantization = Quantization.NONE
    """Weight format: none (dtype), awq or gptq (4-bit checkpoints), fp8 or int8 (8-bit; fp8 needs an Ada,
    Hopper or Blackwell GPU); sizing counts weight memory by it."""
    kv_cache_dtype: KvCacheDType = KvCacheDType.AUTO
    """KV cache precision: auto (the model's dtype) or an fp8 format, half the memory per token of 16-bit
    (fp8_e4m3 needs an Ada, Hopper or Blackwell GPU)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.98)] = 0.90
    """Share of each GPU's memory the engine may use (weights, KV cache, activations)."""
    max_model_len: Annotated[int, Field(ge=16)] = 8192
    """Longest prompt plus completion, in tokens."""
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] = DEFAULT_MAX_NUM_SEQS
    """Sequences decoded together; also the router's per-replica concurrency cap."""
    max_num_batched_tokens: Annotated[int, Field(ge=16)] | None = None
    """Tokens per scheduler step; defaults to the engine's choice (8192 with chunked prefill)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of prompt prefixes already computed (vLLM prefix caching, SGLang radix cache,
    TensorRT-LLM block reuse); prefix-affine routing pays off only with it. For embedding models vLLM
    keeps it only where the architecture supports it (not for BERT-like encoders)."""
    enable_chunked_prefill: bool = True
    """Split long prompts into chunks scheduled beside decode steps, so one long prompt does not stall
    streaming; off, max_num_batched_tokens must hold max_model_len. For embedding models vLLM keeps it
    only where the architecture supports it (not for BERT-like encoders)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (less memory, slower decode)."""
    cpu_kv_offload_gib: Annotated[float, Field(ge=0, le=4096)] = 0
    """CPU memory per replica that extends the KV cache (vLLM --kv-offloading-size, which replaced the
    removed --swap-space: preempted and evicted prefixes are kept in host memory); 0 = off."""
    trust_remote_code: bool = False
    """Let the engine run Python code from the model repository (custom architectures); only for repos you trust."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments appended verbatim."""
    cpu_cores: Annotated[float, Field(gt=0)] | None = None
    """CPU request per replica; defaults to the instance's share (GPU) or 2 (CPU engines)."""
    memory_gib: Annotated[float, Field(gt=0)] | None = None
    """Memory request per replica; defaults to the instance's share (GPU) or 8 (CPU engines)."""
    lora: LoraSpec = Field(default_factory=LoraSpec)
    """LoRA adapter limits of a replica (only for models with adapters)."""

    @field_validator("extra_args")
    @classmethod
    def _no_listener_overrides(cls, value: list[str]) -> list[str]:
        owned = {"--host", "--port", "--served-model-name", "--model", "--model-path"}
        clash = sorted({a.split("=", 1)[0] for a in value} & owned)
        if clash:
            raise ValueError(
                f"extra_args may not set {', '.join(clash)}: inferstack renders them from the spec"
            )
        return value

    @model_validator(mode="after")
    def _engine_rules(self) -> EngineSpec:
        if self.device is Device.CPU and self.kind is not EngineKind.VLLM:
            raise ValueError(f"device: cpu is supported for vllm only, not {self.kind.value}; use kind: vllm")
        if self.device is Device.CPU and (self.tensor_parallel_size, self.pipeline_parallel_size) != (1, 1):
            raise ValueError(
                "device: cpu runs one engine process; set tensor_parallel_size and pipeline_parallel_size to 1"
            )
        if self.cpu_kv_offload_gib and (self.kind is not EngineKind.VLLM or self.device is Device.CPU):
            raise ValueError("cpu_kv_offload_gib works with kind: vllm on GPUs only; set it to 0")
        if self.kind is EngineKind.TRTLLM and self.quantization in (Quantization.AWQ, Quantization.GPTQ):
            raise ValueError(
                f"quantization: {self.quantization.value} checkpoints are not served by trtllm-serve here; "
                "use a pre-quantized TensorRT-LLM checkpoint with quantization: fp8, or kind: vllm"
            )
        if (
            not self.enable_chunked_prefill
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_model_len "
                f"({self.max_model_len}) with chunked prefill off, so a full-length prompt can never be "
                f"scheduled; raise it to at least {self.max_model_len} or set enable_chunked_prefill: true"
            )
        return self

    @property
    def gpus(self) -> int:
        return 0 if self.device is Device.CPU else self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def resolved_image(self) -> str:
        if self.image:
            return self.image
        table = CPU_IMAGES if self.device is Device.CPU else DEFAULT_IMAGES
        return table[self.kind]


class WeightsFetch(StrEnum):
    AUTO = "auto"
    STREAMER = "streamer"
    NODE_CACHE = "node-cache"


class WeightsSpec(_Spec):
    """How an engine gets its weights from the platform's model store (never from the hub at start)."""

    fetch: WeightsFetch = WeightsFetch.AUTO
    """auto (placement picks: vLLM streams from the store, other engines read a node-level cache), streamer
    (vLLM's Run:ai streamer reads safetensors straight from S3) or node-cache (copied once per node to its
    local NVMe, or root disk where it has none, and shared by every replica there)."""


class ScalingSpec(_Spec):
    """When to add and remove replicas (the thresholds derive from the SLO and engine limits)."""

    min_replicas: Annotated[int, Field(ge=0)] = 1
    """0 enables scale-to-zero: the first request wakes the model."""
    max_replicas: Annotated[int, Field(ge=1)] = 1
    """Most replicas the autoscaler may run (equal to min_replicas: a fixed count, no autoscaler); the pool's
    node ceiling and the projected monthly cost assume it."""
    queue_per_replica: Annotated[float, Field(gt=0)] | None = None
    """Waiting requests per replica that trigger scale-up; defaults to 10% of max_num_seqs."""
    kv_cache_usage_target: Annotated[float, Field(gt=0, le=1)] = 0.85
    """KV cache usage (0-1) above which to scale up."""
    scale_up_stabilization_s: Annotated[int, Field(ge=0, le=3600)] = 30
    """Seconds load must stay high before replicas are added (the HPA's scale-up stabilization window)."""
    scale_down_stabilization_s: Annotated[int, Field(ge=0, le=3600)] = 600
    """Cooldown: how long load must stay low before replicas are removed."""
    idle_before_zero_s: Annotated[int, Field(ge=60)] = 900
    """With min_replicas 0: idle time before the last replica goes."""
    sleep_after_idle_s: Annotated[int, Field(ge=10, le=86_400)] | None = None
    """Idle time after which a replica goes to sleep instead of staying hot (vLLM sleep mode, level 1: weights
    move to host memory, the KV cache is dropped, the GPU memory is freed) and wakes on the next request, which
    the router holds meanwhile (seconds for a sleeping replica, against minutes for a cold start). None: replicas
    never sleep. Engines and devices that support it only (vLLM on GPUs)."""
    cold_start_hold_ms: Annotated[int, Field(ge=0)] = 90_000
    """With min_replicas 0: how long the router holds a request while the model has no ready replica (one is
    starting from zero; the waiting request is what wakes it); past it the client gets 503 with Retry-After.
    At most the router's first-byte timeout. 0 answers 503 at once (the refusals still wake the model), which is
    what the endpoint picker does in gateway.mode inference-extension (it holds nothing; a hold is refused)."""

    @model_validator(mode="after")
    def _ordered(self) -> ScalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas}); "
                f"raise max_replicas to at least {self.min_replicas}"
            )
        return self

    @model_validator(mode="after")
    def _hold_fits(self) -> ScalingSpec:
        first_byte_ms = RouterSettings().first_byte_timeout_ms
        if self.cold_start_hold_ms > first_byte_ms:
            raise ValueError(
                f"cold_start_hold_ms ({self.cold_start_hold_ms}) is longer than the router's first-byte timeout "
                f"({first_byte_ms} ms), which the load balancer's idle timeout is sized from: a request held "
                f"longer is cut off upstream while the router still holds it; use at most {first_byte_ms}"
            )
        if "cold_start_hold_ms" in self.model_fields_set and self.min_replicas > 0:
            raise ValueError(
                f"cold_start_hold_ms has no effect with min_replicas {self.min_replicas} (a model that never "
                "scales to zero is never started for a waiting request): remove it, or set min_replicas: 0"
            )
        return self


class RollbackRuleSpec(_Spec):
    """When the health monitor sends a canary's traffic back to the stable version: any one breach, measured
    over one evaluation interval, rolls back at once."""

    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    """Share of the canary's probes and one-token checks that may fail in an interval (0-1); above it: rollback."""
    max_ttft_ratio: Annotated[float, Field(ge=1)] = 1.5
    """The canary's TTFT p95 may be at most this multiple of the stable version's (when both have samples)."""
    max_inter_token_ratio: Annotated[float, Field(ge=1)] = 1.5
    """The canary's inter-token p95 may be at most this multiple of the stable version's."""
    enforce_slo: bool = True
    """Also roll back when the canary's TTFT or inter-token p95 breaks the model's slo (ttft_p95_ms,
    inter_token_p95_ms), even if the stable version is as slow."""
    min_samples: Annotated[int, Field(ge=1, le=10_000)] = 3
    """Probes of the canary an interval needs before its error rate is judged (fewer: hold, never advance)."""


class CanarySpec(_Spec):
    """The steps a new version's traffic share moves through, and the rule that undoes them."""

    steps_percent: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [10, 25, 50, 100]
    )
    """Canary weights in order, rising to 100 (e.g. [10, 25, 50, 100]): the canary's weight in versions must be
    one of them (or 0); promotion is a spec change to the next step, which the plan shows."""
    evaluation_interval_s: Annotated[int, Field(ge=5, le=3600)] = 60
    """How often the health monitor compares the canary with the stable version and the SLO; a breach rolls
    back within one interval."""
    rollback: RollbackRuleSpec = Field(default_factory=RollbackRuleSpec)
    """What counts as a breach: error rate, latency against the stable version, the SLO."""

    @field_validator("steps_percent")
    @classmethod
    def _rising(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("give at least one step, e.g. [10, 25, 50, 100]")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"steps must rise strictly, e.g. [10, 25, 50, 100], not {value}")
        return value


class RolloutSpec(_Spec):
    """How long `pulumi up` waits for a model's replicas to start, how they are replaced, and how a new
    version takes traffic."""

    startup_budget_s: Annotated[int, Field(ge=60, le=21_600)] | None = None
    """Seconds one replica may take from a cold node to ready: the engine's startup probe, its Deployment's
    progress deadline and how long `pulumi up` waits for it. Defaults to the estimate (node start, image pull,
    weights fetch and load; components.startup) plus 25%; a value below the estimate is refused."""
    canary: CanarySpec | None = None
    """With two versions: the canary steps and the automatic rollback rule (required when versions are given)."""


class PreparationKind(StrEnum):
    QUANTIZE = "quantize"
    TRTLLM_BUILD = "trtllm-build"


#: Weight formats a quantize step writes, with the llm-compressor scheme that writes each (compressed-tensors
#: checkpoints, which vLLM and SGLang load without a --quantization flag).
QUANTIZE_SCHEMES: dict[Quantization, str] = {
    Quantization.AWQ: "W4A16_ASYM",
    Quantization.GPTQ: "W4A16",
    Quantization.FP8: "FP8_DYNAMIC",
    Quantization.INT8: "W8A8",
}
QUANTIZE_IMAGE = "prepare-llmcompressor"
"""The quantize step's image, built from runtime/images/prepare-llmcompressor.Dockerfile and published by the
release workflow (components.images.RELEASED_IMAGES)."""
LLMCOMPRESSOR_VERSION = "0.14.0.1"
"""The llm-compressor it installs (runtime/images/prepare-llmcompressor.requirements.txt pins it, and a test
holds the two together): its published tag, so the tag says which tool quantized a version."""
PREPARATION_IMAGES: dict[PreparationKind, str] = {
    PreparationKind.QUANTIZE: f"ghcr.io/inferstack/{QUANTIZE_IMAGE}:{LLMCOMPRESSOR_VERSION}",
    PreparationKind.TRTLLM_BUILD: "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
}


class PreparationSpec(_Spec):
    """A step that turns a version's source into what its engine loads: a Kubernetes Job run before the engines
    that reads the source from the model store (where the source's preparation Job copied it) and writes its
    result there too, at '<model_store.prefix>/prepared/<model>/<version>/<input hash>/' with a manifest and a
    provenance.json; the same inputs run it once."""

    kind: PreparationKind
    """quantize (llm-compressor one-shot quantization to `format`) or trtllm-build (a TensorRT-LLM engine for the
    GPU of the model's pool; needs engine kind trtllm)."""
    format: Quantization = Quantization.AWQ
    """quantize: the weight format written (awq and gptq: 4-bit weight-only; fp8; int8); the version's engine
    serves and is sized by it. trtllm-build: the checkpoint's quantization (none or fp8)."""
    calibration_dataset: str = "HuggingFaceH4/ultrachat_200k"
    """quantize: Hugging Face dataset id (or local path) whose samples calibrate activation-aware scales."""
    calibration_samples: Annotated[int, Field(ge=1, le=4096)] = 256
    """quantize: calibration samples."""
    max_sequence_length: Annotated[int, Field(ge=16, le=131_072)] = 2048
    """quantize: tokens per calibration sample; trtllm-build: the engine's max sequence length."""
    image: PinnedImage | None = None
    """Image of the Job, pinned; defaults to the tool's tested image (llm-compressor 0.14, TensorRT-LLM 1.0)."""

    @property
    def resolved_image(self) -> str:
        return self.image or PREPARATION_IMAGES[self.kind]


class ModelVersionSpec(_Spec):
    """One version of a model: what it serves (source, revision, engine, preparation) and its share of traffic."""

    name: DnsLabel
    """Version name, e.g. 'v1' or '2025-06-awq': in Deployment names, metrics and events."""
    source: str | None = None
    """Hugging Face repo id, S3 URI or local path; defaults to the model's source."""
    revision: HubCommit | None = None
    """The hub commit (40 hex digits) of a Hugging Face source, as the model's revision; defaults to the model's
    revision when the version keeps the model's source."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Engine knobs that differ from the model's engine (merged onto it), e.g. {image: ..., quantization: awq}."""
    preparation: PreparationSpec | None = None
    """A quantization or engine build run before this version's engines start."""
    weight: Annotated[int, Field(ge=0, le=100)]
    """Percent of the model's requests this version gets; the versions' weights add up to 100."""


def _engine_of(model_engine: EngineSpec, version: ModelVersionSpec, *, prepared: bool = True) -> EngineSpec:
    merged = {**model_engine.model_dump(exclude_unset=True), **version.engine}
    prep = version.preparation
    if (
        prepared
        and prep is not None
        and (prep.kind is PreparationKind.QUANTIZE or prep.format is not Quantization.NONE)
    ):
        merged["quantization"] = prep.format.value  # what the prepared checkpoint holds: sized by it
    return EngineSpec.model_validate(merged)


def _version_engine(
    j: int, model_engine: EngineSpec, version: ModelVersionSpec, *, prepared: bool
) -> EngineSpec:
    """The version's engine, or one error naming the version's engine field that is wrong."""
    try:
        return _engine_of(model_engine, version, prepared=prepared)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"versions[{j}].engine{'.' + where if where else ''}: {message}") from None


class SloSpec(_Spec):
    """Latency objectives; scaling and alerts are derived from them."""

    ttft_p95_ms: Annotated[int, Field(ge=1)] = 2000
    """95th percentile time to first token."""
    inter_token_p95_ms: Annotated[int, Field(ge=1)] = 100
    """95th percentile time between streamed tokens."""
    allow_cold_starts: bool = True
    """A request may wait while a replica starts from zero (scaling.min_replicas 0). false: the model must
    always have a warm replica, and min_replicas 0 is refused."""


class RoutingSpec(_Spec):
    """How the gateway spreads this model's requests over its replicas: a named strategy (a preset blend
    of scorers), weights that adjust the blend, and the knobs of the scorers it uses. Names, ranges and
    descriptions come from the router's registry (``runtime.config``), so a typo fails here, at plan."""

    KNOBS: ClassVar[frozenset[str]] = frozenset(
        {"load_guard_ratio", "prefix_balance_factor", "prefix_block_tokens"}
    )

    strategy: StrategyName = Field(default="prefix_aware", description=strategy_field("name").description)
    weights: dict[BuiltinScorerName, Annotated[float, Field(ge=0)]] = strategy_field("weights")
    load_guard_ratio: float = strategy_field("load_guard_ratio")
    prefix_balance_factor: float = strategy_field("prefix_balance_factor")
    prefix_block_tokens: int = strategy_field("prefix_block_tokens")
    priority: int | None = None
    """gateway.mode inference-extension: the request priority of this model's InferenceObjective
    (inference.networking.x-k8s.io/v1alpha2): under load the gateway serves higher first and may shed
    negative ones. Requests name it with the x-gateway-inference-objective header (the objective is named
    after the model)."""

    @model_validator(mode="after")
    def _knobs_take_effect(self) -> RoutingSpec:
        read = routing_knobs_read(self.strategy, self.weights)
        for knob in sorted((self.model_fields_set & self.KNOBS) - read):
            readers = " or ".join(n for n, info in routing_scorers().items() if knob in info.knobs)
            raise ValueError(
                f"{knob} has no effect with strategy {self.strategy!r} and these weights (only the {readers}"
                " scorer reads it): remove it, or choose a strategy or weights that use that scorer"
            )
        return self


MIG_PROFILE = re.compile(r"^[1-7]g\.\d+gb$")


class GpuShareSpec(_Spec):
    """The part of one GPU a replica takes on a shared pool: a memory fraction (time-slicing) or a MIG profile."""

    fraction: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Pool sharing time-slicing: the share of one GPU's memory the engine may use, e.g. 0.25. Its
    gpu_memory_utilization is derived from it (fraction x the safe total), so engines that share a GPU never
    ask for more than the card has. On a CPU engine (target local): its share of the memory the machine gives
    its engines (`inferstack local up --engine-memory-gib`), which sizes its KV cache (VLLM_CPU_KVCACHE_SPACE)."""
    mig_profile: str | None = None
    """Pool sharing mig: the MIG instance profile each replica runs in, e.g. '1g.10gb' or '3g.40gb' on an H100
    (`inferstack size <model>` shows the smallest that holds it on each GPU); the engine requests
    nvidia.com/mig-<profile>."""

    @field_validator("mig_profile")
    @classmethod
    def _profile_name(cls, value: str | None) -> str | None:
        if value is not None and not MIG_PROFILE.match(value):
            raise ValueError(
                f"{value!r} is not a MIG profile name; write '<compute slices>g.<memory>gb', e.g. '1g.10gb'"
            )
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> GpuShareSpec:
        if (self.fraction is None) == (self.mig_profile is None):
            raise ValueError(
                "give exactly one of fraction (a time-slicing pool, e.g. 0.25) or mig_profile (a mig pool, "
                "e.g. '1g.10gb')"
            )
        return self


def _checked_source(value: str, what: str = "model") -> str:
    """A Hugging Face repo id, an S3 URI or a local path (the same rules for weights and adapters)."""
    if value.startswith("s3://"):
        if not S3_URI.match(value):
            raise ValueError(f"{value!r} is not a valid S3 URI; write 's3://<bucket>/<prefix>'")
        return value
    if value.startswith(("/", "./", "../", "~")):
        return value
    if not HF_REPO.match(value):
        raise ValueError(
            f"{value!r} is not a {what} source: use a Hugging Face repo id like 'meta-llama/Llama-3.1-8B-Instruct', "
            f"an S3 URI like 's3://models/llama-3.1-8b/', or a local path starting with '/' or './'"
        )
    return value


class AdapterSpec(_Spec):
    """A LoRA adapter of the model: clients ask for it by name; the router loads it onto a replica of
    the model the first time a request for it lands there."""

    name: DnsLabel
    """What clients put in `model` for this adapter; unique in the stack, and no model's name."""
    source: str
    """Hugging Face repo id ('org/name', pinned by revision), an 's3://bucket/prefix/' holding
    adapter_config.json and adapter_model.safetensors, or (target local) a local directory."""
    revision: HubCommit | None = None
    """Hugging Face sources: the hub commit (40 hex digits) to fetch, as for a model; required on a cluster,
    where the adapter is copied into the model store at that commit. Not for S3 or local sources."""
    rank: Annotated[int, Field(ge=1, le=512)]
    """The adapter's LoRA rank (adapter_config.json "r"); at most engine.lora.max_rank."""

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _checked_source(value, "adapter")

    @model_validator(mode="after")
    def _revision_for_hub(self) -> AdapterSpec:
        if self.revision is not None and not self.is_hub:
            raise ValueError(
                f"revision applies to Hugging Face sources only, not {self.source!r}: remove it "
                "(an S3 prefix or a directory is pinned by writing a new one per version)"
            )
        return self

    @property
    def is_hub(self) -> bool:
        return is_hub_source(self.source)

    @property
    def pinned(self) -> bool:
        """A source that cannot change under the same spec: a hub commit, an S3 prefix, a local directory."""
        return not self.is_hub or self.revision is not None


class ModelSpec(_Spec):
    """A model to serve, its engine, placement, scale and objectives."""

    name: DnsLabel
    """Served model name: what clients put in `model`; a DNS label, unique in the stack."""
    source: str
    """Hugging Face repo id ('org/name', with revision), an 's3://bucket/prefix/' of prepared weights in the model
    store, or (target local) a local path."""
    revision: HubCommit | None = None
    """The hub commit (40 hex digits) of a Hugging Face source: the weights the preparation Job copies into the
    model store, so every replica serves exactly that model. Required for hub sources on a cluster."""
    weights: WeightsSpec = Field(default_factory=WeightsSpec)
    """How engines get the weights from the model store (streamer or node-level cache)."""
    architecture: ArchitectureSpec | None = None
    """Required when the catalog does not know the source; see `inferstack size --list`."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The serving engine and its launch knobs: kind, parallelism, precision, length and batch limits."""
    pool: str = AUTO
    """GPU pool name, or 'auto' for the cheapest declared pool that fits."""
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    """Replica bounds, and when the autoscaler adds or removes replicas."""
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    """How the router picks one of this model's replicas for each request."""
    slo: SloSpec = Field(default_factory=SloSpec)
    """Latency objectives; scaling triggers and alerts derive from them."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How long its replicas may take to start; how they roll (surge from the pool's spare GPUs)."""
    task: Task | None = None
    """generate or embed; defaults from the architecture (embedding models pool)."""
    gpu_share: GpuShareSpec | None = None
    """Share a GPU instead of taking whole ones: a memory fraction on a time-slicing pool, a MIG profile on a
    mig pool. None: each replica takes engine.tensor_parallel_size x pipeline_parallel_size whole GPUs."""
    team: DnsLabel | None = None
    """The team or tenant that owns the model. In production the policy pack lets models of different teams
    share a GPU only through MIG (isolated memory and faults), never time-slicing."""

    adapters: list[AdapterSpec] = Field(default_factory=list)
    """LoRA adapters of this model, served under their own names from its replicas (vLLM only); each
    replica loads the ones asked of it, up to engine.lora.max_loaded."""

    versions: list[ModelVersionSpec] = Field(default_factory=list)
    """Versions served under this one name, with traffic weights adding up to 100; the first is the stable
    version (rollbacks return to it), the others are canaries (rollout.canary). Each version runs its own
    replicas within scaling (pool size and cost count them). Empty: one version, the model."""

    # Set on the serving units derived from versions (components.lifecycle), never from a stack file.
    _served_as: str | None = PrivateAttr(default=None)
    _version_of: tuple[str, str, int, bool] | None = PrivateAttr(
        default=None
    )  # model, version, weight, stable
    _format_in_checkpoint: bool = PrivateAttr(default=False)
    _prepared_by: str | None = PrivateAttr(default=None)

    @property
    def serving_units(self) -> int:
        """Deployments serving the model: one per version (each scales on its own within scaling), else one."""
        return max(1, len(self.versions))

    @property
    def served_name(self) -> str:
        """What clients send and the engine serves: the model's name, also for each of its versions."""
        return self._served_as or self.name

    @property
    def version_of(self) -> tuple[str, str, int, bool] | None:
        """(model, version, weight, stable) for a serving unit derived from a version; None otherwise."""
        return self._version_of

    @property
    def prepared_by(self) -> str | None:
        """The preparation Job whose output this unit loads (its source), if any."""
        return self._prepared_by

    @property
    def format_in_checkpoint(self) -> bool:
        """The checkpoint says its own quantization (llm-compressor output): no --quantization flag."""
        return self._format_in_checkpoint

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _checked_source(value)

    @model_validator(mode="after")
    def _weights_rules(self) -> ModelSpec:
        if self.revision is not None and not self.is_hub:
            raise ValueError(
                f"revision pins a Hugging Face source; {self.source!r} is not one: remove revision (an s3:// or "
                "local source is what it is)"
            )
        if self.weights.fetch is WeightsFetch.STREAMER and self.engine.kind is not EngineKind.VLLM:
            raise ValueError(
                f"weights.fetch: streamer is vLLM's (runai_streamer); {self.engine.kind.value} reads a node-level "
                "cache: set weights.fetch to node-cache or auto"
            )
        return self

    @property
    def is_local_path(self) -> bool:
        return is_local_path(self.source)

    @model_validator(mode="after")
    def _adapters_servable(self) -> ModelSpec:
        if not self.adapters:
            if "lora" in self.engine.model_fields_set:
                raise ValueError(
                    "engine.lora has no effect on a model without adapters: remove it, or add adapters"
                )
            return self
        engine = facts(self.engine.kind)
        if engine.lora is None:
            raise ValueError(
                f"adapters: {engine.display_name} {engine.version} (engine.kind {self.engine.kind.value}) is not "
                "driven with LoRA adapters by inferstack (its adapters cannot be loaded and routed at run time "
                "here); serve this model with kind: vllm, or remove its adapters"
            )
        if self.resolved_task() is Task.EMBED:
            raise ValueError("adapters: an embedding model serves no LoRA adapters here; remove them")
        lora = self.engine.lora
        if lora.max_rank not in engine.lora.ranks:
            raise ValueError(
                f"engine.lora.max_rank: {engine.display_name} {engine.version} accepts "
                f"{', '.join(map(str, engine.lora.ranks))}, not {lora.max_rank}"
            )
        names = [a.name for a in self.adapters]
        for i, adapter in enumerate(self.adapters):
            if names.index(adapter.name) != i:
                raise ValueError(f"adapters[{i}].name: {adapter.name!r} is used twice")
            if adapter.rank > lora.max_rank:
                raise ValueError(
                    f"adapters[{i}].rank: {adapter.name} has rank {adapter.rank}, above engine.lora.max_rank "
                    f"{lora.max_rank}; raise max_rank to at least {adapter.rank} (it sizes every adapter slot)"
                )
        if self.engine.device is Device.CPU and self.engine.dtype is not DType.FLOAT32:
            raise ValueError(
                "adapters on device: cpu need engine.dtype: float32: vLLM-CPU 0.32.0 with LoRA on dies with "
                "SIGILL in its bfloat16 (AMX) attention kernel at the first request (bench/lora/README.md)"
            )
        return self

    @property
    def is_hub(self) -> bool:
        """A Hugging Face repository id (not an S3 URI, not a local path)."""
        return is_hub_source(self.source)

    def arch(self) -> catalog.ModelArch | None:
        """The architecture from the stack file, else from the catalog; None when neither knows it."""
        if self.architecture is not None:
            return self.architecture.to_catalog()
        found = catalog.lookup_model(self.source) or catalog.lookup_model(self.name)
        return found[1] if found else None

    @model_validator(mode="after")
    def _cold_starts_allowed(self) -> ModelSpec:
        if self.scaling.min_replicas == 0 and not self.slo.allow_cold_starts:
            raise ValueError(
                f"scaling.min_replicas: 0 lets {self.name} scale to zero, so its first request after idle waits "
                "for a replica to start, but slo.allow_cold_starts is false; set min_replicas to at least 1, "
                "or allow cold starts"
            )
        return self

    @model_validator(mode="after")
    def _versions(self) -> ModelSpec:
        if not self.versions:
            if self.rollout.canary is not None:
                raise ValueError("rollout.canary needs versions: list the stable version and the canary")
            return self
        if len(self.versions) < 2:
            raise ValueError(
                "versions: list at least two (the stable version first, then the canary), or none"
            )
        if self.adapters:
            raise ValueError(
                "adapters: a model served in versions carries no LoRA adapters here (the router routes an "
                "adapter to its base model's replicas, not through the version split); serve the adapters on a "
                "model without versions"
            )
        total = sum(v.weight for v in self.versions)
        if total != 100:
            raise ValueError(
                "versions: the weights add up to "
                f"{total}, not 100 ({', '.join(f'{v.name}: {v.weight}' for v in self.versions)})"
            )
        seen: dict[str, int] = {}
        served: dict[tuple[str, ...], int] = {}
        for j, v in enumerate(self.versions):
            if v.name in seen:
                raise ValueError(f"versions[{j}].name: {v.name!r} is also versions[{seen[v.name]}].name")
            unit = f"{self.name}-{v.name}"
            if len(unit) > MAX_MODEL_NAME:
                raise ValueError(
                    f"versions[{j}].name: its engines are named {unit!r}, {len(unit)} characters; model and version "
                    f"names together may have at most {MAX_MODEL_NAME - 1}"
                )
            seen[v.name] = j
            if v.source is not None:
                try:
                    _checked_source(v.source)
                except ValueError as err:
                    raise ValueError(f"versions[{j}].source: {err}") from None
            engine = _version_engine(j, self.engine, v, prepared=False)
            if v.preparation is not None:
                _check_preparation(j, v.preparation, engine)
            engine = _version_engine(j, self.engine, v, prepared=True)
            if v.revision is not None and v.source is not None and not is_hub_source(v.source):
                raise ValueError(
                    f"versions[{j}].revision: revision pins a Hugging Face source; {v.source!r} is not one: "
                    "remove revision"
                )
            key = (
                self.version_source(v),
                self.version_revision(v) or "",
                engine.model_dump_json(),
                v.preparation.model_dump_json() if v.preparation else "",
            )
            if key in served:
                raise ValueError(
                    f"versions[{j}]: same source, revision, engine and preparation as versions[{served[key]}]: "
                    "two versions must differ in what they serve"
                )
            served[key] = j
        if self.rollout.canary is None:
            raise ValueError(
                "rollout.canary: versions need a canary rule (steps and rollback), e.g. "
                "`rollout: {canary: {steps_percent: [10, 25, 50, 100]}}`"
            )
        steps = self.rollout.canary.steps_percent
        for j, v in enumerate(self.versions[1:], start=1):
            if v.weight and v.weight not in steps:
                raise ValueError(
                    f"versions[{j}].weight: {v.weight} is not a step of rollout.canary.steps_percent {steps}; "
                    "move the canary step by step"
                )
        return self

    def version_engine(self, version: ModelVersionSpec) -> EngineSpec:
        """The engine a version runs: the model's, with the version's overrides and its prepared format."""
        return _engine_of(self.engine, version)

    def version_source(self, version: ModelVersionSpec) -> str:
        return version.source or self.source

    def version_revision(self, version: ModelVersionSpec) -> str | None:
        """The hub commit a version's source is pinned at: its own, or the model's when it keeps the model's
        source."""
        if version.revision is not None:
            return version.revision
        return self.revision if version.source is None else None

    @model_validator(mode="after")
    def _sleep_supported(self) -> ModelSpec:
        if self.scaling.sleep_after_idle_s is None:
            return self
        engine, device = facts(self.engine.kind), self.engine.device
        sleep = engine.sleep
        if sleep is None or device.value not in sleep.devices:
            supported = ", ".join(
                f"{f.display_name} on {'/'.join(sorted(f.sleep.devices))}"
                for f in ENGINES.values()
                if f.sleep
            )
            raise ValueError(
                f"scaling.sleep_after_idle_s: {engine.display_name} on {device.value} has no sleep mode "
                f"(supported: {supported}); remove it (min_replicas: 0 scales to zero instead)"
            )
        zero = self.scaling.min_replicas == 0
        if zero and self.scaling.sleep_after_idle_s >= self.scaling.idle_before_zero_s:
            raise ValueError(
                f"scaling.sleep_after_idle_s ({self.scaling.sleep_after_idle_s}) must be shorter than "
                f"idle_before_zero_s ({self.scaling.idle_before_zero_s}): a replica sleeps first, then goes"
            )
        return self

    @model_validator(mode="after")
    def _share_rules(self) -> ModelSpec:
        share, e = self.gpu_share, self.engine
        if share is None:
            return self
        if e.device is Device.CPU and share.mig_profile is not None:
            raise ValueError(
                "gpu_share.mig_profile: a CPU engine has no GPU to cut into MIG instances; on CPU (target local) "
                "give gpu_share.fraction, its share of the memory the machine gives its engines"
            )
        if e.device is Device.GPU and e.gpus != 1:
            raise ValueError(
                f"gpu_share: a replica that shares a GPU runs on one GPU, but tensor x pipeline parallel size is "
                f"{e.gpus}; set both to 1 or remove gpu_share"
            )
        if share.fraction is not None and e.kind is EngineKind.TRTLLM:
            raise ValueError(
                "gpu_share.fraction: trtllm-serve sizes its KV cache from the memory left free after loading "
                "(kv_cache_free_gpu_memory_fraction), so a time-sliced share cannot bound it; use kind vllm or "
                "sglang, or a MIG profile (gpu_share.mig_profile on a mig pool)"
            )
        if share.fraction is not None and "gpu_memory_utilization" in e.model_fields_set:
            raise ValueError(
                "engine.gpu_memory_utilization is derived from gpu_share.fraction on a time-sliced GPU (so the "
                "engines sharing it fit together); remove it and set the fraction"
            )
        return self

    @property
    def memory_utilization(self) -> float:
        """The engine's gpu_memory_utilization: the spec's, or derived from a time-sliced share."""
        if self.gpu_share is not None and self.gpu_share.fraction is not None:
            return shared_memory_utilization(self.gpu_share.fraction)
        return self.engine.gpu_memory_utilization

    def resolved_task(self) -> Task:
        if self.task is not None:
            return self.task
        arch = self.arch()
        return Task.EMBED if arch is not None and arch.pooling else Task.GENERATE

    @property
    def publishes_kv_events(self) -> bool:
        """Its routing weighs the engines' own KV-cache events (``precise_prefix``): the engines publish
        them and every router replica follows them."""
        return reads_engine_events(self.routing.strategy, self.routing.weights)

    @model_validator(mode="after")
    def _kv_events_possible(self) -> ModelSpec:
        if self.publishes_kv_events:
            if self.engine.kind is not EngineKind.VLLM:
                raise ValueError(
                    f"routing: precise_prefix reads the engines' KV-cache events, which only vLLM publishes"
                    f" here, not {self.engine.kind.value}; use strategy prefix_aware"
                )
            if not self.engine.enable_prefix_caching:
                raise ValueError(
                    "routing: precise_prefix routes to the engine caching the prompt's prefix, but"
                    " engine.enable_prefix_caching is false; turn it on or use another strategy"
                )
        return self


#: What a quantize step may write for a CPU engine: formats vLLM-CPU has a kernel for and llm-compressor 0.14 writes
#: on CPU (components/local/cpu_kernels.py says which CPUs have which kernel).
CPU_QUANTIZE_FORMATS = frozenset({Quantization.INT8, Quantization.GPTQ})


def _check_preparation(j: int, prep: PreparationSpec, engine: EngineSpec) -> None:
    """A preparation must produce something the version's engine loads."""
    where = f"versions[{j}].preparation"
    if prep.kind is PreparationKind.TRTLLM_BUILD:
        if engine.kind is not EngineKind.TRTLLM:
            raise ValueError(
                f"{where}.kind: trtllm-build makes a TensorRT-LLM engine, which {engine.kind.value} does not load; "
                "set the version's engine kind to trtllm, or use kind: quantize"
            )
        if prep.format not in (Quantization.NONE, Quantization.FP8):
            raise ValueError(
                f"{where}.format: trtllm-build here builds from none or fp8 checkpoints, not {prep.format.value}"
            )
        return
    if prep.format is Quantization.NONE:
        raise ValueError(f"{where}.format: quantize needs a format (awq, gptq, fp8 or int8), not none")
    if engine.kind is EngineKind.TRTLLM:
        raise ValueError(
            f"{where}.format: trtllm-serve does not load llm-compressor's {prep.format.value} checkpoints; "
            "use kind: trtllm-build, or engine kind vllm or sglang"
        )
    if engine.device is Device.CPU and prep.format not in CPU_QUANTIZE_FORMATS:
        raise ValueError(
            f"{where}.format: on CPU, use int8 or gptq: vLLM-CPU serves llm-compressor's W8A8 checkpoints (oneDNN, "
            "every x86 CPU) and 4-bit weight-only ones (CPUWNA16 kernel, AVX-512 CPUs only), and llm-compressor "
            f"0.14's AWQ needs an accelerator; not {prep.format.value}"
        )


class IngressKind(StrEnum):
    NONE = "none"
    ALB = "alb"
    GATEWAY_API = "gateway-api"


class GatewayApiImplementation(StrEnum):
    """Who serves the Gateway of ``ingress: gateway-api``."""

    EXISTING = "existing"
    ENVOY_GATEWAY = "envoy-gateway"


ENVOY_GATEWAY_CLASS = "envoy-gateway"
"""The GatewayClass the stack creates for the Envoy Gateway it installs, unless gateway_class names another."""
IMAGE_REGISTRY = re.compile(r"^[a-z0-9]+([.-][a-z0-9]+)*(:\d{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


RUNTIME_IMAGES = {
    "router": "ghcr.io/inferstack/router:0.1.0",
    "health": "ghcr.io/inferstack/health:0.1.0",
    "batcher": "ghcr.io/inferstack/batcher:0.1.0",
    "batches": "ghcr.io/inferstack/batches:0.1.0",
    "picker": "ghcr.io/inferstack/picker:0.1.0",
}


class GatewayMode(StrEnum):
    """Who routes requests to replicas: inferstack's router, or a Gateway API Inference Extension gateway
    that asks inferstack's endpoint picker (the router's scheduler over Envoy ext_proc)."""

    ROUTER = "router"
    INFERENCE_EXTENSION = "inference-extension"


class PickerFailureMode(StrEnum):
    """The InferencePool's endpointPickerRef.failureMode (inference.networking.k8s.io/v1)."""

    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


class GatewaySpec(_Spec):
    """The router in front of the engines, and how traffic reaches it."""

    mode: GatewayMode = GatewayMode.ROUTER
    """router (inferstack's router serves the OpenAI API) or inference-extension (a gateway of gateway_class
    that implements the Gateway API Inference Extension routes each request, asking inferstack's endpoint
    picker which replica: an InferencePool per model, the picker, and an HTTPRoute from a Gateway to the
    pools; gateway_class is then required)."""
    picker_failure_mode: PickerFailureMode = PickerFailureMode.FAIL_CLOSE
    """inference-extension: what the gateway does when the picker does not answer: FailClose (a 503) or
    FailOpen (the pool's replicas without a pick)."""
    picker_image: PinnedImage = RUNTIME_IMAGES["picker"]
    """Endpoint picker image (inference-extension), pinned by tag or digest (eks runs its ECR push, by digest)."""
    replicas: Annotated[int, Field(ge=1)] = 2
    """Router replicas; the router autoscaler's minimum when max_replicas is higher."""
    max_replicas: Annotated[int, Field(ge=1)] = 6
    """Most router replicas: above replicas, an HPA scales the router on CPU use; equal, the count is fixed."""
    ingress: IngressKind = IngressKind.NONE
    """How clients outside the cluster reach the router: none (the in-cluster Service only), alb (an AWS
    Application Load Balancer, through the AWS Load Balancer Controller) or gateway-api (an HTTPRoute on a
    Gateway of gateway_class). Both need hostname."""
    hostname: str | None = None
    """Public host name for the ingress."""
    require_api_key: bool = True
    """The router refuses requests without a known API key (the keys of api_keys_config_key); false serves
    anyone who reaches it."""
    api_keys_config_key: str | None = None
    """Pulumi secret config key holding a YAML/JSON list of {name, key, models} (stored hashed in the cluster)."""
    gateway_api: GatewayApiImplementation = GatewayApiImplementation.EXISTING
    """With ingress gateway-api, who serves the Gateway: 'existing' is a GatewayClass the cluster already runs
    (gateway_class; `pulumi up` reads it before creating the Gateway, and stops there if it is missing),
    'envoy-gateway' installs Envoy Gateway (addons.versions.envoy_gateway; its chart brings the Gateway API CRDs)
    and creates GatewayClass gateway_class for it."""
    gateway_class: str = "istio"
    """GatewayClass of the parent Gateway when ingress is gateway-api: the existing one's name, or (gateway_api
    envoy-gateway) the name of the one the stack creates, 'envoy-gateway' unless set."""
    tls_secret_name: str | None = None
    """TLS Secret (e.g. from cert-manager) for the Gateway's HTTPS listener (gateway-api); None = HTTP only.
    The ALB finds its ACM certificate by hostname."""
    ingress_source_cidrs: list[Cidr] | None = None
    """Where traffic to the router pods may come from (where an ALB with target-type ip sits); defaults to
    cluster.vpc_cidr on eks when the stack creates the VPC, else the private ranges."""
    image_registry: str | None = None
    """Target kubernetes: the registry and path the stack builds the router, health monitor, batcher and weights
    images into (from runtime/images/, with Docker on the machine running `pulumi up`, logged in to it) and runs
    them from, by digest: e.g. 'ghcr.io/acme/inferstack', or kind's local registry 'localhost:5001'. None: run
    router_image, health_image, batcher_image and model_store.image as given (published release images). Target
    eks always builds into its own ECR."""
    router_image: PinnedImage = RUNTIME_IMAGES["router"]
    """Router image, pinned by tag or digest (target kubernetes; eks runs the image it builds from
    runtime/images/ and pushes to ECR, by digest)."""
    health_image: PinnedImage = RUNTIME_IMAGES["health"]
    """Health monitor image, pinned by tag or digest (target kubernetes; eks runs its ECR push, by digest)."""
    batcher_image: PinnedImage = RUNTIME_IMAGES["batcher"]
    """Batcher image (embedding models only), pinned by tag or digest (target kubernetes; eks runs its ECR
    push, by digest)."""
    router_cpu_cores: Annotated[float, Field(gt=0, le=64)] = 1.0
    """CPU request and limit per router replica."""
    router_memory_gib: Annotated[float, Field(gt=0, le=256)] = 1.0
    """Memory request and limit per router replica."""
    shared_limits: bool = False
    """Keep per-key rate limits in one Redis all router replicas use, so N replicas enforce one limit (off:
    each replica limits alone, and a key gets up to replicas x its limit): ElastiCache on eks (two nodes in
    two zones, encrypted in transit and at rest), a Redis StatefulSet on kubernetes, redis-server on
    127.0.0.1 with `make local`. While the store is unreachable each replica limits at its share of every
    limit (the limit divided by the replicas alive), and goes back to the store by itself."""
    limit_store_auth_config_key: str | None = None
    """Pulumi secret config key with the store's AUTH token (16-128 characters, letters, digits and
    !&#$^<>-, ElastiCache's rule); required with shared_limits on eks and kubernetes."""
    limit_store_node_type: Annotated[str, Field(pattern=r"^cache\.[a-z0-9]+\.[a-z0-9]+$")] = "cache.t4g.small"
    """ElastiCache node type of the store (eks)."""

    @field_validator("image_registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is not None and not IMAGE_REGISTRY.match(value):
            raise ValueError(
                f"{value!r} is not a registry and path: write host[:port][/path] in lowercase, e.g. "
                "'ghcr.io/acme/inferstack' or 'localhost:5001'"
            )
        return value

    @model_validator(mode="after")
    def _gateway_class_of_the_installed_implementation(self) -> GatewaySpec:
        if (
            self.gateway_api is GatewayApiImplementation.ENVOY_GATEWAY
            and "gateway_class" not in self.model_fields_set
        ):
            self.gateway_class = ENVOY_GATEWAY_CLASS
        return self

    @model_validator(mode="after")
    def _inference_extension(self) -> GatewaySpec:
        if self.mode is not GatewayMode.INFERENCE_EXTENSION:
            return self
        if (
            "gateway_class" not in self.model_fields_set
            and self.gateway_api is GatewayApiImplementation.EXISTING
        ):
            raise ValueError(
                "mode inference-extension needs gateway_class: the GatewayClass of a gateway that implements the "
                "Gateway API Inference Extension (e.g. 'istio', 'kgateway', 'eg' for Envoy Gateway, "
                "'gke-l7-regional-external-managed')"
            )
        if self.ingress is not IngressKind.GATEWAY_API:
            raise ValueError(
                "mode inference-extension serves clients through a Gateway of gateway_class: set ingress to "
                "gateway-api (with hostname)"
            )
        if self.shared_limits:
            raise ValueError(
                "shared_limits shares the router's rate limits, and mode inference-extension runs no router (the "
                "endpoint picker limits nothing): set shared_limits false, or use mode router"
            )
        return self

    @model_validator(mode="after")
    def _replicas_ordered(self) -> GatewaySpec:
        if self.ingress is not IngressKind.NONE and not self.hostname:
            raise ValueError(
                f"ingress {self.ingress.value} needs a hostname (the ALB finds its certificate by it, "
                "the HTTPRoute matches it); set gateway.hostname, e.g. 'llm.example.com'"
            )
        if self.replicas > self.max_replicas:
            raise ValueError(
                f"replicas ({self.replicas}) is above max_replicas ({self.max_replicas}); "
                f"raise max_replicas to at least {self.replicas}"
            )
        return self


class ObservabilitySpec(_Spec):
    """What gets installed and rendered to watch the platform."""

    prometheus: bool = True
    """Scrape the platform with the Prometheus operator: install kube-prometheus-stack (unless
    addons.install_prometheus_stack is false) and render ServiceMonitors for engines, runtime services and
    add-ons."""
    grafana_dashboards: bool = True
    """Render a Grafana dashboard per model and one for the gateway (ConfigMaps for Grafana's dashboard
    sidecar), and run Grafana in kube-prometheus-stack."""
    alerts: bool = True
    """Render the PrometheusRule (engines down, queue backlog, KV cache full, SLO burn, router errors,
    ejections); only with prometheus."""
    dcgm_exporter: bool = True
    """Install NVIDIA's DCGM exporter on GPU nodes, for the GPU utilisation panels (stacks with GPU models)."""
    namespace: DnsLabel = "monitoring"
    """Namespace of Prometheus and Grafana (kube-prometheus-stack); engines admit scrapes from it."""
    grafana_admin_password_config_key: str | None = None
    """Pulumi secret config key with Grafana's admin password. Without it Grafana has no password login at
    all: dashboards are read-only for anyone who reaches it (port-forward), and nobody can change them."""
    prometheus_url: str | None = None
    """Prometheus query URL for scaling triggers and adapter rules; defaults to kube-prometheus-stack's
    in `namespace` (e.g. 'http://prometheus-operated.monitoring.svc:9090' for your own)."""

    @field_validator("prometheus_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+(:\d+)?(/[^\s]*)?$", value):
            raise ValueError(
                f"{value!r} is not an http(s) URL; write e.g. 'http://prometheus.monitoring.svc:9090'"
            )
        return value


class Autoscaler(StrEnum):
    KEDA = "keda"
    HPA = "hpa"


class GpuPlugin(StrEnum):
    DEVICE_PLUGIN = "nvidia-device-plugin"
    GPU_OPERATOR = "gpu-operator"
    NONE = "none"


class ChartVersionsSpec(_Spec):
    """Pinned Helm chart versions of the add-ons (tested together; bump deliberately)."""

    nvidia_device_plugin: str = "0.17.1"
    """Chart nvidia-device-plugin (addons.gpu_plugin nvidia-device-plugin)."""
    gpu_operator: str = "v25.3.0"
    """Chart gpu-operator (addons.gpu_plugin gpu-operator)."""
    dcgm_exporter: str = "4.1.1"
    """Chart dcgm-exporter (observability.dcgm_exporter)."""
    keda: str = "2.19.0"
    """Chart keda (addons.autoscaler keda). 2.19 is tested on Kubernetes 1.32-1.34 (2.17: 1.30-1.32), and its
    CRDs are the ones the schema check covers (tools/crd-schemas)."""
    kube_prometheus_stack: str = "75.6.1"
    """Chart kube-prometheus-stack: Prometheus, its operator and Grafana (observability.prometheus)."""
    prometheus_adapter: str = "4.14.1"
    """Chart prometheus-adapter (addons.autoscaler hpa)."""
    aws_load_balancer_controller: str = "1.13.3"
    """Chart aws-load-balancer-controller (target eks with gateway.ingress alb)."""
    cluster_autoscaler: str = "9.46.6"
    """Chart cluster-autoscaler (target eks with cluster.node_provisioner managed)."""
    karpenter: str = "1.6.0"
    """Chart karpenter, from oci://public.ecr.aws/karpenter (target eks with cluster.node_provisioner karpenter)."""
    lws: str = "0.8.0"
    """Chart lws, from oci://registry.k8s.io/lws/charts: the LeaderWorkerSet controller and CRD (models whose
    replica spans nodes); the rendered LeaderWorkerSets are checked against this release's API."""
    aws_efa_k8s_device_plugin: str = "0.5.10"
    """Chart aws-efa-k8s-device-plugin, from https://aws.github.io/eks-charts (target eks, pools with EFA): advertises
    vpc.amazonaws.com/efa on the nodes it supports (its supportedInstanceLabels)."""
    envoy_gateway: str = "v1.4.2"
    """Chart gateway-helm, from oci://docker.io/envoyproxy: Envoy Gateway and the Gateway API CRDs it ships
    (gateway.ingress gateway-api with gateway.gateway_api envoy-gateway)."""

    @field_validator("*")
    @classmethod
    def _exact(cls, value: str) -> str:
        if not re.fullmatch(r"v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", value):
            raise ValueError(
                f"chart version {value!r} is not an exact version; write e.g. '2.17.1' (no ranges)"
            )
        return value


class AddonsSpec(_Spec):
    """Cluster add-ons installed with Helm at pinned versions, and how engines are autoscaled."""

    autoscaler: Autoscaler = Autoscaler.KEDA
    """keda (ScaledObjects; scale to zero) or hpa (autoscaling/v2 through prometheus-adapter rules)."""
    gpu_plugin: GpuPlugin = GpuPlugin.DEVICE_PLUGIN
    """How GPUs become schedulable: the NVIDIA device plugin, the GPU operator, or none (already there)."""
    install_keda: bool = True
    """Install KEDA (autoscaler keda); false when the cluster already runs it."""
    install_prometheus_stack: bool = True
    """Install kube-prometheus-stack (observability.prometheus); false when the cluster already runs it."""
    install_prometheus_adapter: bool = True
    """Install prometheus-adapter (autoscaler hpa)."""
    install_aws_load_balancer_controller: bool = True
    """Install the AWS Load Balancer Controller (target eks with ingress alb)."""
    install_cluster_autoscaler: bool = True
    """Install the Cluster Autoscaler (target eks, managed node groups): GPU groups grow when engines are pending."""
    versions: ChartVersionsSpec = Field(default_factory=ChartVersionsSpec)
    """Exact Helm chart version of each add-on."""


class BatchSpec(_Spec):
    """The OpenAI Batch API on the gateway (``/v1/files``, ``/v1/batches``): offline work that fills the
    replicas' idle capacity at low priority, with the same API keys, scopes and rate limits as the router."""

    enabled: bool = False
    """Run the batch service (a StatefulSet with a volume for its state; on eks its files go to the platform's
    bucket under batches/, elsewhere to the volume)."""
    storage_gib: Annotated[int, Field(ge=1, le=16_384)] = 20
    """The service's persistent volume: its state store (SQLite) and, where files do not go to S3, the files."""
    storage_class: str | None = None
    """StorageClass of the volume; None = the cluster's default."""
    max_file_mib: Annotated[int, Field(ge=1, le=512)] = 64
    """Largest batch input file an upload may carry, in MiB (the router holds an upload in memory)."""
    max_requests_per_batch: int = batches_field("max_requests_per_batch")
    max_inflight_per_replica: int = batches_field("max_inflight_per_replica")
    headroom_share: float = batches_field("headroom_share")
    stuck_after_minutes: Annotated[int, Field(ge=5, le=1440)] = 60
    """Alert when an unfinished batch has recorded no result for this long (no headroom for that long, or the
    service cannot reach the router)."""
    router_key_name: str = "batches"
    """With gateway.require_api_key: the name of the key (in gateway.api_keys_config_key's list) the service
    sends to the router; its scopes and rate limits bound all batch traffic."""
    image: PinnedImage = RUNTIME_IMAGES["batches"]
    """Batch service image, pinned by tag or digest (target kubernetes; eks runs its ECR push, by digest)."""
    cpu_cores: Annotated[float, Field(gt=0, le=16)] = 0.5
    """CPU request and limit of the service."""
    memory_gib: Annotated[float, Field(gt=0, le=64)] = 1.0
    """Memory request and limit of the service (an upload and a validated file are held in memory)."""


class BudgetSpec(_Spec):
    """Money: what the environment may cost."""

    monthly_usd_cap: Annotated[float, Field(gt=0)] | None = None
    """Projected monthly cost at max replicas must stay under this; None = no cap."""
    allow_spot_in_prod: bool = False
    """Let GPU pools use spot capacity where the policy pack otherwise refuses it (prod): interruptions are
    accepted."""
    expected_utilisation: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Share of a running replica's token capacity that is used on average (interactive load, plus batches
    filling idle time); `inferstack cost --compare` prices the tokens the stack serves at it."""
    allow_multi_node_spot: bool = False
    """Let a model whose replica spans nodes run on spot capacity: one interrupted node restarts the whole group,
    so the policy pack refuses it unless this says the risk is accepted."""


class ModelStoreSpec(_Spec):
    """The platform's model store: the S3 bucket every model's weights are prepared into once, by a Job, and
    loaded from by the engines. On eks it is the bucket the stack creates (cluster.model_bucket)."""

    prefix: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._/-]{0,100}[a-z0-9]$")] = "models"
    """Key prefix under which hub models are prepared: '<prefix>/<org>/<name>/<revision>/'."""
    bucket: str | None = None
    """Target kubernetes: an existing bucket of an S3-compatible store for the prepared weights (eks names its
    own with cluster.model_bucket)."""
    endpoint_url: str | None = None
    """Target kubernetes: the S3-compatible endpoint (e.g. 'http://minio.minio.svc:9000'); None: AWS S3."""
    reader_secret: str | None = None
    """Target kubernetes: Secret whose key 'credentials' is an AWS shared-credentials file of a key that may
    read the bucket (engines; mounted as a file, never environment variables); on eks, EKS Pod Identity."""
    writer_secret: str | None = None
    """Target kubernetes: the same for a key that may write the bucket (the preparation Jobs only)."""
    account_id: AwsAccount | None = None
    """AWS account that owns the store bucket (12 digits): every request carries it as the expected bucket
    owner, so a bucket of the same name in another account is refused. Must be the stack's account."""
    image: PinnedImage = "ghcr.io/inferstack/weights:0.1.0"
    """The weights image (preparation Job, cache fill, store check), pinned (target kubernetes without
    gateway.image_registry; eks, and a stack with gateway.image_registry, run the image they build from
    runtime/images/weights.Dockerfile, by digest)."""

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+(:\d+)?/?$", value):
            raise ValueError(f"{value!r} is not an endpoint URL; write e.g. 'http://minio.minio.svc:9000'")
        return value


class PlatformSpec(_Spec):
    """One environment of the platform: everything `pulumi up` creates."""

    name: DnsLabel = "inferstack"
    """Platform name: the prefix of its shared objects ('<name>-router', '<name>-alerts', ...) and, with
    environment, of the default cluster name and the image repositories."""
    environment: DnsLabel
    """dev, staging, prod, ... (labels, tags, policy enforcement)."""
    target: Target = Target.EKS
    """Where the stack runs: eks (an EKS cluster the stack creates on AWS), kubernetes (a cluster you bring,
    through Pulumi's default Kubernetes provider) or local (this machine, with `make local`)."""
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    """The cluster: region, Kubernetes version, namespace, network and access."""
    gpu_pools: list[GpuPoolSpec] = Field(default_factory=list)
    """Groups of identical GPU nodes; each GPU model runs on one (its pool, or the cheapest that fits)."""
    models: list[ModelSpec] = Field(min_length=1)
    """The models to serve (at least one)."""
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    """The router in front of the engines, its API keys and its ingress."""
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    """Scrape targets, alerts, dashboards and GPU metrics."""
    addons: AddonsSpec = Field(default_factory=AddonsSpec)
    """Cluster add-ons installed with Helm (GPU plugin, autoscalers, monitoring, load balancer controller)."""
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    """What the environment may cost, checked by the policy pack."""
    batch: BatchSpec = Field(default_factory=BatchSpec)
    """The OpenAI Batch API (/v1/files, /v1/batches), fed to the replicas' idle capacity."""
    model_store: ModelStoreSpec = Field(default_factory=ModelStoreSpec)
    """Where model weights are prepared once and engines load them from."""
    huggingface_token_config_key: str | None = None
    """Pulumi secret config key with a Hugging Face token (for gated models); only the preparation Jobs read it,
    never the engines."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Cost-allocation tags on every cloud resource."""

    @model_validator(mode="after")
    def _cross_section_rules(self) -> PlatformSpec:
        """The rules that read several sections (components/spec/rules.py), every problem of every rule at once."""
        from components.spec.rules import platform_problems  # noqa: PLC0415 - the rules read these models

        problems = platform_problems(self)
        if problems:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "value_error", "{problem}", {"problem": f"{p.path}: {p.message}"}
                        ),
                        loc=(),
                        input=None,
                    )
                    for p in problems
                ],
            )
        return self

    @property
    def cluster_name(self) -> str:
        return self.cluster.name or f"{self.name}-{self.environment}"

    def pool(self, name: str) -> GpuPoolSpec | None:
        return next((p for p in self.gpu_pools if p.name == name), None)


def spec_json_schema() -> dict[str, Any]:
    """JSON Schema of a whole stack file (`config: {inferstack:platform: ...}`), for editor completion."""
    platform = PlatformSpec.model_json_schema()
    defs = platform.pop("$defs", {})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "inferstack stack file",
        "type": "object",
        "properties": {
            "config": {
                "type": "object",
                "properties": {"inferstack:platform": platform},
                "required": ["inferstack:platform"],
            },
            "secretsprovider": {"type": "string"},
            "encryptedkey": {"type": "string"},
            "encryptionsalt": {"type": "string"},
        },
        "required": ["config"],
        "$defs": defs,
    }
