"""Fixtures: a background event loop, engine doubles and routers on loopback, cleaned up per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread()
    yield loop_thread
    loop_thread.stop()


@pytest.fixture
def doubles(lt: LoopThread) -> Iterator[Callable[..., list[Double]]]:
    started: list[Double] = []

    def make(n: int = 2, **kw: Any) -> list[Double]:
        out = []
        for i in range(n):
            d = Double(name=f"d{i}", **kw)
            lt.run(d.start())
            started.append(d)
            out.append(d)
        return out

    yield make
    for d in started:
        lt.run(d.stop())


@pytest.fixture
def make_router(lt: LoopThread) -> Iterator[Callable[..., RouterUnderTest]]:
    started: list[RouterUnderTest] = []

    def make(replica_urls: list[str], **router: Any) -> RouterUnderTest:
        r = RouterUnderTest(lt, router_cfg(replica_urls, **router)).start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()
