"""Replicas come and go (discovery), and load/health signals arrive from our probe or the health feed."""

from __future__ import annotations

import asyncio
import threading
import time

from aiohttp import web

from runtime.config import RuntimeConfig
from runtime.router.__main__ import make_metrics_server
from runtime.router.app import Router
from runtime.router.fleet import Fleet
from runtime.router.metrics import DEPARTED_KEEP_S
from runtime.server import Server
from tests.runtime.router.harness import RouterUnderTest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _wait(cond, timeout_s: float = 10.0) -> bool:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return True
        threading.Event().wait(0.05)
    return False


def test_discovered_replicas_are_followed_without_restart(doubles, lt) -> None:
    a, b = doubles(2)
    updates: asyncio.Queue[list[str]] = asyncio.Queue()

    async def discover(target):
        while True:
            yield await updates.get()

    cfg = RuntimeConfig.model_validate(
        {
            "models": [{"name": "m", "discovery": {"namespace": "ml", "service": "m"}}],
            "router": {"host": "127.0.0.1", "port": 8080, "probe_interval_ms": 60000},
        }
    )
    rut = RouterUnderTest.__new__(RouterUnderTest)

    async def start() -> None:
        rut.router = Router(cfg, Fleet(cfg, discover=discover))
        rut.server = Server(rut.router.handle, cfg.router.max_body_bytes)
        await rut.router.fleet.start()
        rut.port = await rut.server.start("127.0.0.1", 0)
        rut.ops = make_metrics_server(rut.router)
        rut.metrics_port = await rut.ops.start("127.0.0.1", 0)

    lt.run(start())
    rut.lt = lt
    try:
        assert rut.request("POST", "/v1/chat/completions", CHAT)[0] == 503  # no replicas yet
        assert rut.request("GET", "/readyz")[0] == 503
        # a model scaled to zero is woken by this counter (KEDA activation): it must carry the model
        metrics = rut.metrics()
        assert 'inferstack_router_rejections_total{model="m",reason="no_backend"} 1.0' in metrics
        lt.loop.call_soon_threadsafe(updates.put_nowait, [a.url])
        assert _wait(lambda: rut.request("POST", "/v1/chat/completions", CHAT)[0] == 200)
        lt.loop.call_soon_threadsafe(updates.put_nowait, [b.url])  # a leaves, b arrives
        assert _wait(
            lambda: rut.call(lambda: [x.url for x in rut.router.fleet.models["m"].replicas]) == [b.url]
        )
        before = len(a.requests)
        for _ in range(5):
            assert rut.request("POST", "/v1/chat/completions", CHAT)[0] == 200
        assert len(a.requests) == before and len(b.requests) == 5
        metrics = rut.metrics()
        # departed: its counters stay for the alerts' rate windows (its last errors still count) ...
        assert f'backend="{b.url}"' in metrics and f'backend="{a.url}"' in metrics
        rut.call(lambda: rut.router.metrics.sweep(time.monotonic() + DEPARTED_KEEP_S))
        metrics = rut.metrics()
        assert f'backend="{b.url}"' in metrics and f'backend="{a.url}"' not in metrics  # ... then go
    finally:
        rut.stop()


def test_own_probe_takes_an_unhealthy_replica_out_and_back(doubles, make_router) -> None:
    sick, well = doubles(2)
    r = make_router([sick.url, well.url], default_strategy={"name": "round_robin"}, probe_interval_ms=100)
    sick.healthy = False
    assert _wait(lambda: not r.call(lambda: r.router.fleet.models["m"].by_url[sick.url].healthy))
    before = len(sick.requests)
    for _ in range(6):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert len(sick.requests) == before
    sick.healthy = True
    assert _wait(lambda: r.call(lambda: r.router.fleet.models["m"].by_url[sick.url].healthy))


def test_probe_reads_engine_queue_for_load_scoring(doubles, make_router) -> None:
    busy, idle = doubles(2)
    busy.metrics_text = 'vllm:num_requests_waiting{engine="0"} 40\nvllm:kv_cache_usage_perc 0.9\n'
    r = make_router([busy.url, idle.url], default_strategy={"name": "kv_aware"}, probe_interval_ms=100)
    assert _wait(lambda: r.call(lambda: r.router.fleet.models["m"].by_url[busy.url].engine_queued) == 40)
    for _ in range(5):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert not busy.requests and len(idle.requests) == 5


def test_health_feed_drives_routability(doubles, make_router, lt) -> None:
    a, b = doubles(2)
    state = {"routable_a": False}

    async def feed(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "schema_version": 1,
                "generated_at": time.time(),
                "stale_after_s": 15,
                "backends": [
                    {"url": a.url, "model": "m", "routable": state["routable_a"], "metrics": {}},
                    {"url": b.url, "model": "m", "routable": True, "metrics": {"queued": 0}},
                ],
            }
        )

    app = web.Application()
    app.router.add_get("/v1/backends", feed)
    runner = web.AppRunner(app)

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    port = lt.run(start())
    try:
        # the feed read's budget is probe_interval_ms: a short one on a loaded machine falls back to direct
        # probes, which find a's /health fine and route to it. While a is out the feed is read every
        # recovery_poll_ms (250) anyway.
        r = make_router(
            [a.url, b.url],
            default_strategy={"name": "round_robin"},
            probe_interval_ms=5000,
            health_feed_url=f"http://127.0.0.1:{port}/v1/backends",
        )
        assert _wait(lambda: r.call(lambda: r.router.fleet.feed_ok))
        assert _wait(lambda: not r.call(lambda: r.router.fleet.models["m"].by_url[a.url].healthy))
        for _ in range(4):
            assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
        assert not a.requests
        state["routable_a"] = True
        assert _wait(lambda: r.call(lambda: r.router.fleet.models["m"].by_url[a.url].healthy))
    finally:
        lt.run(runner.cleanup())


def test_a_replica_rebuilt_with_a_new_cap_closes_the_old_connection_pool() -> None:
    cfg = RuntimeConfig.model_validate(
        {
            "models": [{"name": "m", "static_backends": [{"url": "http://127.0.0.1:9"}]}],
            "router": {"host": "127.0.0.1", "port": 8080},
        }
    )
    state = Fleet(cfg).models["m"]
    state.set_replicas(["http://127.0.0.1:9"])
    [old] = state.replicas
    old.cap += 1  # as if the model's max_concurrency_per_backend changed under a config reload
    state.set_replicas([old.url])
    [new] = state.replicas
    assert new is not old and new.cap == cfg.models[0].max_concurrency_per_backend
    assert old.pool.closed and not new.pool.closed
