"""``/metrics`` of the batcher: ``inferstack_batcher_*`` in its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NS = "inferstack_batcher"
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)
WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class BatcherMetrics:
    """Batch size and wait histograms, queue depth, items (rate() of ``items_total`` is items/s)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.batch_size = Histogram(
            f"{NS}_batch_size", "Inputs per engine call.", ["model"], buckets=SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            f"{NS}_batch_tokens",
            "Estimated tokens per engine call.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.wait = Histogram(
            f"{NS}_wait_seconds",
            "Time an input waited in the queue.",
            ["model"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.engine_seconds = Histogram(
            f"{NS}_engine_seconds",
            "Duration of one engine call.",
            ["model"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(f"{NS}_queue_depth", "Inputs waiting for a batch.", ["model"], registry=r)
        self.items = Counter(
            f"{NS}_items",
            "Inputs by outcome (ok, error, dropped, rejected).",
            ["model", "outcome"],
            registry=r,
        )
        self.items_per_second = Gauge(
            f"{NS}_items_per_second", "Inputs answered per second over the last 10 s.", ["model"], registry=r
        )
        self.requests = Counter(
            f"{NS}_requests", "Client requests by status code.", ["model", "code"], registry=r
        )
        self.engine_calls = Counter(
            f"{NS}_engine_calls",
            "Engine calls by outcome (ok, error, retry_alone).",
            ["model", "outcome"],
            registry=r,
        )
