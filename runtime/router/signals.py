"""Keeping every replica's health and load fresh: the health monitor's feed when it is fresh (``runtime.fleet_feed``,
which also carries the versions' weights and the adapters each replica holds), else the router's own look at
each engine (``runtime.engine_probe``), plus, for models with adapters, the engine's model list.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import aiohttp

from runtime.config import RouterSettings
from runtime.engine_probe import look_timeout_s, probe
from runtime.engines import facts
from runtime.fleet_feed import Feed, apply_signals, fetch_feed
from runtime.router.adapters import listed_adapters
from runtime.router.backends import Backend
from runtime.router.model_state import ModelState
from runtime.versions import Split

log = logging.getLogger("inferstack.router.fleet")


def interval_s(models: Mapping[str, ModelState], settings: RouterSettings) -> float:
    """The feed (or probe) period: ``recovery_poll_ms`` while some replica is out, so one that comes back
    is routed to again within a fraction of a second of the health monitor readmitting it."""
    out = any(not b.healthy for state in models.values() for b in state.replicas)
    return (
        min(settings.recovery_poll_ms, settings.probe_interval_ms) / 1000
        if out
        else settings.probe_interval_ms / 1000
    )


def apply_feed(models: Mapping[str, ModelState], feed: Feed) -> None:
    """Copy each replica's entry (may it take traffic, its load, the adapters it holds) onto the router's."""
    for entry in feed.replicas:
        state = models.get(entry.model)
        b = state.by_url.get(entry.url) if state is not None else None
        if state is None or b is None:
            continue
        if state.adapters and entry.adapters is not None:
            b.adapters.sync(list(entry.adapters), feed.generated_at)
        if apply_signals(entry, b):
            state.queue.wake_all()


def apply_version_weights(splits: Mapping[str, Split], feed: Feed) -> None:
    """Install the weights the health monitor decided (a canary rolled back, or restored) on the splits."""
    for entry in feed.versions:
        split = splits.get(entry.model)
        if split is None or set(entry.weights) != set(split.versions):
            continue
        if split.set_weights([entry.weights[v] for v in split.versions], entry.reason):
            log.warning(
                "versions of %s now weighted %s: %s",
                split.model,
                dict(zip(split.versions, split.weights, strict=True)),
                split.override_reason or "back to the configured weights",
            )


async def read_feed(
    session: aiohttp.ClientSession,
    settings: RouterSettings,
    models: Mapping[str, ModelState],
    splits: Mapping[str, Split],
) -> bool:
    """Apply the health monitor's feed; False if it is unreachable, stale or not a feed."""
    feed = await fetch_feed(session, str(settings.health_feed_url), settings.probe_interval_ms / 1000)
    if feed is None:
        return False
    apply_feed(models, feed)
    apply_version_weights(splits, feed)
    return True


async def probe_all(
    session: aiohttp.ClientSession, settings: RouterSettings, models: Mapping[str, ModelState]
) -> None:
    timeout_s = look_timeout_s(settings.probe_interval_ms)
    jobs = [_probe(session, state, b, timeout_s) for state in models.values() for b in state.replicas]
    if jobs:
        await asyncio.gather(*jobs)


async def _probe(session: aiohttp.ClientSession, state: ModelState, b: Backend, timeout_s: float) -> None:
    answered, signals = await probe(session, b.url, state.target.engine, timeout_s)
    if answered and state.adapters:  # which adapters it holds: its model list says (lost on restart)
        observed_at = time.time()
        try:
            url = b.url + facts(state.target.engine).models_path
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status == 200:
                    b.adapters.sync(
                        listed_adapters(await resp.json(content_type=None), state.name), observed_at
                    )
        except (aiohttp.ClientError, TimeoutError, ValueError):
            answered = False
    if state.probed(b, answered, signals):
        state.queue.wake_all()
