"""vLLM's prefix-cache block hash, reproduced: what a replica's KV events name, computed for a prompt here.

vLLM 0.32 (``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``): block ``i`` of a request hashes
``(parent, tuple(token_ids[i*B:(i+1)*B]), extra_keys)`` with the configured function, where ``parent`` is
block ``i-1``'s hash, or for block 0 ``NONE_HASH = hash_fn(seed)``; only full blocks are hashed. The seed
is ``PYTHONHASHSEED`` when set, else the fixed ``"vllm-none-hash"`` for the cryptographic functions. With
``--prefix-caching-hash-algo sha256_cbor`` the function is ``sha256(cbor2.dumps(x, canonical=True))``
(``vllm/utils/hashing.py``): reproducible in any language, which is why inferstack renders it whenever KV
events are on. Events carry ``int.from_bytes(hash, "big") & (2**64 - 1)``
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default), so that is the form kept here too.

Extra keys: only a request's ``cache_salt`` (block 0: ``(("cache_salt", salt),)``) is reproduced; LoRA
and multimodal requests carry keys the router cannot know, and are simply not matched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import cbor2

from runtime.scheduling.lru import BoundedLru

DEFAULT_SEED = "vllm-none-hash"
_MASK64 = (1 << 64) - 1


def sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def external(block_hash: bytes) -> int:
    """The form KV events carry a block hash in (the low 64 bits, big-endian)."""
    return int.from_bytes(block_hash, "big") & _MASK64


#: Blocks whose hash is remembered: a conversation's next turn resends every block of the last one, so
#: most of a prompt's chain is a dictionary hit instead of a CBOR encoding and a SHA-256 (~6 us each).
BLOCKS_REMEMBERED = 16_384


class BlockHasher:
    """Chained block hashes of token ids, as one vLLM deployment computes them."""

    __slots__ = ("known", "none_hash")

    def __init__(self, seed: str = DEFAULT_SEED) -> None:
        self.none_hash = sha256_cbor(seed)
        self.known: BoundedLru[tuple[bytes, tuple[int, ...]], bytes] = BoundedLru(BLOCKS_REMEMBERED)

    def hashes(
        self, tokens: Sequence[int], block_size: int, max_blocks: int, cache_salt: str | None = None
    ) -> list[int]:
        """The event-form hashes of the full blocks of ``tokens`` (at most ``max_blocks``)."""
        out: list[int] = []
        parent = self.none_hash
        n = min(len(tokens) // block_size, max_blocks)
        known = self.known
        for i in range(n):
            block = tuple(tokens[i * block_size : (i + 1) * block_size])
            if i == 0 and cache_salt:
                parent = sha256_cbor((parent, block, (("cache_salt", cache_salt),)))
            else:
                key = (parent, block)
                digest = known.get(key)
                if digest is None:
                    digest = sha256_cbor((parent, block, None))
                    known.put(key, digest)
                parent = digest
            out.append(external(parent))
        return out
