"""An out-of-tree scorer: this one module is all it takes. A router whose config lists the module in
``router.plugins`` imports it at start, and its strategies may then weight ``first_url`` by name."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling import Category, Context, Replica, Scorer, register_scorer


@register_scorer("first_url", Category.DISTRIBUTION)
class FirstUrlScorer(Scorer):
    """1 for the replica whose URL sorts first, 0 for the others: pins traffic to one replica."""

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        first = min(r.url for r in candidates)
        return [1.0 if r.url == first else 0.0 for r in candidates]
