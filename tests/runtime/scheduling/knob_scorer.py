"""A scorer with a knob, for the tests: this one module is all it takes (in ``runtime/scheduling/scorers/``
it would be a built-in; named in ``router.plugins`` a plug-in, which may read built-in knobs only).
The knob's record is its one definition: ``StrategyConfig`` gets a field from it, the scorer reads it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from runtime.scheduling import Category, Context, Knob, Replica, Scorer, StrategySettings, register_scorer

PINNED_RANK = Knob(
    "pinned_rank",
    int,
    0,
    "pinned: which replica, by the rank of its URL among the candidates, takes the requests.",
    ge=0,
    le=15,
)


@register_scorer("pinned", Category.DISTRIBUTION, knobs=[PINNED_RANK])
class PinnedScorer(Scorer):
    """1 for the candidate whose URL has rank ``pinned_rank`` (the last if there are fewer), 0 for others."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    @classmethod
    def from_knobs(cls, settings: StrategySettings) -> Self:
        return cls(PINNED_RANK.read(settings))

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        urls = sorted(r.url for r in candidates)
        pinned = urls[min(self.rank, len(urls) - 1)]
        return [1.0 if r.url == pinned else 0.0 for r in candidates]
