"""The routing pipeline: filters -> scorers (each in [0, 1], affinity or distribution) -> picker.

A strategy is data: which filters, which scorers with which weights. Scorers that pull toward
affinity (prefix, session) are ignored for a replica above the load guard, so a hot prefix cannot
pile onto one overloaded replica; distribution scorers (load, latency, KV) always count.
Everything here is a pure function of the candidates and the request context, so the strategies
are property-tested without a network.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from runtime.router.backends import Backend


@dataclass(slots=True)
class Context:
    """What the strategies may look at in a request."""

    model: str
    prompt: str = ""
    session: str | None = None
    now: float = 0.0
    exclude: frozenset[str] = frozenset()  # replicas already tried by this request
    notes: dict[str, object] = field(default_factory=dict)  # scorers leave state for on_routed


class Filter(Protocol):
    name: str

    def keep(self, backends: Sequence[Backend], ctx: Context) -> list[Backend]: ...


class Eligible:
    """Healthy, circuit allows, under its concurrency cap, not already tried by this request."""

    name = "eligible"

    def keep(self, backends: Sequence[Backend], ctx: Context) -> list[Backend]:
        now = ctx.now
        exclude = ctx.exclude
        return [
            b
            for b in backends
            if b.healthy and b.inflight < b.cap and b.breaker.allows(now) and b.url not in exclude
        ]


class Scorer(ABC):
    """One opinion per candidate, in [0, 1]; ``affinity`` scorers are subject to the load guard."""

    name: ClassVar[str] = ""
    affinity: ClassVar[bool] = False

    @abstractmethod
    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]: ...

    def on_routed(self, backend: Backend, ctx: Context) -> None:
        """Remember where a request went (affinity scorers); most scorers have no memory."""
        return None


def invert_normalised(values: Sequence[float]) -> list[float]:
    """Lowest value -> 1, highest -> 0, linear between; all equal -> all 1."""
    lo = min(values)
    hi = max(values)
    if hi <= lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]


class Strategy:
    """Filters, then a weighted blend of scorers, then the best (ties broken at random)."""

    def __init__(
        self,
        name: str,
        scorers: Sequence[tuple[Scorer, float]],
        *,
        filters: Sequence[Filter] = (),
        load_guard_ratio: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.filters: list[Filter] = [Eligible(), *filters]
        self.scorers = [(s, w) for s, w in scorers if w > 0]
        self.load_guard_ratio = load_guard_ratio
        self.rng = rng or random.Random()

    def pick(self, backends: Sequence[Backend], ctx: Context) -> Backend | None:
        candidates = list(backends)
        for f in self.filters:
            candidates = f.keep(candidates, ctx)
            if not candidates:
                return None
        if len(candidates) == 1 and not self.scorers:
            return candidates[0]
        total = [0.0] * len(candidates)
        guard = self.load_guard_ratio
        for scorer, weight in self.scorers:
            scores = scorer.score(candidates, ctx)
            if scorer.affinity:
                for i, b in enumerate(candidates):
                    if b.inflight / b.cap <= guard:
                        total[i] += weight * scores[i]
            else:
                for i in range(len(candidates)):
                    total[i] += weight * scores[i]
        best = max(total)
        winners = [b for b, t in zip(candidates, total, strict=True) if t >= best - 1e-9]
        return winners[0] if len(winners) == 1 else self.rng.choice(winners)

    def on_routed(self, backend: Backend, ctx: Context) -> None:
        """Tell affinity scorers where this request went, so the next one with its prefix follows."""
        for scorer, _ in self.scorers:
            scorer.on_routed(backend, ctx)

    def index_sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for scorer, _ in self.scorers:
            size = getattr(scorer, "index_size", None)
            if callable(size):
                sizes[scorer.name] = int(size())
        return sizes
