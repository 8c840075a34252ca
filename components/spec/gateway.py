"""The gateway section: the router (or the Inference Extension's endpoint picker) in front of the engines, its
ingress, API keys and shared rate limits, and the runtime images."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from components.spec.base import Cidr, PinnedImage, _Spec, every_problem
from runtime.config import Band, QueueOrder, Tenant


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
    FailOpen (the pool's replicas without a pick). The picker checks API keys, so FailOpen needs
    require_api_key false."""
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
    """Pulumi secret config key holding a YAML/JSON list of {name, key, models, requests_per_minute,
    tokens_per_minute, tenant} (stored hashed in the cluster). ``tenant`` names the entry of tenants whose share
    and band the key's requests take; without it a key is a tenant of its own, by its name."""
    tenants: list[Tenant] = Field(default_factory=list)
    """Tenants' weights and priority bands (interactive, standard, batch, best-effort) when a model's replicas are
    full: a waiting request of a higher band goes first; within a band the tenant served the fewest tokens
    (prompt + output, divided by its weight) goes next. A key of no listed tenant has weight 1 and
    default_band. A request may ask for a lower band (header x-inferstack-priority), never a higher one."""
    default_band: Band = Band.STANDARD
    """Band of the keys whose tenant is not listed in tenants (and of requests without a key)."""
    queue_order: QueueOrder = QueueOrder.FAIR
    """fair (bands, then tenants' token shares) or fifo (arrival order, every request alike)."""
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
    router_metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9091
    """The router's /metrics listener, apart from its API port (8080), which the ingress routes: the metrics name
    every replica's address, so only Prometheus may reach them (the network policy admits it alone)."""
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

    @property
    def runs_router(self) -> bool:
        """inferstack's router serves the API; else a Gateway API Inference Extension gateway does, asking the
        endpoint picker. The one place the rest of the code asks which."""
        return self.mode is GatewayMode.ROUTER

    @model_validator(mode="after")
    def _gateway_class_of_the_installed_implementation(self) -> GatewaySpec:
        if (
            self.gateway_api is GatewayApiImplementation.ENVOY_GATEWAY
            and "gateway_class" not in self.model_fields_set
        ):
            self.gateway_class = ENVOY_GATEWAY_CLASS
        return self

    @model_validator(mode="after")
    def _rules(self) -> GatewaySpec:
        """Each of the gateway's rules below runs, and a gateway with several mistakes hears of each."""
        every_problem(
            type(self).__name__,
            self._inference_extension,
            self._fail_open_keeps_no_keys,
            self._ingress_has_a_hostname,
            self._replicas_ordered,
            self._tenants_listed_once,
        )
        return self

    def _tenants_listed_once(self) -> GatewaySpec:
        names = [t.name for t in self.tenants]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"gateway.tenants: {', '.join(twice)} listed twice; list each tenant once")
        return self

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

    def _fail_open_keeps_no_keys(self) -> GatewaySpec:
        """The picker is what checks API keys behind the gateway: failing open past it serves anyone."""
        if self.picker_failure_mode is PickerFailureMode.FAIL_OPEN and self.require_api_key:
            raise ValueError(
                "gateway.picker_failure_mode FailOpen with gateway.require_api_key: the endpoint picker checks "
                "the API keys, and FailOpen sends requests to the engines without it whenever it cannot be "
                "reached, so any client without a key would be served then; set picker_failure_mode FailClose "
                "(an unreachable picker is a 503), or require_api_key false if the API is meant to be open"
            )
        return self

    def _ingress_has_a_hostname(self) -> GatewaySpec:
        if self.ingress is not IngressKind.NONE and not self.hostname:
            raise ValueError(
                f"ingress {self.ingress.value} needs a hostname (the ALB finds its certificate by it, "
                "the HTTPRoute matches it); set gateway.hostname, e.g. 'llm.example.com'"
            )
        return self

    def _replicas_ordered(self) -> GatewaySpec:
        if self.replicas > self.max_replicas:
            raise ValueError(
                f"replicas ({self.replicas}) is above max_replicas ({self.max_replicas}); "
                f"raise max_replicas to at least {self.replicas}"
            )
        return self
