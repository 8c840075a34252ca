"""``latency``: a lower moving average of time to first token is better."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.inputs import Context, Replica
from runtime.scheduling.kinds import Category, Knob
from runtime.scheduling.pipeline import Scorer, invert_normalised
from runtime.scheduling.registry import register_scorer

#: Read by the front end, which keeps each replica's average (``Replica.ttft_ewma_s``).
LATENCY_EWMA_ALPHA = Knob(
    "latency_ewma_alpha",
    float,
    0.3,
    "Weight of the newest TTFT sample in a replica's latency mean.",
    gt=0,
    le=1,
    position=9,
)


@register_scorer("latency", Category.DISTRIBUTION, knobs=[LATENCY_EWMA_ALPHA])
class LatencyScorer(Scorer):
    """Lower EWMA of time to first token is better; a replica without samples gets the best score
    (so new replicas are tried and measured). The front end keeps the average (``latency_ewma_alpha``)."""

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        known = [r.ttft_ewma_s for r in candidates if r.ttft_ewma_s is not None]
        if not known:
            return [1.0] * len(candidates)
        lo = min(known)
        return invert_normalised([lo if r.ttft_ewma_s is None else r.ttft_ewma_s for r in candidates])
