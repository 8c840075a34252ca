"""``precise_prefix``: the share of a prompt's blocks a replica's engine holds, by the engine's own account.

The engines publish every block they cache and evict (vLLM KV events); the front end follows them for every
replica and hashes the prompt's blocks the way the engines do (``Need.PROMPT_BLOCKS``), so a replica's
score is exactly ``leading blocks it holds / blocks of the prompt``: what it would take from its cache.
Every router replica follows the same streams, so they all see the same truth: with N router replicas
behind a load balancer a conversation's follow-up finds its home as surely as with one, which the
routed-history index (``prefix``) cannot do, since each router sees only the traffic sent to it.

A replica whose events are not followed (another engine kind, a stream that broke, a prompt the front end
cannot tokenize exactly) is scored by the routed-history index instead, which this scorer keeps for it.
Blended with ``load`` like ``prefix``: a shared prompt held by one replica pulls new conversations there
only while it is not the busiest, and the load guard drops affinity on a replica past its share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from runtime.scheduling.inputs import Context, Replica, StrategySettings
from runtime.scheduling.kinds import Category, Need, Report
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer
from runtime.scheduling.scorers.prefix import PREFIX_KNOBS, PrefixScorer


@register_scorer(
    "precise_prefix",
    Category.AFFINITY,
    needs=[Need.PROMPT_BLOCKS, Need.PROMPT],
    knobs=PREFIX_KNOBS,
    reports=[Report.HIT_RATE],
)
class PrecisePrefixScorer(Scorer):
    """Share of the prompt's blocks the replica's engine holds (its KV events); routed history otherwise."""

    def __init__(self, history: PrefixScorer) -> None:
        self.history = history
        self.lookups = 0
        self.hits = 0

    @classmethod
    def from_knobs(cls, settings: StrategySettings) -> Self:
        return cls(PrefixScorer.from_knobs(settings))

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        blocks = ctx.prompt_blocks
        cache = ctx.cache
        if not blocks or cache is None:
            return self.history.score(candidates, ctx)
        depths = cache.depths(blocks, [r.url for r in candidates])
        self.lookups += 1
        if any(depths.values()):
            self.hits += 1
        fallback = self.history.score(candidates, ctx) if len(depths) < len(candidates) else None
        n = len(blocks)
        return [
            depths[r.url] / n if r.url in depths else (fallback[i] if fallback else 0.0)
            for i, r in enumerate(candidates)
        ]

    def on_routed(self, replica: Replica, ctx: Context) -> None:
        self.history.on_routed(replica, ctx)  # learns only where the history scored this request

    def report(self) -> dict[Report, float]:
        return {Report.HIT_RATE: self.hits / self.lookups if self.lookups else 0.0}
