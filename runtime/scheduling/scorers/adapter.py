"""``adapter_affinity``: a request for a LoRA adapter goes where that adapter is already loaded."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.inputs import Context, Replica
from runtime.scheduling.kinds import Category, Need
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer


@register_scorer("adapter_affinity", Category.AFFINITY, needs=[Need.ADAPTER])
class AdapterAffinityScorer(Scorer):
    """1 on replicas that hold the requested LoRA adapter loaded, 0 elsewhere (and for base-model
    requests); past the load guard it stops counting, and the pick loads the adapter on another replica.

    Loading costs the engine a read of the adapter's files and a slot: affinity keeps loads (and the
    evictions that make room for them) rare when several adapters share few replicas."""

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        if ctx.adapter is None or not ctx.warm:
            return [0.0] * len(candidates)
        warm = ctx.warm
        return [1.0 if r.url in warm else 0.0 for r in candidates]
