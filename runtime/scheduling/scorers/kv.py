"""``kv``: more free KV cache is better."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.inputs import Context, Replica
from runtime.scheduling.kinds import Category, Need
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer


@register_scorer("kv", Category.DISTRIBUTION, needs=[Need.ENGINE_STATS])
class KvScorer(Scorer):
    """More free KV cache (as the health monitor or the router's probe reports) is better; unknown is neutral."""

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        return [0.5 if r.kv_usage is None else max(0.0, min(1.0, 1.0 - r.kv_usage)) for r in candidates]
