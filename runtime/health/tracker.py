"""What the monitor knows about one replica: its health, its last signals and their windows.

Pure bookkeeping (no I/O): the probe shell feeds it outcomes and parsed metrics with timestamps,
and it answers with feed entries. Stale metrics keep their last values but are flagged, so the
router can tell "queue 0 an hour ago" from "queue 0 now".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.config import EngineKind
from runtime.engines import Signal, facts
from runtime.health import state as st
from runtime.health.feed import ModelSummary, ReplicaMetrics, ReplicaStatus
from runtime.health.window import WindowedCounter, WindowedHistogram, merge, quantile, ratio
from runtime.metrics_text import ParsedMetrics, wanted_sample_names
from runtime.model_view import in_panic

GAUGES = (Signal.QUEUED, Signal.RUNNING, Signal.KV_USAGE, Signal.PREFIX_HIT_RATE)
COUNTERS = (Signal.PREFIX_HITS, Signal.PREFIX_QUERIES, Signal.PREEMPTIONS)
HISTOGRAMS = (Signal.TTFT, Signal.INTER_TOKEN)


def wanted_for(kind: EngineKind) -> frozenset[str]:
    """Every sample name the monitor reads from this engine kind, old names included."""
    f = facts(kind)
    return wanted_sample_names(name for names in f.metrics.values() for name in names)


@dataclass
class Tracker:
    url: str
    model: str
    engine: EngineKind
    window_s: float
    health: st.Health
    last_probe_at: float | None = None
    metrics_at: float | None = None
    metrics_stale: bool = True
    gauges: dict[Signal, float | None] = field(default_factory=dict)
    counters: dict[Signal, WindowedCounter] = field(default_factory=dict)
    histograms: dict[Signal, WindowedHistogram] = field(default_factory=dict)
    probes: int = 0
    adapters: list[str] | None = None  # what the engine's model list said last, for models with adapters

    @classmethod
    def new(cls, url: str, model: str, engine: EngineKind, window_s: float, now_s: float) -> Tracker:
        return cls(url=url, model=model, engine=engine, window_s=window_s, health=st.initial(now_s))

    def observe_metrics(self, parsed: ParsedMetrics, at_s: float) -> None:
        f = facts(self.engine)
        for sig in GAUGES:
            self.gauges[sig] = parsed.first_total(f.names(sig))
        for sig in COUNTERS:
            value = parsed.first_total(f.names(sig))
            if value is None:
                self.counters.pop(sig, None)
                continue
            self.counters.setdefault(sig, WindowedCounter(self.window_s)).add(at_s, value)
        for sig in HISTOGRAMS:
            buckets = parsed.first_buckets(f.names(sig))
            if buckets is None:
                self.histograms.pop(sig, None)
                continue
            self.histograms.setdefault(sig, WindowedHistogram(self.window_s)).add(at_s, buckets)
        self.metrics_at = at_s
        self.metrics_stale = False

    def metrics_failed(self) -> None:
        self.metrics_stale = True

    def apply(
        self, outcome: st.Outcome, now_s: float, *, eject_after: int, readmit_after: int
    ) -> st.Transition | None:
        self.probes += 1
        self.last_probe_at = now_s
        self.health, transition = st.step(
            self.health, outcome, now_s, eject_after=eject_after, readmit_after=readmit_after
        )
        return transition

    def window_histogram(self, sig: Signal) -> dict[float, float] | None:
        h = self.histograms.get(sig)
        return h.delta() if h is not None else None

    def window_count(self, sig: Signal) -> float:
        """Observations of a histogram inside the window (requests answered): how much a p95 stands on."""
        h = self.window_histogram(sig)
        return max(h.values(), default=0.0) if h else 0.0

    def signals(self) -> ReplicaMetrics:
        ttft = self.window_histogram(Signal.TTFT)
        itl = self.window_histogram(Signal.INTER_TOKEN)
        hit_rate = self.gauges.get(Signal.PREFIX_HIT_RATE)
        if hit_rate is None:
            hits, queries = self.counters.get(Signal.PREFIX_HITS), self.counters.get(Signal.PREFIX_QUERIES)
            if hits is not None and queries is not None:
                hit_rate = ratio(hits.increase(), queries.increase())
        preempt = self.counters.get(Signal.PREEMPTIONS)
        return ReplicaMetrics(
            queued=self.gauges.get(Signal.QUEUED),
            running=self.gauges.get(Signal.RUNNING),
            kv_usage=self.gauges.get(Signal.KV_USAGE),
            prefix_hit_rate=hit_rate,
            ttft_p50_s=quantile(0.5, ttft) if ttft else None,
            ttft_p95_s=quantile(0.95, ttft) if ttft else None,
            inter_token_p50_s=quantile(0.5, itl) if itl else None,
            inter_token_p95_s=quantile(0.95, itl) if itl else None,
            preemptions_window=preempt.increase() if preempt is not None else None,
        )

    def status(self, now_s: float) -> ReplicaStatus:
        h = self.health
        return ReplicaStatus(
            url=self.url,
            model=self.model,
            engine=self.engine.value,
            state=h.state,
            routable=h.routable,
            admitted=h.ever_healthy,
            reason=h.reason,
            detail=h.detail,
            since=h.since_s,
            consecutive_failures=h.consecutive_failures,
            consecutive_successes=h.consecutive_successes,
            last_probe_at=self.last_probe_at,
            metrics=self.signals(),
            metrics_at=self.metrics_at,
            metrics_age_s=(now_s - self.metrics_at) if self.metrics_at is not None else None,
            metrics_stale=self.metrics_stale,
            adapters=self.adapters,
        )


def in_panic_now(trackers: list[Tracker], max_ejected_percent: float) -> bool:
    """Is the model in panic: more than ``max_ejected_percent`` of its admitted replicas (those that passed a
    probe since found) ejected? The front ends decide the same from the feed (``runtime.model_view``)."""
    admitted = [t for t in trackers if t.health.ever_healthy]
    return in_panic(len(admitted), sum(not t.health.routable for t in admitted), max_ejected_percent)


def summarize(model: str, trackers: list[Tracker], max_ejected_percent: float) -> ModelSummary:
    """Per-model aggregates over routable replicas with fresh metrics; stale values are not summed."""
    routable = [t for t in trackers if t.health.routable]
    fresh = [t for t in routable if not t.metrics_stale]

    def total(sig: Signal) -> float | None:
        values = [v for t in fresh if (v := t.gauges.get(sig)) is not None]
        return sum(values) if values else None

    kv = [v for t in fresh if (v := t.gauges.get(Signal.KV_USAGE)) is not None]
    ttft = merge([h for t in fresh if (h := t.window_histogram(Signal.TTFT))])
    return ModelSummary(
        model=model,
        replicas=len(trackers),
        healthy_replicas=sum(1 for t in trackers if t.health.state is st.State.HEALTHY),
        routable_replicas=len(routable),
        panic=in_panic_now(trackers, max_ejected_percent),
        queue_depth=total(Signal.QUEUED),
        running=total(Signal.RUNNING),
        kv_usage_mean=sum(kv) / len(kv) if kv else None,
        kv_usage_max=max(kv) if kv else None,
        ttft_p95_s=quantile(0.95, ttft) if ttft else None,
    )
