"""The router's metrics, all under ``inferstack_router_*`` in a registry of its own.

Label children are cached per (model, backend, status) so the hot path is a dict hit and an add.
Gauges that mirror live state (queue depth, in-flight, circuit state, index size) are filled in at
scrape time by a collector rather than on every request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.scheduling import Report

if TYPE_CHECKING:
    from runtime.router.fleet import ModelState

DEPARTED_KEEP_S = 600.0
"""How long a departed replica's request counters stay in /metrics: longer than the alerts' and dashboards'
rate windows, so the errors of a replica that crashed still count after it left (a series scraped once, then
gone, has no rate). Then they go, so pod churn does not grow /metrics without bound."""
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: Gauges filled at scrape time from live state: name (after ``inferstack_router_``) -> help, labels.
LIVE_GAUGES: dict[str, tuple[str, list[str]]] = {
    "queue_depth": ("Requests waiting for a free replica", ["model"]),
    "backend_inflight": ("Requests in flight per replica", ["model", "backend"]),
    "circuit_state": ("Circuit per replica: 0 closed, 1 half-open, 2 open", ["model", "backend"]),
    "backend_healthy": ("1 if the replica is considered healthy", ["model", "backend"]),
    "prefix_index_entries": ("Entries in the prefix / session index", ["model", "index"]),
    "prefix_hit_rate": ("Share of prefix lookups that found a replica", ["model"]),
    "backends": ("Replicas known per model", ["model"]),
    "backends_asleep": ("Replicas asleep per model (sleep mode: a request wakes one)", ["model"]),
    "kv_view_blocks": ("Blocks each replica's engine caches, as its KV events say", ["model", "backend"]),
    "kv_view_synced": ("1 if the replica's KV events are followed and were replayed", ["model", "backend"]),
    "limit_store_up": ("1 while the shared rate-limit store answers; 0: limits are per replica", []),
}
Snapshot = dict[str, list[tuple[tuple[str, ...], float]]]


def live_gauges(models: Mapping[str, ModelState]) -> Snapshot:
    """The live gauges' samples: wait lines, replicas, and what each strategy's scorers report."""
    out: Snapshot = {name: [] for name in LIVE_GAUGES}
    for name, m in models.items():
        out["queue_depth"].append(((name,), float(len(m.queue))))
        out["backends"].append(((name,), float(len(m.backends))))
        if m.sleep is not None:
            out["backends_asleep"].append(((name,), float(sum(1 for b in m.backends if b.asleep))))
        for b in m.backends:
            out["backend_inflight"].append(((name, b.url), float(b.inflight)))
            out["circuit_state"].append(((name, b.url), float(b.breaker.state)))
            out["backend_healthy"].append(((name, b.url), 1.0 if b.healthy else 0.0))
        hit_rate: float | None = None
        for scorer, report in m.strategy.reports().items():
            if Report.INDEX_ENTRIES in report:
                out["prefix_index_entries"].append(((name, scorer), report[Report.INDEX_ENTRIES]))
            if hit_rate is None and Report.HIT_RATE in report:
                hit_rate = report[Report.HIT_RATE]  # one series per model: the first scorer that reports it
        if hit_rate is not None:
            out["prefix_hit_rate"].append(((name,), hit_rate))
        if m.kv is not None:
            index = m.kv.index
            for b in m.backends:
                out["kv_view_blocks"].append(((name, b.url), float(index.held(b.url))))
                out["kv_view_synced"].append(((name, b.url), 1.0 if b.url in index.synced else 0.0))
    return out


class _Live(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        for name, (doc, labels) in LIVE_GAUGES.items():
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
        self.sleeps = Counter(
            "inferstack_router_sleeps", "Replicas put to sleep after their idle period", ["model"], registry=r
        )
        self.wake = Histogram(
            "inferstack_router_wake_seconds",
            "Time a sleeping replica took to wake for a waiting request",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.adapter_loads = Counter(
            "inferstack_router_adapter_loads",
            "LoRA adapter load calls to replicas, by base model and outcome (ok, refused, failed)",
            ["model", "outcome"],
            registry=r,
        )
        self.config_reload_failures = Counter(
            "inferstack_router_config_reload_failures",
            "Changed config or API-key files that were refused; the last good config kept serving",
            registry=r,
        )
        self.limit_store_errors = Counter(
            "inferstack_router_limit_store_errors",
            "Failed calls to the shared rate-limit store, by cause (each switches this replica to its fallback)",
            ["cause"],
            registry=r,
        )
        self.limit_checks = Counter(
            "inferstack_router_limit_checks",
            "Rate-limit decisions: shared (in the store) or fallback (this replica's share of each limit)",
            ["mode"],
            registry=r,
        )
        self.kv_event_problems = Counter(
            "inferstack_router_kv_event_problems",
            "KV-event stream problems (malformed, gap, restarted, replay_timeout, ...), by model and cause",
            ["model", "cause"],
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}
        self._departed: dict[tuple[str, str], float] = {}  # (model, backend) -> when it departed

    def attach_live(self, snapshot: Callable[[], Snapshot]) -> None:
        def swept() -> Snapshot:  # every scrape also lets expired departures go
            self.sweep(time.monotonic())
            return snapshot()

        self.registry.register(_Live(swept))

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def forget_backend(self, model: str, backend: str, now: float | None = None) -> None:
        """A replica departed: drop its series once ``DEPARTED_KEEP_S`` has passed (unless it comes back)."""
        now = time.monotonic() if now is None else now
        self._departed[(model, backend)] = now
        self.sweep(now)

    def sweep(self, now: float) -> None:
        """Drop the series of replicas that departed more than ``DEPARTED_KEEP_S`` ago."""
        gone = {mb for mb, at in self._departed.items() if now - at >= DEPARTED_KEEP_S}
        for mb in gone:
            del self._departed[mb]
        for key in [k for k in self._children if k[0] == id(self.requests) and k[1:3] in gone]:
            del self._children[key]
            self.requests.remove(*key[1:])

    def request(self, model: str, backend: str, status: int, duration_s: float) -> None:
        if self._departed:
            self._departed.pop((model, backend), None)  # it came back
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

    def slept(self, model: str) -> None:
        self._child(self.sleeps, model).inc()

    def woke(self, model: str, seconds: float) -> None:
        self._child(self.wake, model).observe(seconds)

    def reject(self, reason: str, model: str = "") -> None:
        self._child(self.rejections, model, reason).inc()

    def retry(self, model: str, reason: str) -> None:
        self._child(self.retries, model, reason).inc()

    def adapter_load(self, model: str, outcome: str) -> None:
        self._child(self.adapter_loads, model, outcome).inc()

    def limit_store_error(self, cause: str) -> None:
        self._child(self.limit_store_errors, cause).inc()

    def limit_check(self, mode: str) -> None:
        self._child(self.limit_checks, mode).inc()

    def kv_problem(self, model: str, cause: str) -> None:
        self._child(self.kv_event_problems, model, cause).inc()

    def waited(self, model: str, seconds: float) -> None:
        self._child(self.queue_wait, model).observe(seconds)
