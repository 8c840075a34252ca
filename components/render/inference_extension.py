"""``gateway.mode: inference-extension``: the Gateway API Inference Extension objects. Pure.

A gateway of the spec's class (Istio, kgateway, Envoy Gateway, GKE's) routes the OpenAI API; for each
request it asks inferstack's endpoint picker (``runtime.picker``: the router's scheduler over Envoy
ext_proc) which replica serves. Rendered here, with the API versions of the extension's v1.0 release
(2025-09):

- an ``InferencePool`` per model (``inference.networking.k8s.io/v1``): ``selector.matchLabels`` = the
  model's engine pods, ``targetPorts`` = the engine port, ``endpointPickerRef`` = the picker's Service and
  gRPC port, with ``failureMode`` (FailOpen | FailClose) from ``gateway.picker_failure_mode``;
- an ``InferenceObjective`` per model whose routing gives a priority
  (``inference.networking.x-k8s.io/v1alpha2``: ``priority``, ``poolRef``);
- the picker: ServiceAccount, a Role that may only read EndpointSlices (it discovers replicas the
  router's way), its Deployment (one replica: its prefix index is per process, like one router's) and a
  Service with the gRPC port (``appProtocol: kubernetes.io/h2c``, what gateways dial ext_proc with) and
  the metrics port;
- the ``Gateway`` of ``gateway.gateway_class`` and an ``HTTPRoute`` whose backends are the pools. With
  one model every request goes to its pool; with several, each rule matches ``x-gateway-model-name``
  (the header the extension's body-based router sets from the body's ``model``), which the gateway must
  then run in front (its install is the gateway implementation's: the plan's notes say so). With the Envoy
  Gateway the stack installs, its proxies hold request heads to the picker's limits
  (``ingress.head_limits_patch``).
"""

from __future__ import annotations

from typing import Any

from components.render import common, ingress
from components.render.common import Manifest
from components.spec import ModelSpec, PlatformSpec
from runtime.config import PickerSettings

POOL_API_GROUP = "inference.networking.k8s.io"
POOL_API_VERSION = f"{POOL_API_GROUP}/v1"
OBJECTIVE_API_VERSION = "inference.networking.x-k8s.io/v1alpha2"
MODEL_HEADER = "x-gateway-model-name"
PICKER = common.PICKER
PICKER_RESOURCES = (1.0, 1.0)  # cores, GiB: one decision costs what one router decision costs


def picker_settings() -> PickerSettings:
    return PickerSettings()


def pool_name(model: ModelSpec) -> str:
    return f"{model.name}-pool"


def inference_pool(spec: PlatformSpec, model: ModelSpec) -> Manifest:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": common.metadata(spec, pool_name(model), "engine"),
        "spec": {
            "selector": {"matchLabels": common.engine_selector(spec, model.name)},
            "targetPorts": [{"number": common.ENGINE_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": common.runtime_name(spec, PICKER),
                "port": {"number": picker_settings().port},
                "failureMode": spec.gateway.picker_failure_mode.value,
            },
        },
    }


def inference_objective(spec: PlatformSpec, model: ModelSpec) -> Manifest | None:
    if model.routing.priority is None:
        return None
    return {
        "apiVersion": OBJECTIVE_API_VERSION,
        "kind": "InferenceObjective",
        "metadata": common.metadata(spec, model.name, "engine"),
        "spec": {
            "priority": model.routing.priority,
            "poolRef": {"group": POOL_API_GROUP, "kind": "InferencePool", "name": pool_name(model)},
        },
    }


def http_route(spec: PlatformSpec) -> Manifest:
    """Requests to each model's pool (by the model header when the stack serves several)."""
    several = len(spec.models) > 1
    rules: list[Manifest] = []
    for model in spec.models:
        match: Manifest = {"path": {"type": "PathPrefix", "value": "/"}}
        if several:
            match["headers"] = [{"type": "Exact", "name": MODEL_HEADER, "value": model.name}]
        backend = {"group": POOL_API_GROUP, "kind": "InferencePool", "name": pool_name(model)}
        rules.append({"matches": [match], "backendRefs": [backend]})
    route: Manifest = {"parentRefs": [{"name": ingress.gateway_name(spec)}], "rules": rules}
    if spec.gateway.hostname:
        route["hostnames"] = [spec.gateway.hostname]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": common.metadata(spec, common.runtime_name(spec, "inference"), PICKER),
        "spec": route,
    }


def picker_service(spec: PlatformSpec) -> Manifest:
    s = picker_settings()
    name = common.runtime_name(spec, PICKER)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(spec, name, PICKER),
        "spec": {
            "type": "ClusterIP",
            "selector": common.selector(spec, name, PICKER),
            "ports": [
                {
                    "name": "grpc",
                    "port": s.port,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {"name": "http", "port": s.metrics_port, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    }


def with_grpc_port(deployment: Manifest) -> Manifest:
    """The picker's Deployment (rendered like every runtime service) plus its gRPC port."""
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    container["ports"] = [
        *container["ports"],
        {"name": "grpc", "containerPort": picker_settings().port, "protocol": "TCP"},
    ]
    return deployment


def routing(spec: PlatformSpec) -> list[Manifest]:
    """Pools, objectives, the Gateway and the route: what the gateway implementation acts on."""
    out: list[Manifest] = [inference_pool(spec, m) for m in spec.models]
    out += [o for m in spec.models if (o := inference_objective(spec, m)) is not None]
    picker = picker_settings()
    return [
        *out,
        *ingress.gateway_objects(spec, picker.max_header_bytes, picker.max_headers),
        http_route(spec),
    ]


def routing_note(spec: PlatformSpec) -> str | None:
    """What a reviewer must know about the gateway this mode relies on (a plan note)."""
    if len(spec.models) < 2:
        return None
    return (
        f"gateway: inference-extension with {len(spec.models)} models: the HTTPRoute sends each request to its "
        f"model's InferencePool by the {MODEL_HEADER} header, which the gateway sets from the body only when it "
        "runs the extension's body-based router in front of the route (install it with the gateway of class "
        f"{spec.gateway.gateway_class!r})"
    )
