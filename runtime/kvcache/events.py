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

import msgspec

PRIMARY_MEDIA = frozenset({None, "GPU"})
_MASK64 = (1 << 64) - 1
_Hash = int | bytes  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the whole digest


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


# The wire schema, reduced to what the view reads. msgspec (what vLLM encodes with) checks types as it
# decodes and skips what is not read: ``token_ids`` stays raw bytes (a stored block's tokens are most of a
# batch, and the hashes already name them), unknown fields are ignored.
class _BlockStored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None
    block_size: int
    token_ids: msgspec.Raw = msgspec.Raw(b"")
    medium: str | None = None
    group_idx: int | None = None


class _BlockRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[_Hash]
    medium: str | None = None
    group_idx: int | None = None


class _AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_BlockStored | _BlockRemoved | _AllBlocksCleared]
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(_Batch)


def _int(h: _Hash) -> int:
    return (int.from_bytes(h, "big") if isinstance(h, bytes) else h) & _MASK64


def _primary(medium: str | None, group: int | None) -> bool:
    return medium in PRIMARY_MEDIA and group in (None, 0)


def decode(payload: bytes) -> list[Event]:
    """The events of one batch that concern the engine's prefix cache, in order."""
    try:
        batch = _DECODER.decode(payload)
    except msgspec.ValidationError as err:
        unknown = str(err).startswith("Invalid value") and str(err).endswith(".type`")  # an unknown tag
        raise BadEventError("unknown_type" if unknown else "malformed", str(err)[:120]) from None
    except msgspec.DecodeError as err:
        raise BadEventError("undecodable", str(err)[:120]) from None
    out: list[Event] = []
    for event in batch.events:
        if isinstance(event, _BlockStored):
            if not _primary(event.medium, event.group_idx):
                continue
            if event.block_size < 1:
                raise BadEventError("malformed", "BlockStored with a block_size below 1")
            parent = event.parent_block_hash
            out.append(
                Stored(
                    tuple(map(_int, event.block_hashes)),
                    None if parent is None else _int(parent),
                    event.block_size,
                )
            )
        elif isinstance(event, _BlockRemoved):
            if _primary(event.medium, event.group_idx):
                out.append(Removed(tuple(map(_int, event.block_hashes))))
        else:
            out.append(Cleared())
    return out
