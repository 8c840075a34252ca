"""Fixtures for the batcher's tests: a fake pooling engine and the batcher in front of it, on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio

from runtime.batcher.app import Batcher, make_server
from runtime.config import RuntimeConfig
from runtime.discovery import watch_replicas
from runtime.server import Server
from tests.runtime.health.conftest import fakes, wait_for


def batcher_config(urls: list[str], **policy: Any) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "models": [{"name": "emb", "task": "embed", "static_backends": [{"url": u} for u in urls]}],
            "batcher": {"policies": [{"model": "emb", **policy}], "max_body_bytes": 64 * 1024},
        }
    )


class Running:
    def __init__(self, batcher: Batcher, server: Server, url: str) -> None:
        self.batcher = batcher
        self.server = server
        self.url = url

    async def close(self) -> None:
        await self.server.stop_accepting()
        self.server.close_all()
        await self.batcher.stop()


async def start_batcher(config: RuntimeConfig, watch: Any = watch_replicas) -> Running:
    """The batcher on the lean server, on an ephemeral loopback port (not waiting for readiness)."""
    batcher = Batcher(config, watch=watch)
    server = make_server(batcher)
    await batcher.start()
    port = await server.start("127.0.0.1", 0)
    return Running(batcher, server, f"http://127.0.0.1:{port}")


#: Fake engines on loopback (FakeEngine pools too): the health tests' factory, under the batcher tests' name.
fake_engine = fakes


@pytest_asyncio.fixture(loop_scope="function")
async def batcher_at() -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    made: list[Running] = []

    async def make(config: RuntimeConfig) -> Running:
        running = await start_batcher(config)
        made.append(running)
        await wait_for(lambda: running.batcher.ready)
        return running

    yield make
    for r in made:
        await r.close()
