"""NetworkPolicies: deny by default, then exactly the flows the platform needs. Pure.

- Everything in the namespace: no traffic in or out, except DNS to kube-dns.
- Engines: reached only by the router, the health monitor, the batcher and Prometheus; may reach HTTPS
  (model weights from the Hugging Face hub or S3).
- Router: reached only from the ingress (the load balancer's addresses in the cluster network, or the
  Gateway's proxy pods) and Prometheus; reaches engines, the health monitor, the batcher and the Kubernetes API.

Where the cluster network is (the VPC, or just the private ranges) is the cloud's answer
(``Cloud.cluster_network``).
- Health monitor and batcher: reached by the router and Prometheus; reach engines and the Kubernetes API.
"""

from __future__ import annotations

from components.cloud import Cloud
from components.render import common, limit_store, tokenizers
from components.render.common import Manifest
from components.render.gateway import parts
from components.render.ingress import GATEWAY_NAME_LABEL, gateway_listener_port, gateway_name
from components.render.runtime_config import batcher_port, health_port, router_port
from components.spec import IngressKind, PlatformSpec
from runtime.config import KvEventsSource

API_SERVER_PORTS = (443, 6443)
ANYWHERE = "0.0.0.0/0"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def _policy(spec: PlatformSpec, name: str, pod_selector: dict[str, str], body: Manifest) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": common.metadata(spec, name, "network-policy"),
        "spec": {"podSelector": {"matchLabels": pod_selector} if pod_selector else {}, **body},
    }


def _tcp(*ports: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def _instance(spec: PlatformSpec, component: str) -> dict[str, str]:
    full = common.labels(spec, "x", component)
    return {k: full[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}


def _pods(spec: PlatformSpec, component: str) -> Manifest:
    return {"podSelector": {"matchLabels": _instance(spec, component)}}


def _prometheus(spec: PlatformSpec) -> Manifest:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: spec.observability.namespace}}}


def router_source_cidrs(spec: PlatformSpec, cloud: Cloud) -> list[str]:
    """Where requests to the router come from: the load balancer's addresses in the cluster network, unless set."""
    if spec.gateway.ingress_source_cidrs is not None:
        return list(spec.gateway.ingress_source_cidrs)
    return cloud.cluster_network(spec)


def _api_server(spec: PlatformSpec, cloud: Cloud) -> Manifest:
    """The Kubernetes API: EKS private endpoint ENIs sit in the VPC; kind's in the node network."""
    cidrs = cloud.cluster_network(spec)
    return {"to": [{"ipBlock": {"cidr": c}} for c in cidrs], "ports": _tcp(*API_SERVER_PORTS)}


def default_deny(spec: PlatformSpec) -> Manifest:
    return _policy(spec, "default-deny", {}, {"policyTypes": ["Ingress", "Egress"]})


def allow_dns(spec: PlatformSpec) -> Manifest:
    dns = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    ports = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    return _policy(
        spec, "allow-dns", {}, {"policyTypes": ["Egress"], "egress": [{"to": [dns], "ports": ports}]}
    )


def kv_event_ports(spec: PlatformSpec) -> list[int]:
    """The engines' KV-event publisher and replay ports, when a model's routing follows them."""
    if not any(m.publishes_kv_events for m in spec.models):
        return []
    source = KvEventsSource.model_fields
    return [source["port"].default, source["replay_port"].default]


def engines(spec: PlatformSpec) -> Manifest:
    callers = [_pods(spec, part) for part in parts(spec)]
    ingress = [
        {"from": callers, "ports": _tcp(common.ENGINE_PORT)},
        {"from": [_prometheus(spec)], "ports": _tcp(common.ENGINE_PORT)},
    ]
    if kv_event_ports(spec):  # every router replica follows every engine's KV events
        ingress.append({"from": [_pods(spec, common.ROUTER)], "ports": _tcp(*kv_event_ports(spec))})
    return _policy(
        spec,
        "engines",
        _instance(spec, "engine"),
        {
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            # Weights come from the Hugging Face hub or S3 over HTTPS.
            "egress": [{"to": [{"ipBlock": {"cidr": ANYWHERE}}], "ports": _tcp(443)}],
        },
    )


def _router_sources(spec: PlatformSpec, cloud: Cloud) -> list[Manifest]:
    if spec.gateway.ingress is IngressKind.GATEWAY_API:
        return [{"podSelector": {"matchLabels": {GATEWAY_NAME_LABEL: gateway_name(spec)}}}]
    return [{"ipBlock": {"cidr": c}} for c in router_source_cidrs(spec, cloud)]


def _limit_store(spec: PlatformSpec, cloud: Cloud) -> list[Manifest]:
    """The router's way to the shared rate-limit store: the managed one in the cluster network, or the pods."""
    if not spec.gateway.shared_limits:
        return []
    if cloud.managed_limit_store:
        to = [{"ipBlock": {"cidr": c}} for c in cloud.cluster_network(spec)]
    else:
        to = [_pods(spec, limit_store.STORE)]
    return [{"to": to, "ports": _tcp(limit_store.PORT)}]


def router(spec: PlatformSpec, cloud: Cloud) -> Manifest:
    peers = [_pods(spec, "engine")]
    ports = [common.ENGINE_PORT, health_port(), *kv_event_ports(spec)]
    if common.BATCHER in parts(spec):
        peers.append(_pods(spec, common.BATCHER))
        ports.append(batcher_port())
    peers += [_pods(spec, common.HEALTH)]
    egress = [{"to": peers, "ports": _tcp(*ports)}, _api_server(spec, cloud), *_limit_store(spec, cloud)]
    if tokenizers.models(spec):  # its init container fetches tokenizers from the Hugging Face hub
        egress.append({"to": [{"ipBlock": {"cidr": ANYWHERE}}], "ports": _tcp(443)})
    return _policy(
        spec,
        common.runtime_name(spec, common.ROUTER),
        _instance(spec, common.ROUTER),
        {
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": _router_sources(spec, cloud), "ports": _tcp(router_port())},
                {"from": [_prometheus(spec)], "ports": _tcp(router_port())},
            ],
            "egress": egress,
        },
    )


def limit_store_pods(spec: PlatformSpec) -> Manifest:
    """The in-cluster store: the router's pods reach it; it reaches nothing."""
    return _policy(
        spec,
        limit_store.name(spec),
        _instance(spec, limit_store.STORE),
        {
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [_pods(spec, common.ROUTER)], "ports": _tcp(limit_store.PORT)}],
        },
    )


def _backend_service(spec: PlatformSpec, cloud: Cloud, part: str, port: int) -> Manifest:
    return _policy(
        spec,
        common.runtime_name(spec, part),
        _instance(spec, part),
        {
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [_pods(spec, common.ROUTER)], "ports": _tcp(port)},
                {"from": [_prometheus(spec)], "ports": _tcp(port)},
            ],
            "egress": [
                {"to": [_pods(spec, "engine")], "ports": _tcp(common.ENGINE_PORT)},
                _api_server(spec, cloud),
            ],
        },
    )


def gateway_proxies(spec: PlatformSpec) -> Manifest:
    """The Gateway's proxy pods (created in this namespace by the Gateway API implementation)."""
    return _policy(
        spec,
        gateway_name(spec),
        {GATEWAY_NAME_LABEL: gateway_name(spec)},
        {
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [{"ipBlock": {"cidr": ANYWHERE}}], "ports": _tcp(gateway_listener_port(spec))}
            ],
            "egress": [
                {"to": [_pods(spec, common.ROUTER)], "ports": _tcp(router_port())},
                # The implementation's control plane (istiod, envoy-gateway) lives in its own namespace.
                {"to": [{"namespaceSelector": {}}]},
            ],
        },
    )


def render(spec: PlatformSpec, cloud: Cloud) -> list[Manifest]:
    out = [default_deny(spec), allow_dns(spec), engines(spec), router(spec, cloud)]
    out.append(_backend_service(spec, cloud, common.HEALTH, health_port()))
    if common.BATCHER in parts(spec):
        out.append(_backend_service(spec, cloud, common.BATCHER, batcher_port()))
    if spec.gateway.ingress is IngressKind.GATEWAY_API:
        out.append(gateway_proxies(spec))
    if spec.gateway.shared_limits and not cloud.managed_limit_store:
        out.append(limit_store_pods(spec))
    return out
