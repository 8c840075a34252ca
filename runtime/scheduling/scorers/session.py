"""``session``: requests carrying the same session key go back to the replica that served the last one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from runtime.scheduling.inputs import Context, Replica, StrategySettings
from runtime.scheduling.kinds import Category, Knob, Need, Report
from runtime.scheduling.lru import BoundedLru
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer

SESSION_INDEX_MAX_ENTRIES = Knob(
    "session_index_max_entries", int, 100_000, "Bound of the session -> replica map (LRU).", ge=1, position=8
)


@register_scorer(
    "session",
    Category.AFFINITY,
    needs=[Need.SESSION],
    knobs=[SESSION_INDEX_MAX_ENTRIES],
    reports=[Report.INDEX_ENTRIES],
)
class SessionScorer(Scorer):
    """1 on the replica that served this session key last, 0 elsewhere (the key comes from
    ``session_header``); a session whose replica left or is past the load guard follows the next pick."""

    def __init__(self, max_entries: int) -> None:
        self.index: BoundedLru[str, str] = BoundedLru(max_entries)

    @classmethod
    def from_knobs(cls, settings: StrategySettings) -> Self:
        return cls(SESSION_INDEX_MAX_ENTRIES.read(settings))

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        if ctx.session is None:
            return [0.0] * len(candidates)
        url = self.index.get(ctx.session)
        return [1.0 if r.url == url else 0.0 for r in candidates]

    def on_routed(self, replica: Replica, ctx: Context) -> None:
        if ctx.session is not None:
            self.index.put(ctx.session, replica.url)

    def report(self) -> dict[Report, float]:
        return {Report.INDEX_ENTRIES: float(len(self.index))}
