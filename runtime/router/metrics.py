"""The router's metrics, all under ``inferstack_router_*`` in a registry of its own.

The four families every request touches (requests, duration, time to first byte, tokens) are plain
dicts of numbers exposed by a collector (``Counts``, ``Histograms``): one dict update per event, where
prometheus-client's children take a lock and several Python calls per update (a histogram walks its
buckets in Python). The router is one event-loop thread, and /metrics is rendered on it, so nothing else
touches these dicts. The rarer families keep prometheus-client's types, children cached per label set.
Gauges that mirror live state (queue depth, in-flight, circuit state, index size) are filled in at
scrape time by a collector rather than on every request.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from runtime.scheduling import Report
from runtime.scheduling.fair_queue import Place
from runtime.versions import Split

if TYPE_CHECKING:
    from runtime.router.model_state import ModelState

DEPARTED_KEEP_S = 600.0
"""How long a departed replica's request counters stay in /metrics: longer than the alerts' and dashboards'
rate windows, so the errors of a replica that crashed still count after it left (a series scraped once, then
gone, has no rate). Then they go, so pod churn does not grow /metrics without bound."""
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: Gauges filled at scrape time from live state: name (after ``inferstack_router_``) -> help, labels.
LIVE_GAUGES: dict[str, tuple[str, list[str]]] = {
    "queue_depth": ("Requests waiting for a free replica", ["model"]),
    "queue_waiting": (
        "Requests waiting for a free replica per tenant (from the config; 'other' without a key) and band",
        ["model", "tenant", "band"],
    ),
    "backend_inflight": ("Requests in flight per replica", ["model", "backend"]),
    "circuit_state": ("Circuit per replica: 0 closed, 1 half-open, 2 open", ["model", "backend"]),
    "backend_healthy": (
        "1 if the replica is considered healthy (0 if ejected, even while a panic routes to it)",
        ["model", "backend"],
    ),
    "prefix_index_entries": ("Entries in the prefix / session index", ["model", "index"]),
    "prefix_hit_rate": ("Share of prefix lookups that found a replica", ["model"]),
    "backends": ("Replicas known per model", ["model"]),
    "version_weight": ("Percent of a versioned model's requests each version gets now", ["model", "version"]),
    "backends_asleep": ("Replicas asleep per model (sleep mode: a request wakes one)", ["model"]),
    "kv_view_blocks": ("Blocks each replica's engine caches, as its KV events say", ["model", "backend"]),
    "kv_view_synced": ("1 if the replica's KV events are followed and were replayed", ["model", "backend"]),
    "limit_store_up": ("1 while the shared rate-limit store answers; 0: limits are per replica", []),
}
Snapshot = dict[str, list[tuple[tuple[str, ...], float]]]


def live_gauges(models: Mapping[str, ModelState], splits: Mapping[str, Split] | None = None) -> Snapshot:
    """The live gauges' samples: wait lines, replicas, version weights, and what each strategy's scorers
    report. A version's series carry its own name ('<model>-<version>'), as its request metrics do."""
    out: Snapshot = {name: [] for name in LIVE_GAUGES}
    for model, split in (splits or {}).items():
        total = sum(split.weights) or 1.0
        for version, weight in zip(split.versions, split.weights, strict=True):
            out["version_weight"].append(((model, version), 100.0 * weight / total))
    for name, m in models.items():
        out["queue_depth"].append(((name,), float(len(m.queue))))
        for tenant, band, waiting in m.queue.waiters.waiting():
            out["queue_waiting"].append(((name, tenant, band.value), float(waiting)))
        out["backends"].append(((name,), float(len(m.replicas))))
        if m.sleep is not None:
            out["backends_asleep"].append(((name,), float(sum(1 for r in m.replicas if r.asleep))))
        for r in m.replicas:
            out["backend_inflight"].append(((name, r.url), float(r.inflight)))
            out["circuit_state"].append(((name, r.url), float(r.breaker.state)))
            out["backend_healthy"].append(((name, r.url), 1.0 if r.reported_healthy else 0.0))
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
            for r in m.replicas:
                out["kv_view_blocks"].append(((name, r.url), float(index.held(r.url))))
                out["kv_view_synced"].append(((name, r.url), 1.0 if r.url in index.synced else 0.0))
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


class Counts(Collector):
    """A counter family as a dict of label values -> count; callers add to ``values`` directly."""

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name = name
        self.doc = doc
        self.labels = list(labels)
        self.values: dict[tuple[Any, ...], float] = {}

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for values, v in list(self.values.items()):
            fam.add_metric([str(x) for x in values], v)
        yield fam


class Histograms(Collector):
    """A histogram family: label values -> [count per bucket..., count above the last bound, sum]."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name = name
        self.doc = doc
        self.labels = list(labels)
        self.bounds = tuple(bounds)
        self.les = [floatToGoString(b) for b in (*self.bounds, math.inf)]  # type: ignore[no-untyped-call]
        self.series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        row = self.series.get(labels)
        if row is None:
            row = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        row[bisect_left(self.bounds, value)] += 1  # a bucket counts values <= its bound, as Prometheus'
        row[-1] += value

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, row in list(self.series.items()):
            cumulative, acc = [], 0.0
            for le, n in zip(self.les, row, strict=False):
                acc += n
                cumulative.append((le, acc))
            fam.add_metric(list(values), cumulative, row[-1])
        yield fam


def _add_tokens(
    counts: dict[tuple[Any, ...], float], labels: tuple[str, ...], prompt: int, completion: int
) -> None:
    if prompt:
        key = (*labels, "in")
        counts[key] = counts.get(key, 0.0) + prompt
    if completion:
        key = (*labels, "out")
        counts[key] = counts.get(key, 0.0) + completion


class RouterMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series double the scrape for nothing a dashboard uses
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counts(
            "inferstack_router_requests",
            "Requests by model, replica and status",
            ["model", "backend", "status"],
        )
        self.rejections = Counter(
            "inferstack_router_rejections",
            "Requests refused, not served (reason: before routing, or a batcher's full queue after it); model is"
            " empty unless the model is served (no client-chosen labels)",
            ["model", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "inferstack_router_retries", "Retries to another replica", ["model", "reason"], registry=r
        )
        self.tokens = Counts("inferstack_router_tokens", "Tokens from usage", ["model", "direction"])
        self.duration = Histograms(
            "inferstack_router_request_duration_seconds",
            "End-to-end latency seen by the router",
            ["model"],
            LATENCY_BUCKETS_S,
        )
        self.ttft = Histograms(
            "inferstack_router_ttft_seconds",
            "Time to the first body byte from the engine",
            ["model"],
            LATENCY_BUCKETS_S,
        )
        for hot in (self.requests, self.tokens, self.duration, self.ttft):
            r.register(hot)
        self.queue_wait = Histogram(
            "inferstack_router_queue_wait_seconds",
            "Time spent waiting for a free replica",
            ["model"],
            buckets=WAIT_BUCKETS_S,
            registry=r,
        )
        self.fair_admissions = Counter(
            "inferstack_router_fair_admitted",
            "Requests given a replica, per tenant (from the config; 'other' without a key) and band",
            ["model", "tenant", "band"],
            registry=r,
        )
        self.fair_sheds = Counter(
            "inferstack_router_fair_shed",
            "Requests refused for want of a replica (queue full, deadline, none ready), per tenant and band",
            ["model", "tenant", "band"],
            registry=r,
        )
        # per version of a model served in versions (the canary's numbers beside the stable's)
        self.version_requests = Counts(
            "inferstack_router_version_requests",
            "Requests of a versioned model by version and status",
            ["model", "version", "status"],
        )
        self.version_tokens = Counts(
            "inferstack_router_version_tokens",
            "Tokens from usage by version",
            ["model", "version", "direction"],
        )
        self.version_duration = Histograms(
            "inferstack_router_version_request_duration_seconds",
            "End-to-end latency by version",
            ["model", "version"],
            LATENCY_BUCKETS_S,
        )
        self.version_ttft = Histograms(
            "inferstack_router_version_ttft_seconds",
            "Time to the first body byte from the engine, by version",
            ["model", "version"],
            LATENCY_BUCKETS_S,
        )
        for hot in (self.version_requests, self.version_tokens, self.version_duration, self.version_ttft):
            r.register(hot)
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
        self.pd_requests = Counter(
            "inferstack_router_pd_requests",
            "Requests of disaggregated (prefill/decode) models answered, by how: disaggregated (the decode used"
            " a prefill's KV) or decode_only (a fallback: the decode computed the prompt itself)",
            ["model", "outcome"],
            registry=r,
        )
        self.pd_fallbacks = Counter(
            "inferstack_router_pd_fallbacks",
            "Requests of disaggregated models whose decode computed the prompt itself, by reason"
            " (no_prefill_replica, prefill_error, prefill_timeout, prefill_refused, prefill_adapter,"
            " transfer_failed, transfer_timeout, kv_lease, decode_error, unsplittable)",
            ["model", "reason"],
            registry=r,
        )
        self.migrations = Counter(
            "inferstack_router_migrations",
            "Streams moved to another replica mid-generation, by model and reason (reset, timeout,"
            " error_event, truncated, protocol, replacement_failed)",
            ["model", "reason"],
            registry=r,
        )
        self.migrated_tokens = Counter(
            "inferstack_router_migrated_tokens",
            "Tokens already generated that moved streams carried over to their replacement",
            ["model"],
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}
        self._departed: dict[tuple[str, str], float] = {}  # (model, replica url) -> when it departed

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

    def forget_replica(self, model: str, replica: str, now: float | None = None) -> None:
        """A replica departed: drop its series once ``DEPARTED_KEEP_S`` has passed (unless it comes back)."""
        now = time.monotonic() if now is None else now
        self._departed[(model, replica)] = now
        self.sweep(now)

    def sweep(self, now: float) -> None:
        """Drop the series of replicas that departed more than ``DEPARTED_KEEP_S`` ago."""
        gone = {mb for mb, at in self._departed.items() if now - at >= DEPARTED_KEEP_S}
        for mb in gone:
            del self._departed[mb]
        if gone:
            counts = self.requests.values
            for key in [k for k in counts if k[:2] in gone]:
                del counts[key]

    # ``version`` is (model clients send, version) for a version of a model: its numbers also go to the
    # inferstack_router_version_* series, where the versions of one model sit side by side.
    def request(
        self, model: str, replica: str, status: int, duration_s: float, version: tuple[str, str] | None = None
    ) -> None:
        if self._departed:
            self._departed.pop((model, replica), None)  # it came back
        counts = self.requests.values
        key = (model, replica, status)
        counts[key] = counts.get(key, 0.0) + 1.0
        if version:
            vcounts = self.version_requests.values
            vkey = (*version, status)
            vcounts[vkey] = vcounts.get(vkey, 0.0) + 1.0
        if duration_s >= 0:
            self.duration.observe((model,), duration_s)
            if version:
                self.version_duration.observe(version, duration_s)

    def first_byte(self, model: str, seconds: float, version: tuple[str, str] | None = None) -> None:
        self.ttft.observe((model,), seconds)
        if version:
            self.version_ttft.observe(version, seconds)

    def usage(self, model: str, prompt: int, completion: int, version: tuple[str, str] | None = None) -> None:
        _add_tokens(self.tokens.values, (model,), prompt, completion)
        if version:
            _add_tokens(self.version_tokens.values, version, prompt, completion)

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

    def pd_request(self, model: str, outcome: str) -> None:
        self._child(self.pd_requests, model, outcome).inc()

    def pd_fallback(self, model: str, reason: str) -> None:
        self._child(self.pd_fallbacks, model, reason).inc()

    def fair_admitted(self, model: str, place: Place) -> None:
        self._child(self.fair_admissions, model, place.tenant, place.band.value).inc()

    def fair_shed(self, model: str, place: Place) -> None:
        self._child(self.fair_sheds, model, place.tenant, place.band.value).inc()

    def waited(self, model: str, seconds: float) -> None:
        self._child(self.queue_wait, model).observe(seconds)

    def migration(self, model: str, reason: str, tokens: int) -> None:
        self._child(self.migrations, model, reason).inc()
        self._child(self.migrated_tokens, model).inc(tokens)
