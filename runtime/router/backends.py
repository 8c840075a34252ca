"""What the router knows about each engine replica: load, latency, health signals and its circuit.

Plain mutable state, updated by the proxy (in-flight, TTFT, outcomes), by the health feed or our
own probing (engine queue, KV usage, health), and read by the strategies. No I/O here.
"""

from __future__ import annotations

import hashlib
import time
from enum import IntEnum
from urllib.parse import urlsplit

from runtime.upstream import Pool


class Circuit(IntEnum):
    """Breaker states; the value is what ``inferstack_router_circuit_state`` exports."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Breaker:
    """Consecutive-failure circuit breaker with a single trial request when the open period ends."""

    __slots__ = ("failures", "open_s", "opened_at", "state", "threshold", "trial_in_flight")

    def __init__(self, threshold: int, open_s: float) -> None:
        self.threshold = threshold
        self.open_s = open_s
        self.failures = 0
        self.state = Circuit.CLOSED
        self.opened_at = 0.0
        self.trial_in_flight = False

    def allows(self, now: float) -> bool:
        """May a request go to this replica now? (Does not reserve the trial; see :meth:`on_start`.)"""
        if self.state is Circuit.CLOSED:
            return True
        if self.state is Circuit.OPEN:
            return now - self.opened_at >= self.open_s
        return not self.trial_in_flight

    def on_start(self, now: float) -> None:
        if self.state is Circuit.OPEN and now - self.opened_at >= self.open_s:
            self.state = Circuit.HALF_OPEN
        if self.state is Circuit.HALF_OPEN:
            self.trial_in_flight = True

    def on_success(self) -> None:
        self.failures = 0
        self.trial_in_flight = False
        self.state = Circuit.CLOSED

    def on_abandon(self) -> None:
        """The trial request ended without a verdict (its client left): let another one try."""
        if self.state is Circuit.HALF_OPEN:
            self.trial_in_flight = False

    def on_failure(self, now: float) -> None:
        self.failures += 1
        self.trial_in_flight = False
        if self.state is Circuit.HALF_OPEN or self.failures >= self.threshold:
            self.state = Circuit.OPEN
            self.opened_at = now


#: Answer header naming the replica that served a request (by ``backend_tag``).
BACKEND_HEADER = b"x-inferstack-backend"


def backend_tag(url: str) -> str:
    """The opaque, stable name of a replica in the ``x-inferstack-backend`` header."""
    return hashlib.sha256(url.encode()).hexdigest()[:12]


class Backend:
    """One replica of one model."""

    __slots__ = (
        "asleep",
        "breaker",
        "cap",
        "engine_queued",
        "engine_running",
        "healthy",
        "inflight",
        "kv_usage",
        "last_used",
        "pool",
        "prompt_tokens",
        "signals_at",
        "tag",
        "ttft_ewma_s",
        "url",
        "weight",
    )

    def __init__(self, url: str, cap: int, breaker: Breaker, weight: float = 1.0) -> None:
        self.url = url
        # what the x-inferstack-backend answer header carries: stable, opaque (no internal address
        # reaches clients), and anyone holding the replica list can compute it: sha256(url)[:12]
        self.tag = backend_tag(url).encode()
        parts = urlsplit(url)
        self.pool = Pool(parts.hostname or "127.0.0.1", parts.port or 80, max_idle=cap)
        self.cap = cap
        self.weight = weight
        self.breaker = breaker
        self.inflight = 0
        self.healthy = True  # until the feed or a probe says otherwise
        self.engine_queued = 0.0
        self.engine_running = 0.0
        self.kv_usage: float | None = None
        self.signals_at = 0.0
        self.ttft_ewma_s: float | None = None
        # sleep mode: whether the engine sleeps, and when it last did anything (our requests or, from its
        # prompt-token counter, another router's)
        self.asleep = False
        self.last_used = time.monotonic()
        self.prompt_tokens: float | None = None

    def __repr__(self) -> str:
        return f"Backend({self.url}, inflight={self.inflight})"

    @property
    def load(self) -> float:
        """In-flight requests plus what the engine reports waiting in its own queue."""
        return self.inflight + self.engine_queued

    @property
    def load_ratio(self) -> float:
        return self.inflight / self.cap

    def has_room(self) -> bool:
        return self.inflight < self.cap

    def observe_ttft(self, seconds: float, alpha: float) -> None:
        prev = self.ttft_ewma_s
        self.ttft_ewma_s = seconds if prev is None else prev + alpha * (seconds - prev)

    def update_signals(
        self, *, healthy: bool, queued: float | None, running: float | None, kv_usage: float | None
    ) -> None:
        self.healthy = healthy
        self.engine_queued = queued or 0.0
        self.engine_running = running or 0.0
        self.kv_usage = kv_usage
        self.signals_at = time.monotonic()
