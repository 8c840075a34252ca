"""``session``: requests carrying the same session header go to the same replica while it is
eligible and under the load guard; otherwise least-load picks, and the session follows it."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.config import StrategyConfig
from runtime.router.backends import Backend
from runtime.router.lru import BoundedLru
from runtime.router.strategies.base import Context, Scorer, Strategy
from runtime.router.strategies.scorers import LoadScorer


class SessionScorer(Scorer):
    name = "session"
    affinity = True

    def __init__(self, max_entries: int) -> None:
        self.index: BoundedLru[str, str] = BoundedLru(max_entries)

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        if ctx.session is None:
            return [0.0] * len(backends)
        url = self.index.get(ctx.session)
        return [1.0 if b.url == url else 0.0 for b in backends]

    def on_routed(self, backend: Backend, ctx: Context) -> None:
        if ctx.session is not None:
            self.index.put(ctx.session, backend.url)

    def index_size(self) -> int:
        return len(self.index)


def build(cfg: StrategyConfig) -> Strategy:
    return Strategy(
        "session",
        [(SessionScorer(cfg.session_index_max_entries), 10.0), (LoadScorer(), 1.0)],
        load_guard_ratio=cfg.load_guard_ratio,
    )
