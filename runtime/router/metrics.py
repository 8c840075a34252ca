"""The router's metrics, all under ``inferstack_router_*`` in a registry of its own.

Label children are cached per (model, backend, status) so the hot path is a dict hit and an add.
Gauges that mirror live state (queue depth, in-flight, circuit state, index size) are filled in at
scrape time by a collector rather than on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Live(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, list[tuple[tuple[str, ...], float]]]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        specs = {
            "queue_depth": ("Requests waiting for a free replica", ["model"]),
            "backend_inflight": ("Requests in flight per replica", ["model", "backend"]),
            "circuit_state": ("Circuit per replica: 0 closed, 1 half-open, 2 open", ["model", "backend"]),
            "backend_healthy": ("1 if the replica is considered healthy", ["model", "backend"]),
            "prefix_index_entries": ("Entries in the prefix / session index", ["model", "index"]),
            "prefix_hit_rate": ("Share of prefix lookups that found a replica", ["model"]),
            "backends": ("Replicas known per model", ["model"]),
        }
        for name, (doc, labels) in specs.items():
            fam = GaugeMetricFamily(f"inferstack_router_{name}", doc, labels=labels)
            for values, v in snap.get(name, []):
                fam.add_metric(list(values), v)
            yield fam


class RouterMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series double the scrape for nothing a dashboard uses
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "inferstack_router_requests",
            "Requests by model, replica and status",
            ["model", "backend", "status"],
            registry=r,
        )
        self.rejections = Counter(
            "inferstack_router_rejections",
            "Requests refused before routing; model is empty unless the model is served (no client-chosen labels)",
            ["model", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "inferstack_router_retries", "Retries to another replica", ["model", "reason"], registry=r
        )
        self.tokens = Counter(
            "inferstack_router_tokens", "Tokens from usage", ["model", "direction"], registry=r
        )
        self.duration = Histogram(
            "inferstack_router_request_duration_seconds",
            "End-to-end latency seen by the router",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ttft = Histogram(
            "inferstack_router_ttft_seconds",
            "Time to the first body byte from the engine",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_wait = Histogram(
            "inferstack_router_queue_wait_seconds",
            "Time spent waiting for a free replica",
            ["model"],
            buckets=WAIT_BUCKETS_S,
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def attach_live(self, snapshot: Callable[[], dict[str, list[tuple[tuple[str, ...], float]]]]) -> None:
        self.registry.register(_Live(snapshot))

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def forget_backend(self, model: str, backend: str) -> None:
        """Drop a departed replica's series, so pod churn does not grow /metrics without bound."""
        for key in [k for k in self._children if k[0] == id(self.requests) and k[1:3] == (model, backend)]:
            del self._children[key]
            self.requests.remove(*key[1:])

    def request(self, model: str, backend: str, status: int, duration_s: float) -> None:
        self._child(self.requests, model, backend, str(status)).inc()
        if duration_s >= 0:
            self._child(self.duration, model).observe(duration_s)

    def first_byte(self, model: str, seconds: float) -> None:
        self._child(self.ttft, model).observe(seconds)

    def usage(self, model: str, prompt: int, completion: int) -> None:
        if prompt:
            self._child(self.tokens, model, "in").inc(prompt)
        if completion:
            self._child(self.tokens, model, "out").inc(completion)

    def reject(self, reason: str, model: str = "") -> None:
        self._child(self.rejections, model, reason).inc()

    def retry(self, model: str, reason: str) -> None:
        self._child(self.retries, model, reason).inc()

    def waited(self, model: str, seconds: float) -> None:
        self._child(self.queue_wait, model).observe(seconds)
