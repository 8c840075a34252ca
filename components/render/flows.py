"""Who talks to whom in the stack's namespace, on which ports: the one table the NetworkPolicies come from. Pure.

Each flow is read off the part that makes the call, not written down twice:

- the runtime config: the router sends requests to every model's engine Service and to the batcher of embedding
  models, reads the health monitor's feed and forwards the Batch API to the batch service; the health monitor
  probes every model's replicas; the batcher sends batches to the engines of the models it batches for; the batch
  service sends its requests through the router, reads the health monitor's feed and, where the cloud keeps its
  files in an object store, reaches it over HTTPS with credentials from the cloud's endpoint;
- the runtime services' Roles: each watches EndpointSlices (and the health monitor lists pods), so each talks
  to the Kubernetes API, at the ``kubernetes`` Service's address and at the endpoints behind it;
- the ServiceMonitors: Prometheus scrapes what they select, on the port they name (the batch service's metrics
  listen apart from its API, which admits the router only);
- the ingress: the load balancer (or in-cluster clients) or the Gateway's proxies send requests to the router;
- shared limits and KV events (the runtime config too): the router reaches the rate-limit store (the managed one
  in the cluster network, or the in-cluster Redis, which reaches nothing), follows every precise_prefix engine's
  KV-event publisher and replay ports, and its init container fetches those models' tokenizers over HTTPS;
- the model store (``components.render.weights``): engines read it (their init container checks or fills from it,
  vLLM streams from it), never the hub; the preparation Jobs copy pinned revisions from the Hugging Face hub over
  HTTPS and write them into it. The store is S3 over HTTPS at public addresses, or the S3-compatible endpoint of
  ``model_store.endpoint_url`` (which may run in the cluster); credentials come from the cloud's endpoint (EKS Pod
  Identity's agent), never from the instance metadata service;
- every pod resolves names through kube-dns.

``components.render.network`` turns this table into policies; the tests check the policies against it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from components.core.cloud import Cloud
from components.core.placement import Layout
from components.render import (
    batches,
    common,
    gateway,
    inference_extension,
    ingress,
    limit_store,
    monitors,
    tracing,
    weights,
)
from components.render.runtime_config import batcher_port, health_port, router_port, runtime_config
from components.spec import PREFILL_SUFFIX, IngressKind, PlatformSpec
from runtime.config import RuntimeConfig

ANYWHERE = "0.0.0.0/0"
LINK_LOCAL = "169.254.0.0/16"
"""The instance metadata service (169.254.169.254) and the node-local agents: never reached over HTTPS."""
API_SERVER_PORTS = (443, 6443)
"""Where the API's endpoints listen: EKS's private endpoint on 443, a kubeadm or k3s server on 6443."""
HTTPS = 443
API_SERVICE_PORT = HTTPS
"""The ``kubernetes`` Service's port."""
DNS_PORT = 53
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
ENGINE = "engine"
WEIGHTS = weights.COMPONENT
"""The model store's preparation Jobs."""
GATEWAY_PROXY = "gateway-proxy"

Port = tuple[str, int]
"""(protocol, port)."""


def tcp(*ports: int) -> tuple[Port, ...]:
    return tuple(("TCP", p) for p in ports)


@dataclass(frozen=True)
class Peer:
    """One end of a flow, as a NetworkPolicy peer: pods (by labels, in a namespace), or address ranges."""

    name: str
    pods: Mapping[str, str] | None = None
    """Pod labels (empty: every pod); None for address ranges."""
    namespace: str | None = None
    """The pods' namespace; None: the stack's own."""
    outside: str | None = None
    """Pods in every namespace but this one (the stack's): ``namespace`` does not apply then."""
    cidrs: tuple[str, ...] = ()
    except_cidrs: tuple[str, ...] = ()
    includes_pods: bool = False
    """Address ranges that deliberately take in the namespace's own pods (the Kubernetes API's range is the pod
    network's; a Gateway listener open to the world is open to them too). Otherwise a range means the world
    outside the namespace's components, which reach each other only by the flows that name them."""

    def as_policy_peers(self) -> list[common.Manifest]:
        if self.pods is None:
            return [
                {"ipBlock": {"cidr": c, **({"except": list(self.except_cidrs)} if self.except_cidrs else {})}}
                for c in self.cidrs
            ]
        peer: common.Manifest = {}
        if self.outside is not None:
            not_ours = {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": [self.outside]}
            peer["namespaceSelector"] = {"matchExpressions": [not_ours]}
        elif self.namespace is not None:
            peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: self.namespace}}
        if self.pods or not peer:
            peer["podSelector"] = {"matchLabels": dict(self.pods)} if self.pods else {}
        return [peer]


@dataclass(frozen=True)
class Flow:
    source: Peer
    dest: Peer
    ports: tuple[Port, ...]
    """Empty: every port."""
    why: str = field(compare=False)


def component_labels(spec: PlatformSpec, component: str) -> dict[str, str]:
    """The labels every pod of one component carries (instance and component), whatever its name."""
    full = common.labels(spec, "x", component)
    return {k: full[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}


def component(spec: PlatformSpec, part: str) -> Peer:
    return Peer(part, pods=component_labels(spec, part))


def every_pod() -> Peer:
    return Peer("every pod", pods={})


def kube_dns() -> Peer:
    return Peer("kube-dns", pods={"k8s-app": "kube-dns"}, namespace="kube-system")


def prometheus(spec: PlatformSpec) -> Peer:
    return Peer("prometheus", pods={}, namespace=spec.observability.namespace)


API_SERVICE = "kubernetes-api-service"


def api_server(spec: PlatformSpec, cloud: Cloud) -> Peer:
    """The Kubernetes API's endpoints: EKS's private endpoint sits in the VPC; a cluster you bring's, in its node
    network."""
    return Peer("kubernetes-api", cidrs=tuple(cloud.cluster_network(spec)), includes_pods=True)


def api_service(spec: PlatformSpec) -> Peer | None:
    """The ``kubernetes`` Service's ClusterIP, which clients dial (in-cluster config reads it from
    KUBERNETES_SERVICE_HOST), where the cluster section knows it; None: not known (a cluster you bring without
    cluster.service_cidr), so the endpoints' private ranges must take it in.

    On EKS, vpc-cni's network policy agent checks a pod's egress at its veth, before kube-proxy translates the
    Service address, so an ``ipBlock`` of the endpoints never admits it: the policy controller adds a Service's
    ClusterIP only for peers chosen by pod selectors, and only for Services whose selector matches them
    (aws/amazon-network-policy-controller-k8s v1.1.7, pkg/resolvers/endpoints.go, getMatchingServiceClusterIPs:
    "unable to see the pod IP after the DNAT happens for the clusterIPs"); the ``kubernetes`` Service has no
    selector. Other CNIs check after the translation, so the endpoints stay admitted too (``api_server``)."""
    ip = spec.cluster.api_service_ip
    return Peer(API_SERVICE, cidrs=(f"{ip}/32",), includes_pods=True) if ip else None


def service_ranges(spec: PlatformSpec) -> tuple[str, ...]:
    """The cluster's Service range where the section knows it: virtual addresses inside the cluster, never the
    public internet's."""
    cidr = spec.cluster.service_range
    return (cidr,) if cidr else ()


def router_source_cidrs(spec: PlatformSpec, cloud: Cloud) -> list[str]:
    """Where requests to the router come from: the load balancer's addresses in the cluster network, unless set."""
    if spec.gateway.ingress_source_cidrs is not None:
        return list(spec.gateway.ingress_source_cidrs)
    return cloud.cluster_network(spec)


def gateway_proxies(spec: PlatformSpec) -> Peer:
    where = ingress.gateway_proxies(spec)
    return Peer(GATEWAY_PROXY, pods=where.labels, namespace=where.namespace)


def gateway_proxies_in_namespace(spec: PlatformSpec) -> bool:
    return spec.gateway.ingress is IngressKind.GATEWAY_API and ingress.gateway_proxies(spec).namespace is None


GROUP_PREFIX = "group:"
"""Subjects named ``group:<model>``: the pods of one model whose replica spans nodes."""


def group_models(spec: PlatformSpec, layout: Layout) -> list[str]:
    """Models whose replica spans nodes (by the stack's placement, ``layout``), in stack-file order."""
    return [m.name for m in spec.models if layout.placements[m.name].multi_node]


def group_peer(spec: PlatformSpec, model: str) -> Peer:
    return Peer(f"{model} group", pods={**component_labels(spec, ENGINE), common.MODEL_LABEL: model})


PD_PREFIX = "pd:"
"""Subjects named ``pd:<unit>``: the engine pods of one role of a disaggregated model (its decode unit, named as the
model, or its prefill unit)."""


def pd_pairs(spec: PlatformSpec) -> list[tuple[str, str]]:
    """(decode unit, prefill unit) of each disaggregated model, in stack-file order (the declared spec or the
    served one alike)."""
    return [
        (m.name, f"{m.name}{PREFILL_SUFFIX}")
        for m in spec.models
        if m.disaggregation is not None and m.pd_role != "prefill"
    ]


def in_cluster_limit_store(spec: PlatformSpec, cloud: Cloud) -> bool:
    """The shared rate-limit store runs as pods of the namespace (a cluster you bring), not as a managed one."""
    return spec.gateway.shared_limits and not cloud.managed_limit_store


def subjects(spec: PlatformSpec, cloud: Cloud, layout: Layout) -> list[str]:
    """The components of the stack's namespace that get a policy of their own, in apply order."""
    out = [ENGINE, WEIGHTS, *(GROUP_PREFIX + m for m in group_models(spec, layout))]
    out += [PD_PREFIX + unit for pair in pd_pairs(spec) for unit in pair]
    out += gateway.parts(spec)
    out += batches.parts(spec)
    out += [GATEWAY_PROXY] if gateway_proxies_in_namespace(spec) else []
    return out + ([limit_store.STORE] if in_cluster_limit_store(spec, cloud) else [])


def subject(spec: PlatformSpec, name: str) -> Peer:
    if name.startswith(GROUP_PREFIX):
        return group_peer(spec, name.removeprefix(GROUP_PREFIX))
    if name.startswith(PD_PREFIX):
        unit = name.removeprefix(PD_PREFIX)
        return Peer(f"{unit} engines", pods={**component_labels(spec, ENGINE), common.MODEL_LABEL: unit})
    return gateway_proxies(spec) if name == GATEWAY_PROXY else component(spec, name)


def _limit_store(spec: PlatformSpec, cloud: Cloud) -> Peer:
    """The managed store sits in the cluster network (its address is known only once it exists); else the pods."""
    if cloud.managed_limit_store:
        return Peer("managed rate-limit store", cidrs=tuple(cloud.cluster_network(spec)), includes_pods=True)
    return component(spec, limit_store.STORE)


def _port_of(url: object) -> int:
    port = urlsplit(str(url)).port
    if port is None:
        raise ValueError(f"runtime config URL {url!r} names no port")
    return port


def _runtime_flows(spec: PlatformSpec, cloud: Cloud) -> list[Flow]:
    """The runtime services' calls, read from the config they run with and the Roles they hold."""
    config = runtime_config(spec, files=cloud.batch_files(spec))
    engine, router = component(spec, ENGINE), component(spec, common.ROUTER)
    health = component(spec, common.HEALTH)
    # behind an inference-extension gateway the picker reads the fleet the router's way (and sends nothing)
    picked = not spec.gateway.runs_router
    front_name = inference_extension.PICKER if picked else common.ROUTER
    front = component(spec, front_name)
    out: list[Flow] = []
    if any(m.discovery is not None for m in config.models):
        why = (
            "the picker probes replicas while the feed is away"
            if picked
            else "the router proxies requests to every replica"
        )
        out.append(Flow(front, engine, tcp(common.ENGINE_PORT), why))
        out.append(
            Flow(health, engine, tcp(common.ENGINE_PORT), "the health monitor probes and scrapes replicas")
        )
    if config.router.health_feed_url:
        port = _port_of(config.router.health_feed_url)
        out.append(Flow(front, health, tcp(port), f"the {front_name} reads the health monitor's feed"))
    batcher_urls = sorted({r.batcher_url for r in config.router.routes if r.batcher_url})
    if batcher_urls:
        batcher = component(spec, common.BATCHER)
        ports = tcp(*sorted({_port_of(u) for u in batcher_urls}))
        out.append(Flow(router, batcher, ports, "the router sends embedding requests to the batcher"))
        out.append(
            Flow(batcher, engine, tcp(common.ENGINE_PORT), "the batcher sends batches to the replicas")
        )
    out += _batch_flows(spec, cloud, config, router, health)
    event_ports = sorted(
        {
            p
            for m in config.models
            if m.kv_events and m.discovery
            for p in (m.kv_events.port, m.kv_events.replay_port)
        }
    )
    if event_ports:
        why = "every router replica follows the engines' KV-cache events (publisher and replay)"
        out.append(Flow(router, engine, tcp(*event_ports), why))
    if config.router.limit_store is not None:
        out.append(
            Flow(router, _limit_store(spec, cloud), tcp(limit_store.PORT), "the router's shared limits")
        )
    if any(m.kv_events for m in config.models):
        why = "the router's init container fetches the tokenizers of the models it follows KV events of"
        out.append(Flow(router, public_https(spec, cloud, "tokenizers over HTTPS"), tcp(HTTPS), why))
    api, service = api_server(spec, cloud), api_service(spec)
    for part in gateway.parts(spec):
        if gateway.role(spec, part)["rules"]:
            caller = component(spec, part)
            if service is not None:
                why = f"the {part} watches the API at the kubernetes Service's address"
                out.append(Flow(caller, service, tcp(API_SERVICE_PORT), why))
            why = f"the {part} watches the API (its endpoints, behind the kubernetes Service)"
            out.append(Flow(caller, api, tcp(*API_SERVER_PORTS), why))
    return out


def _batch_flows(
    spec: PlatformSpec, cloud: Cloud, config: RuntimeConfig, router: Peer, health: Peer
) -> list[Flow]:
    """The batch service's calls and the router's to it, read from the runtime config; files in the cloud's object
    store add HTTPS to public addresses and the cloud's credential endpoints (the engines' own)."""
    if config.batches is None:
        return []
    me = component(spec, batches.PART)
    out: list[Flow] = []
    if config.router.batches_url:
        port = tcp(_port_of(config.router.batches_url))
        out.append(
            Flow(router, me, port, "the router forwards /v1/files and /v1/batches to the batch service")
        )
    port = tcp(_port_of(config.batches.router_url))
    out.append(Flow(me, router, port, "the batch service sends its requests through the router"))
    if config.batches.health_feed_url:
        port = tcp(_port_of(config.batches.health_feed_url))
        out.append(
            Flow(me, health, port, "the batch service reads the replicas' headroom from the health monitor")
        )
    if config.batches.s3 is not None:
        out += [
            Flow(
                me, Peer(e.why.split(":", 1)[0], cidrs=(e.cidr,)), tcp(e.port), f"the batch service: {e.why}"
            )
            for e in cloud.credential_endpoints(spec)
        ]
        out.append(
            Flow(
                me,
                public_https(spec, cloud, "files over HTTPS"),
                tcp(HTTPS),
                "the batch service's files in S3",
            )
        )
    return out


def _scrape_flows(spec: PlatformSpec) -> list[Flow]:
    """Prometheus scrapes the components the ServiceMonitors select, on their Services' http ports (the router's
    and the batch service's on their metrics ports)."""
    if not spec.observability.prometheus:
        return []
    router_metrics = spec.gateway.router_metrics_port
    ports = {ENGINE: common.ENGINE_PORT, common.ROUTER: router_metrics, common.HEALTH: health_port()}
    ports[common.BATCHER] = batcher_port()
    ports[inference_extension.PICKER] = inference_extension.picker_settings().metrics_port
    ports[batches.PART] = batches.METRICS_PORT
    scraped: list[str] = []
    for monitor in monitors.render(spec):
        selector = monitor["spec"]["selector"]
        labelled = selector.get("matchLabels", {}).get("app.kubernetes.io/component")
        listed = [v for e in selector.get("matchExpressions", []) for v in e["values"]]
        scraped += [c for c in [labelled, *listed] if c and c not in scraped]
    return [
        Flow(prometheus(spec), component(spec, c), tcp(ports[c]), f"Prometheus scrapes the {c}'s metrics")
        for c in scraped
    ]


def _ingress_flows(spec: PlatformSpec, cloud: Cloud) -> list[Flow]:
    router = component(spec, common.ROUTER)
    port = tcp(router_port())
    if spec.gateway.ingress is not IngressKind.GATEWAY_API:
        sources = tuple(router_source_cidrs(spec, cloud))
        clients = Peer("load balancer and in-cluster clients", cidrs=sources, includes_pods=True)
        return [Flow(clients, router, port, "requests from the load balancer (or clients in the cluster)")]
    proxies = gateway_proxies(spec)
    if not spec.gateway.runs_router:
        picker = component(spec, inference_extension.PICKER)
        ext_proc = tcp(inference_extension.picker_settings().port)
        out = [
            Flow(
                proxies, picker, ext_proc, "the Gateway's proxies ask the picker for each request's replica"
            ),
            Flow(
                proxies, component(spec, ENGINE), tcp(common.ENGINE_PORT), "and send it to the replica picked"
            ),
        ]
    else:
        out = [Flow(proxies, router, port, "the Gateway's proxies send requests to the router")]
    if gateway_proxies_in_namespace(spec):
        listener = tcp(ingress.gateway_listener_port(spec))
        world = Peer("internet", cidrs=(ANYWHERE,), includes_pods=True)
        out.append(Flow(world, proxies, listener, "clients reach the Gateway"))
        # The implementation's control plane (istiod, ...) lives in a namespace of its own, on ports it picks.
        control = Peer("gateway control plane", pods={}, outside=spec.cluster.namespace)
        out.append(Flow(proxies, control, (), "the proxies fetch their configuration"))
    return out


def _group_flows(spec: PlatformSpec, layout: Layout) -> list[Flow]:
    """The engine picks its ports: the rendezvous (vLLM's master port, SGLang's dist-init port), then ZMQ queues
    and NCCL's sockets on ephemeral ones. Only the pods of the same model's groups."""
    out: list[Flow] = []
    for model in group_models(spec, layout):
        group = group_peer(spec, model)
        out.append(
            Flow(group, group, (), "the nodes of a multi-node replica talk to each other (rendezvous, NCCL)")
        )
    return out


def _pd_flows(spec: PlatformSpec) -> list[Flow]:
    """A disaggregated model's decode engines pull the prefill engines' KV (NixlConnector): the handshake on the
    prefill engine's side channel, then UCX or libfabric connections on ports the transport picks, in both
    directions (the decode's reads, the prefill's notifications). Only between the two roles of one model."""
    out: list[Flow] = []
    for decode, prefill in pd_pairs(spec):
        d, p = subject(spec, PD_PREFIX + decode), subject(spec, PD_PREFIX + prefill)
        out.append(Flow(d, p, (), "a decode engine pulls its prefill engine's KV cache"))
        out.append(Flow(p, d, (), "a prefill engine notifies the decode engine that pulled its KV cache"))
    return out


def public_https(spec: PlatformSpec, cloud: Cloud, name: str) -> Peer:
    """HTTPS at public addresses only: nothing in the cluster network (the Gateway's listener, the API), none of the
    cluster's Service addresses (the API's among them) and nothing link-local. S3 is reached at its public addresses
    (a gateway endpoint keeps them), not an interface one."""
    private = tuple(cloud.cluster_network(spec))
    services = tuple(c for c in service_ranges(spec) if not _within(c, private))
    return Peer(name, cidrs=(ANYWHERE,), except_cidrs=(*private, *services, LINK_LOCAL))


def _within(cidr: str, ranges: tuple[str, ...]) -> bool:
    network = ipaddress.IPv4Network(cidr)
    return any(network.subnet_of(ipaddress.IPv4Network(r)) for r in ranges)


def model_store(spec: PlatformSpec, cloud: Cloud) -> tuple[Peer, tuple[Port, ...]]:
    """The model store and its port: S3 over HTTPS, or the S3-compatible endpoint, wherever it runs (an in-cluster
    MinIO is in the cluster network, so its range takes in pods; never link-local)."""
    endpoint = spec.model_store.endpoint_url
    if endpoint is None:
        return public_https(spec, cloud, "the model store (S3) over HTTPS"), tcp(HTTPS)
    peer = Peer(
        f"the model store at {urlsplit(endpoint).hostname}",
        cidrs=(ANYWHERE,),
        except_cidrs=(LINK_LOCAL,),
        includes_pods=True,
    )
    return peer, tcp(weights.store_port(spec))


def _weights_flows(spec: PlatformSpec, cloud: Cloud) -> list[Flow]:
    """Engines read the model store; the preparation Jobs copy from the hub into it. Both get their store
    credentials from the cloud's endpoint where it has one."""
    engine, jobs = component(spec, ENGINE), component(spec, WEIGHTS)
    store, store_ports = model_store(spec, cloud)
    out: list[Flow] = []
    for who, part in ((engine, "engines"), (jobs, "preparation Jobs")):
        out += [
            Flow(who, Peer(e.why.split(":", 1)[0], cidrs=(e.cidr,)), tcp(e.port), f"{part}: {e.why}")
            for e in cloud.credential_endpoints(spec)
        ]
    adapters = ", and fetch their LoRA adapters" if any(m.adapters for m in spec.models) else ""
    out.append(
        Flow(
            engine,
            store,
            store_ports,
            f"engines check the store, fill a node cache or stream from it{adapters}",
        )
    )
    hub_adapters = any(a.is_hub for m in spec.models for a in m.adapters)
    # A version's preparation (components.core.lifecycle) reads its source from the store and its calibration data
    # from the hub.
    prepared = any(m.prepared_by for m in spec.models)
    if any(m.is_hub for m in spec.models) or hub_adapters or prepared:
        hub = public_https(spec, cloud, "the Hugging Face hub over HTTPS")
        what = "pinned revisions (models and LoRA adapters)" if hub_adapters else "pinned revisions"
        if prepared:
            what += " and calibration data"
        out.append(Flow(jobs, hub, tcp(HTTPS), f"preparation Jobs copy {what} from the hub"))
    out.append(Flow(jobs, store, store_ports, "preparation Jobs write (or verify) the model store"))
    return out


def _trace_flows(spec: PlatformSpec, layout: Layout) -> list[Flow]:
    """Spans to the OpenTelemetry Collector (observability.tracing), on its OTLP/gRPC port: from the runtime
    services that trace (not the health monitor) and from the engines (vLLM's own tracing), groups' too."""
    if not tracing.enabled(spec):
        return []
    collector = Peer(
        "the OpenTelemetry Collector", pods=tracing.POD_LABELS, namespace=tracing.namespace(spec)
    )
    senders = [ENGINE, *(GROUP_PREFIX + m for m in group_models(spec, layout))]
    senders += [p for p in [*gateway.parts(spec), *batches.parts(spec)] if p != common.HEALTH]
    return [
        Flow(subject(spec, s), collector, tcp(tracing.OTLP_GRPC_PORT), f"the {s} exports its spans")
        for s in senders
    ]


def flows(spec: PlatformSpec, cloud: Cloud, layout: Layout) -> list[Flow]:
    """Every flow the stack's namespace allows, DNS first (``layout``: the stack's placement, which says whose
    replicas span nodes)."""
    dns = Flow(every_pod(), kube_dns(), (("UDP", DNS_PORT), ("TCP", DNS_PORT)), "every pod resolves names")
    return [
        dns,
        *_runtime_flows(spec, cloud),
        *_scrape_flows(spec),
        *_ingress_flows(spec, cloud),
        *_weights_flows(spec, cloud),
        *_group_flows(spec, layout),
        *_pd_flows(spec),
        *_trace_flows(spec, layout),
    ]
