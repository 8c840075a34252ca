"""``prefix_aware``: send prompts that share a prefix to the replica that already holds it in its KV
cache, unless that replica is above the load guard; load decides among the rest.

The index maps a chained hash of each prompt block (block i's hash covers blocks 0..i) to the replica
that last served it. It is an LRU bounded by ``prefix_index_max_entries``: memory is fixed whatever
the traffic, which is where the field's Python router leaks. The router has no tokenizer, so a block
is ``prefix_block_tokens x prefix_chars_per_token`` characters; engines cache by token blocks, and
a character block that matches implies the token prefix matches too (same text, same tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.config import StrategyConfig
from runtime.router.backends import Backend
from runtime.router.lru import BoundedLru
from runtime.router.strategies.base import Context, Scorer, Strategy
from runtime.router.strategies.scorers import LoadScorer


def block_hashes(prompt: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained hashes of the full blocks of ``prompt`` (a trailing partial block is not cached by
    engines either, so it is not indexed)."""
    out: list[int] = []
    h = 0
    n = min(len(prompt) // block_chars, max_blocks)
    for i in range(n):
        h = hash((h, prompt[i * block_chars : (i + 1) * block_chars]))
        out.append(h)
    return out


class PrefixScorer(Scorer):
    """Score = share of the prompt's blocks whose longest indexed prefix lives on that replica."""

    name = "prefix"
    affinity = True

    def __init__(self, block_chars: int, max_blocks: int, max_entries: int) -> None:
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.index: BoundedLru[int, str] = BoundedLru(max_entries)
        self.lookups = 0
        self.hits = 0

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        hashes = block_hashes(ctx.prompt, self.block_chars, self.max_blocks)
        ctx.notes["prefix_hashes"] = hashes
        if not hashes:
            return [0.0] * len(backends)
        self.lookups += 1
        # walk from the longest prefix down: the first indexed one is the best match
        for depth in range(len(hashes), 0, -1):
            url = self.index.get(hashes[depth - 1])
            if url is not None:
                ctx.notes["prefix_match"] = url
                share = depth / len(hashes)
                scores = [share if b.url == url else 0.0 for b in backends]
                if any(scores):
                    self.hits += 1
                return scores
        return [0.0] * len(backends)

    def on_routed(self, backend: Backend, ctx: Context) -> None:
        hashes = ctx.notes.get("prefix_hashes")
        if not isinstance(hashes, list):
            return
        put = self.index.put
        url = backend.url
        for h in hashes:
            put(h, url)

    def index_size(self) -> int:
        return len(self.index)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def build(cfg: StrategyConfig) -> Strategy:
    prefix = PrefixScorer(
        cfg.prefix_block_tokens * cfg.prefix_chars_per_token,
        cfg.prefix_max_blocks,
        cfg.prefix_index_max_entries,
    )
    weights = {"prefix": 2.0, "load": 1.0, **cfg.weights}
    return Strategy(
        "prefix_aware",
        [(prefix, weights["prefix"]), (LoadScorer(), weights["load"])],
        load_guard_ratio=cfg.load_guard_ratio,
    )
