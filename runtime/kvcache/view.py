"""The blocks each replica of one model holds, kept from their KV events: pure, bounded, no I/O.

One dict maps a block hash to a bit mask of the replicas holding it (a bit per followed replica), so memory
is one small int per distinct block whatever the replica count; ``max_blocks`` bounds it (beyond it the
oldest-stored block is forgotten, which can only make the view under-promise). A replica's cache hit is
the longest run of a prompt's blocks it holds *from the first block* (vLLM stops at the first miss), so
:meth:`CacheIndex.depths` walks forward and drops each replica at its first missing block.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from runtime.kvcache.events import Cleared, Event, Removed, Stored


class CacheIndex:
    """Block hash -> holders, per model; fed by followers (one per replica), read by the scheduler."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.block_size: int | None = None  # from the events: what the engines hash by
        self._blocks: dict[int, int] = {}
        self._slot: dict[str, int] = {}  # replica url -> its bit
        self._held: dict[str, int] = {}  # replica url -> blocks it holds
        self.synced: set[str] = set()  # replicas whose stream is live and whose past was replayed
        self.forgotten = 0  # blocks dropped by the bound

    # --- replicas ---------------------------------------------------------------------------------
    def _bit(self, url: str) -> int:
        slot = self._slot.get(url)
        if slot is None:
            taken = set(self._slot.values())
            slot = next(i for i in range(len(taken) + 1) if i not in taken)
            self._slot[url] = slot
            self._held[url] = 0
        return 1 << slot

    def forget(self, url: str) -> None:
        """A replica left (or its stream broke): nothing of its cache is known any more."""
        self.clear(url)
        self.synced.discard(url)
        self._slot.pop(url, None)
        self._held.pop(url, None)

    def clear(self, url: str) -> None:
        if not self._held.get(url):
            return
        bit = self._bit(url)
        keep = ~bit
        blocks = self._blocks
        for h in [h for h, mask in blocks.items() if mask & bit]:
            left = blocks[h] & keep
            if left:
                blocks[h] = left
            else:
                del blocks[h]
        self._held[url] = 0

    def held(self, url: str) -> int:
        return self._held.get(url, 0)

    def __len__(self) -> int:
        return len(self._blocks)

    # --- events -----------------------------------------------------------------------------------
    def apply(self, url: str, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, Stored):
                self.block_size = event.block_size
                self.stored(url, event.hashes)
            elif isinstance(event, Removed):
                self.removed(url, event.hashes)
            elif isinstance(event, Cleared):
                self.clear(url)

    def stored(self, url: str, hashes: Sequence[int]) -> None:
        bit = self._bit(url)
        blocks = self._blocks
        added = 0
        for h in hashes:
            mask = blocks.get(h, 0)
            if not mask & bit:
                blocks[h] = mask | bit
                added += 1
        self._held[url] += added
        while len(blocks) > self.max_blocks:
            self._drop_oldest()

    def removed(self, url: str, hashes: Sequence[int]) -> None:
        bit = self._slot.get(url)
        if bit is None:
            return
        mask_bit = 1 << bit
        blocks = self._blocks
        gone = 0
        for h in hashes:
            mask = blocks.get(h, 0)
            if mask & mask_bit:
                gone += 1
                if mask == mask_bit:
                    del blocks[h]
                else:
                    blocks[h] = mask & ~mask_bit
        self._held[url] -= gone

    def _drop_oldest(self) -> None:
        h = next(iter(self._blocks))
        mask = self._blocks.pop(h)
        for url, slot in self._slot.items():
            if mask & (1 << slot):
                self._held[url] -= 1
        self.forgotten += 1

    # --- lookups ----------------------------------------------------------------------------------
    def depths(self, hashes: Sequence[int], urls: Iterable[str]) -> dict[str, int]:
        """For each synced replica among ``urls``: how many leading blocks of ``hashes`` it holds."""
        bits = {url: 1 << self._slot[url] for url in urls if url in self.synced and url in self._slot}
        out = dict.fromkeys((url for url in urls if url in self.synced), 0)
        alive = 0
        for bit in bits.values():
            alive |= bit
        blocks = self._blocks
        for depth, h in enumerate(hashes):
            if not alive:
                break
            still = blocks.get(h, 0) & alive
            if still != alive:
                for url, bit in bits.items():
                    if alive & bit and not still & bit:
                        out[url] = depth
            alive = still
        for url, bit in bits.items():
            if alive & bit:
                out[url] = len(hashes)
        return out

    def hit_tokens(self, depth: int, prompt_tokens: int) -> int:
        """Prompt tokens an engine holding ``depth`` leading blocks takes from its cache: vLLM never takes
        the last prompt token from the cache (it must compute one to sample), so a fully cached prompt
        recomputes its last block."""
        size = self.block_size or 0
        if not size or prompt_tokens <= 0:
            return 0
        return min(depth, (prompt_tokens - 1) // size) * size

    def summary(self) -> Mapping[str, int]:
        """Blocks held per replica (metrics)."""
        return dict(self._held)
