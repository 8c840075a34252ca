"""``sample_two``: keep two candidates drawn at random, the filter of the ``power_of_two`` preset."""

from __future__ import annotations

import random
from collections.abc import Sequence

from runtime.scheduling.inputs import Context
from runtime.scheduling.pipeline import Filter, R
from runtime.scheduling.registry import register_filter


@register_filter("sample_two")
class SampleTwo(Filter):
    """Keep two replicas drawn at random (all of them if there are two or fewer): the scorers then
    choose between two, which avoids the herd that pure least-load causes when many routers see the
    same stale load."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def keep(self, candidates: Sequence[R], ctx: Context) -> list[R]:
        if len(candidates) <= 2:
            return list(candidates)
        return self.rng.sample(list(candidates), 2)
