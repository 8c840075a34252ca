"""NetworkPolicies against the who-talks-to-whom table: every flow passes, nothing else does.

The table (``components.render.flows``) is read off the parts that talk (runtime config, Roles, ServiceMonitors,
ingress, the model store: engines read it, preparation Jobs copy from the hub into it, with their credentials). These tests take the NetworkPolicies the program registers, put
pods with the labels of the rendered workloads (and the callers around them) at addresses in the cluster network,
and try every pair on every port the table mentions and a few more: a missing rule (a flow that does not pass) or
an extra one (a connection no flow explains) fails.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cache
from typing import Any

import pytest

from components.clouds.aws import decisions
from components.clouds.aws.cloud import POD_IDENTITY_AGENT
from components.clouds.targets import cloud_for
from components.core.cloud import PRIVATE_CIDRS, Cloud
from components.core.placement import place
from components.core.stackfile import STACKS_DIR, available_stacks
from components.render import batches, common, flows, ingress, network
from components.spec import PlatformSpec, Target
from tests.components.helpers import SOME_COMMIT, minimal, on_own_cluster
from tests.components.netpol import Endpoint, allowed, expected
from tests.stacks import load, synthesized

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target is not Target.LOCAL]
IMDS = "169.254.169.254"
INTERNET = "52.216.8.10"  # an S3 address
EXTRA_PORTS = (22, 80, 443, 2379, 6443, 8000, 8080, 8081, 8082, 9000, 9090, 15012)
WORKLOADS = ("Deployment", "StatefulSet", "Job")


@cache
def _manifests(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(synthesized(name).kubernetes_manifests())


def _policies_of(manifests: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == "NetworkPolicy"]


def _pod_labels(
    manifests: list[dict[str, Any]] | tuple[dict[str, Any], ...], component: str
) -> dict[str, str]:
    """The labels of the rendered pods of one component (the first Deployment, StatefulSet or Job of it, else the
    leaders of the first LeaderWorkerSet); for a multi-node group's subject, its workers' (so a leader and a worker of one group
    are both tried)."""
    if component.startswith(flows.GROUP_PREFIX):
        model = component.removeprefix(flows.GROUP_PREFIX)
        for m in manifests:
            if m["kind"] == "LeaderWorkerSet" and m["metadata"]["labels"].get(common.MODEL_LABEL) == model:
                return dict(m["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"])
        raise AssertionError(f"no LeaderWorkerSet of {model}")
    for kinds in (WORKLOADS, ("LeaderWorkerSet",)):
        for m in manifests:
            if m["kind"] in kinds and m["metadata"]["labels"].get("app.kubernetes.io/component") == component:
                if m["kind"] == "LeaderWorkerSet":
                    return dict(m["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"])
                return dict(m["spec"]["template"]["metadata"]["labels"])
    raise AssertionError(f"no Deployment, StatefulSet, Job or LeaderWorkerSet of {component}")


def _endpoints(spec: PlatformSpec, cloud: Cloud, manifests: Any) -> list[Endpoint]:
    """Pods of every component as rendered, the callers around them, and the addresses outside."""
    network_range = ipaddress.ip_network(cloud.cluster_network(spec)[0])
    addresses = (str(a) for a in network_range.hosts())
    next(addresses)
    ns = spec.cluster.namespace
    out = [
        Endpoint(part, next(addresses), ns, _pod_labels(manifests, part))
        for part in flows.subjects(spec, cloud, place(spec))
        if part != flows.GATEWAY_PROXY
    ]
    if spec.gateway.ingress.value == "gateway-api":
        where = ingress.gateway_proxies(spec)
        out.append(Endpoint(flows.GATEWAY_PROXY, next(addresses), where.namespace or ns, where.labels))
    out += [
        Endpoint("prometheus", next(addresses), spec.observability.namespace, {"app": "prometheus"}),
        Endpoint("kube-dns", next(addresses), "kube-system", {"k8s-app": "kube-dns"}),
        Endpoint("another app", next(addresses), "default", {"app": "other"}),
        Endpoint("istiod", next(addresses), "istio-system", {"app": "istiod"}),
        # An S3-compatible model store in the cluster (model_store.endpoint_url on a cluster you bring).
        Endpoint("minio", next(addresses), "minio", {"app": "minio"}),
        Endpoint("load balancer", next(addresses)),
        Endpoint("kubernetes API", next(addresses)),
        *(
            [Endpoint("kubernetes Service", spec.cluster.api_service_ip)]
            if spec.cluster.api_service_ip
            else []
        ),
        Endpoint("pod identity agent", POD_IDENTITY_AGENT.cidr.split("/")[0]),
        Endpoint("instance metadata", IMDS),
        Endpoint("S3 and the hub", INTERNET),
    ]
    return out


def _mismatches(spec: PlatformSpec, cloud: Cloud, manifests: Any) -> list[str]:
    """Every connection where the policies and the table disagree, one line each."""
    table = flows.flows(spec, cloud, place(spec))
    policies = _policies_of(manifests)
    endpoints = _endpoints(spec, cloud, manifests)
    subjects = set(flows.subjects(spec, cloud, place(spec)))
    ports = sorted({p for f in table for p in f.ports} | {("TCP", p) for p in EXTRA_PORTS} | {("UDP", 53)})
    ns = spec.cluster.namespace
    wrong: list[str] = []
    for src in endpoints:
        for dst in endpoints:
            if src is dst or not (src.name in subjects or dst.name in subjects):
                continue  # the namespace's policies govern only connections of its own pods
            for protocol, port in ports:
                want = expected(table, ns, subjects, src, dst, protocol, port)
                got = allowed(policies, src, dst, protocol, port)
                if want != got:
                    what = (
                        "blocked, but the table has the flow" if want else "allowed, but no flow explains it"
                    )
                    wrong.append(f"{src.name} -> {dst.name} {protocol}/{port}: {what}")
    return wrong


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_flow_passes_and_nothing_else_in_each_committed_stack(name: str) -> None:
    spec = load(name).spec
    assert _mismatches(spec, cloud_for(spec), _manifests(name)) == []


INGRESSES = [
    {"ingress": "none"},
    {"ingress": "alb", "hostname": "llm.example.com"},
    {"ingress": "gateway-api", "hostname": "llm.example.com"},
    {"ingress": "gateway-api", "hostname": "llm.example.com", "gateway_api": "envoy-gateway"},
    {"ingress": "gateway-api", "hostname": "llm.example.com", "tls_secret_name": "llm-tls"},
]


def _rendered(raw: dict[str, Any]) -> tuple[PlatformSpec, list[dict[str, Any]]]:
    """The stack's NetworkPolicies and the workloads whose pods they govern, rendered without a synthesis."""
    from components.core.decisions import decide
    from components.render import engine, gateway, limit_store, weights
    from components.render.runtime_config import runtime_config

    spec = PlatformSpec.model_validate(raw)
    cloud = cloud_for(spec)
    layout = place(spec)
    manifests = network.render(spec, cloud, layout) + gateway.render(spec, cloud)
    config = runtime_config(spec, files=cloud.batch_files(spec))
    checksum = gateway.config_checksum(gateway.config_text(config))
    manifests += batches.render(spec, config, "batches:1", "1", "bucket", checksum)
    if flows.in_cluster_limit_store(spec, cloud):
        manifests += limit_store.in_cluster(spec)
    decided = decide(spec, layout)
    for model in spec.models:
        placement = layout.placements[model.name]
        manifests += engine.render(spec, decided.models[model.name])
        manifests.append(weights.prepare_job(spec, model, placement, spec.model_store.image))
    return spec, manifests


@pytest.mark.parametrize("target", ["eks", "kubernetes"])
@pytest.mark.parametrize("gateway_fields", INGRESSES, ids=lambda g: "-".join(map(str, g.values())))
def test_every_flow_passes_and_nothing_else_for_each_ingress_and_target(
    target: str, gateway_fields: dict[str, Any]
) -> None:
    raw = {**minimal(), "gateway": gateway_fields, "batch": {"enabled": True}}
    raw = on_own_cluster(raw) if target == "kubernetes" else raw
    raw["models"].append(
        {
            "name": "bge",
            "source": "BAAI/bge-large-en-v1.5",
            "revision": SOME_COMMIT,
            "pool": "l40s",
            "engine": {"max_model_len": 512},
        }
    )
    spec, manifests = _rendered(raw)
    assert _mismatches(spec, cloud_for(spec), manifests) == []


@pytest.mark.parametrize("target", ["eks", "kubernetes"])
def test_shared_limits_and_kv_events_flows_pass_and_nothing_else(target: str) -> None:
    """The router's store (managed or in-cluster), the engines' KV-event ports, the tokenizer fetch."""
    raw = on_own_cluster(minimal()) if target == "kubernetes" else minimal()
    raw["gateway"] = {**raw.get("gateway", {}), "shared_limits": True, "limit_store_auth_config_key": "t"}
    raw["models"][0]["routing"] = {"strategy": "precise_prefix"}
    spec, manifests = _rendered(raw)
    cloud = cloud_for(spec)
    assert _mismatches(spec, cloud, manifests) == []
    names = {m["metadata"]["name"] for m in _policies_of(manifests)}
    assert ("inferstack-limits" in names) is (target == "kubernetes")
    [events] = [f for f in _flows_between(spec, "router", "engine") if ("TCP", 5557) in f.ports]
    assert events.ports == (("TCP", 5557), ("TCP", 5558))
    store = "managed rate-limit store" if target == "eks" else "limits"
    [to_store] = _flows_between(spec, "router", store)
    assert to_store.ports == (("TCP", 6379),)
    [tokenizers] = _flows_between(spec, "router", "tokenizers over HTTPS")
    assert tokenizers.ports == (("TCP", 443),) and flows.LINK_LOCAL in tokenizers.dest.except_cidrs


def test_without_shared_limits_or_kv_events_the_router_has_no_such_flow() -> None:
    spec = PlatformSpec.model_validate(minimal())
    dests = {
        f.dest.name for f in flows.flows(spec, cloud_for(spec), place(spec)) if f.source.name == "router"
    }
    assert not dests & {"limits", "managed rate-limit store", "tokenizers over HTTPS"}
    assert all(("TCP", 5557) not in f.ports for f in flows.flows(spec, cloud_for(spec), place(spec)))


def _api_sources(router_policy: dict[str, Any]) -> list[dict[str, Any]]:
    """Who may reach the router's API port (its metrics port has a rule of its own: Prometheus only)."""
    api = [{"protocol": "TCP", "port": 8080}]
    return next(rule["from"] for rule in router_policy["ingress"] if rule["ports"] == api)


def test_the_evaluator_catches_a_missing_and_an_extra_rule() -> None:
    """The check above can fail: drop the engines' credential rule, or open the router to the internet."""
    spec, manifests = _rendered(minimal())
    cloud = cloud_for(spec)
    engines = next(m for m in manifests if m["metadata"]["name"] == "engines")
    engines["spec"]["egress"] = [r for r in engines["spec"]["egress"] if r["ports"][0]["port"] != 80]
    assert "engine -> pod identity agent TCP/80: blocked, but the table has the flow" in _mismatches(
        spec, cloud, manifests
    )
    spec, manifests = _rendered(minimal())
    router = next(m for m in manifests if m["metadata"]["name"] == "inferstack-router")
    _api_sources(router["spec"]).append({"ipBlock": {"cidr": "0.0.0.0/0"}})
    assert "S3 and the hub -> router TCP/8080: allowed, but no flow explains it" in _mismatches(
        spec, cloud, manifests
    )


def _flows_between(spec: PlatformSpec, source: str, dest: str) -> list[flows.Flow]:
    return [
        f
        for f in flows.flows(spec, cloud_for(spec), place(spec))
        if f.source.name == source and f.dest.name == dest
    ]


def test_the_table_has_the_calls_the_runtime_makes_and_none_to_instance_metadata() -> None:
    spec = load("prod").spec
    table = flows.flows(spec, cloud_for(spec), place(spec))
    pairs = {(f.source.name, f.dest.name) for f in table}
    assert {
        ("router", "engine"),
        ("health", "engine"),
        ("batcher", "engine"),
        ("router", "health"),
        ("router", "batcher"),
        ("prometheus", "engine"),
        ("prometheus", "router"),
        ("load balancer and in-cluster clients", "router"),
        ("every pod", "kube-dns"),
    } <= pairs
    assert {
        ("router", "kubernetes-api"),
        ("health", "kubernetes-api"),
        ("batcher", "kubernetes-api"),
    } <= pairs
    [credentials] = _flows_between(spec, "engine", "EKS Pod Identity agent")
    assert credentials.dest.cidrs == ("169.254.170.23/32",) and credentials.ports == (("TCP", 80),)
    [store] = _flows_between(spec, "engine", "the model store (S3) over HTTPS")
    assert store.ports == (("TCP", 443),)
    assert store.dest.except_cidrs == (spec.cluster.vpc_cidr, spec.cluster.service_cidr, flows.LINK_LOCAL)
    assert ipaddress.ip_address(IMDS) in ipaddress.ip_network(flows.LINK_LOCAL)
    assert not [f for f in table if f.dest.cidrs and any(IMDS in c for c in f.dest.cidrs)]
    # Engines never reach the hub; the preparation Jobs do, and write the store, with Pod Identity credentials.
    assert not _flows_between(spec, "engine", "the Hugging Face hub over HTTPS")
    jobs = {f.dest.name: f.ports for f in table if f.source.name == flows.WEIGHTS}
    assert jobs == {
        "EKS Pod Identity agent": (("TCP", 80),),
        "the Hugging Face hub over HTTPS": (("TCP", 443),),
        "the model store (S3) over HTTPS": (("TCP", 443),),
    }
    assert not [f for f in table if f.dest == flows.component(spec, flows.WEIGHTS)]  # nothing calls them


def test_the_batch_service_talks_to_the_router_and_health_monitor_and_on_eks_to_its_files_only() -> None:
    """Its API admits the router alone (it trusts the router's identity headers); Prometheus reaches only its
    metrics port; it never reaches the engines; S3 and the Pod Identity agent only where the files are in S3."""
    spec = load("prod").spec
    assert spec.batch.enabled
    table = flows.flows(spec, cloud_for(spec), place(spec))
    into = {(f.source.name, f.ports) for f in table if f.dest.name == batches.PART}
    assert into == {
        ("router", (("TCP", batches.port()),)),
        ("prometheus", (("TCP", batches.METRICS_PORT),)),
    }
    out = {f.dest.name: f for f in table if f.source.name == batches.PART}
    assert set(out) == {"router", "health", "EKS Pod Identity agent", "files over HTTPS"}
    assert out["files over HTTPS"].dest.except_cidrs == (
        spec.cluster.vpc_cidr,
        spec.cluster.service_cidr,
        flows.LINK_LOCAL,
    )
    byo = PlatformSpec.model_validate(on_own_cluster({**minimal(), "batch": {"enabled": True}}))
    assert {
        f.dest.name for f in flows.flows(byo, cloud_for(byo), place(byo)) if f.source.name == batches.PART
    } == {
        "router",
        "health",
    }


def test_a_cluster_you_bring_gives_engines_no_credential_endpoint_and_the_store_at_its_endpoint() -> None:
    spec = PlatformSpec.model_validate(on_own_cluster(minimal()))
    table = flows.flows(spec, cloud_for(spec), place(spec))
    assert [(f.dest.name, f.ports) for f in table if f.source.name == "engine"] == [
        ("the model store at minio.minio.svc", (("TCP", 9000),))
    ]
    assert [f.dest.name for f in table if f.source.name == flows.WEIGHTS] == [
        "the Hugging Face hub over HTTPS",
        "the model store at minio.minio.svc",
    ]


def test_the_preparation_jobs_get_a_policy_of_their_own_with_no_ingress() -> None:
    _, manifests = _rendered(minimal())
    [jobs] = [p for p in _policies_of(manifests) if p["metadata"]["name"] == "weights"]
    assert jobs["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == flows.WEIGHTS
    assert jobs["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in jobs["spec"]


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_namespace_denies_everything_by_default_except_dns(name: str) -> None:
    policies = {m["metadata"]["name"]: m["spec"] for m in _policies_of(_manifests(name))}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    dns = policies["allow-dns"]["egress"][0]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}


def test_with_gateway_api_the_router_accepts_the_gateway_proxies_where_the_implementation_runs_them() -> None:
    raw = {**minimal(), "gateway": INGRESSES[2]}
    spec, manifests = _rendered(raw)
    policies = {p["metadata"]["name"]: p["spec"] for p in _policies_of(manifests)}
    sources = _api_sources(policies["inferstack-router"])
    assert {"podSelector": {"matchLabels": {ingress.GATEWAY_NAME_LABEL: "inferstack-gateway"}}} in sources
    assert policies["inferstack-gateway"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 80}]
    spec, manifests = _rendered({**minimal(), "gateway": INGRESSES[3]})
    policies = {p["metadata"]["name"]: p["spec"] for p in _policies_of(manifests)}
    assert "inferstack-gateway" not in policies  # Envoy Gateway runs its proxies in its own namespace
    assert {
        "namespaceSelector": {"matchLabels": {flows.NAMESPACE_NAME_LABEL: "envoy-gateway-system"}},
        "podSelector": {
            "matchLabels": {
                ingress.ENVOY_GATEWAY_NAME_LABEL: "inferstack-gateway",
                ingress.ENVOY_GATEWAY_NAMESPACE_LABEL: spec.cluster.namespace,
            }
        },
    } in _api_sources(policies["inferstack-router"])


@pytest.mark.parametrize("gateway_fields", INGRESSES, ids=lambda g: "-".join(map(str, g.values())))
def test_every_policy_passes_strict_validation_for_each_ingress(gateway_fields: dict[str, Any]) -> None:
    import kubernetes_validate

    spec, manifests = _rendered({**minimal(), "gateway": gateway_fields})
    for policy in _policies_of(manifests):
        kubernetes_validate.validate(policy, f"{spec.cluster.kubernetes_version}.0", strict=True)


def test_router_sources_default_to_the_vpc_the_stack_creates_else_the_private_ranges() -> None:
    raw = minimal()
    raw["cluster"] = {**raw["cluster"], "vpc_cidr": "10.42.0.0/16"}
    eks = PlatformSpec.model_validate(raw)
    assert flows.router_source_cidrs(eks, cloud_for(eks)) == ["10.42.0.0/16"]
    raw = on_own_cluster(raw)
    own = PlatformSpec.model_validate(raw)
    assert flows.router_source_cidrs(own, cloud_for(own)) == list(PRIVATE_CIDRS)
    raw["gateway"] = {"ingress_source_cidrs": ["192.168.10.0/24"]}
    _, manifests = _rendered(raw)
    router = next(p for p in _policies_of(manifests) if p["metadata"]["name"] == "inferstack-router")
    assert {"ipBlock": {"cidr": "192.168.10.0/24"}} in _api_sources(router["spec"])


def test_vpc_cni_enforces_network_policies_on_eks() -> None:
    """Without enableNetworkPolicy the vpc-cni add-on ignores every NetworkPolicy above."""
    import json

    synthesis = synthesized("prod")
    [cni] = [
        r
        for r in synthesis.resources
        if r.type == "aws:eks/addon:Addon" and r.inputs["addonName"] == "vpc-cni"
    ]
    assert json.loads(cni.inputs["configurationValues"]) == {"enableNetworkPolicy": "true"}
    assert decisions.ADDON_CONFIGURATION["vpc-cni"] == {"enableNetworkPolicy": "true"}
    assert common.ENGINE_PORT == 8000


def _api_callers(spec: PlatformSpec) -> list[str]:
    """The runtime services whose Role lets them read the API (each watches EndpointSlices or pods)."""
    from components.render import gateway

    return [p for p in gateway.parts(spec) if gateway.role(spec, p)["rules"]]


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_policy_that_lets_pods_reach_the_api_admits_the_kubernetes_service_address(name: str) -> None:
    """Clients dial the `kubernetes` Service's ClusterIP (KUBERNETES_SERVICE_HOST), and vpc-cni checks egress
    before that address is translated (aws/amazon-network-policy-controller-k8s v1.1.7, pkg/resolvers/endpoints.go,
    getMatchingServiceClusterIPs): an ipBlock of the VPC alone left the health monitor unready and the router with
    no replicas. Every pod a policy lets reach the API's endpoints reaches that address on 443 too, the API callers
    among them, and no other pod of the namespace does."""
    spec = load(name).spec
    cloud = cloud_for(spec)
    manifests = _manifests(name)
    policies = _policies_of(manifests)
    network_range = ipaddress.ip_network(cloud.cluster_network(spec)[0])
    endpoint = Endpoint("kubernetes API", str(next(network_range.hosts())))
    if (
        spec.cluster.api_service_ip is None
    ):  # a cluster you bring, its Service range unstated: the plan says so
        assert spec.target is Target.KUBERNETES and "assume the `kubernetes` Service's ClusterIP" in str(
            spec.cluster.api_endpoint_note()
        )
        return
    service = Endpoint("kubernetes Service", spec.cluster.api_service_ip)
    ns = spec.cluster.namespace
    reaching: list[str] = []
    for part in flows.subjects(spec, cloud, place(spec)):
        if part == flows.GATEWAY_PROXY:
            continue
        pod = Endpoint(part, "10.255.255.254", ns, _pod_labels(manifests, part))
        to_endpoints = any(allowed(policies, pod, endpoint, "TCP", p) for p in flows.API_SERVER_PORTS)
        to_service = allowed(policies, pod, service, "TCP", 443)
        assert to_endpoints == to_service, part
        if to_service:
            reaching.append(part)
    assert reaching == _api_callers(spec) and reaching


@pytest.mark.parametrize("name", [s for s in PULUMI_STACKS if load(s).spec.target is Target.EKS])
def test_the_eks_cluster_pins_the_service_range_whose_first_address_the_policies_admit(name: str) -> None:
    spec = load(name).spec
    [cluster] = [r for r in synthesized(name).resources if r.type == "aws:eks/cluster:Cluster"]
    assert cluster.inputs["kubernetesNetworkConfig"] == {
        "ipFamily": "ipv4",
        "serviceIpv4Cidr": spec.cluster.service_cidr,
    }
    assert spec.cluster.api_service_ip == str(ipaddress.ip_network(spec.cluster.service_cidr)[1])
    router = next(p for p in _policies_of(_manifests(name)) if p["metadata"]["name"] == "inferstack-router")
    https = [r["to"] for r in router["spec"]["egress"] if r["ports"] == [{"protocol": "TCP", "port": 443}]]
    assert [{"ipBlock": {"cidr": f"{spec.cluster.api_service_ip}/32"}} in peers for peers in https] == [True]


def test_the_default_service_range_is_172_20_and_its_api_address_172_20_0_1() -> None:
    spec = PlatformSpec.model_validate(minimal())
    assert (spec.cluster.service_range, spec.cluster.api_service_ip) == ("172.20.0.0/16", "172.20.0.1")


def test_https_to_the_internet_never_takes_in_the_cluster_service_addresses() -> None:
    """0.0.0.0/0 on 443 without the Service range would let an engine or a preparation Job reach the API (and every
    Service on 443) at its ClusterIP, checked before translation on EKS."""
    raw = minimal()
    raw["cluster"] = {**raw["cluster"], "service_cidr": "10.100.0.0/16", "vpc_cidr": "10.0.0.0/16"}
    spec = PlatformSpec.model_validate(raw)
    hub = flows.public_https(spec, cloud_for(spec), "x")
    assert "10.100.0.0/16" in hub.except_cidrs
    spec, manifests = _rendered(raw)
    engines = next(p for p in _policies_of(manifests) if p["metadata"]["name"] == "engines")
    engine = Endpoint(
        "engine", "10.0.0.9", spec.cluster.namespace, engines["spec"]["podSelector"]["matchLabels"]
    )
    assert not allowed(_policies_of(manifests), engine, Endpoint("api", "10.100.0.1"), "TCP", 443)
    assert allowed(_policies_of(manifests), engine, Endpoint("s3", INTERNET), "TCP", 443)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"vpc_cidr": "172.20.0.0/16"}, "service_cidr 172.20.0.0/16 overlaps vpc_cidr 172.20.0.0/16"),
        (
            {"vpc_cidr": "10.100.0.0/16", "service_cidr": "10.100.128.0/24"},
            "set service_cidr to e.g. '172.20.0.0/16'",
        ),
        ({"service_cidr": "100.64.0.0/16"}, "inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"),
        ({"service_cidr": "10.0.0.0/8"}, "a /12 to /24 Service range"),
        ({"service_cidr": "172.20.0.1/16"}, "not an IPv4 CIDR block"),
    ],
)
def test_a_service_range_eks_would_refuse_is_refused_with_what_to_write(
    fields: dict[str, str], message: str
) -> None:
    from pydantic import ValidationError

    raw = minimal()
    raw["cluster"] = {**raw["cluster"], **fields}
    with pytest.raises(ValidationError, match=re.escape(message)):
        PlatformSpec.model_validate(raw)


def test_a_cluster_you_bring_states_its_service_range_or_the_plan_says_what_the_policies_assume() -> None:
    raw = on_own_cluster(minimal())
    unknown = PlatformSpec.model_validate(raw)
    assert unknown.cluster.api_service_ip is None and flows.api_service(unknown) is None
    assert "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16" in str(unknown.cluster.api_endpoint_note())
    raw["cluster"] = {**raw["cluster"], "service_cidr": "10.96.0.0/16"}
    spec, manifests = _rendered(raw)
    assert spec.cluster.api_service_ip == "10.96.0.1"
    assert _mismatches(spec, cloud_for(spec), manifests) == []
    health = next(p for p in _policies_of(manifests) if p["metadata"]["name"] == "inferstack-health")
    assert {"ipBlock": {"cidr": "10.96.0.1/32"}} in [p for r in health["spec"]["egress"] for p in r["to"]]
