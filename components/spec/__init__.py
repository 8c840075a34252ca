"""The platform spec: what a platform engineer writes in ``stacks/Pulumi.<env>.yaml``.

The one source of truth. Every knob is a documented field with a default and, where it has one, a unit
in its name. Structure and single-field rules live here (pydantic); rules that span sections live in
``components.spec.rules`` (all reported at once); rules that need the hardware catalog, the layout or the
target's cloud (fit, parallelism against a node's GPUs, pool placement, startup budgets, the model store's
buckets) are the plan-time rules of ``components.core.plan_rules``, reported with the same field paths and, for a
stack file, in the same run (``components.core.stackfile``).

One module per section of the stack file, so a section's models, defaults and rules read together:

- ``base``: the base model (``_Spec``), the shared patterns and annotated types (DNS labels, pinned images,
  hub commits, AWS accounts, CIDRs) and the source rules every section uses;
- ``cluster``: ``cluster``, one section per target (on eks: network, API endpoint access, log retention);
- ``pools``: ``gpu_pools`` (capacity reservations, GPU sharing);
- ``engine``: a model's ``engine`` and ``architecture`` (its rules ask the engine table's capabilities,
  ``runtime.engines``);
- ``versions``: a model's ``versions`` and ``rollout`` (canary, rollback, preparation Jobs);
- ``model``: ``models`` (weights, scaling, SLO, routing, GPU share, adapters);
- ``gateway``: ``gateway`` (mode, ingress, runtime images);
- ``platform``: ``observability``, ``addons``, ``batch``, ``budget``, ``model_store`` and ``PlatformSpec``
  itself, whose validator runs the cross-section rules of ``rules``; ``spec_json_schema``.

Each module imports only those before it (base, then cluster, pools, engine, versions, model, gateway,
platform; ``rules`` reads them all and registers each of its rules with platform, which runs them at
validation: this package imports it, so no spec is validated without them). This package re-exports every name,
so ``from components.spec import X`` is the way in.
"""

from __future__ import annotations

# The spec's plain enums, re-exported: they live in components.base.enums so the CLI starts without pydantic.
from components.base.enums import CapacityType as CapacityType
from components.base.enums import Device as Device
from components.base.enums import DType as DType
from components.base.enums import KvCacheDType as KvCacheDType
from components.base.enums import NodeProvisioner as NodeProvisioner
from components.base.enums import Quantization as Quantization
from components.base.enums import Target as Target
from components.spec import (
    rules as rules,  # registers the cross-section rules (``platform.CROSS_SECTION_RULES``)
)
from components.spec.base import (
    AUTO,
    AWS_ACCOUNT,
    DNS_LABEL,
    HF_REPO,
    HUB_COMMIT,
    MAX_EKS_CLUSTER_NAME,
    MAX_MODEL_NAME,
    MOVING_TAGS,
    PINNED_IMAGE,
    S3_URI,
    AwsAccount,
    Cidr,
    DnsLabel,
    HubCommit,
    Ipv4Cidr,
    PinnedImage,
    hub_commit,
    is_hub_source,
    is_local_path,
    is_pinned_revision,
    is_pinned_source,
)
from components.spec.cluster import (
    ANYWHERE_IPV4,
    CLOUDWATCH_RETENTION_DAYS,
    ApiAccess,
    ApiEndpointSpec,
    ClusterSpec,
    ClusterSpecBase,
    EksClusterSpec,
    KubernetesClusterSpec,
    LocalClusterSpec,
    eks_section,
)
from components.spec.engine import (
    ArchitectureSpec,
    EngineSpec,
    LoraSpec,
)
from components.spec.gateway import (
    ENVOY_GATEWAY_CLASS,
    IMAGE_REGISTRY,
    RUNTIME_IMAGES,
    GatewayApiImplementation,
    GatewayMode,
    GatewaySpec,
    IngressKind,
    PickerFailureMode,
)
from components.spec.model import (
    MIG_PROFILE,
    PREFILL_SUFFIX,
    AdapterSpec,
    DisaggregationSpec,
    GpuShareSpec,
    ModelSpec,
    PrefillRoleSpec,
    RoutingSpec,
    ScalingSpec,
    SloSpec,
    Transport,
    WeightsFetch,
    WeightsSpec,
    kv_transfer_refusal,
)
from components.spec.platform import (
    RULES_LATER,
    AddonsSpec,
    Autoscaler,
    BatchSpec,
    BudgetSpec,
    ChartVersionsSpec,
    GpuPlugin,
    ModelStoreSpec,
    ObservabilitySpec,
    PlatformSpec,
    TraceBackend,
    TracingSpec,
    spec_json_schema,
)
from components.spec.pools import (
    AVAILABILITY_ZONE,
    CAPACITY_RESERVATION_ID,
    CapacityReservationSpec,
    GpuPoolSpec,
    GpuSharing,
    ReservationKind,
)
from components.spec.versions import (
    CPU_QUANTIZE_FORMATS,
    LLMCOMPRESSOR_VERSION,
    PREPARATION_IMAGES,
    QUANTIZE_IMAGE,
    QUANTIZE_SCHEMES,
    CanarySpec,
    ModelVersionSpec,
    PreparationKind,
    PreparationSpec,
    RollbackRuleSpec,
    RolloutSpec,
)

__all__ = [
    "ANYWHERE_IPV4",
    "AUTO",
    "AVAILABILITY_ZONE",
    "AWS_ACCOUNT",
    "CAPACITY_RESERVATION_ID",
    "CLOUDWATCH_RETENTION_DAYS",
    "CPU_QUANTIZE_FORMATS",
    "DNS_LABEL",
    "ENVOY_GATEWAY_CLASS",
    "HF_REPO",
    "HUB_COMMIT",
    "IMAGE_REGISTRY",
    "LLMCOMPRESSOR_VERSION",
    "MAX_EKS_CLUSTER_NAME",
    "MAX_MODEL_NAME",
    "MIG_PROFILE",
    "MOVING_TAGS",
    "PINNED_IMAGE",
    "PREFILL_SUFFIX",
    "PREPARATION_IMAGES",
    "QUANTIZE_IMAGE",
    "QUANTIZE_SCHEMES",
    "RULES_LATER",
    "RUNTIME_IMAGES",
    "S3_URI",
    "AdapterSpec",
    "AddonsSpec",
    "ApiAccess",
    "ApiEndpointSpec",
    "ArchitectureSpec",
    "Autoscaler",
    "AwsAccount",
    "BatchSpec",
    "BudgetSpec",
    "CanarySpec",
    "CapacityReservationSpec",
    "CapacityType",
    "ChartVersionsSpec",
    "Cidr",
    "ClusterSpec",
    "ClusterSpecBase",
    "DType",
    "Device",
    "DisaggregationSpec",
    "DnsLabel",
    "EksClusterSpec",
    "EngineSpec",
    "GatewayApiImplementation",
    "GatewayMode",
    "GatewaySpec",
    "GpuPlugin",
    "GpuPoolSpec",
    "GpuShareSpec",
    "GpuSharing",
    "HubCommit",
    "IngressKind",
    "Ipv4Cidr",
    "KubernetesClusterSpec",
    "KvCacheDType",
    "LocalClusterSpec",
    "LoraSpec",
    "ModelSpec",
    "ModelStoreSpec",
    "ModelVersionSpec",
    "NodeProvisioner",
    "ObservabilitySpec",
    "PickerFailureMode",
    "PinnedImage",
    "PlatformSpec",
    "PrefillRoleSpec",
    "PreparationKind",
    "PreparationSpec",
    "Quantization",
    "ReservationKind",
    "RollbackRuleSpec",
    "RolloutSpec",
    "RoutingSpec",
    "ScalingSpec",
    "SloSpec",
    "Target",
    "TraceBackend",
    "TracingSpec",
    "Transport",
    "WeightsFetch",
    "WeightsSpec",
    "eks_section",
    "hub_commit",
    "is_hub_source",
    "is_local_path",
    "is_pinned_revision",
    "is_pinned_source",
    "kv_transfer_refusal",
    "spec_json_schema",
]
