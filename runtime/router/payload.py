"""What the router reads from OpenAI-shaped bodies: the request (``runtime.openai_request``, shared with the
endpoint picker) and the token ``usage`` of an answer.

The body is parsed once (orjson) and never re-serialised: the engine gets the client's bytes. Answers
are scanned for ``usage`` with a regex rather than parsed.
"""

from __future__ import annotations

import re

from runtime.openai_request import BadRequest, Routable, prompt_text, read_request

__all__ = ["BadRequest", "Routable", "prompt_text", "read_request", "usage_of"]

_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def usage_of(body: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens from the last ``usage`` object in a response or stream chunk."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return 0, 0
    tail = body[at:]
    p = _PROMPT_TOKENS.search(tail)
    c = _COMPLETION_TOKENS.search(tail)
    return (int(p.group(1)) if p else 0), (int(c.group(1)) if c else 0)
