"""The picker's fleet, read the router's way: replicas from discovery (``runtime.discovery``: static
addresses or the engine Services' EndpointSlices), load and health from the health monitor's feed
(``runtime.fleet_feed``), or from the engines themselves while the feed is absent or stale.

Reconfiguration is a restart (the picker's ConfigMap carries a checksum that rolls its pods); discovery
changes keep surviving replicas' counters and circuits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import aiohttp

from runtime.config import ModelTarget, RuntimeConfig
from runtime.discovery import watch_backends
from runtime.engine_probe import look_timeout_s, probe
from runtime.fleet_feed import apply_signals, fetch_feed
from runtime.picker.replicas import ModelPool, Replica

log = logging.getLogger("inferstack.picker.fleet")

Discover = Callable[[ModelTarget], AsyncIterator[list[str]]]


class Fleet:
    """Every model's pool; owns the discovery watches and the signal loop."""

    def __init__(self, cfg: RuntimeConfig, discover: Discover = watch_backends) -> None:
        self.cfg = cfg
        self.discover = discover
        self.models: dict[str, ModelPool] = {
            t.name: ModelPool(t, cfg.route(t.name), cfg.router) for t in cfg.models
        }
        self.on_departed: Callable[[str, str], None] | None = None
        self.feed_ok = False
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def listed(self) -> bool:
        """Every model's replicas have been reported once (the picker is ready)."""
        return all(pool.listed for pool in self.models.values())

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession()
        self._tasks = [loop.create_task(self._watch(pool)) for pool in self.models.values()]
        self._tasks.append(loop.create_task(self._signals_loop()))
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

    # --- load and health signals -----------------------------------------------------------------
    async def _signals_loop(self) -> None:
        while True:
            try:
                self.feed_ok = await self._read_feed() if self.cfg.router.health_feed_url else False
                if not self.feed_ok:
                    await self._probe_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # the signal loop must outlive any one bad answer
                log.exception("signal refresh failed")
            await asyncio.sleep(self.cfg.router.probe_interval_ms / 1000)

    async def _read_feed(self) -> bool:
        """Apply the health monitor's feed; False if it is unreachable, stale or not a feed."""
        assert self._session is not None
        timeout_s = self.cfg.router.probe_interval_ms / 1000
        feed = await fetch_feed(self._session, str(self.cfg.router.health_feed_url), timeout_s)
        if feed is None:
            return False
        for entry in feed.replicas:
            pool = self.models.get(entry.model)
            replica = pool.by_url.get(entry.url) if pool is not None else None
            if replica is not None:
                apply_signals(entry, replica)
        return True

    async def _probe_all(self) -> None:
        jobs = [self._probe(pool, r) for pool in self.models.values() for r in pool.replicas]
        if jobs:
            await asyncio.gather(*jobs)

    async def _probe(self, pool: ModelPool, replica: Replica) -> None:
        timeout_s = look_timeout_s(self.cfg.router.probe_interval_ms)
        assert self._session is not None
        answered, signals = await probe(self._session, replica.url, pool.target.engine, timeout_s)
        pool.probed(replica, answered, signals)
