"""``/metrics`` of the health monitor: ``inferstack_health_*`` per replica and per model.

A custom collector renders the monitor's current state at scrape time, so a replica that left the
fleet leaves the metrics too (no stale label sets), and nothing is ever written twice. Stale engine
values are not exported as if fresh: per-replica signals carry ``inferstack_health_metrics_stale``
beside them, and per-model aggregates only count fresh, routable replicas.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.health.monitor import Monitor
from runtime.health.state import State

NS = "inferstack_health"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MonitorCollector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        self.monitor.sweep_departed()  # departed replicas' counters go once they had their scrapes
        feed = self.monitor.feed()
        lbl = ["model", "backend"]
        state = GaugeMetricFamily(
            f"{NS}_backend_state", "1 for the replica's current state.", labels=[*lbl, "state"]
        )
        up = GaugeMetricFamily(
            f"{NS}_backend_routable", "1 when the replica takes traffic (not ejected).", labels=lbl
        )
        fails = GaugeMetricFamily(
            f"{NS}_backend_consecutive_failures", "Hard probe failures in a row.", labels=lbl
        )
        stale = GaugeMetricFamily(f"{NS}_backend_metrics_stale", "1 when the last scrape failed.", labels=lbl)
        age = GaugeMetricFamily(
            f"{NS}_backend_metrics_age_seconds", "Age of the last good scrape.", labels=lbl
        )
        queued = GaugeMetricFamily(
            f"{NS}_backend_queued_requests", "Requests waiting in the engine.", labels=lbl
        )
        running = GaugeMetricFamily(
            f"{NS}_backend_running_requests", "Requests running in the engine.", labels=lbl
        )
        kv = GaugeMetricFamily(f"{NS}_backend_kv_cache_usage_ratio", "KV cache usage 0..1.", labels=lbl)
        hit = GaugeMetricFamily(
            f"{NS}_backend_prefix_cache_hit_ratio", "Prefix cache hit rate, window.", labels=lbl
        )
        ttft = GaugeMetricFamily(
            f"{NS}_backend_ttft_seconds", "Time to first token over the window.", labels=[*lbl, "quantile"]
        )
        itl = GaugeMetricFamily(
            f"{NS}_backend_inter_token_latency_seconds",
            "Inter-token latency over the window.",
            labels=[*lbl, "quantile"],
        )
        pre = GaugeMetricFamily(
            f"{NS}_backend_preemptions_window", "Preemptions during the window.", labels=lbl
        )
        for b in feed.backends:
            key = [b.model, b.url]
            for s in State:
                state.add_metric([*key, s.value], 1.0 if b.state is s else 0.0)
            up.add_metric(key, 1.0 if b.routable else 0.0)
            fails.add_metric(key, float(b.consecutive_failures))
            stale.add_metric(key, 1.0 if b.metrics_stale else 0.0)
            if b.metrics_age_s is not None:
                age.add_metric(key, b.metrics_age_s)
            m = b.metrics
            for fam, value in (
                (queued, m.queued),
                (running, m.running),
                (kv, m.kv_usage),
                (hit, m.prefix_hit_rate),
            ):
                if value is not None:
                    fam.add_metric(key, value)
            if m.preemptions_window is not None:
                pre.add_metric(key, m.preemptions_window)
            for fam, q, value in (
                (ttft, "0.5", m.ttft_p50_s),
                (ttft, "0.95", m.ttft_p95_s),
                (itl, "0.5", m.inter_token_p50_s),
                (itl, "0.95", m.inter_token_p95_s),
            ):
                if value is not None:
                    fam.add_metric([*key, q], value)
        yield from (state, up, fails, stale, age, queued, running, kv, hit, ttft, itl, pre)

        c = self.monitor.counters
        probes = CounterMetricFamily(
            f"{NS}_probes", "Probe rounds by result (ok or a reason code).", labels=[*lbl, "result"]
        )
        for (model, url, result), n in sorted(c.probes.items()):
            probes.add_metric([model, url, result], n)
        ej = CounterMetricFamily(f"{NS}_ejections", "Replicas taken out of rotation.", labels=lbl)
        for (model, url), n in sorted(c.ejections.items()):
            ej.add_metric([model, url], n)
        re = CounterMetricFamily(f"{NS}_readmissions", "Replicas put back into rotation.", labels=lbl)
        for (model, url), n in sorted(c.readmissions.items()):
            re.add_metric([model, url], n)
        rem = CounterMetricFamily(f"{NS}_remediations", "Wedged pods deleted.", labels=["model"])
        for model, n in sorted(c.remediations.items()):
            rem.add_metric([model], n)
        failed = CounterMetricFamily(
            f"{NS}_remediation_failures",
            "Remediation attempts that deleted no pod (API error, timeout, no pod found): retried an interval later.",
            labels=["model"],
        )
        for model, n in sorted(c.remediation_failures.items()):
            failed.add_metric([model], n)
        yield from (probes, ej, re, rem, failed)

        rb = CounterMetricFamily(
            f"{NS}_canary_rollbacks",
            "Canary versions rolled back to the stable version, by the signal that decided.",
            labels=["model", "version", "metric"],
        )
        for (model, version, metric), n in sorted(self.monitor.canaries.rollbacks.items()):
            rb.add_metric([model, version, metric], n)
        weight = GaugeMetricFamily(
            f"{NS}_version_weight",
            "Percent of a versioned model's requests each version gets.",
            labels=["model", "version"],
        )
        for v in feed.versions:
            for version, w in v.weights.items():
                weight.add_metric([v.model, version], w)
        yield from (rb, weight)

        ml = ["model"]
        replicas = GaugeMetricFamily(f"{NS}_model_replicas", "Replicas discovered.", labels=ml)
        healthy = GaugeMetricFamily(f"{NS}_model_healthy_replicas", "Replicas in state healthy.", labels=ml)
        routable = GaugeMetricFamily(
            f"{NS}_model_routable_replicas", "Replicas healthy or degraded.", labels=ml
        )
        qd = GaugeMetricFamily(
            f"{NS}_model_queue_depth", "Queued requests summed over fresh replicas.", labels=ml
        )
        run = GaugeMetricFamily(
            f"{NS}_model_running_requests", "Running requests, fresh replicas.", labels=ml
        )
        kvm = GaugeMetricFamily(
            f"{NS}_model_kv_cache_usage_ratio", "Mean KV usage of fresh replicas.", labels=ml
        )
        kvx = GaugeMetricFamily(
            f"{NS}_model_kv_cache_usage_max_ratio", "Max KV usage of fresh replicas.", labels=ml
        )
        tp95 = GaugeMetricFamily(
            f"{NS}_model_ttft_p95_seconds", "TTFT p95 of the merged window histograms.", labels=ml
        )
        panic = GaugeMetricFamily(
            f"{NS}_model_panic",
            "1 while more than max_ejected_percent of the model's replicas are ejected: the front ends route"
            " to all of them and no pod is remediated.",
            labels=ml,
        )
        for summary in feed.models:
            replicas.add_metric([summary.model], summary.replicas)
            panic.add_metric([summary.model], 1.0 if summary.panic else 0.0)
            healthy.add_metric([summary.model], summary.healthy_replicas)
            routable.add_metric([summary.model], summary.routable_replicas)
            for fam, value in (
                (qd, summary.queue_depth),
                (run, summary.running),
                (kvm, summary.kv_usage_mean),
                (kvx, summary.kv_usage_max),
                (tp95, summary.ttft_p95_s),
            ):
                if value is not None:
                    fam.add_metric([summary.model], value)
        yield from (replicas, healthy, routable, qd, run, kvm, kvx, tp95, panic)


def registry_for(monitor: Monitor) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
