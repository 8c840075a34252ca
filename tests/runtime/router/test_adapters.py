"""The router's adapter bookkeeping against a small in-process engine API (aiohttp) that answers the load
and unload endpoints as vLLM 0.32 does (bench/lora/README.md): one load per (replica, adapter), LRU
unloading past the limit, refusals backed off, failures of the replica retried elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest_asyncio
from aiohttp import web

from runtime.engines import VLLM_LORA
from runtime.router.adapters import ReplicaAdapters, ensure_loaded, listed_adapters


class FakeEngine:
    """Load/unload endpoints with vLLM's answers; ``delay_s`` makes loads slow enough to overlap."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.loaded: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.fail_with: int | None = None

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        self.calls.append(("load", name))
        await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            return web.json_response({"error": {"message": "boom"}}, status=self.fail_with)
        if path.endswith("missing"):
            return web.json_response(
                {"error": {"message": f"Loading lora {name} failed: No adapter found for {path}"}}, status=404
            )
        if name in self.loaded:
            return web.json_response(
                {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}, status=400
            )
        self.loaded.add(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        self.calls.append(("unload", name))
        if name not in self.loaded:
            return web.json_response({"error": {"message": "cannot be found"}}, status=404)
        self.loaded.discard(name)
        return web.Response(text="ok")


@pytest_asyncio.fixture(loop_scope="function")
async def engine() -> AsyncIterator[tuple[FakeEngine, str, aiohttp.ClientSession]]:
    fake = FakeEngine()
    app = web.Application()
    app.router.add_post(VLLM_LORA.load_path, fake.load)
    app.router.add_post(VLLM_LORA.unload_path, fake.unload)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as session:
        yield fake, f"http://127.0.0.1:{port}", session
    await runner.cleanup()


async def _ensure(engine, held: ReplicaAdapters, name: str, *, limit: int = 4, path: str = "/adapters/x"):
    _fake, url, session = engine
    return await ensure_loaded(session, url, held, VLLM_LORA, name, path, limit=limit, backoff_s=30.0)


async def test_concurrent_requests_share_one_load(engine) -> None:
    fake = engine[0]
    held = ReplicaAdapters()
    results = await asyncio.gather(*(_ensure(engine, held, "a") for _ in range(8)))
    assert results == [None] * 8
    assert fake.calls == [("load", "a")]
    assert await _ensure(engine, held, "a") is None  # held now: no call at all
    assert fake.calls == [("load", "a")]


async def test_least_recently_used_is_unloaded_past_the_limit(engine) -> None:
    fake = engine[0]
    held = ReplicaAdapters()
    for name in ("a", "b"):
        assert await _ensure(engine, held, name, limit=2) is None
    assert await _ensure(engine, held, "a", limit=2) is None  # a used again: b is now the oldest
    assert await _ensure(engine, held, "c", limit=2) is None
    assert ("unload", "b") in fake.calls
    assert list(held.loaded) == ["a", "c"]
    assert fake.loaded == {"a", "c"}


async def test_a_refused_adapter_is_backed_off_not_reloaded_per_request(engine) -> None:
    fake = engine[0]
    held = ReplicaAdapters()
    first = await _ensure(engine, held, "m", path="/adapters/missing")
    assert first is not None and not first.retryable and first.status == 424
    assert "m" in first.message and "No adapter found" in first.message
    again = await _ensure(engine, held, "m", path="/adapters/missing")
    assert again == first
    assert fake.calls == [("load", "m")]


async def test_a_failing_replica_is_retryable_and_not_backed_off(engine) -> None:
    fake = engine[0]
    fake.fail_with = 500
    held = ReplicaAdapters()
    failure = await _ensure(engine, held, "a")
    assert failure is not None and failure.retryable
    fake.fail_with = None
    assert await _ensure(engine, held, "a") is None
    assert fake.calls == [("load", "a"), ("load", "a")]


async def test_already_loaded_counts_as_loaded(engine) -> None:
    fake = engine[0]
    fake.loaded.add("a")  # the engine has it; our view does not (a stale feed)
    assert await _ensure(engine, ReplicaAdapters(), "a") is None


def test_the_engine_list_is_followed_except_for_newer_loads() -> None:
    held = ReplicaAdapters()
    held.loaded["old"] = 100.0
    held.loaded["new"] = 300.0
    held.sync(["other"], observed_at=200.0)  # a restart dropped "old"; "new" was loaded after the list
    assert set(held.loaded) == {"new", "other"}


def test_listed_adapters_reads_vllm_models() -> None:
    body = {
        "data": [
            {"id": "tiny", "parent": None},
            {"id": "a1", "parent": "tiny", "root": "/x"},
            {"id": "b1", "parent": "other"},
        ]
    }
    assert listed_adapters(body, "tiny") == ["a1"]
    assert listed_adapters({"oops": 1}, "tiny") == []


def test_the_health_feed_tells_the_router_which_adapters_each_replica_holds() -> None:
    from runtime.config import RuntimeConfig
    from runtime.fleet_feed import read_feed
    from runtime.router.model_state import ModelState
    from runtime.router.signals import feed_adapters

    cfg = RuntimeConfig.model_validate(
        {
            "models": [
                {
                    "name": "tiny",
                    "static_backends": [{"url": "http://10.0.0.1:8000"}],
                    "adapters": [{"name": "sql", "path": "/a/sql"}],
                }
            ]
        }
    )
    state = ModelState(cfg.models[0], cfg.route("tiny"), cfg.router)
    state.set_replicas(["http://10.0.0.1:8000"])
    b = state.replicas[0]
    entry = {"model": "tiny", "url": b.url, "routable": True, "metrics": {}, "adapters": ["sql"]}
    feed = read_feed({"generated_at": 1000.0, "backends": [entry]}, now_unix_s=1000.5)
    assert feed is not None
    feed_adapters({"tiny": state}, feed)
    assert b.adapters.holds("sql")
    entry["adapters"] = []  # restarted
    feed = read_feed({"generated_at": 2000.0, "backends": [entry]}, now_unix_s=2000.5)
    assert feed is not None
    feed_adapters({"tiny": state}, feed)
    assert not b.adapters.holds("sql")
