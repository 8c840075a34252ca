"""``rotation``: round robin as a scorer."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.inputs import Context, Replica
from runtime.scheduling.kinds import Category
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer


@register_scorer("rotation", Category.DISTRIBUTION)
class RotationScorer(Scorer):
    """1 for the next eligible replica in turn, 0 for the others: round robin as a scorer."""

    def __init__(self) -> None:
        self.counter = 0

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        turn = self.counter % len(candidates)
        self.counter += 1
        return [1.0 if i == turn else 0.0 for i in range(len(candidates))]
