"""``power_of_two``: sample two eligible replicas at random, take the less loaded.

Cheap, and avoids the herd that pure least-load causes when many routers see the same stale load.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from runtime.config import StrategyConfig
from runtime.router.backends import Backend
from runtime.router.strategies.base import Context, Strategy
from runtime.router.strategies.scorers import LoadScorer


class SampleTwo:
    """Keep two replicas drawn at random (all of them if there are two or fewer)."""

    name = "sample_two"

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def keep(self, backends: Sequence[Backend], ctx: Context) -> list[Backend]:
        if len(backends) <= 2:
            return list(backends)
        return self.rng.sample(list(backends), 2)


def build(cfg: StrategyConfig) -> Strategy:
    return Strategy("power_of_two", [(LoadScorer(), 1.0)], filters=[SampleTwo()])
