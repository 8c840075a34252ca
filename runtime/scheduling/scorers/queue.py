"""``queue``: a shorter engine-side wait queue is better."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.inputs import Context, Replica
from runtime.scheduling.kinds import Category, Need
from runtime.scheduling.pipeline import Scorer, invert_normalised
from runtime.scheduling.registry import register_scorer


@register_scorer("queue", Category.DISTRIBUTION, needs=[Need.ENGINE_STATS])
class QueueScorer(Scorer):
    """A shorter engine-side wait queue is better."""

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        return invert_normalised([r.engine_queued for r in candidates])
