"""Pure parts of the batcher: input normalisation, batch assembly, splitting results back.

Why coalesce: a pooling engine moves several times more items per second when it gets one request
of many inputs than many requests of one input (DESIGN.md: ~3x with 32). The service collects
concurrent embedding requests into one engine call and this module decides what goes in it and
who gets which result; nothing here does I/O.
"""

from __future__ import annotations

import array
import base64
import binascii
import json
import math
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Input = str | list[int]  # one text, or one pre-tokenised input

# Request fields that do not change what the engine computes for other members of a batch.
PER_REQUEST_FIELDS = frozenset({"input", "user"})
# Fields that only choose how vectors are written; when they ask for plain float32 vectors (as JSON
# floats or as base64), the batcher asks the engine for base64 and writes each client's own format.
FORMAT_FIELDS = frozenset({"encoding_format", "embed_dtype", "endianness"})
_NATIVE = ("native", sys.byteorder)
# What the engine's base64 holds: float32 in the engine's byte order (vLLM's default, "native"; every
# platform vLLM runs on is little-endian, as is every platform this image is built for).
_F32 = "f"
assert array.array(_F32).itemsize == 4


class BadInputError(ValueError):
    """The client's ``input`` is not one of the shapes the embeddings API accepts."""


def normalize_inputs(raw: Any) -> list[Input]:
    """``str | list[str] | list[int] | list[list[int]]`` -> list of inputs, as the OpenAI API defines."""
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw:
        raise BadInputError("`input` must be a string, a non-empty list of strings, or token ids")
    if all(isinstance(x, str) for x in raw):
        return list(raw)
    if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        return [list(raw)]
    if all(
        isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
        for x in raw
    ):
        return [list(x) for x in raw]
    raise BadInputError("`input` mixes types; give strings, or lists of token ids, not both")


def estimate_tokens(value: Input) -> int:
    """Token count of one input: exact for token ids, ~4 UTF-8 bytes per token for text (BPE average)."""
    if isinstance(value, list):
        return max(1, len(value))
    return max(1, math.ceil(len(value.encode("utf-8")) / 4))


def _canonical(fields: Mapping[str, Any]) -> str:
    """Equal for equal field sets whatever their order: requests share a call only if all agree."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)


def client_format(body: Mapping[str, Any]) -> str | None:
    """``"float"`` or ``"base64"`` when the batcher may serve this request from the engine's base64
    float32 vectors (and so batch it with requests of the other format); None otherwise (other dtypes,
    byte orders or formats go to the engine as the client wrote them)."""
    fmt = body.get("encoding_format")
    if fmt is None:
        fmt = "float"
    elif fmt not in ("float", "base64"):
        return None
    if body.get("embed_dtype", "float32") != "float32" or body.get("endianness", "native") not in _NATIVE:
        return None
    return str(fmt)


def key_and_engine_body(body: Mapping[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    """The queue key of a request, the fields its batch's engine call carries (without ``input``),
    and the client's format when the batcher writes it (:func:`client_format`).

    The usual body, ``{"model", "input"}`` with perhaps ``encoding_format``, costs no JSON encoding.
    """
    fmt = client_format(body)
    if fmt is None:
        rest = {k: v for k, v in body.items() if k not in PER_REQUEST_FIELDS}
        return "raw:" + _canonical(rest), rest, None
    rest = {k: v for k, v in body.items() if k not in PER_REQUEST_FIELDS and k not in FORMAT_FIELDS}
    only_model = len(rest) == 1 and "model" in rest
    key = "b64:" + (str(rest["model"]) if only_model else _canonical(rest))
    rest["encoding_format"] = "base64"
    return key, rest, fmt


def convert_embedding(value: Any, fmt: str | None) -> Any:
    """One engine vector in the client's format. ``fmt`` None: the engine's value as it came.

    base64 -> float: the float32 values as Python floats, the same numbers vLLM's float path writes.
    base64 -> base64: the engine's string itself (byte-identical). An engine that ignored the base64
    request and sent floats is served too.
    """
    if fmt is None:
        return value
    if isinstance(value, str):
        if fmt == "base64":
            return value
        try:
            # strict a2b_base64 validates in C; b64decode(validate=True) runs a regex over the string
            return array.array(_F32, binascii.a2b_base64(value, strict_mode=True)).tolist()
        except (binascii.Error, ValueError) as err:
            raise EngineResponseError(f"engine sent an unreadable base64 vector: {err}") from err
    if isinstance(value, list):
        if fmt == "float":
            return value
        try:
            return base64.b64encode(array.array(_F32, value).tobytes()).decode("ascii")
        except (TypeError, OverflowError) as err:
            raise EngineResponseError(f"engine sent a vector that is not numbers: {err}") from err
    raise EngineResponseError("engine sent an embedding that is neither a list nor a string")


@dataclass
class Item:
    """One input of one client request, waiting for a batch."""

    owner: Any  # the service's per-request record; ``alive(owner)`` says whether it still wants results
    position: int  # index within its request
    value: Input
    tokens: int
    enqueued_s: float


def take_batch(
    queue: deque[Item], *, max_size: int, max_tokens: int, alive: Callable[[Any], bool]
) -> tuple[list[Item], int]:
    """Pop the next batch from the left of ``queue``: up to ``max_size`` items and ``max_tokens``.

    Items whose owner is gone (client disconnected, request failed) are dropped here, before
    dispatch; the count of dropped items is returned too. The first live item is always taken even
    if it alone exceeds ``max_tokens``: the engine decides whether it is too long, not the batcher.
    """
    batch: list[Item] = []
    tokens = 0
    dropped = 0
    while queue and len(batch) < max_size:
        item = queue[0]
        if not alive(item.owner):
            queue.popleft()
            dropped += 1
            continue
        if batch and tokens + item.tokens > max_tokens:
            break
        queue.popleft()
        batch.append(item)
        tokens += item.tokens
    return batch, dropped


def ready_to_send(queue: Sequence[Item], *, max_size: int, max_tokens: int) -> bool:
    """A full batch is waiting (by count or by tokens): no reason to wait for more."""
    if len(queue) >= max_size:
        return True
    total = 0
    for item in queue:
        total += item.tokens
        if total >= max_tokens:
            return True
    return False


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split an integer ``total`` by ``weights`` (largest remainder): parts sum exactly to ``total``."""
    if not weights:
        return []
    wsum = sum(weights)
    if wsum <= 0:
        weights = [1] * len(weights)
        wsum = len(weights)
    raw = [total * w / wsum for w in weights]
    parts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (raw[i] - parts[i], -i), reverse=True)
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


class EngineResponseError(ValueError):
    """The engine answered 200 with something we cannot split (wrong count, missing indices)."""


def engine_vectors(body: Any, expected: int) -> list[dict[str, Any]]:
    """The engine's ``data`` entries ordered by ``index``, checked to be exactly one per input."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise EngineResponseError("engine response has no `data` list")
    data = body["data"]
    if len(data) != expected:
        raise EngineResponseError(f"engine returned {len(data)} results for {expected} inputs")
    try:
        ordered = sorted(data, key=lambda d: int(d["index"]))
    except (KeyError, TypeError, ValueError) as err:
        raise EngineResponseError(f"engine results lack integer `index`: {err}") from err
    if [int(d["index"]) for d in ordered] != list(range(expected)):
        raise EngineResponseError("engine result indices are not 0..n-1")
    return ordered


def usage_shares(body: Mapping[str, Any], batch: Sequence[Item]) -> list[int]:
    """Prompt tokens per item: the engine's batch total split by each input's estimated share.

    The engine reports usage for the whole call only; token-id inputs are exact, text inputs are
    apportioned so that the shares always add up to what the engine counted.
    """
    usage = body.get("usage")
    total = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(total, int) or total < 0:
        return [item.tokens for item in batch]
    return apportion(total, [item.tokens for item in batch])


def response_for(
    data: Sequence[Mapping[str, Any]], prompt_tokens: int, *, model: str, request_id: str, created: int
) -> dict[str, Any]:
    """One client's OpenAI-shaped answer, its entries re-indexed 0..n-1 in its own input order."""
    return {
        "id": request_id,
        "object": "list",
        "created": created,
        "model": model,
        "data": [{**d, "index": i} for i, d in enumerate(data)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
