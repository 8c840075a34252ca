"""``prefix``, the scorer of the ``prefix_aware`` preset: keep a conversation's follow-ups on the replica
that holds its history in KV cache, and spread new conversations that only share a common prefix (a
system prompt, few-shot examples) evenly, copying a shared prefix to a second replica only when its
holder has had more than its share.

**The index** maps a chained hash of each prompt block (block i's hash covers blocks 0..i) to the
replicas that served it (up to ``OWNERS_PER_BLOCK``, oldest first) and to how many distinct
continuations of it were seen. It is an LRU bounded by ``prefix_index_max_entries``: memory is fixed
whatever the traffic. The router has no tokenizer, so a block is ``prefix_block_tokens x
prefix_chars_per_token`` characters; engines cache by token blocks, and a character block that matches
implies the token prefix matches too (same text, same tokens).

**Two kinds of match.** The index is a prefix tree of what was routed. A request's longest match ends
at some block, and what was seen after that block tells the two kinds apart:

- nothing continued it (a *leaf*): the request extends exactly what an earlier request sent, as a
  conversation's next turn does; its own history lives on the replica(s) holding that leaf. A
  **follow-up** stays home (score 1 there, 0 elsewhere) unless home is past the load guard: moving it
  throws away the whole conversation's cache, and a conversation started somewhere has committed that
  replica to its remaining turns anyway.
- other requests continued it differently (a *branch point*, where SGLang's radix tree would split a
  node): the request shares a prefix that many went through but has no history of its own. A new
  conversation is where the router can still choose, so it is placed with **bounded loads**
  (consistent hashing with bounded loads: Mirrokni, Thorup, Zadimoghaddam 2018; HAProxy's
  ``hash-balance-factor``): among the replicas holding the prefix (deepest match first), the one that
  started the fewest conversations lately takes it if its count, with this one, stays within
  ``ceil(prefix_balance_factor x the average)``; else the replica that started the fewest of all takes
  it and the prefix is copied there (one prefill of the shared part, and room in a second cache). A
  prompt already on several replicas is the cheap lever: its new conversations go wherever fewer
  started, so the other prompts need not be copied.

**Why count conversations, not requests in flight.** Follow-ups stay put, so a replica's future
load is the conversations homed on it, most of which sit between turns (invisible to an in-flight
count) at any moment. Balancing new conversations balances the requests they bring; balancing
in-flight counts at the instant a conversation starts does not (measured: one replica took 62-69 % of
requests in 3 of 5 runs, bench/README.md). A replica that is slow anyway is protected by the load
guard, which drops affinity on a replica past ``load_guard_ratio`` of its cap; requests with no match
at all are placed by load alone, so traffic with nothing in common is routed like ``least_load``.

The field, for comparison: SGLang's cache_aware switches every request to shortest-queue when max - min
> ``balance_abs_threshold`` (64) and max > ``balance_rel_threshold`` (1.5) x min; AIBrix's prefix-cache
router does the same above an absolute gap of running requests (16), then keeps a matching pod only if
it is under mean + 2 standard deviations; vLLM's production-stack scores match share minus
beta x relative load. Those are global switches or blends that move follow-ups as well; here only new
conversations are balanced, which is what keeps conversations at home while the load evens out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Self

from runtime.scheduling.inputs import Context, Replica, StrategySettings
from runtime.scheduling.kinds import Category, Knob, Need, Report
from runtime.scheduling.lru import BoundedLru
from runtime.scheduling.pipeline import Scorer
from runtime.scheduling.registry import register_scorer


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


#: Replicas remembered per block, oldest first: a popular system prompt lives on several.
OWNERS_PER_BLOCK = 4

# The knobs of the routed-history index (``precise_prefix`` falls back on it, so it reads them too).
PREFIX_BLOCK_TOKENS = Knob(
    "prefix_block_tokens",
    int,
    64,
    "Tokens per block of the prefix index: prompts are matched block by block, so a smaller block"
    " finds shorter shared prefixes, at more hashing per request.",
    ge=1,
    stack=True,
    position=1,
)
PREFIX_INDEX_MAX_ENTRIES = Knob(
    "prefix_index_max_entries", int, 100_000, "Bound of the prefix index (LRU).", ge=1, position=2
)
PREFIX_BALANCE_FACTOR = Knob(
    "prefix_balance_factor",
    float,
    1.2,
    "prefix_aware: a new conversation on a shared prefix (a system prompt others went through)"
    " goes to a replica holding it only while that replica's count of recently started"
    " conversations, with this one, stays within ceil(this x the average) (bounded loads);"
    " else to the replica that started the fewest, which copies the prefix. 1.2: at most ~60 %"
    " of new conversations on one of two replicas. A conversation's follow-ups are not bounded"
    " by it: they stay home up to load_guard_ratio.",
    ge=1,
    stack=True,
    position=4,
)
PREFIX_BALANCE_WINDOW_S = Knob(
    "prefix_balance_window_s",
    float,
    30.0,
    "prefix_aware: time constant of the decaying count of conversations started per replica.",
    gt=0,
    position=5,
)
PREFIX_CHARS_PER_TOKEN = Knob(
    "prefix_chars_per_token",
    int,
    4,
    "The router hashes characters, not tokens: a block is prefix_block_tokens x this many.",
    ge=1,
    position=6,
)
PREFIX_MAX_BLOCKS = Knob(
    "prefix_max_blocks",
    int,
    128,
    "Blocks of a prompt that are hashed at most (bounds CPU per request).",
    ge=1,
    position=7,
)
PREFIX_KNOBS = (
    PREFIX_BLOCK_TOKENS,
    PREFIX_CHARS_PER_TOKEN,
    PREFIX_MAX_BLOCKS,
    PREFIX_INDEX_MAX_ENTRIES,
    PREFIX_BALANCE_FACTOR,
    PREFIX_BALANCE_WINDOW_S,
)


class Block:
    """One indexed block: who served it (oldest first), and how many distinct next blocks followed it."""

    __slots__ = ("children", "owners")

    def __init__(self, owner: str) -> None:
        self.owners: tuple[str, ...] = (owner,)
        self.children = 0


def within_bound(load: float, total: float, n: int, factor: float) -> bool:
    """Bounded-load admission: ``load + 1 <= ceil(factor x (total + 1) / n)`` (this request included)."""
    return load + 1 <= math.ceil(factor * (total + 1) / n - 1e-9) + 1e-9


@register_scorer(
    "prefix",
    Category.AFFINITY,
    needs=[Need.PROMPT],
    knobs=PREFIX_KNOBS,
    reports=[Report.INDEX_ENTRIES, Report.HIT_RATE],
)
class PrefixScorer(Scorer):
    """Follow-ups (match ends at a leaf) score 1 on their home replica; new conversations on a shared
    prefix (match ends at a branch point) score 1 on the replica the bounded-load rule picks."""

    def __init__(
        self, block_chars: int, max_blocks: int, max_entries: int, balance_factor: float, window_s: float
    ) -> None:
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.balance_factor = balance_factor
        self.window_s = window_s
        self.index: BoundedLru[int, Block] = BoundedLru(max_entries)
        # replica url -> conversations started there, decayed with time constant window_s, stored grown:
        # count x e^((t - epoch) / window_s) for a start at t. One shared factor e^(-(now - epoch) / window_s)
        # turns every stored value into its count now, so a pick over N replicas costs N lookups, not N
        # exponentials; the epoch moves (and forgotten replicas go) once per window_s.
        self.grown: dict[str, float] = {}
        self.epoch: float | None = None
        self.lookups = 0
        self.hits = 0
        self.followups = 0
        self.shared = 0
        self.spilled = 0  # new conversations that went past a busy holder and copied the prefix

    @classmethod
    def from_knobs(cls, settings: StrategySettings) -> Self:
        return cls(
            PREFIX_BLOCK_TOKENS.read(settings) * PREFIX_CHARS_PER_TOKEN.read(settings),
            PREFIX_MAX_BLOCKS.read(settings),
            PREFIX_INDEX_MAX_ENTRIES.read(settings),
            PREFIX_BALANCE_FACTOR.read(settings),
            PREFIX_BALANCE_WINDOW_S.read(settings),
        )

    def decay(self, now: float) -> float:
        """What turns a stored (grown) count into the count at ``now``."""
        return 1.0 if self.epoch is None else math.exp(min(0.0, self.epoch - now) / self.window_s)

    def started(self, url: str, now: float) -> float:
        """Conversations started on ``url`` lately (decayed with time constant ``window_s``)."""
        return self.grown.get(url, 0.0) * self.decay(now)

    def _count_start(self, url: str, now: float) -> None:
        epoch = self.epoch
        if epoch is None or now - epoch >= self.window_s:
            # move the epoch to now (so the growth factor stays small), forgetting replicas that started
            # nothing lately: once per window_s, whatever the traffic, so O(replicas) amortises to nothing
            decay = self.decay(now)
            self.grown = {u: g * decay for u, g in self.grown.items() if g * decay >= 0.01}
            self.epoch = epoch = now
        self.grown[url] = self.grown.get(url, 0.0) + math.exp(max(0.0, now - epoch) / self.window_s)

    def score(self, candidates: Sequence[Replica], ctx: Context) -> list[float]:
        hashes = block_hashes(ctx.prompt, self.block_chars, self.max_blocks)
        notes = ctx.notes
        notes["prefix_hashes"] = hashes
        notes["prefix_followup"] = False
        if not hashes:
            return [0.0] * len(candidates)
        self.lookups += 1
        wanted = {r.url for r in candidates}
        depth_of: dict[str, int] = {}
        order: list[str] = []  # holders, deepest match first; at one depth, the longest holder first
        get = self.index.get
        deepest: Block | None = None
        # walk from the longest prefix down: the first depth a replica shows up at is its best match
        for depth in range(len(hashes), 0, -1):
            block = get(hashes[depth - 1])
            if block is None:
                continue
            for url in block.owners:
                if url in wanted and url not in depth_of:
                    depth_of[url] = depth
                    order.append(url)
                    if deepest is None:
                        deepest = block
            if len(depth_of) == len(wanted):
                break
        if deepest is None:
            return [0.0] * len(candidates)  # nothing known: load decides
        self.hits += 1
        if deepest.children == 0:
            # a follow-up: the replicas with the deepest match hold this conversation's own history
            self.followups += 1
            notes["prefix_followup"] = True
            top = depth_of[order[0]]
            return [1.0 if depth_of.get(r.url) == top else 0.0 for r in candidates]
        # a new conversation on a shared prefix: bounded loads over recently started conversations
        self.shared += 1
        decay = self.decay(ctx.now)
        grown = self.grown.get
        counts = [grown(r.url, 0.0) * decay for r in candidates]
        total = sum(counts)
        n = len(candidates)
        factor = self.balance_factor
        # deepest match first; among equally deep holders, the one that started the fewest: a prefix
        # already copied to several replicas is the cheapest way to even them out
        for url in sorted(order, key=lambda u: (-depth_of[u], grown(u, 0.0))):
            if within_bound(grown(url, 0.0) * decay, total, n, factor):
                return [1.0 if r.url == url else 0.0 for r in candidates]
        self.spilled += 1
        fewest = min(counts)
        return [1.0 if c <= fewest else 0.0 for c in counts]

    def on_routed(self, replica: Replica, ctx: Context) -> None:
        hashes = ctx.notes.get("prefix_hashes")
        if not isinstance(hashes, list):
            return
        url = replica.url
        if not ctx.notes.get("prefix_followup"):
            self._count_start(url, ctx.now)
        index = self.index
        keep = OWNERS_PER_BLOCK - 1
        parent: Block | None = None
        for h in hashes:
            block = index.get(h)
            if block is None:
                block = Block(url)
                index.put(h, block)
                if parent is not None:
                    parent.children += 1  # a new continuation of the parent: it is a branch point now
            elif url not in block.owners:
                block.owners = (*block.owners[-keep:], url)
            parent = block

    def report(self) -> dict[Report, float]:
        return {
            Report.INDEX_ENTRIES: float(len(self.index)),
            Report.HIT_RATE: self.hits / self.lookups if self.lookups else 0.0,
        }
