"""What a front end reads from an OpenAI-shaped request body: the ``model`` and ``stream`` it names, and the
text a prefix cache would see first. Shared by the router and the endpoint picker, so both route the same
body the same way (one parse, with orjson; the engine always gets the client's bytes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class BadRequest:
    """Why a body cannot be routed; the app answers it as a 400."""

    message: str
    param: str | None = None
    code: str | None = None


@dataclass(slots=True)
class Routable:
    """A body the router can route: its JSON, the model it names, whether it asks for a stream."""

    payload: dict[str, Any]
    model: str
    stream: bool


def read_request(body: bytes) -> Routable | BadRequest:
    """Parse and check the fields the router itself needs; the engine validates the rest."""
    try:
        payload = orjson.loads(body)  # ~5x faster than json.loads on a chat body, on the hot path
    except orjson.JSONDecodeError:
        return BadRequest("request body is not valid JSON", code="invalid_json")
    if not isinstance(payload, dict):
        return BadRequest("request body must be a JSON object", code="invalid_json")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return BadRequest("'model' is required and must be a string", param="model")
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        return BadRequest("'stream' must be true or false", param="stream")
    return Routable(payload, model, stream)


def choices_problem(payload: dict[str, Any], limit: int) -> BadRequest | None:
    """``n`` and ``best_of`` ask the engine for that many completions of one prompt: bounded per request, by
    the router and the endpoint picker alike (1,000 sequences would hold a replica for minutes)."""
    for field in ("n", "best_of"):
        value = payload.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            return BadRequest(
                f"'{field}' must be an integer from 1 to {limit} on this gateway, not {str(value)[:20]}",
                param=field,
                code="invalid_value",
            )
    return None


def prompt_text(payload: dict[str, Any]) -> str:
    """The text a prefix cache would see first: chat messages in order, or the completion prompt."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            parts.append(str(m.get("role", "")))
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return "\x1e".join(parts)
    prompt = payload.get("prompt", payload.get("input"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        try:
            return json.dumps(prompt[:1])
        except RecursionError:  # nested ~1,000 deep (orjson read it): the engine's 400, routed by load
            return ""
    return ""


#: The inference endpoints a front end routes (path -> kind); other paths are not a replica's to answer.
INFERENCE_PATHS: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}


def visible(names: Iterable[str], scope: Iterable[str] | None) -> list[str]:
    """The served models a caller may learn of (sorted): all of them, or those its key is scoped to. One rule
    for every front end, so an error naming what is served never names a model outside the key's scope."""
    allowed = None if scope is None else frozenset(scope)
    return sorted(n for n in names if allowed is None or n in allowed)


def models_list(models: Iterable[tuple[str, int]]) -> bytes:
    """``GET /v1/models``: ``(name, max_model_len)`` of each model the front end can serve now."""
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "inferstack", "max_model_len": length}
        for name, length in models
    ]
    return json.dumps({"object": "list", "data": data}).encode()
