"""What the router knows about each engine replica: the shared replica state (``runtime.replica``: load,
latency, health signals, circuit), plus the connection pool the proxy sends through and the opaque tag
clients see. No I/O here.
"""

from __future__ import annotations

import hashlib
import time
from urllib.parse import urlsplit

from runtime.breaker import Breaker, Circuit
from runtime.replica import ReplicaState
from runtime.router.adapters import ReplicaAdapters
from runtime.upstream import Pool

__all__ = ["BACKEND_HEADER", "Breaker", "Circuit", "Replica", "replica_tag"]


#: Answer header naming the replica that served a request (by ``replica_tag``). The header's name is what
#: clients read, so it keeps the word "backend".
BACKEND_HEADER = b"x-inferstack-backend"


def replica_tag(url: str) -> str:
    """The opaque, stable name of a replica in the ``x-inferstack-backend`` header."""
    return hashlib.sha256(url.encode()).hexdigest()[:12]


class Replica(ReplicaState):
    """One replica of one model, with the router's connection pool to it and its sleep state."""

    __slots__ = ("adapters", "asleep", "last_used", "pool", "prompt_tokens", "tag")

    def __init__(self, url: str, cap: int, breaker: Breaker, weight: float = 1.0) -> None:
        super().__init__(url, cap, breaker, weight)
        # what the x-inferstack-backend answer header carries: stable, opaque (no internal address
        # reaches clients), and anyone holding the replica list can compute it: sha256(url)[:12]
        self.tag = replica_tag(url).encode()
        parts = urlsplit(url)
        self.pool = Pool(parts.hostname or "127.0.0.1", parts.port or 80, max_idle=cap)
        self.adapters = ReplicaAdapters()
        # sleep mode: whether the engine sleeps, and when it last did anything (our requests or, from its
        # prompt-token counter, another router's)
        self.asleep = False
        self.last_used = time.monotonic()
        self.prompt_tokens: float | None = None

    @property
    def load(self) -> float:
        """In-flight requests plus what the engine reports waiting in its own queue."""
        return self.inflight + self.engine_queued

    @property
    def load_ratio(self) -> float:
        return self.inflight / self.cap

    def has_room(self) -> bool:
        return self.inflight < self.cap
