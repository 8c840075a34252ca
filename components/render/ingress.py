"""How traffic reaches the router: an Ingress of the cloud's load-balancer class, or a Gateway API Gateway
and HTTPRoute, or nothing but the router Service (``gateway.ingress``). Pure.

The load balancer's class and annotations are the cloud's (``Cloud.load_balancer_ingress``: on EKS an ALB
through the AWS Load Balancer Controller); the Gateway's class is the spec's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from components.core.cloud import Cloud, IngressClass
from components.render import addons, common, envoy
from components.render.common import Manifest
from components.render.runtime_config import lb_idle_timeout_s, runtime_config
from components.spec import GatewayApiImplementation, IngressKind, PlatformSpec

GATEWAY_API_VERSION = "gateway.networking.k8s.io/v1"
ENVOY_GATEWAY_API_VERSION = "gateway.envoyproxy.io/v1alpha1"
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
"""The label in-cluster Gateway implementations put on the proxy pods they run for a Gateway, in the Gateway's
namespace (GEP-1762; Istio does)."""
ENVOY_GATEWAY_NAME_LABEL = "gateway.envoyproxy.io/owning-gateway-name"
ENVOY_GATEWAY_NAMESPACE_LABEL = "gateway.envoyproxy.io/owning-gateway-namespace"
"""The labels Envoy Gateway puts on the Envoy proxies of a Gateway, which it runs in its own namespace."""


@dataclass(frozen=True)
class GatewayProxies:
    """Where the proxy pods of the stack's Gateway run and how they are labelled (they call the router)."""

    labels: dict[str, str]
    namespace: str | None = None
    """None: the stack's namespace."""
    listener_port: int = 80


ALB_INGRESS_CLASS = "alb"
ALB_SSL_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"


def alb_ingress(spec: PlatformSpec) -> IngressClass:
    """An internet-facing ALB, HTTPS only, sending to the router pods' IPs, with timeouts the router's: the AWS Load
    Balancer Controller's class, on EKS (which installs it) and on a cluster you bring to AWS (where you run it)."""
    router = runtime_config(spec).router
    # Streams may be quiet until the first token; the ALB must not cut them earlier than the router would,
    # and the router keeps client connections open longer than this (client_idle_timeout_s).
    idle_s = lb_idle_timeout_s()
    annotations = {
        "alb.ingress.kubernetes.io/scheme": "internet-facing",
        "alb.ingress.kubernetes.io/target-type": "ip",
        "alb.ingress.kubernetes.io/listen-ports": json.dumps([{"HTTPS": 443}]),
        "alb.ingress.kubernetes.io/ssl-policy": ALB_SSL_POLICY,
        "alb.ingress.kubernetes.io/backend-protocol": "HTTP",
        "alb.ingress.kubernetes.io/healthcheck-path": "/readyz",
        "alb.ingress.kubernetes.io/load-balancer-attributes": (
            f"idle_timeout.timeout_seconds={idle_s},routing.http.drop_invalid_header_fields.enabled=true"
        ),
        "alb.ingress.kubernetes.io/target-group-attributes": (
            f"deregistration_delay.timeout_seconds={router.drain_grace_s}"
        ),
    }
    return IngressClass(ALB_INGRESS_CLASS, annotations)


def ingress(spec: PlatformSpec, cloud: Cloud) -> Manifest:
    """An Ingress of the cloud's load-balancer class (``gateway.ingress: alb``) to the router Service."""
    load_balancer = cloud.load_balancer_ingress(spec)
    meta = common.metadata(spec, common.runtime_name(spec, common.ROUTER), common.ROUTER)
    meta["annotations"] = dict(load_balancer.annotations)
    backend = {"service": {"name": common.runtime_name(spec, common.ROUTER), "port": {"name": "http"}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": meta,
        "spec": {
            "ingressClassName": load_balancer.name,
            "rules": [
                {
                    "host": spec.gateway.hostname,
                    "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
                }
            ],
        },
    }


def gateway_name(spec: PlatformSpec) -> str:
    return f"{spec.name}-gateway"


def gateway_proxies(spec: PlatformSpec) -> GatewayProxies:
    """Envoy Gateway (installed by the stack) runs them in its namespace; an existing class, per GEP-1762, in
    ours."""
    port = gateway_listener_port(spec)
    if spec.gateway.gateway_api is GatewayApiImplementation.ENVOY_GATEWAY:
        labels = {
            ENVOY_GATEWAY_NAME_LABEL: gateway_name(spec),
            ENVOY_GATEWAY_NAMESPACE_LABEL: spec.cluster.namespace,
        }
        return GatewayProxies(labels, addons.ENVOY_GATEWAY_NAMESPACE, port)
    return GatewayProxies({GATEWAY_NAME_LABEL: gateway_name(spec)}, None, port)


def gateway_class(spec: PlatformSpec) -> Manifest:
    """The GatewayClass that hands the stack's Gateway to the Envoy Gateway it installs (cluster-scoped)."""
    meta = common.metadata(spec, spec.gateway.gateway_class, common.ROUTER)
    meta.pop("namespace")
    return {
        "apiVersion": GATEWAY_API_VERSION,
        "kind": "GatewayClass",
        "metadata": meta,
        "spec": {"controllerName": addons.ENVOY_GATEWAY_CONTROLLER},
    }


def gateway_api_note(spec: PlatformSpec) -> str | None:
    """What the plan says about the Gateway's implementation (ingress gateway-api only)."""
    g = spec.gateway
    if g.ingress is not IngressKind.GATEWAY_API:
        return None
    if g.gateway_api is GatewayApiImplementation.ENVOY_GATEWAY:
        return (
            f"ingress gateway-api: installs Envoy Gateway {spec.addons.versions.envoy_gateway} (chart gateway-helm, "
            f"with the Gateway API CRDs) and GatewayClass {g.gateway_class}"
        )
    return (
        f"ingress gateway-api: requires GatewayClass {g.gateway_class} and its implementation in the cluster "
        "(installs neither); `pulumi up` reads the class before creating the Gateway and stops if it is missing"
    )


def listener_name(spec: PlatformSpec) -> str:
    return "https" if spec.gateway.tls_secret_name else "http"


def gateway(spec: PlatformSpec) -> Manifest:
    g = spec.gateway
    listener: Manifest = {
        "name": listener_name(spec),
        "protocol": "HTTP",
        "port": 80,
        "allowedRoutes": {"namespaces": {"from": "Same"}},
    }
    if g.tls_secret_name:
        listener = {
            "name": listener_name(spec),
            "protocol": "HTTPS",
            "port": 443,
            "tls": {"mode": "Terminate", "certificateRefs": [{"kind": "Secret", "name": g.tls_secret_name}]},
            "allowedRoutes": {"namespaces": {"from": "Same"}},
        }
    if g.hostname:
        listener["hostname"] = g.hostname
    return {
        "apiVersion": GATEWAY_API_VERSION,
        "kind": "Gateway",
        "metadata": common.metadata(spec, gateway_name(spec), common.ROUTER),
        "spec": {"gatewayClassName": g.gateway_class, "listeners": [listener]},
    }


def head_limits_patch(spec: PlatformSpec, max_header_bytes: int, max_headers: int) -> Manifest:
    """Envoy Gateway's proxies hold a request head to the limits of the service behind them and refuse one past
    them with that service's 431 JSON, as the local Envoy does (``envoy.local_replies``). Without it, Envoy's
    default of 60 KiB lets a head the router or picker would refuse through, and answers a larger one with a
    plain-text 431 no OpenAI client can read. Envoy Gateway has no field for either (its ClientTrafficPolicy
    proposal was closed unmerged, envoyproxy/gateway#8825), so this is an ``EnvoyPatchPolicy`` on the listener
    it generates, named ``<namespace>/<gateway>/<listener>``, whose HTTP connection manager is the first filter
    of its default chain (HTTP) or of its one TLS chain (HTTPS): the shape of Envoy Gateway's own translator
    tests. The ext_proc filter of an InferencePool needs no skip here, unlike the local Envoy's: Envoy Gateway
    adds route filters disabled and enables them per route, and a head that never parsed matched no route.
    Envoy Gateway 1.5 brought listener names by port (off by default there): a patch naming a listener that
    no longer exists applies to nothing, so a bump of ``addons.versions.envoy_gateway`` must check the name
    (test_crd_schemas pins the chart to the version this was written for)."""
    chain = "filter_chains/0" if spec.gateway.tls_secret_name else "default_filter_chain"
    manager = f"/{chain}/filters/0/typed_config"
    listener = f"{spec.cluster.namespace}/{gateway_name(spec)}/{listener_name(spec)}"
    fields = {
        "max_request_headers_kb": envoy.headers_kb(max_header_bytes),
        "common_http_protocol_options/max_headers_count": max_headers,
        "local_reply_config": envoy.local_replies(max_header_bytes, max_headers),
    }
    patches = [
        {
            "type": "type.googleapis.com/envoy.config.listener.v3.Listener",
            "name": listener,
            "operation": {"op": "add", "path": f"{manager}/{field}", "value": value},
        }
        for field, value in fields.items()
    ]
    return {
        "apiVersion": ENVOY_GATEWAY_API_VERSION,
        "kind": "EnvoyPatchPolicy",
        "metadata": common.metadata(spec, f"{gateway_name(spec)}-head-limits", common.ROUTER),
        "spec": {
            "targetRef": {
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": gateway_name(spec),
            },
            "type": "JSONPatch",
            "jsonPatches": patches,
        },
    }


def gateway_objects(spec: PlatformSpec, max_header_bytes: int, max_headers: int) -> list[Manifest]:
    """The Gateway, with what the stack installs around it when it installs Envoy Gateway: the GatewayClass and
    the request head limits of the service behind it (``max_header_bytes``, ``max_headers``)."""
    if spec.gateway.gateway_api is not GatewayApiImplementation.ENVOY_GATEWAY:
        return [gateway(spec)]
    return [gateway_class(spec), gateway(spec), head_limits_patch(spec, max_header_bytes, max_headers)]


def public_url(spec: PlatformSpec) -> str:
    """Where clients reach the gateway: the ingress host, or the router Service inside the cluster."""
    g = spec.gateway
    if g.ingress is not IngressKind.NONE and g.hostname:
        secure = g.ingress is IngressKind.ALB or bool(g.tls_secret_name)  # the ALB listens on HTTPS only
        return f"{'https' if secure else 'http'}://{g.hostname}"
    service = common.runtime_name(spec, common.ROUTER)
    return f"http://{service}.{spec.cluster.namespace}.svc:{runtime_config(spec).router.port}"


def gateway_listener_port(spec: PlatformSpec) -> int:
    return 443 if spec.gateway.tls_secret_name else 80


def http_route(spec: PlatformSpec) -> Manifest:
    route: Manifest = {
        "parentRefs": [{"name": gateway_name(spec)}],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {
                        "name": common.runtime_name(spec, common.ROUTER),
                        "port": runtime_config(spec).router.port,
                    }
                ],
            }
        ],
    }
    if spec.gateway.hostname:
        route["hostnames"] = [spec.gateway.hostname]
    return {
        "apiVersion": GATEWAY_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": common.metadata(spec, common.runtime_name(spec, common.ROUTER), common.ROUTER),
        "spec": route,
    }


def render(spec: PlatformSpec, cloud: Cloud) -> list[Manifest]:
    """The objects ``gateway.ingress`` asks for, in apply order."""
    if spec.gateway.ingress is IngressKind.ALB:
        return [ingress(spec, cloud)]
    if spec.gateway.ingress is IngressKind.GATEWAY_API:
        router = runtime_config(spec).router
        return [*gateway_objects(spec, router.max_header_bytes, router.max_headers), http_route(spec)]
    return []
