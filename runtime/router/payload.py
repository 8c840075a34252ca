"""What the router reads from OpenAI-shaped bodies: the request's ``model`` and ``stream``, the prompt a
prefix cache would see, and the token ``usage`` of an answer.

The body is parsed once (orjson) and never re-serialised: the engine gets the client's bytes. Answers
are scanned for ``usage`` with a regex rather than parsed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


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
    """``n`` and ``best_of`` ask the engine for that many completions of one prompt: bounded per request."""
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


def usage_of(body: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens from the last ``usage`` object in a response or stream chunk."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return 0, 0
    tail = body[at:]
    p = _PROMPT_TOKENS.search(tail)
    c = _COMPLETION_TOKENS.search(tail)
    return (int(p.group(1)) if p else 0), (int(c.group(1)) if c else 0)


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
