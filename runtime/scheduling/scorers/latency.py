"""``latency``: a lower moving average of time to first token is better."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.inputs import Context, Endpoint
from runtime.scheduling.kinds import Category
from runtime.scheduling.pipeline import Scorer, invert_normalised
from runtime.scheduling.registry import register_scorer


@register_scorer("latency", Category.DISTRIBUTION, knobs=["latency_ewma_alpha"])
class LatencyScorer(Scorer):
    """Lower EWMA of time to first token is better; a replica without samples gets the best score
    (so new replicas are tried and measured). The front end keeps the average (``latency_ewma_alpha``)."""

    def score(self, endpoints: Sequence[Endpoint], ctx: Context) -> list[float]:
        known = [b.ttft_ewma_s for b in endpoints if b.ttft_ewma_s is not None]
        if not known:
            return [1.0] * len(endpoints)
        lo = min(known)
        return invert_normalised([lo if b.ttft_ewma_s is None else b.ttft_ewma_s for b in endpoints])
