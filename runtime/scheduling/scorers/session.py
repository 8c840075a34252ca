"""``session``: requests carrying the same session key go back to the replica that served the last one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from runtime.scheduling.inputs import Context, Endpoint, Knobs
from runtime.scheduling.kinds import Category, Need, Report
from runtime.scheduling.lru import BoundedLru
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer


@register_scorer(
    "session",
    Category.AFFINITY,
    needs=[Need.SESSION],
    knobs=["session_header", "session_index_max_entries"],
    reports=[Report.INDEX_ENTRIES],
)
class SessionScorer(Scorer):
    """1 on the replica that served this session key last, 0 elsewhere (the key comes from
    ``session_header``); a session whose replica left or is past the load guard follows the next pick."""

    def __init__(self, max_entries: int) -> None:
        self.index: BoundedLru[str, str] = BoundedLru(max_entries)

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> Self:
        return cls(knobs.session_index_max_entries)

    def score(self, endpoints: Sequence[Endpoint], ctx: Context) -> list[float]:
        if ctx.session is None:
            return [0.0] * len(endpoints)
        url = self.index.get(ctx.session)
        return [1.0 if b.url == url else 0.0 for b in endpoints]

    def on_routed(self, endpoint: Endpoint, ctx: Context) -> None:
        if ctx.session is not None:
            self.index.put(ctx.session, endpoint.url)

    def report(self) -> dict[Report, float]:
        return {Report.INDEX_ENTRIES: float(len(self.index))}
