"""One look at an engine replica, as a front end takes it when the health monitor's feed is away: is it
up (the engine's health path), and what its metrics page says: how loaded (queued and running requests,
KV usage) and how many prompt tokens it has taken (the router's sleep mode reads that counter). The names
are ``runtime.engines``'; the page is read through ``runtime.metrics_text``'s bounded, filtered parser,
once per look: a front end that needs the page again in the same round reuses the look's ``metrics``."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from runtime.config import EngineKind
from runtime.engines import Signal, facts
from runtime.metrics_text import decode, parse, wanted_sample_names

#: The largest metrics page read from an engine.
MAX_BYTES = 4 * 1024 * 1024
LOAD_SIGNALS = (Signal.QUEUED, Signal.RUNNING, Signal.KV_USAGE)
#: Every signal a front end reads from an engine's metrics page (one parse finds them all).
PAGE_SIGNALS = (*LOAD_SIGNALS, Signal.PROMPT_TOKENS)
#: Signals summed over the engine's label sets; the others (KV usage, a ratio) are averaged.
_SUMMED = (Signal.QUEUED, Signal.RUNNING, Signal.PROMPT_TOKENS)


def look_timeout_s(probe_interval_ms: int) -> float:
    """How long one look at an engine may take: most of a probe period, never under half a second."""
    return max(0.5, probe_interval_ms / 1000 * 0.8)


def page_signals(text: str, engine: EngineKind) -> dict[Signal, float]:
    """What a metrics page says: queued and running requests and prompt tokens taken (each summed over the
    engine's label sets) and KV usage (their mean). A signal the page lacks is absent."""
    names = {s: facts(engine).names(s) for s in PAGE_SIGNALS}
    parsed = parse(text, wanted_sample_names(n for spelled in names.values() for n in spelled))
    out: dict[Signal, float] = {}
    for signal in _SUMMED:
        value = parsed.first_total(names[signal])
        if value is not None:
            out[signal] = value
    for name in names[Signal.KV_USAGE]:
        values = [s.value for s in parsed.samples.get(name, ())]
        if values:
            out[Signal.KV_USAGE] = sum(values) / len(values)  # a ratio per engine: averaged, not summed
            break
    return out


@dataclass(frozen=True, slots=True)
class Look:
    """One look at an engine. ``metrics`` is what its metrics page said: None when the page was not asked
    for (the health check failed), empty when it could not be read or named nothing we read."""

    answered: bool
    metrics: Mapping[Signal, float] | None = None

    @property
    def signals(self) -> Mapping[Signal, float]:
        """The page's signals, empty when unknown."""
        return self.metrics or {}


async def read_metrics(
    session: aiohttp.ClientSession, url: str, engine: EngineKind, timeout_s: float
) -> dict[Signal, float]:
    """One GET of the engine's metrics page, parsed once for every signal a front end reads there (load and
    the prompt-token counter); empty when it does not answer. Never raises on a bad engine."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with session.get(
            url + facts(engine).metrics_path, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status == 200:
                return page_signals(decode(await resp.content.read(MAX_BYTES)), engine)
    return {}


async def probe(session: aiohttp.ClientSession, url: str, engine: EngineKind, timeout_s: float) -> Look:
    """Whether the engine answers its health check and, when it does, its metrics page (read once).
    Never raises on a bad engine."""
    healthy = False
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with session.get(
            url + facts(engine).health_path, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            healthy = resp.status == 200
    if not healthy:
        return Look(answered=False)
    return Look(answered=True, metrics=await read_metrics(session, url, engine, timeout_s))
