"""What a front end knows about one engine replica: its load, latency, health signals and circuit.

Plain mutable state, shared by every front end (each front end's ``Replica``, in ``runtime.router.replicas``
and ``runtime.picker.replicas``, extends it with what only it needs): updated by the front end (in-flight, TTFT, outcomes)
and by the health feed or its own probe (engine queue, KV usage, health), and read by the scheduler,
whose ``Replica`` protocol (``runtime.scheduling``) it satisfies as it is. No I/O here.
"""

from __future__ import annotations

import time

from runtime.breaker import Breaker


class ReplicaState:
    """One replica of one model, as the scheduler reads it."""

    __slots__ = (
        "breaker",
        "cap",
        "ejected",
        "engine_queued",
        "engine_running",
        "healthy",
        "inflight",
        "kv_usage",
        "signals_at",
        "ttft_ewma_s",
        "url",
        "weight",
    )

    def __init__(self, url: str, cap: int, breaker: Breaker, weight: float = 1.0) -> None:
        self.url = url
        self.cap = cap
        self.weight = weight
        self.breaker = breaker
        self.inflight = 0
        self.healthy = True  # may take traffic: until the feed or a probe says otherwise
        # The health feed ejected it. Usually the same as not ``healthy``, but a model in panic
        # (``runtime.model_view.in_panic``) routes to its ejected replicas: they stay reported unhealthy.
        self.ejected = False
        self.engine_queued = 0.0
        self.engine_running = 0.0
        self.kv_usage: float | None = None
        self.signals_at = 0.0
        self.ttft_ewma_s: float | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url}, inflight={self.inflight})"

    @property
    def reported_healthy(self) -> bool:
        """What ``backend_healthy`` says: an ejected replica is not healthy, even while a panic routes to it
        (as Envoy's health stats stay true in panic), so dashboards and alerts see the ejection."""
        return self.healthy and not self.ejected

    def observe_ttft(self, seconds: float, alpha: float) -> None:
        prev = self.ttft_ewma_s
        self.ttft_ewma_s = seconds if prev is None else prev + alpha * (seconds - prev)

    def update_signals(
        self,
        *,
        healthy: bool,
        queued: float | None,
        running: float | None,
        kv_usage: float | None,
        ejected: bool = False,
    ) -> None:
        self.healthy = healthy
        self.ejected = ejected
        self.engine_queued = queued or 0.0
        self.engine_running = running or 0.0
        self.kv_usage = kv_usage
        self.signals_at = time.monotonic()
