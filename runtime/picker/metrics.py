"""The picker's metrics, all under ``inferstack_picker_*`` in a registry of its own.

The scheduling gauges carry the router's names after the prefix (``backend_inflight``,
``backend_healthy``, ``circuit_state``, ``backends``, ``prefix_index_entries``, ``prefix_hit_rate``), read
at scrape time from the same strategies' reports, so one dashboard query works for either front end with
the prefix swapped. Counters: picks, refusals by reason, requests by replica and status, decision time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.picker.replicas import ModelPool
from runtime.scheduling import Report
from runtime.scheduling.fair_queue import Place

PREFIX = "inferstack_picker_"
DECISION_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def scheduling_families(models: Mapping[str, ModelPool]) -> list[GaugeMetricFamily]:
    """The live scheduling gauges of every model, as the router exports them (its names after the prefix)."""

    def family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=labels)

    replicas = family("backends", "Replicas known per model", ["model"])
    inflight = family(
        "backend_inflight", "Requests in flight per replica (picked, stream still open)", ["model", "backend"]
    )
    healthy = family(
        "backend_healthy",
        "1 if the replica is considered healthy (0 if ejected, even while a panic routes to it)",
        ["model", "backend"],
    )
    circuit = family(
        "circuit_state", "Circuit per replica: 0 closed, 1 half-open, 2 open", ["model", "backend"]
    )
    entries = family("prefix_index_entries", "Entries in the prefix / session index", ["model", "index"])
    hit_rate = family("prefix_hit_rate", "Share of prefix lookups that found a replica", ["model"])
    for name, pool in models.items():
        replicas.add_metric([name], float(len(pool.replicas)))
        for r in pool.replicas:
            inflight.add_metric([name, r.url], float(r.inflight))
            healthy.add_metric([name, r.url], 1.0 if r.reported_healthy else 0.0)
            circuit.add_metric([name, r.url], float(r.breaker.state))
        reported_hit_rate = False
        for scorer, report in pool.strategy.reports().items():
            if Report.INDEX_ENTRIES in report:
                entries.add_metric([name, scorer], report[Report.INDEX_ENTRIES])
            if not reported_hit_rate and Report.HIT_RATE in report:
                hit_rate.add_metric([name], report[Report.HIT_RATE])
                reported_hit_rate = True
    return [replicas, inflight, healthy, circuit, entries, hit_rate]


class _Live(Collector):
    def __init__(self, models: Callable[[], Mapping[str, ModelPool]]) -> None:
        self.models = models

    def collect(self) -> Iterator[Metric]:
        yield from scheduling_families(self.models())


class PickerMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series: scrape weight, no use
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.picks = Counter(
            PREFIX + "picks", "Requests routed, by model and chosen replica", ["model", "backend"], registry=r
        )
        self.rejections = Counter(
            PREFIX + "rejections",
            "Requests the gateway answered itself; model is empty unless the model is served",
            ["model", "reason"],
            registry=r,
        )
        self.requests = Counter(
            PREFIX + "requests",
            "Routed requests by replica and the status the gateway saw (0: no answer)",
            ["model", "backend", "status"],
            registry=r,
        )
        self.decision = Histogram(
            PREFIX + "decision_seconds",
            "Time to choose a replica",
            ["model"],
            buckets=DECISION_BUCKETS_S,
            registry=r,
        )
        self.duration = Histogram(
            PREFIX + "request_duration_seconds",
            "From the pick to the end of the request's stream",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.keys_reload_failures = Counter(
            PREFIX + "keys_reload_failures",
            "Changes to the API keys file that were refused (the keys in use stayed)",
            registry=r,
        )
        self.fair_admissions = Counter(
            PREFIX + "fair_admitted",
            "Requests given a replica, per tenant (from the config; 'other' without a key) and band",
            ["model", "tenant", "band"],
            registry=r,
        )
        self.fair_sheds = Counter(
            PREFIX + "fair_shed",
            "Requests refused for want of a replica (full, no headroom for the band, none ready), per tenant and"
            " band",
            ["model", "tenant", "band"],
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def attach_live(self, models: Callable[[], Mapping[str, ModelPool]]) -> None:
        self.registry.register(_Live(models))

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def fair(self, outcome: str, model: str, place: Place) -> None:
        """A request given a replica (``admitted``) or refused for want of one (``shed``), per tenant and band."""
        metric = self.fair_admissions if outcome == "admitted" else self.fair_sheds
        self._child(metric, model, place.tenant, place.band.value).inc()

    def picked(self, model: str, replica: str, decision_s: float) -> None:
        self._child(self.picks, model, replica).inc()
        self._child(self.decision, model).observe(max(0.0, decision_s))

    def rejected(self, reason: str, model: str = "") -> None:
        self._child(self.rejections, model, reason).inc()

    def finished(self, model: str, replica: str, status: int, duration_s: float) -> None:
        self._child(self.requests, model, replica, str(status)).inc()
        self._child(self.duration, model).observe(max(0.0, duration_s))

    def forget_replica(self, model: str, replica: str) -> None:
        """Drop a departed replica's counters, so pod churn does not grow /metrics without bound."""
        for key in [
            k
            for k in self._children
            if k[0] in (id(self.picks), id(self.requests)) and k[1:3] == (model, replica)
        ]:
            metric = self.picks if key[0] == id(self.picks) else self.requests
            del self._children[key]
            metric.remove(*key[1:])
