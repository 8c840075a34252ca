"""How traffic reaches the router: an Ingress of the cloud's load-balancer class, or a Gateway API Gateway
and HTTPRoute, or nothing but the router Service (``gateway.ingress``). Pure.

The load balancer's class and annotations are the cloud's (``Cloud.load_balancer_ingress``: on EKS an ALB
through the AWS Load Balancer Controller); the Gateway's class is the spec's.
"""

from __future__ import annotations

from components.cloud import Cloud
from components.render import common
from components.render.common import Manifest
from components.render.runtime_config import runtime_config
from components.spec import IngressKind, PlatformSpec

GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
"""Label Gateway API implementations (Istio, Envoy Gateway) put on the proxy pods of a Gateway."""


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


def gateway(spec: PlatformSpec) -> Manifest:
    g = spec.gateway
    listener: Manifest = {
        "name": "http",
        "protocol": "HTTP",
        "port": 80,
        "allowedRoutes": {"namespaces": {"from": "Same"}},
    }
    if g.tls_secret_name:
        listener = {
            "name": "https",
            "protocol": "HTTPS",
            "port": 443,
            "tls": {"mode": "Terminate", "certificateRefs": [{"kind": "Secret", "name": g.tls_secret_name}]},
            "allowedRoutes": {"namespaces": {"from": "Same"}},
        }
    if g.hostname:
        listener["hostname"] = g.hostname
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": common.metadata(spec, gateway_name(spec), common.ROUTER),
        "spec": {"gatewayClassName": g.gateway_class, "listeners": [listener]},
    }


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
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": common.metadata(spec, common.runtime_name(spec, common.ROUTER), common.ROUTER),
        "spec": route,
    }


def render(spec: PlatformSpec, cloud: Cloud) -> list[Manifest]:
    """The objects ``gateway.ingress`` asks for, in apply order."""
    if spec.gateway.ingress is IngressKind.ALB:
        return [ingress(spec, cloud)]
    if spec.gateway.ingress is IngressKind.GATEWAY_API:
        return [gateway(spec), http_route(spec)]
    return []
