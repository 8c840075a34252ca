"""Fixtures for the batcher's tests: a fake pooling engine and the batcher in front of it, on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio
from aiohttp import web

from runtime.batcher.app import Batcher, make_app
from runtime.config import RuntimeConfig
from runtime.discovery import watch_backends
from tests.runtime.health.conftest import wait_for
from tests.runtime.health.doubles import FakeEngine, Served, serve


def batcher_config(urls: list[str], **policy: Any) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "models": [{"name": "emb", "task": "embed", "static_backends": [{"url": u} for u in urls]}],
            "batcher": {"policies": [{"model": "emb", **policy}], "max_body_bytes": 64 * 1024},
        }
    )


class Running:
    def __init__(self, batcher: Batcher, runner: web.AppRunner, url: str) -> None:
        self.batcher = batcher
        self.runner = runner
        self.url = url


@pytest_asyncio.fixture(loop_scope="function")
async def fake_engine() -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    made: list[Served] = []

    async def make(**kwargs: Any) -> Served:
        s = await serve(FakeEngine(**kwargs))
        made.append(s)
        return s

    yield make
    for s in made:
        await s.close()


@pytest_asyncio.fixture(loop_scope="function")
async def batcher_at() -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    made: list[Running] = []

    async def make(config: RuntimeConfig) -> Running:
        batcher = Batcher(config, watch=watch_backends)
        runner = web.AppRunner(make_app(batcher), access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        running = Running(batcher, runner, f"http://127.0.0.1:{port}")
        made.append(running)
        await wait_for(lambda: batcher.ready)
        return running

    yield make
    for r in made:
        await r.runner.cleanup()
