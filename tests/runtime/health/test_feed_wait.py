"""Readmission is event-driven (issue 37): a front end with a replica out waits on the health monitor's feed
(``GET /v1/backends?after=N&wait_ms=W``) and is answered the moment a replica turns routable or not, instead of
finding out at its next poll. The monitor's side (the wait ends at the change, or after W) and the front end's
(it waits while a replica is out, and takes the readmission at once) are tested apart, on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp
from aiohttp import web

from runtime.config import RuntimeConfig
from runtime.discovery import watch_replicas
from runtime.fleet_feed import read_feed
from runtime.health.app import make_app
from runtime.health.monitor import Monitor
from runtime.router.fleet import Fleet
from tests.runtime.health.conftest import config_for, wait_for
from tests.runtime.health.test_app_and_kube import start


async def test_a_feed_request_waiting_for_a_change_is_answered_when_a_replica_is_readmitted(fakes) -> None:
    engine = await fakes()
    cfg = config_for([engine.url], eject_after_failures=1, readmit_after_successes=1)
    monitor = Monitor(cfg, watch=watch_replicas, run_loops=False)
    runner, base = await start(make_app(monitor))
    try:
        await wait_for(lambda: monitor.ready)
        await monitor.probe_all()
        engine.engine.health_status = 503
        await monitor.probe_all()  # ejected: a change since start (its first admission was one too)
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/v1/backends") as r:
                seen = (await r.json())["routing_changes"]
            assert seen == 2
            # nothing changes: the wait ends after wait_ms, with the same count
            started = time.monotonic()
            async with s.get(base + "/v1/backends", params={"after": str(seen), "wait_ms": "200"}) as r:
                assert (await r.json())["routing_changes"] == seen
            assert 0.15 < time.monotonic() - started < 5
            # the replica comes back while a front end waits: it is answered then, long before its wait ends
            waiting = asyncio.ensure_future(
                s.get(base + "/v1/backends", params={"after": str(seen), "wait_ms": "20000"})
            )
            await asyncio.sleep(0.1)
            assert not waiting.done()
            engine.engine.health_status = 200
            await monitor.probe_all()
            async with await asyncio.wait_for(waiting, 5) as r:
                feed = await r.json()
        assert feed["routing_changes"] == seen + 1 and feed["backends"][0]["routable"] is True
        parsed = read_feed(feed, time.time())
        assert parsed is not None and parsed.routing_changes == seen + 1
    finally:
        await runner.cleanup()


class FeedServer:
    """A health monitor's feed that answers a wait when the test says the replica is back."""

    def __init__(self, engine_url: str, other_url: str) -> None:
        self.engine_url, self.other_url = engine_url, other_url
        self.routable = False
        self.changes = 1
        self.queries: list[dict[str, str]] = []
        self.changed = asyncio.Event()

    def back(self) -> None:
        self.routable = True
        self.changes += 1
        self.changed.set()

    async def feed(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        after, wait_ms = request.query.get("after"), request.query.get("wait_ms")
        if after is not None and wait_ms is not None and int(after) == self.changes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), int(wait_ms) / 1000)
        body: dict[str, Any] = {
            "generated_at": time.time(),
            "stale_after_s": 60,
            "routing_changes": self.changes,
            "backends": [  # one of two out: not a panic (which would route to both)
                {"model": "m", "url": self.engine_url, "routable": self.routable, "metrics": {}},
                {"model": "m", "url": self.other_url, "routable": True, "metrics": {}},
            ],
        }
        return web.json_response(body)


async def test_the_router_waits_on_the_feed_while_a_replica_is_out_and_routes_to_it_at_once() -> None:
    engine_url, other_url = "http://127.0.0.1:9", "http://127.0.0.1:7"  # never contacted: the feed speaks
    feed = FeedServer(engine_url, other_url)
    app = web.Application()
    app.router.add_get("/v1/backends", feed.feed)
    runner, base = await start(app)
    cfg = RuntimeConfig.model_validate(
        {
            "models": [{"name": "m", "static_backends": [{"url": engine_url}, {"url": other_url}]}],
            # polls 2 s apart while a replica is out: only the wait brings the readmission in within a second
            "router": {
                "health_feed_url": f"{base}/v1/backends",
                "probe_interval_ms": 60_000,
                "recovery_poll_ms": 2_000,
            },
        }
    )
    fleet = Fleet(cfg)
    await fleet.start()
    try:
        await wait_for(lambda: bool(fleet.models["m"].replicas) and fleet.signals.rounds >= 1)
        replica = fleet.models["m"].by_url[engine_url]
        assert not replica.healthy  # out, as the feed says
        await wait_for(lambda: any("after" in q for q in feed.queries))  # the next round is a wait
        assert feed.queries[-1] == {"after": "1", "wait_ms": "60000"}
        back_at = time.monotonic()
        feed.back()
        await wait_for(lambda: replica.healthy, limit_s=5)
        assert time.monotonic() - back_at < 1.0
    finally:
        await fleet.stop()
        await runner.cleanup()
