"""Mid-generation failover: a stream whose engine dies, hangs or resets after the client got its first bytes is
continued on another replica, and the client keeps one stream.

Pure decisions (no I/O): :class:`Progress` reads every event of a stream the router relays (what the client has
seen: its id, its text, the engine's token ids), and when the engine fails builds the continuation request and
rewrites the replacement's events so they read as the rest of the first stream. ``proxy`` relays, ``app``'s
routing loop picks the replacement.

How a stream is continued (vLLM 0.32: ``return_token_ids`` in vllm/entrypoints/openai/completion/protocol.py and
chat_completion/protocol.py puts ``prompt_token_ids`` in a stream's first event and each event's new
``token_ids``; ``continue_final_message`` / ``add_generation_prompt`` in chat_completion/protocol.py):

- **Token ids** (vLLM, a request without stop strings): ``POST /v1/completions`` with ``prompt`` = the first
  engine's prompt token ids + the ids generated so far, the sampling fields carried over, and ``max_tokens``
  less what was generated. No text is tokenized again, so a greedy request gives exactly the tokens an
  uninterrupted run gives (the same model and weights; batch composition may still move bf16 logits on some
  engines). A chat stream's completions events are rewritten into chat events.
- **Text** (stop strings, or an engine without token ids): a chat request is sent again with the partial
  assistant message (``continue_final_message: true``, ``add_generation_prompt: false``); a completion with the
  prompt + the text so far. vLLM holds back the last ``len(longest stop) - 1`` characters of a stream with stop
  strings until it rules them out (vllm/v1/engine/detokenizer.py ``stop_buffer_length``), so ids can be ahead of
  the text the client has: continuing from the text the client has is what loses nothing. The text is tokenized
  again on the replacement, which may split it differently at the seam than the first engine generated it.
- **Stop strings across the seam**: the replacement checks stop strings in its own text only; one that starts
  in the client's text and ends in the replacement's is found here (:class:`Seam`), the stream ends there with
  ``finish_reason: "stop"``, and the replacement is let go.
- **Sampling**: a greedy request continues exactly (token-id path). A sampled one continues from the same
  tokens with its ``seed`` carried over, so the text is a valid sample of the same request, but not the one an
  uninterrupted run would have drawn (the seed restarts the engine's generator at the seam). Penalties that
  count generated tokens (``frequency_penalty``, ``presence_penalty``) see the carried tokens as prompt tokens.
- **Usage**: the final ``usage`` counts the first prompt once and every generated token once, whatever engine
  generated it; ``max_tokens`` (and ``min_tokens``) count what was generated already.

Not continued (the client gets the stream's error event, as before): ``n`` or ``best_of`` above 1, ``echo``,
a list of prompts, a chat stream that had begun a tool call on the text path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

_EVENT_END = re.compile(rb"\r?\n\r?\n")
#: vLLM's default ``max_tokens`` of a completion (vllm/entrypoints/openai/completion/protocol.py, 0.32.0).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: Sampling fields a chat request keeps when it is continued as a completion from token ids (vLLM's
#: CompletionRequest takes each under the same name).
SAMPLING_FIELDS = frozenset(
    (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop_token_ids",
        "ignore_eos",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "bad_words",
        "allowed_token_ids",
        "user",
        "priority",
    )
)
#: Chat fields whose meaning a completion from token ids cannot carry: such a chat stream is continued as chat.
CHAT_ONLY = (
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "logprobs",
    "top_logprobs",
)
#: Why a stream was moved (the migrations metric's ``reason`` label).
REASONS = ("reset", "timeout", "error_event", "truncated", "protocol")


def migratable(payload: dict[str, Any], kind: str) -> bool:
    """A stream this module can continue elsewhere: one choice, one prompt, no echo."""
    if kind not in ("chat", "completions") or payload.get("stream") is not True:
        return False
    if payload.get("n") not in (None, 1) or payload.get("best_of") not in (None, 1) or payload.get("echo"):
        return False
    if kind == "completions":
        prompt = payload.get("prompt")
        return isinstance(prompt, str) or (
            isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)
        )
    return isinstance(payload.get("messages"), list)


def asking_token_ids(body: bytes, payload: dict[str, Any]) -> bytes | None:
    """The body asking the engine for token ids (``return_token_ids``); None when the client asked already."""
    if payload.get("return_token_ids") is True:
        return None
    if "return_token_ids" not in payload:  # the usual case: one splice, the bytes otherwise as they came
        at = body.find(b"{") + 1
        return body[:at] + b'"return_token_ids":true,' + body[at:]
    return orjson.dumps({**orjson.loads(body), "return_token_ids": True})


def _stops(payload: dict[str, Any]) -> tuple[str, ...]:
    stop = payload.get("stop")
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list):
        return tuple(s for s in stop if isinstance(s, str) and s)
    return ()


@dataclass(slots=True)
class Seam:
    """Stop strings across a seam: the replacement's text is held until a stop string that begins in the text
    before the seam (``before``: its last ``len(longest) - 1`` characters) can no longer end in it."""

    stops: tuple[str, ...]
    before: str
    include: bool = False  # include_stop_str_in_output
    held: str = ""
    open: bool = True  # still looking

    def feed(self, text: str, final: bool = False) -> tuple[str, str | None]:
        """(text to pass on now, the stop string that ended the stream here or None)."""
        if not self.open:
            return text, None
        self.held += text
        reach = max(len(s) for s in self.stops) - 1
        window = self.before + self.held
        found: tuple[int, str] | None = None
        for stop in self.stops:
            at = window.find(stop, max(0, len(self.before) - len(stop) + 1))
            if 0 <= at < len(self.before) and (found is None or at < found[0]):
                found = (at, stop)
        if found is not None:
            at, stop = found
            end = at + (len(stop) if self.include else 0)
            self.open = False
            out = window[len(self.before) : max(len(self.before), end)]
            self.held = ""
            return out, stop
        if final or len(self.held) >= reach:
            self.open = False
            out, self.held = self.held, ""
            return out, None
        return "", None


@dataclass(slots=True)
class Continuation:
    """What to send the replacement: the path and the body."""

    path: bytes
    body: bytes


@dataclass(slots=True)
class Progress:
    """One relayed stream: what its client has seen, and how to go on elsewhere."""

    kind: str  # chat | completions
    payload: dict[str, Any]  # the client's request
    max_model_len: int
    strip_usage: bool  # the router asked for the usage event: the client does not see it
    strip_ids: bool  # the router asked for token ids: the client does not see them
    resend: Callable[[bytes], bytes]  # a body -> what follows the request line (headers + body)
    ids_capable: bool = True  # the engine returns token ids when asked (vLLM)
    id: Any = None
    created: Any = None
    model: Any = None
    prompt_ids: list[int] | None = None
    ids: list[int] = field(default_factory=list)
    ids_complete: bool = True  # every content event so far carried its ids
    clean: int = (
        0  # ids up to the last event with text: the ids after it are bytes of a character not yet whole
    )
    pieces: list[str] = field(default_factory=list)  # the text the client has, piece by piece (``text``)
    started: bool = False  # the client has the stream's head
    finished: bool = False  # a finish_reason reached the client
    done: bool = False  # the stream's end ([DONE], or the router's own end) reached the client
    tool_call: bool = False
    content_events: int = 0
    usage: tuple[int, int] | None = None  # (prompt, completion) as the client's usage reports them
    migrations: int = 0
    carried: int = 0  # tokens generated before the current engine (in its prompt)
    via_ids: bool = False  # the current engine continues from token ids (completions events)
    prompt_tokens: int | None = None  # the first prompt's tokens, once known
    seam: Seam | None = None
    stop_hit: str | None = None  # the router ended the stream on a stop string across a seam
    held: bytes = b""
    ids_here: int = 0  # token ids (or content events) the current engine sent
    broken: str | None = None  # the engine sent an error event mid-stream
    touched: bool = False  # the event being read was changed for the client

    # --- the stream ------------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> bytes:
        """The bytes that go to the client for this piece of an engine's stream (whole events only)."""
        data = self.held + chunk if self.held else chunk
        end = 0
        for m in _EVENT_END.finditer(data):
            end = m.end()
        self.held = data[end:]
        out: list[bytes] = []
        start = 0
        for m in _EVENT_END.finditer(data[:end]):
            out.append(self._event(data[start : m.end()]))
            start = m.end()
            if self.broken is not None:  # the engine failed: nothing after its error event is the client's
                self.held = b""
                break
            if self.stop_hit is not None:  # the router ended the stream: nothing more of this engine's
                out.append(b"data: [DONE]\n\n")
                self.done = True
                self.held = b""
                break
        return b"".join(out)

    def rest(self) -> bytes:
        rest, self.held = self.held, b""
        return rest

    def _event(self, raw: bytes) -> bytes:
        value = b"".join(line[5:].strip() for line in raw.splitlines() if line.startswith(b"data:"))
        if value == b"[DONE]":
            self.done = True
            return raw
        try:
            event = orjson.loads(value)
        except orjson.JSONDecodeError:
            return raw
        if not isinstance(event, dict):
            return raw
        if "error" in event:
            self.broken = "error_event"
            return b""
        self.touched = self.migrations > 0
        out = self.rewrite(event)
        if not self.touched and len(out) == 1 and out[0] is event:  # the first engine's event as it came
            return raw
        return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in out)

    def rewrite(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """One engine event -> the events the client gets (none, one, or with the router's own end)."""
        first = self.migrations == 0
        if first and self.id is None:
            self.id, self.created, self.model = event.get("id"), event.get("created"), event.get("model")
        if not first:
            event["id"], event["created"], event["model"] = self.id, self.created, self.model
            event["object"] = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        self._prompt_ids(event)  # a chat stream's first event carries them (a completion's: its choice)
        if not first:
            event.pop("prompt_text", None)
        usage = event.get("usage")
        choices = event.get("choices")
        if isinstance(usage, dict):
            p, c = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
            if first:
                if self.prompt_tokens is None:
                    self.prompt_tokens = p
            else:
                c += self.carried
                p = self.prompt_tokens if self.prompt_tokens is not None else max(0, p - self.carried)
                usage.update(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)
            self.usage = (p, c)
        if not choices:
            if isinstance(usage, dict) and self.strip_usage:
                self.touched = True
                return []
            return [event]
        out_choices = []
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            kept = self._choice(choice)
            if kept is not None:
                out_choices.append(kept)
        if not out_choices and not isinstance(usage, dict):
            return []
        event["choices"] = out_choices
        if isinstance(usage, dict) and self.strip_usage:
            del event["usage"]
            self.touched = True
        out = [event]
        if self.stop_hit is not None:  # ended here: the usage the client asked for, then the end
            out.extend(self.local_end(with_finish=False))
        return out

    def _prompt_ids(self, holder: dict[str, Any]) -> None:
        """Keep the first engine's prompt token ids; the client sees them only when it asked, and once."""
        if "prompt_token_ids" not in holder:
            return
        ids = holder["prompt_token_ids"] if self.migrations == 0 and not self.strip_ids else None
        if self.migrations == 0 and self.prompt_ids is None and isinstance(holder["prompt_token_ids"], list):
            self.prompt_ids = holder["prompt_token_ids"]
            self.prompt_tokens = len(self.prompt_ids)
        if ids is None:
            del holder["prompt_token_ids"]
            self.touched = True

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any] | None:
        """One choice of an engine event, as the client gets it (None: nothing left to send)."""
        self._prompt_ids(choice)
        ids = choice.pop("token_ids", None) if self.strip_ids else choice.get("token_ids")
        self.touched |= self.strip_ids and ids is not None
        if isinstance(ids, list):
            self.ids.extend(ids)
            self.ids_here += len(ids)
        if self.via_ids and self.kind == "chat":  # a completions event continuing a chat stream
            choice = {
                "index": 0,
                "delta": {"content": choice.get("text") or ""},
                "logprobs": None,
                "finish_reason": choice.get("finish_reason"),
                **({"stop_reason": choice["stop_reason"]} if "stop_reason" in choice else {}),
                **({"token_ids": ids} if not self.strip_ids and ids is not None else {}),
            }
        if self.kind == "chat":
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            if self.migrations and "role" in delta:
                del delta["role"]
            if delta.get("tool_calls") or delta.get("function_call"):
                self.tool_call = True
            text = delta.get("content")
        else:
            text = choice.get("text")
        text = text if isinstance(text, str) else ""
        finish = choice.get("finish_reason")
        if self.seam is not None and self.seam.open:
            text, hit = self.seam.feed(text, final=finish is not None)
            if hit is not None:
                self.stop_hit = hit
                finish = choice["finish_reason"] = "stop"
                choice["stop_reason"] = hit
            self._set_text(choice, text)
        if text:
            self.clean = len(self.ids)
            self.pieces.append(text)
            self.content_events += 1
            if ids is None:
                self.ids_complete = False
                self.ids_here += 1
        if finish is not None:
            self.finished = True
        if self.kind == "chat" and not text and finish is None:
            delta = choice.get("delta")
            if isinstance(delta, dict) and not delta:  # vLLM sends a token without text only for its ids
                return None if (self.migrations or (self.strip_ids and ids is not None)) else choice
            if isinstance(delta, dict) and not any(v not in (None, "") for v in delta.values()):
                return None if self.migrations else choice
        if self.kind == "completions" and not text and finish is None and self.migrations:
            return None
        return choice

    @property
    def text(self) -> str:
        """The text the client has (joined when asked: a long stream is not copied at each token)."""
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""

    def _set_text(self, choice: dict[str, Any], text: str) -> None:
        if self.kind == "chat":
            delta = choice.setdefault("delta", {})
            if isinstance(delta, dict):
                delta["content"] = text
        else:
            choice["text"] = text

    # --- ends the router writes itself -----------------------------------------------------------------
    def generated(self) -> int:
        """Completion tokens so far, over every engine."""
        return self.carried + self.ids_here

    def local_end(self, *, with_finish: bool, reason: str = "length") -> list[dict[str, Any]]:
        """The end of a stream the router closes itself: a finish event (unless one went out), the usage the
        client asked for, counted here; ``[DONE]`` follows (:meth:`closing`)."""
        out: list[dict[str, Any]] = []
        base = {"id": self.id, "created": self.created, "model": self.model}
        if with_finish and not self.finished:
            choice: dict[str, Any] = (
                {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
                if self.kind == "chat"
                else {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
            )
            out.append({**base, "object": self._object(), "choices": [choice]})
            self.finished = True
        p = self.prompt_tokens or 0
        c = self.generated()
        self.usage = (p, c)
        if not self.strip_usage:
            usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
            out.append({**base, "object": self._object(), "choices": [], "usage": usage})
        return out

    def closing(self, events: list[dict[str, Any]]) -> bytes:
        self.done = True
        return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"

    def _object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    # --- the continuation ------------------------------------------------------------------------------
    def can_continue(self) -> bool:
        return self.started and not self.done and not self.tool_call

    def remaining(self) -> int | None:
        """Completion tokens the replacement may still generate; None: the engine's default (the context)."""
        p = self.payload
        asked = _int(p.get("max_completion_tokens")) or _int(p.get("max_tokens"))
        if not asked and self.kind == "completions":
            asked = COMPLETIONS_DEFAULT_MAX_TOKENS
        left = asked - self.generated() if asked else None
        if self.prompt_tokens is not None:
            room = self.max_model_len - self.prompt_tokens - self.generated()
            left = room if left is None else min(left, room)
        return left

    def continuation(self) -> Continuation | None:
        """The request that goes on where the stream stopped; None: nothing left to generate (the router ends
        the stream itself, ``finish_reason: "length"``)."""
        if self.ids_complete and self.clean < len(self.ids):
            # the last tokens' text never reached the client (vLLM holds a character's bytes until it is
            # whole): the replacement generates them again. A token-id prompt that ends inside a character
            # also makes vLLM 0.32's detokenizer (a DecodeStream primed with the prompt) misplace its text.
            del self.ids[self.clean :]
            self.carried, self.ids_here = len(self.ids), 0
        left = self.remaining()
        if left is not None and left <= 0:
            return None
        self.migrations += 1
        self.carried = self.generated()
        self.ids_here = 0
        self.broken, self.held = None, b""  # what the failed engine left half-sent is not the client's
        p = self.payload
        stops = _stops(p)
        reach = max((len(s) for s in stops), default=1) - 1
        self.seam = (
            Seam(stops, self.text[len(self.text) - reach :], bool(p.get("include_stop_str_in_output")))
            if reach
            else None
        )
        by_ids = (
            self.ids_capable
            and not stops
            and self.ids_complete
            and self.prompt_ids is not None
            and (self.kind == "completions" or not any(k in p for k in CHAT_ONLY))
        )
        self.via_ids = by_ids
        usage = {"include_usage": True}
        body: dict[str, Any]
        if by_ids:
            assert self.prompt_ids is not None
            keep = SAMPLING_FIELDS if self.kind == "chat" else set(p) - {"prompt", "suffix", "echo"}
            body = {k: p[k] for k in keep if k in p}
            body.pop("max_completion_tokens", None)
            body.update(model=p.get("model"), prompt=self.prompt_ids + self.ids, stream=True)
            body.update(stream_options=usage, return_token_ids=True)
            body["max_tokens"] = left if left is not None else self.max_model_len
            path = b"/v1/completions"
        elif self.kind == "chat":
            messages = list(p["messages"])
            last = messages[-1] if messages else None
            if p.get("continue_final_message") and isinstance(last, dict) and last.get("role") == "assistant":
                messages[-1] = {**last, "content": (last.get("content") or "") + self.text}
            else:
                messages.append({"role": "assistant", "content": self.text})
            body = {**p, "messages": messages, "continue_final_message": True, "add_generation_prompt": False}
            body.update(stream=True, stream_options=usage)
            if self.ids_capable:
                body["return_token_ids"] = True
            if left is not None:
                body.pop("max_tokens", None)
                body["max_completion_tokens"] = left
            path = b"/v1/chat/completions"
        else:
            prompt = p.get("prompt")
            if not isinstance(prompt, str):  # token ids the engine cannot extend with our text
                self.migrations -= 1
                return None
            body = {**p, "prompt": prompt + self.text, "stream": True, "stream_options": usage}
            if self.ids_capable:
                body["return_token_ids"] = True
            body["max_tokens"] = left if left is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
            path = b"/v1/completions"
        min_tokens = _int(p.get("min_tokens"))
        if min_tokens:
            body["min_tokens"] = max(0, min_tokens - self.carried)
        return Continuation(path, orjson.dumps(body))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
