"""What the picker knows about each replica and each model: plain state the scheduler reads.

``Replica`` is the shared replica state (``runtime.replica``), as the router's ``Backend`` is: the same
strategies read the same fields. Its in-flight count is the picker's own (requests it sent there whose
ext_proc stream is still open), its engine queue and KV usage come from the health feed or a probe, its
circuit from the outcomes the gateway reports back (the response status of each request).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from runtime.breaker import Breaker
from runtime.config import ModelRoute, ModelTarget, RouterSettings
from runtime.replica import ReplicaState
from runtime.scheduling import Need, Strategy, build


def host_port(url: str) -> str:
    """``http://10.0.0.5:8000`` -> ``10.0.0.5:8000``: how the Endpoint Picker Protocol names an endpoint
    (IPv6 in brackets, as Envoy's override_host policy reads it)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port or 80}"


class Replica(ReplicaState):
    """One replica of one model, named the way the Endpoint Picker Protocol names it (``ip:port``)."""

    __slots__ = ("endpoint",)

    def __init__(self, url: str, cap: int, breaker: Breaker, weight: float = 1.0) -> None:
        super().__init__(url, cap, breaker, weight)
        self.endpoint = host_port(url)


class ModelPool:
    """One model: its replicas and its strategy (built by ``runtime.scheduling``, as the router builds it)."""

    def __init__(self, target: ModelTarget, route: ModelRoute, settings: RouterSettings) -> None:
        self.target = target
        self.route = route
        self.name = target.name
        self.settings = settings
        self.strategy: Strategy = build(route.strategy)
        # the request fields the strategy's scorers declared they read: parse only those
        self.needs_prompt = Need.PROMPT in self.strategy.needs
        self.needs_session = Need.SESSION in self.strategy.needs
        self.session_header = route.strategy.session_header.lower()
        self.ewma_alpha = route.strategy.latency_ewma_alpha
        self.weights = {str(b.url).rstrip("/"): b.weight for b in target.static_backends}
        self.replicas: list[Replica] = []
        self.by_url: dict[str, Replica] = {}
        self.by_endpoint: dict[str, Replica] = {}
        self.probe_failures: dict[str, int] = {}
        self.listed = False  # discovery has reported at least once

    def set_replicas(self, urls: list[str], previous: dict[str, Replica] | None = None) -> None:
        """The replicas discovery reports now; survivors keep their counters and circuit."""
        old = {**(previous or {}), **self.by_url}
        cap = self.target.max_concurrency_per_backend
        fresh: list[Replica] = []
        for url in sorted(set(urls)):
            r = old.get(url)
            if r is None or r.cap != cap:
                s = self.settings
                breaker = Breaker(s.breaker_failures, s.breaker_open_ms / 1000)
                r = Replica(url, cap, breaker, self.weights.get(url, 1.0))
            fresh.append(r)
        self.replicas = fresh
        self.by_url = {r.url: r for r in fresh}
        for gone in [url for url in self.probe_failures if url not in self.by_url]:
            del self.probe_failures[gone]
        self.by_endpoint = {r.endpoint: r for r in fresh}
        self.listed = True
