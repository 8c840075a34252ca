"""NetworkPolicies: deny by default, then exactly the flows of ``components.render.flows``. Pure.

- ``default-deny``: every pod in the namespace, no traffic in or out;
- ``allow-dns``: every pod may ask kube-dns;
- one policy per component (engines, the model store's preparation Jobs, router, health monitor, batcher, batch
  service, and the Gateway's proxies when they run in the namespace): ingress from the flows that end at it, egress
  to the flows that start at it.

A flow works only when the caller's egress and the callee's ingress both admit it, so each flow is rendered on both
sides. On EKS the ``vpc-cni`` add-on enforces them (``components.clouds.aws.decisions.VPC_CNI_CONFIGURATION``).
"""

from __future__ import annotations

from components.core.cloud import Cloud
from components.core.placement import Layout
from components.render import common, flows
from components.render.common import Manifest
from components.render.flows import Flow, Port
from components.render.ingress import gateway_name
from components.spec import PlatformSpec

POLICY_NAMES = {flows.ENGINE: "engines", flows.WEIGHTS: "weights"}


def policy_name(spec: PlatformSpec, subject: str) -> str:
    if subject == flows.GATEWAY_PROXY:
        return gateway_name(spec)
    if subject.startswith(flows.GROUP_PREFIX):
        return f"{common.engine_name(subject.removeprefix(flows.GROUP_PREFIX))}-group"
    if subject.startswith(flows.PD_PREFIX):
        return f"{common.engine_name(subject.removeprefix(flows.PD_PREFIX))}-kv-transfer"
    return POLICY_NAMES.get(subject) or common.runtime_name(spec, subject)


def _policy(spec: PlatformSpec, name: str, pod_selector: dict[str, str], body: Manifest) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": common.metadata(spec, name, "network-policy"),
        "spec": {"podSelector": {"matchLabels": pod_selector} if pod_selector else {}, **body},
    }


def _ports(ports: tuple[Port, ...]) -> list[Manifest]:
    return [{"protocol": protocol, "port": port} for protocol, port in ports]


def _rules(pairs: list[tuple[flows.Peer, tuple[Port, ...]]], direction: str) -> list[Manifest]:
    """One rule per port set, with every peer that uses it (in the order the flows name them)."""
    grouped: dict[tuple[Port, ...], list[Manifest]] = {}
    for peer, ports in pairs:
        peers = grouped.setdefault(ports, [])
        peers += [p for p in peer.as_policy_peers() if p not in peers]
    rules: list[Manifest] = []
    for ports, peers in grouped.items():
        rule: Manifest = {direction: peers}
        if ports:
            rule["ports"] = _ports(ports)
        rules.append(rule)
    return rules


def default_deny(spec: PlatformSpec) -> Manifest:
    return _policy(spec, "default-deny", {}, {"policyTypes": ["Ingress", "Egress"]})


def allow_dns(spec: PlatformSpec, dns: Flow) -> Manifest:
    egress = _rules([(dns.dest, dns.ports)], "to")
    return _policy(spec, "allow-dns", {}, {"policyTypes": ["Egress"], "egress": egress})


def component_policy(spec: PlatformSpec, subject: str, table: list[Flow]) -> Manifest:
    """Ingress from the flows that end at ``subject``, egress to those that start at it (DNS is allow-dns's)."""
    me = flows.subject(spec, subject)
    body: Manifest = {"policyTypes": ["Ingress", "Egress"]}
    ingress = _rules([(f.source, f.ports) for f in table if f.dest == me], "from")
    egress = _rules([(f.dest, f.ports) for f in table if f.source == me], "to")
    if ingress:
        body["ingress"] = ingress
    if egress:
        body["egress"] = egress
    return _policy(spec, policy_name(spec, subject), dict(me.pods or {}), body)


def render(spec: PlatformSpec, cloud: Cloud, layout: Layout) -> list[Manifest]:
    """``layout``: the stack's placement (the groups of a replica that spans nodes get a policy of their own)."""
    table = flows.flows(spec, cloud, layout)
    dns = next(f for f in table if f.source == flows.every_pod())
    return [
        default_deny(spec),
        allow_dns(spec, dns),
        *(component_policy(spec, s, table) for s in flows.subjects(spec, cloud, layout)),
    ]
