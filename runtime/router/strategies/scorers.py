"""Scorers shared by several strategies: load, latency, KV/queue, static weight and rotation."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.router.backends import Backend
from runtime.router.strategies.base import Context, Scorer, invert_normalised


class LoadScorer(Scorer):
    """Fewer in-flight requests (plus the engine's own queue) is better."""

    name = "load"

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        return invert_normalised([b.inflight + b.engine_queued for b in backends])


class LatencyScorer(Scorer):
    """Lower EWMA of time-to-first-token is better; a replica without samples gets the best score
    (so new replicas are tried and measured)."""

    name = "latency"

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        known = [b.ttft_ewma_s for b in backends if b.ttft_ewma_s is not None]
        if not known:
            return [1.0] * len(backends)
        lo = min(known)
        return invert_normalised([lo if b.ttft_ewma_s is None else b.ttft_ewma_s for b in backends])


class KvScorer(Scorer):
    """More free KV cache (as the health monitor or our probe reports) is better; unknown = neutral."""

    name = "kv"

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        return [0.5 if b.kv_usage is None else max(0.0, min(1.0, 1.0 - b.kv_usage)) for b in backends]


class QueueScorer(Scorer):
    """A shorter engine-side wait queue is better."""

    name = "queue"

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        return invert_normalised([b.engine_queued for b in backends])


class WeightScorer(Scorer):
    """Static share from the config (``static_backends[].weight``), relative to the largest."""

    name = "weight"

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        top = max(b.weight for b in backends)
        return [b.weight / top for b in backends]


class RotationScorer(Scorer):
    """1 for the next replica in turn, 0 for the others: round robin as a scorer."""

    name = "rotation"

    def __init__(self) -> None:
        self.counter = 0

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        turn = self.counter % len(backends)
        self.counter += 1
        return [1.0 if i == turn else 0.0 for i in range(len(backends))]
