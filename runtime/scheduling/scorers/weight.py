"""``weight``: the static share each replica is given in the config."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.inputs import Context, Replica
from runtime.scheduling.kinds import Category
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer


@register_scorer("weight", Category.DISTRIBUTION)
class WeightScorer(Scorer):
    """Static share from the config (``static_backends[].weight``), relative to the largest."""

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        top = max(r.weight for r in candidates)
        return [r.weight / top for r in candidates]
