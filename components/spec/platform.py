"""The platform-wide sections (observability, addons, batch, budget, model_store) and ``PlatformSpec``, a whole
environment, whose validator runs the cross-section rules of ``rules`` (or leaves them to a caller that runs them
with its plan-time rules, ``RULES_LATER``); the stack file's JSON Schema."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from components.base.enums import Target
from components.base.problems import Problem
from components.spec.base import AwsAccount, DnsLabel, PinnedImage, _Spec
from components.spec.cluster import SECTIONS, ClusterSpec, ClusterSpecBase, EksClusterSpec, parse
from components.spec.gateway import RUNTIME_IMAGES, GatewaySpec
from components.spec.model import ModelSpec
from components.spec.pools import GpuPoolSpec
from runtime.config import batches_field


class TraceBackend(StrEnum):
    """Where the collector sends the traces: each takes OTLP/gRPC, so the difference is whose endpoint it is."""

    TEMPO = "tempo"
    JAEGER = "jaeger"
    OTLP = "otlp"  # any other OTLP/gRPC endpoint: an ADOT collector in front of CloudWatch/X-Ray on EKS, a vendor


class TracingSpec(_Spec):
    """OpenTelemetry traces from the gateway to the engines: the router, the picker, the batcher and the batch
    service make spans (``runtime.tracing``), vLLM engines make their own (``--otlp-traces-endpoint``), all export
    to an OpenTelemetry Collector the stack installs (its upstream Helm chart), which sends them to ``backend``."""

    enabled: bool = False
    """Install the collector and turn tracing on everywhere. Off: no collector, no exporter, no spans."""
    sample_ratio: Annotated[float, Field(ge=0, le=1)] = 0.01
    """Share of new traces kept, parent-based: a request arriving with a sampled W3C traceparent is kept whatever
    the ratio (so a client can ask for its request to be traced)."""
    capture_prompts: bool = False
    """Record each request's messages (first 4 KiB) on the router's span. Prompts are the users' data: off unless
    you mean it."""
    backend: TraceBackend = TraceBackend.TEMPO
    """tempo, jaeger or otlp (any OTLP/gRPC endpoint, e.g. an ADOT collector for X-Ray): shown in the plan."""
    endpoint: str | None = None
    """The backend's OTLP/gRPC endpoint, e.g. 'http://tempo.monitoring.svc:4317', 'http://jaeger-collector.tracing.svc:4317'
    or 'https://adot.example.internal:4317' (https: TLS). Required when enabled."""

    @field_validator("endpoint")
    @classmethod
    def _grpc_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[A-Za-z0-9.-]+:\d{1,5}$", value):
            raise ValueError(
                f"{value!r} is not an OTLP/gRPC endpoint; write scheme, host and port, e.g. 'http://tempo.monitoring.svc:4317'"
            )
        return value

    @model_validator(mode="after")
    def _endpoint_when_enabled(self) -> TracingSpec:
        if self.enabled and self.endpoint is None:
            raise ValueError(
                f"tracing is enabled with backend {self.backend.value} but has no endpoint; give the backend's "
                "OTLP/gRPC endpoint, e.g. 'http://tempo.monitoring.svc:4317'"
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
    tracing: TracingSpec = Field(default_factory=TracingSpec)
    """OpenTelemetry traces (off by default)."""
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
    metrics_server: str = "3.12.2"
    """Chart metrics-server, from https://kubernetes-sigs.github.io/metrics-server/: the resource metrics API
    (metrics.k8s.io) the router's CPU HorizontalPodAutoscaler reads (gateway.max_replicas above gateway.replicas)."""
    envoy_gateway: str = "v1.4.2"
    """Chart gateway-helm, from oci://docker.io/envoyproxy: Envoy Gateway and the Gateway API CRDs it ships
    (gateway.ingress gateway-api with gateway.gateway_api envoy-gateway)."""

    opentelemetry_collector: str = "0.170.0"
    """Chart opentelemetry-collector, from https://open-telemetry.github.io/opentelemetry-helm-charts
    (observability.tracing): the collector the runtime services and the engines export their spans to."""

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
    install_metrics_server: bool = True
    """Install metrics-server where the router autoscales on CPU (gateway.max_replicas above gateway.replicas):
    neither EKS nor most clusters serve the resource metrics API without it, and an HPA without them never
    scales. False when the cluster already serves metrics.k8s.io (EKS's metrics-server add-on, an existing
    install)."""
    versions: ChartVersionsSpec = Field(default_factory=ChartVersionsSpec)
    """Exact Helm chart version of each add-on."""


class BatchSpec(_Spec):
    """The OpenAI Batch API on the gateway (``/v1/files``, ``/v1/batches``): offline work that fills the
    replicas' idle capacity at low priority, with the same API keys, scopes and rate limits as the router."""

    enabled: bool = False
    """Run the batch service (a StatefulSet with a volume for its state; on eks its files go to a bucket of
    their own, cluster.batch_bucket, encrypted with a key of their own; elsewhere to the volume)."""
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
    sends to the router. The router believes the owner a batch line names from this key only, and charges
    the line to the owner's scopes and rate limits."""
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


CROSS_SECTION_RULES: list[Callable[[PlatformSpec], Iterable[Problem]]] = []
"""The rules that read several sections, in the order their problems are reported: ``components.spec.rules``
registers them (``@rule``), and the package imports that module, so they are here before any spec is validated."""


def platform_problems(spec: PlatformSpec) -> list[Problem]:
    """Every problem every cross-section rule finds."""
    return [problem for check in CROSS_SECTION_RULES for problem in check(spec)]


RULES_LATER = "inferstack.cross_section_rules_later"
"""A validation context key (``PlatformSpec.model_validate(raw, context={RULES_LATER: True})``): the caller runs the
cross-section rules (``platform_problems``) itself, with the plan-time rules, so a stack file with mistakes of
both kinds hears of all of them in one run (``components.core.stackfile``)."""


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
    cluster: ClusterSpec = Field(default_factory=EksClusterSpec)
    """The cluster: its name, Kubernetes version and namespace, and the target's own fields (on eks its region,
    network, API endpoint access and node provisioning); the target chooses which."""
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

    @field_validator("cluster", mode="wrap")
    @classmethod
    def _cluster_of_the_target(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> ClusterSpecBase | Any:
        """The target's section (``components.spec.cluster.parse``); with no valid target, left as given (the
        target's own error is reported)."""
        target = info.data.get("target")
        return parse(target, value) if target is not None else value

    @model_validator(mode="after")
    def _cross_section_rules(self, info: ValidationInfo) -> PlatformSpec:
        """The rules that read several sections (components/spec/rules.py), every problem of every rule at once;
        unless the caller runs them itself (``RULES_LATER``)."""
        if info.context and info.context.get(RULES_LATER):
            return self
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
    """JSON Schema of a whole stack file (`config: {inferstack:platform: ...}`), for editor completion. The
    cluster section is a union discriminated by the sibling ``target``: one ``if``/``then`` per target (an absent
    target is the default's), so an editor offers and checks exactly the target's cluster fields."""
    platform = PlatformSpec.model_json_schema()
    defs = platform.pop("$defs", {})
    default = PlatformSpec.model_fields["target"].default
    platform["allOf"] = [
        {
            "if": {
                "properties": {"target": {"const": target.value}},
                **({} if target is default else {"required": ["target"]}),
            },
            "then": {"properties": {"cluster": {"$ref": f"#/$defs/{section.__name__}"}}},
        }
        for target, section in SECTIONS.items()
    ]
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
