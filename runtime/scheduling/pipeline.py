"""The routing pipeline: filters -> scorers (each in [0, 1], affinity or distribution) -> picker.

A strategy is data (``presets.py``): which filters, which scorers with which weights. Scorers that pull
toward affinity (prefix, session) are ignored for a replica above the load guard, so a hot prefix
cannot pile onto one overloaded replica; distribution scorers (load, latency, KV) always count.
Everything here is a pure function of the candidates and the request context, so strategies are
property-tested without a network.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import compress
from typing import ClassVar, Self, TypeVar

from runtime.scheduling.inputs import Context, Replica, StrategySettings
from runtime.scheduling.kinds import Knob, Need, Report

R = TypeVar("R", bound=Replica)

#: The load guard: the pipeline's knob, which every affinity scorer is subject to (``register_scorer``
#: adds it to their knobs), so none declares it itself.
LOAD_GUARD_RATIO = Knob(
    "load_guard_ratio",
    float,
    0.8,
    "Affinity scorers (prefix, session) are ignored for a replica whose requests in flight exceed"
    " this share of its concurrency cap: a hot prefix or session moves instead of overloading it.",
    gt=0,
    le=1,
    stack=True,
    position=3,
)


class Filter(ABC):
    """Drops candidates; registered by name with ``register_filter`` (which sets ``name``)."""

    name: ClassVar[str] = ""

    @abstractmethod
    def keep(self, candidates: Sequence[R], ctx: Context) -> list[R]: ...


class Eligible(Filter):
    """Healthy, circuit allows, under its concurrency cap, not already tried by this request.
    Every strategy starts with it; it is not a choice, so it is not registered."""

    name = "eligible"

    def keep(self, candidates: Sequence[R], ctx: Context) -> list[R]:
        now = ctx.now
        exclude = ctx.exclude
        if not exclude:  # the usual case (a first try): one test fewer per replica
            return [r for r in candidates if r.healthy and r.inflight < r.cap and r.breaker.allows(now)]
        return [
            r
            for r in candidates
            if r.healthy and r.inflight < r.cap and r.breaker.allows(now) and r.url not in exclude
        ]


class Scorer(ABC):
    """One opinion per candidate, in [0, 1]. ``register_scorer`` sets the class attributes below from
    its declaration, so a scorer's name, category, needs, knobs and reports are written once."""

    name: ClassVar[str] = ""
    affinity: ClassVar[bool] = False  # subject to the load guard
    needs: ClassVar[frozenset[Need]] = frozenset()
    reports: ClassVar[tuple[Report, ...]] = ()

    @classmethod
    def from_knobs(cls, settings: StrategySettings) -> Self:
        """A fresh scorer for one strategy; scorers with knobs (index sizes, block sizes) override this and
        read each knob they declared from ``settings`` with ``KNOB.read(settings)``."""
        return cls()

    @abstractmethod
    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]: ...

    def on_routed(self, replica: Replica, ctx: Context) -> None:
        """Remember where a request went (affinity scorers); most scorers have no memory."""
        return None

    def report(self) -> dict[Report, float]:
        """The values this scorer declared in ``reports``, for metrics."""
        return {}


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
        self.needs: frozenset[Need] = frozenset().union(*(s.needs for s, _ in self.scorers))

    def pick(self, replicas: Sequence[R], ctx: Context) -> R | None:
        candidates: Sequence[R] = replicas
        for f in self.filters:  # Eligible comes first and builds a new list: the caller's is never changed
            candidates = f.keep(candidates, ctx)
            if not candidates:
                return None
        if len(candidates) == 1 and not self.scorers:
            return candidates[0]
        total = [0.0] * len(candidates)
        guard = self.load_guard_ratio
        for scorer, weight in self.scorers:
            scores = scorer.score(candidates, ctx)
            if not any(scores):  # no opinion (no prefix match, no adapter): adds nothing
                continue
            if scorer.affinity:
                # affinity scores are mostly 0 (one home, a few holders): visit only the others
                for i in compress(range(len(candidates)), scores):
                    r = candidates[i]
                    if r.inflight / r.cap <= guard:
                        total[i] += weight * scores[i]
            else:
                total = [t + weight * s for t, s in zip(total, scores, strict=True)]
        best = max(total)
        winners = [r for r, t in zip(candidates, total, strict=True) if t >= best - 1e-9]
        return winners[0] if len(winners) == 1 else self.rng.choice(winners)

    def on_routed(self, replica: Replica, ctx: Context) -> None:
        """Tell affinity scorers where this request went, so the next one with its prefix follows."""
        for scorer, _ in self.scorers:
            scorer.on_routed(replica, ctx)

    def reports(self) -> dict[str, dict[Report, float]]:
        """Scorer name -> what it reports (only scorers that declared reports)."""
        return {scorer.name: scorer.report() for scorer, _ in self.scorers if scorer.reports}
