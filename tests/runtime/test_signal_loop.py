"""One signal loop for both front ends (``runtime.signal_loop``): the router's fleet and the endpoint picker's
take the health monitor's feed while it is fresh, look at the engines themselves while it is stale or
unreachable, and take the feed again when it is back, each at its own period; and one read of an engine's
metrics page per replica per round serves both the probe's load signals and the router's sleep-mode
prompt-token counter.

Everything is real HTTP on 127.0.0.1: engines and a health monitor as small aiohttp servers that count the
requests they get. The loops' own periods are a minute, so the rounds a test counts are the ones it runs
(``SignalLoop.refresh``) after the first, which ``start`` runs at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from runtime.config import EngineKind, RuntimeConfig
from runtime.engines import facts
from runtime.picker.fleet import Fleet as PickerFleet
from runtime.router.fleet import Fleet as RouterFleet

SLEEP = facts(EngineKind.VLLM).sleep
PROBE_INTERVAL_MS = 60_000
RECOVERY_POLL_MS = 30_000


@dataclass
class Server:
    """A small aiohttp server on 127.0.0.1 counting the requests it gets, by path."""

    hits: Counter[str] = field(default_factory=Counter)
    runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        @web.middleware
        async def count(request: web.Request, handler: Any) -> web.StreamResponse:
            self.hits[request.path] += 1
            return await handler(request)  # type: ignore[no-any-return]

        app = web.Application(middlewares=[count])
        self.routes(app)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class Engine(Server):
    """A vLLM engine as the signal loop sees it: its health path, metrics page and sleep state."""

    healthy: bool = True
    queued: float = 2.0
    prompt_tokens: float = 100.0

    def routes(self, app: web.Application) -> None:
        assert SLEEP is not None
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get(SLEEP.state_path, self.is_sleeping)

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            text=(
                f"vllm:num_requests_waiting {self.queued}\nvllm:num_requests_running 1\n"
                f"vllm:gpu_cache_usage_perc 0.25\nvllm:prompt_tokens_total {self.prompt_tokens}\n"
            )
        )

    async def is_sleeping(self, _: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": False})


@dataclass
class Monitor(Server):
    """The health monitor's feed: fresh, stale, or not answering, as the test sets it."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "fresh"  # or "stale", "down"

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/backends", self.feed)

    async def feed(self, _: web.Request) -> web.Response:
        if self.mode == "down":
            return web.Response(status=503)
        age_s = 60 if self.mode == "stale" else 0
        return web.json_response(
            {"generated_at": time.time() - age_s, "stale_after_s": 5, "backends": self.entries}
        )


def _cfg(engines: list[Engine], feed: Monitor | None = None, sleep_after_idle_ms: int = 0) -> RuntimeConfig:
    router: dict[str, Any] = {
        "probe_interval_ms": PROBE_INTERVAL_MS,
        "recovery_poll_ms": RECOVERY_POLL_MS,
    }
    if feed is not None:
        router["health_feed_url"] = f"{feed.url}/v1/backends"
    if sleep_after_idle_ms:
        router["routes"] = [{"model": "m", "sleep_after_idle_ms": sleep_after_idle_ms}]
    return RuntimeConfig.model_validate(
        {"models": [{"name": "m", "static_backends": [{"url": e.url} for e in engines]}], "router": router}
    )


FRONT_ENDS: dict[str, Callable[[RuntimeConfig], Any]] = {"router": RouterFleet, "picker": PickerFleet}


@contextlib.asynccontextmanager
async def _running(*servers: Server) -> AsyncIterator[None]:
    for s in servers:
        await s.start()
    try:
        yield
    finally:
        for s in servers:
            await s.stop()


@contextlib.asynccontextmanager
async def _started(fleet: Any) -> AsyncIterator[None]:
    """The fleet started, its first round (run at once by ``start``) over; the next is a minute away."""
    await fleet.start()
    try:
        deadline = time.monotonic() + 20
        while fleet.signals.rounds < 1 or len(fleet.models["m"].replicas) < 1:
            assert time.monotonic() < deadline, "the first round never ended"
            await asyncio.sleep(0.01)
        yield
    finally:
        await fleet.stop()


def _engine_hits(engines: list[Engine]) -> Counter[str]:
    out: Counter[str] = Counter()
    for e in engines:
        out.update(e.hits)
    return out


@pytest.mark.parametrize("front", sorted(FRONT_ENDS))
async def test_both_front_ends_take_the_feed_probe_while_it_is_away_and_take_it_again_when_back(
    front: str,
) -> None:
    a, b = Engine(), Engine(queued=4.0)
    monitor = Monitor()
    async with _running(a, b, monitor):
        monitor.entries = [
            {"url": a.url, "model": "m", "routable": False, "metrics": {"queued": 3.0}},
            {"url": b.url, "model": "m", "routable": True, "metrics": {"queued": 7.0, "kv_usage": 0.5}},
        ]
        fleet = FRONT_ENDS[front](_cfg([a, b], feed=monitor))
        async with _started(fleet):
            replicas = fleet.models["m"].by_url
            # the feed is fresh: it alone decides, and no engine is asked anything
            before = _engine_hits([a, b])
            await fleet.signals.refresh()
            assert fleet.feed_ok
            assert _engine_hits([a, b]) == before
            assert not replicas[a.url].healthy and replicas[b.url].healthy
            assert (replicas[b.url].engine_queued, replicas[b.url].kv_usage) == (7.0, 0.5)
            # each front end waits its own period: the router polls faster while a replica is out
            expected_s = RECOVERY_POLL_MS / 1000 if front == "router" else PROBE_INTERVAL_MS / 1000
            assert fleet.signals.interval_s() == expected_s

            # stale, then unreachable: each round looks at every engine once, and the engines' pages decide
            for mode in ("stale", "down"):
                monitor.mode = mode
                before = _engine_hits([a, b])
                await fleet.signals.refresh()
                asked = _engine_hits([a, b]) - before
                assert not fleet.feed_ok, mode
                assert (asked["/health"], asked["/metrics"]) == (2, 2), (mode, asked)
                assert replicas[a.url].healthy and replicas[a.url].engine_queued == 2.0
                assert replicas[b.url].engine_queued == 4.0 and replicas[b.url].kv_usage == 0.25

            # back: the feed decides again and the engines are left alone
            monitor.mode = "fresh"
            before = _engine_hits([a, b])
            await fleet.signals.refresh()
            assert fleet.feed_ok
            assert _engine_hits([a, b]) == before
            assert not replicas[a.url].healthy and replicas[b.url].engine_queued == 7.0
            assert fleet.signals.interval_s() == expected_s


@pytest.mark.parametrize("feed", ["away", "in"])
async def test_one_metrics_read_per_replica_per_round_serves_the_probe_and_the_sleep_counter(
    feed: str,
) -> None:
    """The router's sleep sweep reads the prompt-token counter from the page the round's probe read; with
    the feed in (no probe) it reads the page itself, once. An engine whose health check fails has its page
    read once too (by the sweep: the probe does not read it)."""
    engines = [Engine(queued=1.0), Engine(queued=5.0), Engine(healthy=False)]
    monitor = Monitor(mode="fresh" if feed == "in" else "down")
    async with _running(*engines, monitor):
        monitor.entries = [
            {"url": e.url, "model": "m", "routable": True, "metrics": {"queued": 9.0}} for e in engines
        ]
        fleet = RouterFleet(_cfg(engines, feed=monitor, sleep_after_idle_ms=3_600_000))
        async with _started(fleet):
            replicas = fleet.models["m"].by_url
            for round_ in range(1, 4):
                for i, e in enumerate(engines):  # each engine takes prompts between rounds
                    e.prompt_tokens = 1000.0 * round_ + i
                before = _engine_hits(engines)
                used_before = {e.url: replicas[e.url].last_used for e in engines}
                await fleet.signals.refresh()
                asked = _engine_hits(engines) - before
                assert fleet.feed_ok is (feed == "in")
                assert asked["/metrics"] == len(engines), asked  # one read per replica per round
                assert asked[SLEEP.state_path] == len(engines)  # type: ignore[union-attr]
                assert asked["/health"] == (len(engines) if feed == "away" else 0)
                for i, e in enumerate(engines):
                    r = replicas[e.url]
                    # the sleep mode's counter came from that one read ...
                    assert r.prompt_tokens == 1000.0 * round_ + i
                    assert r.last_used > used_before[e.url]  # ... and it moved: the engine is not idle
                # ... and so did the probe's load signals when the feed was away (else the feed's)
                want = [1.0, 5.0] if feed == "away" else [9.0, 9.0]
                assert [replicas[e.url].engine_queued for e in engines[:2]] == want
