"""Seeded, reproducible routing workloads: multi-turn chats that share system prompts, and a control.

``shared``: ``prompts`` system prompts of ~``system_tokens`` tokens; ``sessions`` chat sessions, each
on one system prompt, of ``turns`` turns. A turn sends the whole conversation so far (system prompt,
earlier user turns and the assistant's replies, the new user turn), so consecutive turns of a session
share everything but their tail, and sessions on one system prompt share its ~1,000 tokens. The
assistant replies in the history are the workload's own (seeded) text, not the model's output, so the
same seed sends byte-identical requests to every target.

``control``: as many single requests, each with a prompt of its own (same lengths): nothing to share,
so a router can only win by balance.

Sessions start as a Poisson process at ``session_rate`` per second; the next turn of a session is sent
``think_s`` (exponential mean) after the previous answer arrived. Control requests arrive as a Poisson
process at the shared workload's mean request rate.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from components.local.tiny_model import corpus


def _vocabulary() -> list[str]:
    words = sorted({w.lower() for line in corpus() for w in re.findall(r"[A-Za-z]+", line)})
    return words


VOCAB = _vocabulary()
#: Measured on the tiny Llama's tokenizer: tokens per word of ``text()`` (with its spaces).
TOKENS_PER_WORD = 1.46


def text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of sentences made of the tokenizer's own words."""
    words = max(1, round(tokens / TOKENS_PER_WORD))
    out: list[str] = []
    for i in range(words):
        w = rng.choice(VOCAB)
        out.append(w.capitalize() if i % 12 == 0 else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


@dataclass(frozen=True)
class Turn:
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class Session:
    start_s: float  # arrival of the first turn, from the start of the run
    system: int  # which system prompt (-1: control, none shared)
    turns: list[Turn]
    think_s: list[float] = field(default_factory=list)  # pause before turn i+1


@dataclass(frozen=True)
class Workload:
    name: str
    sessions: list[Session]

    @property
    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def shared(
    seed: int,
    *,
    prompts: int = 8,
    system_tokens: int = 1000,
    sessions: int = 64,
    turns: int = 6,
    user_tokens: int = 60,
    reply_tokens: int = 60,
    session_rate: float = 6.0,
    think_s: float = 0.5,
) -> Workload:
    rng = random.Random(seed)
    systems = [f"You are assistant number {i}. " + text(rng, system_tokens) for i in range(prompts)]
    out: list[Session] = []
    t = 0.0
    for i in range(sessions):
        t += rng.expovariate(session_rate)
        which = rng.randrange(prompts)
        history: list[dict[str, str]] = [{"role": "system", "content": systems[which]}]
        ts: list[Turn] = []
        for k in range(turns):
            history = [
                *history,
                {"role": "user", "content": f"Question {k} of chat {i}: " + text(rng, user_tokens)},
            ]
            ts.append(Turn(list(history)))
            history = [*history, {"role": "assistant", "content": text(rng, reply_tokens)}]
        pauses = [rng.expovariate(1.0 / think_s) for _ in range(turns - 1)]
        out.append(Session(t, which, ts, pauses))
    return Workload("shared", out)


def control(seed: int, *, like: Workload) -> Workload:
    """Single requests with nothing in common, of the same sizes as ``like``'s, at its mean rate."""
    rng = random.Random(seed + 1_000_003)
    n = like.requests
    span = max(s.start_s for s in like.sessions) + 3.0  # the shared run's sessions outlive the last start
    rate = n / span
    out: list[Session] = []
    t = 0.0
    sizes = [sum(len(m["content"]) for m in turn.messages) for s in like.sessions for turn in s.turns]
    rng.shuffle(sizes)
    for j, chars in enumerate(sizes):
        t += rng.expovariate(rate)
        body = f"Request {j}. " + text(rng, max(1, chars // 5))
        out.append(Session(t, -1, [Turn([{"role": "user", "content": body}])]))
    return Workload("control", out)
