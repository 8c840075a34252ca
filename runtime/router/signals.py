"""What the router adds to the shared signal loop (``runtime.signal_loop``, which reads the health monitor's
feed when it is fresh, else looks at each engine): the versions' weights and the adapters each replica holds
from the feed, the engine's model list after a look (for models with adapters), a faster period while a
replica is out, and the sleep sweep, handed the round's looks so it reads no engine's metrics page twice.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

import aiohttp

from runtime.config import RouterSettings
from runtime.engine_probe import Look
from runtime.engines import facts
from runtime.fleet_feed import Feed
from runtime.router.adapters import listed_adapters
from runtime.router.model_state import ModelState
from runtime.router.replicas import Replica
from runtime.router.sleep import SleepControl
from runtime.signal_loop import Extra, Round, feed_replicas
from runtime.versions import Split

log = logging.getLogger("inferstack.router.fleet")


def interval_s(models: Mapping[str, ModelState], settings: RouterSettings) -> float:
    """The feed (or probe) period: ``recovery_poll_ms`` while some replica is out, so one that comes back
    is routed to again within a fraction of a second of the health monitor readmitting it."""
    out = any(not r.healthy for state in models.values() for r in state.replicas)
    return (
        min(settings.recovery_poll_ms, settings.probe_interval_ms) / 1000
        if out
        else settings.probe_interval_ms / 1000
    )


def feed_adapters(models: Mapping[str, ModelState], feed: Feed) -> None:
    """The adapters the feed says each replica holds, for models with adapters."""
    for state, replica, entry in feed_replicas(models, feed):
        if state.adapters and entry.adapters is not None:
            replica.adapters.sync(list(entry.adapters), feed.generated_at)


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


class RouterSignals(Extra[ModelState, Replica]):
    """The router's step in each round of the signal loop."""

    def __init__(self, splits: Callable[[], Mapping[str, Split]], sleep: SleepControl) -> None:
        self.splits = splits
        self.sleep = sleep

    def interval_s(self, models: Mapping[str, ModelState], settings: RouterSettings) -> float:
        return interval_s(models, settings)

    def took_feed(self, models: Mapping[str, ModelState], feed: Feed) -> None:
        feed_adapters(models, feed)
        apply_version_weights(self.splits(), feed)

    async def look_further(
        self,
        session: aiohttp.ClientSession,
        model: ModelState,
        replica: Replica,
        look: Look,
        timeout_s: float,
    ) -> Look:
        """Which adapters an engine that answered holds: its model list says (they are lost on a restart)."""
        if not look.answered or not model.adapters:
            return look
        observed_at = time.time()
        try:
            url = replica.url + facts(model.target.engine).models_path
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status == 200:
                    replica.adapters.sync(
                        listed_adapters(await resp.json(content_type=None), model.name), observed_at
                    )
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return dataclasses.replace(look, answered=False)
        return look

    async def round_done(self, models: Mapping[str, ModelState], done: Round) -> None:
        await self.sleep.sweep(models.values(), done.looks)
