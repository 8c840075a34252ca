"""What the router reads from OpenAI-shaped bodies: the request (``runtime.openai_request``, shared with the
endpoint picker), the per-request bound on completions, and the token ``usage`` of an answer.

The body is parsed once (orjson) and never re-serialised: the engine gets the client's bytes. Answers
are scanned for ``usage`` with a regex rather than parsed.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.openai_request import BadRequest, Routable, prompt_text, read_request

__all__ = ["BadRequest", "Routable", "choices_problem", "prompt_text", "read_request", "usage_of"]

_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


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
