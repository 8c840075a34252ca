"""``prefix_aware``: send prompts that share a prefix to the replica that already holds it in its KV
cache, unless that replica is above the load guard; load decides among the rest.

The index maps a chained hash of each prompt block (block i's hash covers blocks 0..i) to the replicas
that last served it (up to ``OWNERS_PER_BLOCK``, most recent first). It is an LRU bounded by ``prefix_index_max_entries``: memory is fixed whatever
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


#: Replicas remembered per block, most recent first: a popular system prompt lives on several.
OWNERS_PER_BLOCK = 4


class PrefixScorer(Scorer):
    """Score = share of the prompt's blocks that replica holds as its longest indexed prefix.

    Each block remembers the last few replicas that served it (not only the last), so when a system
    prompt sits on two replicas both score for it and load decides between them; a replica's own
    conversation history still makes it win the deeper match."""

    name = "prefix"
    affinity = True

    def __init__(self, block_chars: int, max_blocks: int, max_entries: int) -> None:
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.index: BoundedLru[int, tuple[str, ...]] = BoundedLru(max_entries)
        self.lookups = 0
        self.hits = 0

    def score(self, backends: Sequence[Backend], ctx: Context) -> list[float]:
        hashes = block_hashes(ctx.prompt, self.block_chars, self.max_blocks)
        ctx.notes["prefix_hashes"] = hashes
        if not hashes:
            return [0.0] * len(backends)
        self.lookups += 1
        wanted = {b.url for b in backends}
        depth_of: dict[str, int] = {}
        get = self.index.get
        # walk from the longest prefix down: the first depth a replica shows up at is its best match
        for depth in range(len(hashes), 0, -1):
            owners = get(hashes[depth - 1])
            if owners is None:
                continue
            for url in owners:
                if url in wanted and url not in depth_of:
                    depth_of[url] = depth
            if len(depth_of) == len(wanted):
                break
        if not depth_of:
            return [0.0] * len(backends)
        self.hits += 1
        n = len(hashes)
        return [depth_of.get(b.url, 0) / n for b in backends]

    def on_routed(self, backend: Backend, ctx: Context) -> None:
        hashes = ctx.notes.get("prefix_hashes")
        if not isinstance(hashes, list):
            return
        index = self.index
        url = backend.url
        keep = OWNERS_PER_BLOCK - 1
        for h in hashes:
            owners = index.get(h)
            if owners is None:
                index.put(h, (url,))
            elif owners[0] != url:
                index.put(h, (url, *[o for o in owners if o != url][:keep]))

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
