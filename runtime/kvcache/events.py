"""vLLM KV-event batches (msgpack) -> typed events; anything else is a ``BadEventError`` with a bounded cause.

Wire format, vLLM 0.32 ``vllm/distributed/kv_events.py``: each ZeroMQ message is three frames, ``(topic,
seq as 8 bytes big-endian, payload)``; the payload is a msgspec ``KVEventBatch`` encoded as a msgpack array
``[ts, events, data_parallel_rank]``; each event is a map tagged by ``"type"``: ``BlockStored``
(``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``medium``, ``group_idx``, ...),
``BlockRemoved`` (``block_hashes``, ``medium``, ``group_idx``) or ``AllBlocksCleared``. Only the engine's
own cache tier counts (``medium`` GPU, or unset; vLLM-CPU reports GPU too) and only KV-cache group 0
(hybrid models have more); blocks offloaded to CPU or storage are another tier, not prefix-cache hits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

PRIMARY_MEDIA = frozenset({None, "GPU"})
_MAX_HASHES = 1 << 16  # one event naming more blocks than this is not from a sane engine


class BadEventError(ValueError):
    """A message that is not a KV-event batch; ``cause`` is a short fixed word (a metric label)."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(f"{cause}: {detail}")
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[int, ...]
    parent: int | None
    block_size: int


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


def _hash(value: Any) -> int:
    if isinstance(value, bool):
        raise BadEventError("malformed", "a block hash is a boolean")
    if isinstance(value, int):
        return value & ((1 << 64) - 1)
    if isinstance(value, bytes):  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the whole digest
        return int.from_bytes(value, "big") & ((1 << 64) - 1)
    raise BadEventError("malformed", f"a block hash is a {type(value).__name__}")


def _hashes(event: dict[Any, Any]) -> tuple[int, ...]:
    raw = event.get("block_hashes")
    if not isinstance(raw, list) or len(raw) > _MAX_HASHES:
        raise BadEventError("malformed", "block_hashes is not a list of hashes")
    return tuple(_hash(h) for h in raw)


def _primary(event: dict[Any, Any]) -> bool:
    return event.get("medium") in PRIMARY_MEDIA and event.get("group_idx") in (None, 0)


def decode(payload: bytes) -> list[Event]:
    """The events of one batch that concern the engine's prefix cache, in order."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as err:
        raise BadEventError("undecodable", str(err)[:120]) from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise BadEventError("malformed", "a batch is [ts, events, rank]")
    out: list[Event] = []
    for event in batch[1]:
        if not isinstance(event, dict):
            raise BadEventError("malformed", "an event is not a map")
        kind = event.get("type")
        if kind == "BlockStored":
            if not _primary(event):
                continue
            size = event.get("block_size")
            parent = event.get("parent_block_hash")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise BadEventError("malformed", "BlockStored without a block_size")
            out.append(Stored(_hashes(event), None if parent is None else _hash(parent), size))
        elif kind == "BlockRemoved":
            if _primary(event):
                out.append(Removed(_hashes(event)))
        elif kind == "AllBlocksCleared":
            out.append(Cleared())
        else:
            raise BadEventError("unknown_type", f"event type {str(kind)[:40]!r}")
    return out
