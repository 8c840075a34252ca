"""What the picker knows about each replica and each model: plain state the scheduler reads.

``Replica`` is the shared replica state (``runtime.replica``), as the router's (``runtime.router.replicas``) is: the same
strategies read the same fields. Its in-flight count is the picker's own (requests it sent there whose
ext_proc stream is still open), its engine queue and KV usage come from the health feed or a probe, its
circuit from the outcomes the gateway reports back (the response status of each request).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from runtime.breaker import Breaker
from runtime.config import ModelRoute, ModelTarget, RouterSettings
from runtime.model_view import ModelView
from runtime.replica import ReplicaState


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


class ModelPool(ModelView[Replica]):
    """One model: the shared model view (``runtime.model_view``), its replicas also named ``ip:port``."""

    def __init__(self, target: ModelTarget, route: ModelRoute, settings: RouterSettings) -> None:
        super().__init__(target, route, settings)
        self.by_endpoint: dict[str, Replica] = {}
        self.listed = False  # discovery has reported at least once

    def new_replica(self, url: str, cap: int) -> Replica:
        return Replica(url, cap, self.new_breaker(), self.weights.get(url, 1.0))

    def replicas_changed(self) -> None:
        self.by_endpoint = {r.endpoint: r for r in self.replicas}
        self.listed = True
