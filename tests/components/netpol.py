"""A small evaluator of Kubernetes NetworkPolicy (networking.k8s.io/v1) for the tests, and the endpoints to try.

Semantics, from the Kubernetes documentation: a pod selected by no policy of a direction is open in that
direction; once selected, only what some rule of a selecting policy admits passes. A connection passes when the
source's egress and the destination's ingress both admit it. An ``ipBlock`` is matched against every address,
pods' included (implementations differ there; matching pods is the stricter reading for "nothing extra").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.render.flows import NAMESPACE_NAME_LABEL, Flow, Peer


@dataclass(frozen=True)
class Endpoint:
    """Something that opens or accepts connections: a pod (namespace and labels) or a bare address."""

    name: str
    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None

    def namespace_labels(self) -> dict[str, str]:
        return {NAMESPACE_NAME_LABEL: self.namespace} if self.namespace else {}


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return True
    assert set(selector) <= {"matchLabels", "matchExpressions"}, f"unknown selector: {selector}"
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] in ("In", "NotIn"), f"the evaluator knows In and NotIn: {expression}"
        inside = labels.get(expression["key"]) in expression["values"]
        if inside != (expression["operator"] == "In"):
            return False
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _in(ip: str, cidr: str, excepts: Iterable[str] = ()) -> bool:
    address = ipaddress.ip_address(ip)
    return address in ipaddress.ip_network(cidr) and not any(
        address in ipaddress.ip_network(e) for e in excepts
    )


def _peer_matches(peer: Mapping[str, Any], policy_namespace: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        return _in(other.ip, block["cidr"], block.get("except", ()))
    if not other.is_pod:
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], other.namespace_labels()):
            return False
    elif other.namespace != policy_namespace:
        return False
    return _selects(peer.get("podSelector"), other.labels)


def _ports_match(ports: list[Mapping[str, Any]] | None, protocol: str, port: int) -> bool:
    if not ports:
        return True
    return any(p.get("protocol", "TCP") == protocol and p.get("port") == port for p in ports)


def _direction_allows(
    policies: list[Mapping[str, Any]], me: Endpoint, other: Endpoint, protocol: str, port: int, kind: str
) -> bool:
    """Whether ``me``'s policies of ``kind`` (Ingress or Egress) admit a connection with ``other``."""
    rules_key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace") == me.namespace
        and kind in p["spec"].get("policyTypes", [])
        and _selects(p["spec"].get("podSelector") or None, me.labels)
    ]
    if not me.is_pod or not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(rules_key) or []:
            peers = rule.get(peers_key)
            peer_ok = not peers or any(
                _peer_matches(peer, policy["metadata"]["namespace"], other) for peer in peers
            )
            if peer_ok and _ports_match(rule.get("ports"), protocol, port):
                return True
    return False


def allowed(
    policies: list[Mapping[str, Any]], src: Endpoint, dst: Endpoint, protocol: str, port: int
) -> bool:
    return _direction_allows(policies, src, dst, protocol, port, "Egress") and _direction_allows(
        policies, dst, src, protocol, port, "Ingress"
    )


def _names(peer: Peer, endpoint: Endpoint, namespace: str, subjects: set[str]) -> bool:
    """Whether a flow's peer takes in ``endpoint``. The namespace's own components (``subjects``) are taken in by
    pod peers, and by address ranges only when those say so (``Peer.includes_pods``)."""
    if peer.pods is None:
        if endpoint.name in subjects and not peer.includes_pods:
            return False
        return any(_in(endpoint.ip, c, peer.except_cidrs) for c in peer.cidrs)
    if not endpoint.is_pod:
        return False
    if peer.outside is not None:
        if endpoint.namespace == peer.outside:
            return False
    elif endpoint.namespace != (peer.namespace or namespace):
        return False
    return all(endpoint.labels.get(k) == v for k, v in peer.pods.items())


def _names_pod(peer: Peer, endpoint: Endpoint, namespace: str) -> bool:
    """Whether a flow names ``endpoint``, one of the namespace's pods, by its labels."""
    return peer.pods is not None and _names(peer, endpoint, namespace, set())


def expected(
    table: list[Flow],
    namespace: str,
    subjects: set[str],
    src: Endpoint,
    dst: Endpoint,
    protocol: str,
    port: int,
) -> bool:
    """Whether the table lets ``src`` open this connection to ``dst``. Like Kubernetes, both ends must: a
    component of the namespace calls only what some flow starting at it names, and is called only by what some
    flow ending at it names."""

    def carries(f: Flow) -> bool:
        return not f.ports or (protocol, port) in f.ports

    calls = src.name not in subjects or any(
        carries(f) and _names_pod(f.source, src, namespace) and _names(f.dest, dst, namespace, subjects)
        for f in table
    )
    answers = dst.name not in subjects or any(
        carries(f) and _names_pod(f.dest, dst, namespace) and _names(f.source, src, namespace, subjects)
        for f in table
    )
    return calls and answers
