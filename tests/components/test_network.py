"""NetworkPolicies: default deny, engines reachable only from the gateway, health, batcher and Prometheus."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from components import plan
from components.cloud import PRIVATE_CIDRS
from components.render import network
from components.spec import PlatformSpec
from components.stackfile import STACKS_DIR, available_stacks, load
from components.targets import cloud_for
from tests.components.helpers import minimal

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]


@cache
def _policies(name: str) -> dict[str, dict[str, Any]]:
    manifests = plan.synthesize(load(name)).kubernetes_manifests()
    return {m["metadata"]["name"]: m["spec"] for m in manifests if m["kind"] == "NetworkPolicy"}


def _components(peers: list[dict[str, Any]]) -> set[str]:
    return {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in peers
        if "podSelector" in p and "app.kubernetes.io/component" in p["podSelector"].get("matchLabels", {})
    }


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_namespace_denies_everything_by_default_except_dns(name: str) -> None:
    policies = _policies(name)
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    dns = policies["allow-dns"]["egress"][0]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_engines_accept_only_the_gateway_health_batcher_and_prometheus(name: str) -> None:
    spec = load(name).spec
    engines = _policies(name)["engines"]
    assert engines["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "engine"
    callers, scrape, *events = engines["ingress"]
    if any(m.publishes_kv_events for m in spec.models):  # the routers follow the engines' KV events
        (kv,) = events
        assert _components(kv["from"]) == {"router"} and [p["port"] for p in kv["ports"]] == [5557, 5558]
    else:
        assert events == []
    expected = {"router", "health"} | (
        {"batcher"} if any(m.resolved_task().value == "embed" for m in spec.models) else set()
    )
    assert _components(callers["from"]) == expected
    assert [p["port"] for p in callers["ports"]] == [8000]
    assert scrape["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": spec.observability.namespace}}}
    ]
    assert all("ipBlock" not in p for rule in engines["ingress"] for p in rule["from"])


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_router_accepts_only_the_ingress_and_prometheus(name: str) -> None:
    spec = load(name).spec
    router = _policies(name)["inferstack-router"]
    sources, scrape = router["ingress"]
    assert sources["from"] == [
        {"ipBlock": {"cidr": c}} for c in network.router_source_cidrs(spec, cloud_for(spec))
    ]
    assert [p["port"] for p in sources["ports"]] == [8080]
    assert "namespaceSelector" in scrape["from"][0]
    reach = _components(router["egress"][0]["to"])
    assert {"engine", "health"} <= reach


def test_with_gateway_api_the_router_accepts_only_the_gateway_proxies() -> None:
    raw = minimal()
    raw["gateway"] = {"ingress": "gateway-api", "hostname": "llm.example.com"}
    spec = PlatformSpec.model_validate(raw)
    policies = {p["metadata"]["name"]: p["spec"] for p in network.render(spec, cloud_for(spec))}
    sources = policies["inferstack-router"]["ingress"][0]["from"]
    assert sources == [
        {"podSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "inferstack-gateway"}}}
    ]
    proxies = policies["inferstack-gateway"]
    assert proxies["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 80}]


@pytest.mark.parametrize("ingress", ["none", "alb", "gateway-api"])
def test_every_policy_passes_strict_validation_for_each_ingress(ingress: str) -> None:
    import kubernetes_validate

    raw = minimal()
    raw["gateway"] = {"ingress": ingress, **({"hostname": "llm.example.com"} if ingress != "none" else {})}
    spec = PlatformSpec.model_validate(raw)
    for policy in network.render(spec, cloud_for(spec)):
        kubernetes_validate.validate(policy, f"{spec.cluster.kubernetes_version}.0", strict=True)


def test_router_sources_default_to_the_vpc_the_stack_creates_else_the_private_ranges() -> None:
    raw = minimal()
    raw["cluster"] = {"vpc_cidr": "10.42.0.0/16"}
    eks = PlatformSpec.model_validate(raw)
    assert network.router_source_cidrs(eks, cloud_for(eks)) == ["10.42.0.0/16"]
    raw["target"] = "kubernetes"
    own = PlatformSpec.model_validate(raw)
    assert network.router_source_cidrs(own, cloud_for(own)) == list(PRIVATE_CIDRS)
    raw["gateway"] = {"ingress_source_cidrs": ["192.168.10.0/24"]}
    spec = PlatformSpec.model_validate(raw)
    assert network.router_source_cidrs(spec, cloud_for(spec)) == ["192.168.10.0/24"]
    assert network.router(spec, cloud_for(spec))["spec"]["ingress"][0]["from"] == [
        {"ipBlock": {"cidr": "192.168.10.0/24"}}
    ]
