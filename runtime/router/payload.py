"""What the router reads from OpenAI-shaped bodies: the request (``runtime.openai_request``, shared with the
endpoint picker), the per-request bound on completions, the tokens a request may cost, and the token
``usage`` of an answer.

The body is parsed once (orjson) and not re-serialised: the engine gets the client's bytes, except that a
stream is asked for its usage (``stream_options.include_usage``) when the client did not ask, so a key's
``tokens_per_minute`` is charged for streams too; the usage chunk is then taken out of the stream again
(``UsageStrip``). Answers are scanned for ``usage`` with a regex rather than parsed.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from runtime.openai_request import BadRequest, Routable, choices_problem, prompt_text, read_request

__all__ = [
    "BadRequest",
    "Routable",
    "UsageStrip",
    "choices_problem",
    "prompt_estimate",
    "prompt_text",
    "read_request",
    "token_estimate",
    "usage_of",
    "with_usage",
]

#: The least completion tokens reserved per choice for a request that sets no ``max_tokens`` (nor
#: ``max_completion_tokens``), which reserves what the model's context leaves after the prompt: the engine
#: may generate that much. The reservation is settled to the real usage when the answer ends, so this only
#: bounds how many such requests a key has in flight at once.
DEFAULT_COMPLETION_ESTIMATE = 1024
#: Prompt tokens are estimated from the body's size (no tokenizer on the hot path): ~4 bytes of text per
#: token, and the JSON around the text makes it an over-estimate rather than an under-estimate.
BYTES_PER_TOKEN = 4
_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'
_EVENT_END = re.compile(rb"\r?\n\r?\n")  # a blank line ends a server-sent event
_USAGE_ONLY = re.compile(rb'"choices"\s*:\s*\[\s*\]')

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


def _count(value: Any) -> int | None:
    """A positive JSON integer, else None (the engine answers bad values itself)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def prompt_estimate(body: bytes) -> int:
    """The prompt tokens of a request, estimated from its body's size (an over-estimate)."""
    return len(body) // BYTES_PER_TOKEN + 1


def token_estimate(body: bytes, payload: dict[str, Any], kind: str, max_model_len: int) -> int:
    """What a request may cost a key's ``tokens_per_minute``, reserved at admission: the prompt (estimated
    from the body's size) plus, for generation, ``max_tokens`` (at most the model's context) for each of its
    ``n``/``best_of`` choices; without one, what the context leaves after the prompt (at least
    ``DEFAULT_COMPLETION_ESTIMATE``, at most the context): the engine may generate that much, and a client
    that leaves mid-stream keeps paying at least its reservation."""
    prompt = prompt_estimate(body)
    if kind == "embeddings":
        return prompt
    asked = _count(payload.get("max_completion_tokens")) or _count(payload.get("max_tokens"))
    per_choice = min(asked or max(max_model_len - prompt, DEFAULT_COMPLETION_ESTIMATE), max_model_len)
    choices = max(_count(payload.get("n")) or 1, _count(payload.get("best_of")) or 1)
    return prompt + per_choice * choices


def with_usage(body: bytes, payload: dict[str, Any]) -> bytes | None:
    """The body of a stream asking the engine for its usage chunk; None when the client asked already (or
    sent a ``stream_options`` that is not an object: the engine refuses it as it stands)."""
    options = payload.get("stream_options")
    if "stream_options" not in payload:  # the usual case: one splice, the client's bytes otherwise
        at = body.find(b"{") + 1
        return body[:at] + _INCLUDE_USAGE + body[at:]
    if options is not None and not isinstance(options, dict):
        return None
    if options is not None and options.get("include_usage") is True:
        return None
    return orjson.dumps({**payload, "stream_options": {**(options or {}), "include_usage": True}})


class UsageStrip:
    """Reads a stream event by event (however the reads split them): keeps the last ``usage`` for accounting
    and counts the content events (each carries about one token of one choice), what a client that leaves
    mid-stream is charged for at least. With ``strip`` (the client did not ask for usage) the usage-only
    event (``"choices": []`` and a ``usage``) is taken out, so the client sees the stream it asked for, and
    events are passed on whole: a piece of one that has not ended yet waits for the rest (an engine writes
    whole events, so this holds nothing back in practice). Without it every byte is passed on as it came."""

    __slots__ = ("content_events", "held", "strip", "usage")

    def __init__(self, strip: bool = True) -> None:
        self.strip = strip
        self.held = b""
        self.usage: bytes | None = None
        self.content_events = 0

    def feed(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` (and what was held) that goes to the client now."""
        data = self.held + chunk if self.held else chunk
        end = 0
        for m in _EVENT_END.finditer(data):
            end = m.end()
        self.held = data[end:]
        events = data[:end]
        kept: list[bytes] = []
        start = 0
        for m in _EVENT_END.finditer(events):
            event, start = events[start : m.end()], m.end()
            usage_only = b'"usage"' in event and _USAGE_ONLY.search(event) is not None
            if b'"usage"' in event and usage_of(event) != (0, 0):
                self.usage = event
            if not usage_only and b'"choices"' in event:
                self.content_events += 1
            if not (usage_only and self.strip):
                kept.append(event)
        return b"".join(kept) if self.strip else chunk

    def rest(self) -> bytes:
        """What was held when the stream ended (an unterminated last event): the client gets it as it is."""
        rest, self.held = self.held, b""
        return rest if self.strip else b""


def stream_start(data: bytes) -> str:
    """What the start of an engine's stream says so far: ``"error"`` (an error event came before any token:
    vLLM's way of failing a stream it already answered 200), ``"generated"`` (a token, a finish or the end of
    the stream came first) or ``"wait"`` (only events that say nothing yet, such as a chat stream's opening
    role event, or an event not yet whole)."""
    start = 0
    for m in _EVENT_END.finditer(data):
        event, start = data[start : m.start()], m.end()
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            value = line[5:].strip()
            if value == b"[DONE]":
                return "generated"
            try:
                parsed = orjson.loads(value)
            except orjson.JSONDecodeError:
                return "generated"  # not ours to judge: the client gets it as it is
            if not isinstance(parsed, dict):
                return "generated"
            if "error" in parsed:
                return "error"
            if any(_says_something(choice) for choice in parsed.get("choices") or ()):
                return "generated"
    return "wait"


def _says_something(choice: Any) -> bool:
    """A stream choice with a token (text, content, a tool call, reasoning) or a finish."""
    if not isinstance(choice, dict):
        return True
    if choice.get("text") or choice.get("finish_reason"):
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return any(
        delta.get(k) for k in ("content", "tool_calls", "reasoning_content", "reasoning", "function_call")
    )
