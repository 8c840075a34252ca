"""``/metrics`` of the batch service: ``inferstack_batches_*`` in its own registry.

Counters move as work happens; the gauges (batches by status, pending and in-flight requests, the
window, the oldest batch's progress age) are set from the store and the runner right before a scrape.
``inferstack_batches_oldest_progress_age_seconds`` is what the stuck-batch alert reads: the longest any
unfinished batch has gone without a recorded result (or, validating, since it was created).

Series are per model the platform serves (validation refuses any other name), and the per-model gauges
of a model no unfinished batch uses any more are dropped: input files cannot grow them. The background
loops (``loop``: work, flusher, janitor) count their errors, and ``loop_failing`` is 1 while a loop's
last turn failed (then ``/readyz`` fails too).
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NS = "inferstack_batches"
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class BatchMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{NS}_requests",
            "Requests of batches sent to the router, by outcome: ok (2xx), error (other answer or none,"
            " written to the error file), refused (no headroom: sent again later), rate_limited (the"
            " batch's owner is over its rate limit: its batches wait), retried (server or transport error:"
            " sent again).",
            ["model", "outcome"],
            registry=r,
        )
        self.finished = Counter(
            f"{NS}_finished", "Batches that reached a terminal status.", ["status"], registry=r
        )
        self.uploads = Gauge(
            f"{NS}_uploads_in_progress",
            "File uploads being received now (bounded in all and per key: api.Uploads).",
            registry=r,
        )
        self.duration = Histogram(
            f"{NS}_request_duration_seconds",
            "Time of one request of a batch through the router.",
            ["model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.batches = Gauge(f"{NS}_batches", "Batches by status.", ["status"], registry=r)
        self.pending = Gauge(
            f"{NS}_pending_requests",
            "Requests of unfinished batches without a result.",
            ["model"],
            registry=r,
        )
        self.inflight = Gauge(
            f"{NS}_inflight_requests", "Requests of batches at the router now.", ["model"], registry=r
        )
        self.window = Gauge(
            f"{NS}_window",
            "Requests of batches the model's lane may have in flight now.",
            ["model"],
            registry=r,
        )
        self.loop_errors = Counter(
            f"{NS}_loop_errors",
            "Turns of a background loop (work, flusher, janitor) that failed; the loop goes on after a backoff.",
            ["loop"],
            registry=r,
        )
        self.loop_failing = Gauge(
            f"{NS}_loop_failing",
            "1 while a background loop's last turn failed (the service is then not ready), else 0.",
            ["loop"],
            registry=r,
        )
        self.oldest_progress_age = Gauge(
            f"{NS}_oldest_progress_age_seconds",
            "Longest time any unfinished batch has gone without progress (0 when none is unfinished).",
            registry=r,
        )

    def forget_model(self, model: str) -> None:
        """Drop a model's gauges (no unfinished batch uses it now); its counters stay, as counters do."""
        for gauge in (self.pending, self.inflight, self.window):
            with contextlib.suppress(KeyError):  # never shown
                gauge.remove(model)
