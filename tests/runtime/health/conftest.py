"""Fixtures for the health monitor's tests: fake engines on loopback and a monitor over them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio

from runtime.config import RuntimeConfig
from runtime.discovery import watch_replicas
from runtime.health.monitor import Monitor
from tests.runtime.health.doubles import FakeEngine, Served, serve


def config_for(
    urls: list[str], *, model: str = "tiny", task: str = "generate", **health: Any
) -> RuntimeConfig:
    settings = {
        "interval_ms": 100,
        "timeout_ms": 3000,  # a loaded machine's stall must not turn HEALTHY into TIMEOUT
        "eject_after_failures": 3,
        "readmit_after_successes": 2,
    }
    settings.update(health)
    return RuntimeConfig.model_validate(
        {
            "models": [{"name": model, "task": task, "static_backends": [{"url": u} for u in urls]}],
            "health": settings,
        }
    )


async def wait_for(predicate: Callable[[], bool], *, limit_s: float = 20.0) -> None:
    """Poll a condition with a generous bound (a hang guard, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture(loop_scope="function")
async def fakes() -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    started: list[Served] = []

    async def make(**kwargs: Any) -> Served:
        s = await serve(FakeEngine(**kwargs))
        started.append(s)
        return s

    yield make
    for s in started:
        await s.close()


@pytest_asyncio.fixture(loop_scope="function")
async def monitors() -> AsyncIterator[Callable[..., Awaitable[Monitor]]]:
    """Monitors in manual mode (tests call probe_all()) with discovery already settled."""
    made: list[Monitor] = []

    async def make(config: RuntimeConfig, **kwargs: Any) -> Monitor:
        kwargs.setdefault("run_loops", False)
        m = Monitor(config, watch=watch_replicas, **kwargs)
        made.append(m)
        await m.start()
        await wait_for(lambda: m.ready)
        return m

    yield make
    for m in made:
        await m.stop()
