"""The picker's fleet, read the router's way: replicas from discovery (``runtime.discovery``: static
addresses or the engine Services' EndpointSlices), load and health from the health monitor's feed
(``runtime.fleet_feed``), or from the engines themselves while the feed is absent or stale: the router's
signal loop (``runtime.signal_loop``), with nothing of the picker's own added.

Reconfiguration is a restart (the picker's ConfigMap carries a checksum that rolls its pods); discovery
changes keep surviving replicas' counters and circuits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import aiohttp

from runtime.config import ModelTarget, RuntimeConfig
from runtime.discovery import watch_replicas
from runtime.picker.replicas import ModelPool
from runtime.signal_loop import SignalLoop

log = logging.getLogger("inferstack.picker.fleet")

Discover = Callable[[ModelTarget], AsyncIterator[list[str]]]


class Fleet:
    """Every model's pool; owns the discovery watches and the signal loop."""

    def __init__(self, cfg: RuntimeConfig, discover: Discover = watch_replicas) -> None:
        self.cfg = cfg
        self.discover = discover
        self.models: dict[str, ModelPool] = {
            t.name: ModelPool(t, cfg.route(t.name), cfg.router) for t in cfg.models
        }
        self.on_departed: Callable[[str, str], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self.signals = SignalLoop(
            lambda: self.models, lambda: self.cfg.router, lambda: self.session, logger=log
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session for looks at replicas; open while started."""
        assert self._session is not None, "the fleet is not started"
        return self._session

    @property
    def feed_ok(self) -> bool:
        """The last round of the signal loop applied a fresh health feed (else it probed the engines)."""
        return self.signals.feed_ok

    @property
    def listed(self) -> bool:
        """Every model's replicas have been reported once (the picker is ready)."""
        return all(pool.listed for pool in self.models.values())

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession()
        self._tasks = [loop.create_task(self._watch(pool)) for pool in self.models.values()]
        self._tasks.append(loop.create_task(self.signals.run()))
        for _ in range(3):  # static targets report at once: let the first lists land
            await asyncio.sleep(0)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()

    async def _watch(self, pool: ModelPool) -> None:
        pool.on_departed = self.on_departed
        async for urls in self.discover(pool.target):
            if urls != [r.url for r in pool.replicas]:
                log.info("replicas of %s: %s", pool.name, urls)
            pool.set_replicas(urls)
