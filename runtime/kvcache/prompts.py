"""A request's prompt as the engine tokenizes it, so its block hashes can be looked up in the view.

vLLM 0.32 tokenizes a completion prompt with the tokenizer's post-processor (``add_special_tokens`` on),
and a chat request by rendering the model's chat template (transformers' sandboxed jinja2 environment,
``trim_blocks`` and ``lstrip_blocks``, the tokenizer's special tokens as variables, ``add_generation_prompt``
on by default) and tokenizing the text without adding special tokens. Both are reproduced here from the
model's own ``tokenizer.json`` and chat template (``chat_template.jinja``, or ``tokenizer_config.json``'s
``chat_template``), loaded from a local directory: nothing is downloaded.

What cannot be reproduced exactly (tools, images or other non-text content, assistant tool calls, a
truncation request) gives ``None``: the request is routed without the view, never on a wrong guess.

**Why chat prompts are tokenized piece by piece.** A chat prompt is mostly what the previous turn sent
(the system prompt, the history), and BPE over ~1,500 tokens costs ~1.4 ms here. The tokenizers library
splits its input at added tokens before anything else and encodes the pieces between them independently,
so for added tokens that are plain (not normalized, no lstrip/rstrip/single-word), encoding the pieces
and joining the ids is exactly encoding the whole; the pieces (a system prompt, each earlier message) are
kept in a bounded LRU, and a follow-up costs the encoding of its new message only. A tokenizer with any
other kind of added token is encoded whole.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from runtime.scheduling.lru import BoundedLru

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
PIECES_CACHED = 4096  # chat pieces (messages between special tokens) kept tokenized
_PIECE_MAX_CHARS = 1 << 20
_UNSUPPORTED_FIELDS = (
    "tools",
    "functions",
    "truncate_prompt_tokens",
    "prompt_embeds",
    "continue_final_message",
)


class TokenizerError(Exception):
    """The tokenizer directory cannot be used; the message names the file and what is wrong."""


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _added_token_splitter(tokenizer: Tokenizer) -> tuple[re.Pattern[str] | None, dict[str, int]]:
    """A regex that splits text at the tokenizer's added tokens, or None when one of them is not plain
    (then only whole-text encoding is exact)."""
    added = tokenizer.get_added_tokens_decoder()
    if not added or any(t.normalized or t.lstrip or t.rstrip or t.single_word for t in added.values()):
        return None, {}
    by_text = {t.content: i for i, t in added.items()}
    longest_first = sorted(by_text, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(t) for t in longest_first) + ")"), by_text


class PromptTokens:
    """One model's tokenizer and chat template."""

    def __init__(self, tokenizer: Tokenizer, template: jinja2.Template | None, special: dict[str, str]):
        self.tokenizer = tokenizer
        self.template = template
        self.special = special
        self.pieces: BoundedLru[str, list[int]] = BoundedLru(PIECES_CACHED)
        self.splitter, self.added = _added_token_splitter(tokenizer)

    @classmethod
    def load(cls, directory: Path) -> PromptTokens:
        path = directory / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # the tokenizers library raises its own Exception subclass
            raise TokenizerError(f"{path}: cannot load the tokenizer ({err})") from None
        config: dict[str, Any] = {}
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except (OSError, ValueError) as err:
                raise TokenizerError(f"{config_path}: not JSON ({err})") from None
        source = None
        template_path = directory / "chat_template.jinja"
        if template_path.is_file():
            source = template_path.read_text()
        elif isinstance(config.get("chat_template"), str):
            source = config["chat_template"]
        elif isinstance(config.get("chat_template"), list):  # named templates: vLLM uses "default"
            named = {t.get("name"): t.get("template") for t in config["chat_template"] if isinstance(t, dict)}
            source = named.get("default")
        template = None
        if source is not None:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            try:
                template = env.from_string(source)
            except jinja2.TemplateError as err:
                raise TokenizerError(f"{directory}: the chat template does not compile ({err})") from None
        special = {k: text for k in _SPECIAL if (text := _token_text(config.get(k))) is not None}
        return cls(tokenizer, template, special)

    def tokens(self, kind: str, payload: dict[str, Any]) -> list[int] | None:
        """The prompt's token ids as the engine sees them; None when that cannot be reproduced here."""
        if any(payload.get(f) is not None for f in _UNSUPPORTED_FIELDS):
            return None
        if kind == "chat":
            return self._chat(payload)
        if kind == "completions":
            prompt = payload.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]  # several prompts: the first decides, as for the history index
            if isinstance(prompt, str):
                return list(self.tokenizer.encode(prompt, add_special_tokens=True).ids)
            if isinstance(prompt, list) and prompt and all(_token_id(t) for t in prompt):
                return list(prompt)  # already token ids
        return None

    def _chat(self, payload: dict[str, Any]) -> list[int] | None:
        messages = payload.get("messages")
        if self.template is None or not isinstance(messages, list) or not messages:
            return None
        plain: list[dict[str, Any]] = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("tool_calls"):
                return None
            message = {"role": m.get("role"), "content": m["content"]}
            if isinstance(m.get("name"), str):
                message["name"] = m["name"]
            plain.append(message)
        extra = payload.get("chat_template_kwargs")
        variables = {
            **self.special,
            **(extra if isinstance(extra, dict) else {}),
            "messages": plain,
            "add_generation_prompt": payload.get("add_generation_prompt", True) is not False,
        }
        try:
            text = self.template.render(**variables)
        except (jinja2.TemplateError, TypeError, ValueError):
            return None  # the engine will answer this one with its own error
        return self.encode_pieces(text)

    def encode_pieces(self, text: str) -> list[int]:
        """``encode(text, add_special_tokens=False)``, with the pieces between added tokens cached."""
        if self.splitter is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        out: list[int] = []
        for piece in self.splitter.split(text):
            if not piece:
                continue
            token = self.added.get(piece)
            if token is not None:
                out.append(token)
                continue
            ids = self.pieces.get(piece)
            if ids is None:
                ids = list(self.tokenizer.encode(piece, add_special_tokens=False).ids)
                if len(piece) <= _PIECE_MAX_CHARS:
                    self.pieces.put(piece, ids)
            out.extend(ids)
        return out
