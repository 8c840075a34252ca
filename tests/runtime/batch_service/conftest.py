"""Fixtures: a loop thread for routers and engine doubles, and batch stacks that are always stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.batch_service.harness import BatchStack
from tests.runtime.router.harness import Double, LoopThread


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread()
    yield loop_thread
    loop_thread.stop()


@pytest.fixture
def make_stack(lt: LoopThread, tmp_path: Path) -> Iterator[Callable[..., BatchStack]]:
    """``make_stack(engines=1, double=dict(...), batches=dict(...), router=dict(...), start=True)``."""
    stacks: list[BatchStack] = []
    doubles: list[Double] = []

    def make(
        engines: int = 1,
        double: dict[str, Any] | None = None,
        batches: dict[str, Any] | None = None,
        router: dict[str, Any] | None = None,
        service_key: str | None = None,
        start: bool = True,
    ) -> BatchStack:
        made = []
        for i in range(engines):
            d = Double(name=f"d{i}", **(double or {}))
            lt.run(d.start())
            made.append(d)
        doubles.extend(made)
        stack = BatchStack(
            lt,
            tmp_path / f"stack{len(stacks)}",
            made,
            batches=batches or {},
            router_extra=router or {},
            service_key=service_key,
        )
        stack.tmp.mkdir(parents=True)
        stacks.append(stack)
        return stack.start() if start else stack.start_router()

    yield make
    for stack in stacks:
        stack.stop()
    for d in doubles:
        lt.run(d.stop())
