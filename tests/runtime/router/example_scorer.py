"""An out-of-tree scorer: this one module is all it takes. A router whose config lists the module in
``router.plugins`` imports it at start, and its strategies may then weight ``first_url`` by name."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling import Category, Context, Endpoint, Scorer, register_scorer


@register_scorer("first_url", Category.DISTRIBUTION)
class FirstUrlScorer(Scorer):
    """1 for the replica whose URL sorts first, 0 for the others: pins traffic to one replica."""

    def score(self, endpoints: Sequence[Endpoint], ctx: Context) -> list[float]:
        first = min(b.url for b in endpoints)
        return [1.0 if b.url == first else 0.0 for b in endpoints]
