"""One look at an engine replica, as a front end takes it when the health monitor's feed is away: is it
up (the engine's health path), and how loaded (queued and running requests, KV usage from its metrics,
named by ``runtime.engines``; read through ``runtime.metrics_text``'s bounded, filtered parser)."""

from __future__ import annotations

import contextlib

import aiohttp

from runtime.config import EngineKind
from runtime.engines import Signal, facts
from runtime.metrics_text import decode, parse, wanted_sample_names

#: The largest metrics page read from an engine.
MAX_BYTES = 4 * 1024 * 1024
LOAD_SIGNALS = (Signal.QUEUED, Signal.RUNNING, Signal.KV_USAGE)


def look_timeout_s(probe_interval_ms: int) -> float:
    """How long one look at an engine may take: most of a probe period, never under half a second."""
    return max(0.5, probe_interval_ms / 1000 * 0.8)


def load_signals(text: str, engine: EngineKind) -> dict[Signal, float]:
    """Queued and running requests (summed over the engine's label sets) and KV usage (their mean)."""
    names = {s: facts(engine).names(s) for s in LOAD_SIGNALS}
    parsed = parse(text, wanted_sample_names(n for spelled in names.values() for n in spelled))
    out: dict[Signal, float] = {}
    for signal in (Signal.QUEUED, Signal.RUNNING):
        value = parsed.first_total(names[signal])
        if value is not None:
            out[signal] = value
    for name in names[Signal.KV_USAGE]:
        values = [s.value for s in parsed.samples.get(name, ())]
        if values:
            out[Signal.KV_USAGE] = sum(values) / len(values)  # a ratio per engine: averaged, not summed
            break
    return out


async def probe(
    session: aiohttp.ClientSession, url: str, engine: EngineKind, timeout_s: float
) -> tuple[bool, dict[Signal, float]]:
    """(answered its health check, its load signals: empty when unknown). Never raises on a bad engine."""
    paths = facts(engine)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    healthy = False
    text = ""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with session.get(url + paths.health_path, timeout=timeout) as resp:
            healthy = resp.status == 200
        if healthy:
            async with session.get(url + paths.metrics_path, timeout=timeout) as resp:
                if resp.status == 200:
                    text = decode(await resp.content.read(MAX_BYTES))
    return healthy, load_signals(text, engine) if text else {}


async def prompt_tokens(
    session: aiohttp.ClientSession, url: str, engine: EngineKind, timeout_s: float
) -> float | None:
    """The engine's prompt-token counter (every client's requests, not only ours); None when unknown."""
    paths = facts(engine)
    names = paths.names(Signal.PROMPT_TOKENS)
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with session.get(
            url + paths.metrics_path, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status == 200:
                text = decode(await resp.content.read(MAX_BYTES))
                return parse(text, wanted_sample_names(names)).first_total(names)
    return None
