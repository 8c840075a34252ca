"""The picker reads the fleet the router's way: the health monitor's feed while it is fresh (ejected
replicas out, engine queues in), the engines' own health and metrics when it is stale or gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from runtime.config import RuntimeConfig
from runtime.fleet_feed import read_feed
from runtime.picker.fleet import Fleet
from tests.runtime.router.harness import Double, LoopThread


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


class Monitor:
    """A stand-in health monitor serving whatever feed the test sets."""

    def __init__(self) -> None:
        self.feed: dict[str, Any] = {}
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        async def fleet_feed(_: web.Request) -> web.Response:
            return web.json_response(self.feed)

        app = web.Application()
        app.router.add_get("/v1/backends", fleet_feed)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def _feed(entries: list[dict[str, Any]], age_s: float = 0.0) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "generated_at": time.time() - age_s,
        "interval_ms": 500,
        "stale_after_s": 5,
        "backends": entries,
    }


async def _settled(fleet: Fleet, check: Any, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the fleet never reached the expected state")
        await asyncio.sleep(0.02)


def test_the_feed_ejects_and_loads_replicas_and_a_stale_feed_falls_back_to_probing(lt: LoopThread) -> None:
    doubles = [Double("a"), Double("b", healthy=False)]
    for d in doubles:
        lt.run(d.start())
    monitor = Monitor()
    lt.run(monitor.start())
    a, b = (d.url for d in doubles)
    monitor.feed = _feed(
        [
            {"url": a, "model": "m", "routable": False, "metrics": {"queued": 3.0}, "metrics_stale": False},
            {
                "url": b,
                "model": "m",
                "routable": True,
                "metrics": {"queued": 7.0, "kv_usage": 0.5},
                "metrics_stale": False,
            },
        ]
    )
    cfg = RuntimeConfig.model_validate(
        {
            "models": [{"name": "m", "static_backends": [{"url": a}, {"url": b}]}],
            "router": {
                # the feed read's budget too: a read a loaded machine answers late falls back to probing
                "probe_interval_ms": 1000,
                "health_feed_url": f"http://127.0.0.1:{monitor.port}/v1/backends",
            },
        }
    )
    fleet = Fleet(cfg)

    async def run() -> None:
        await fleet.start()
        try:

            def by_url() -> dict[str, Any]:
                return fleet.models["m"].by_url

            def from_feed() -> bool:  # b's own /health fails: only the feed says it is fine and loaded
                b_state = by_url()[b]
                return b_state.healthy and b_state.engine_queued == 7.0 and b_state.kv_usage == 0.5

            await _settled(
                fleet,
                lambda: fleet.feed_ok and len(by_url()) == 2 and not by_url()[a].healthy and from_feed(),
            )
            monitor.feed = _feed(monitor.feed["backends"], age_s=60)  # stale: the engines say b is down
            await _settled(
                fleet, lambda: not fleet.feed_ok and by_url()[a].healthy and not by_url()[b].healthy
            )
        finally:
            await fleet.stop()

    try:
        lt.run(run())
    finally:
        lt.run(monitor.stop())
        for d in doubles:
            lt.run(d.stop())


def test_read_feed_keeps_unknown_load_unknown() -> None:
    now = time.time()
    feed = read_feed(
        _feed(
            [
                {
                    "url": "http://x:1/",
                    "model": "m",
                    "state": "ejected",
                    "metrics": {"queued": 4},
                    "metrics_stale": True,
                }
            ]
        ),
        now,
    )
    assert feed is not None
    (entry,) = feed.replicas
    assert (entry.url, entry.routable, entry.queued) == ("http://x:1", False, None)
    assert read_feed(_feed([], age_s=30), now) is None
    assert read_feed({"backends": "nonsense", "generated_at": now}, now) is None
