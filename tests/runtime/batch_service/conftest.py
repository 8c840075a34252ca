"""Fixtures: a loop thread for routers and engine doubles, and batch stacks that are always stopped."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def _stacks(lt: LoopThread, root: Path) -> Iterator[Callable[..., BatchStack]]:
    """``make(engines=1, double=dict(...), batches=dict(...), router=dict(...), service_key=None,
    preload="", from_file=False, start=True)``; every stack made and its doubles stop at the end."""
    stacks: list[BatchStack] = []
    doubles: list[Double] = []

    def make(
        engines: int = 1,
        double: dict[str, Any] | None = None,
        batches: dict[str, Any] | None = None,
        router: dict[str, Any] | None = None,
        service_key: str | None = None,
        preload: str = "",
        from_file: bool = False,
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
            root / f"stack{len(stacks)}",
            made,
            batches=batches or {},
            router_extra=router or {},
            service_key=service_key,
            preload=preload,
            from_file=from_file,
        )
        stack.tmp.mkdir(parents=True)
        stacks.append(stack)
        return stack.start() if start else stack.start_router()

    try:
        yield make
    finally:
        for stack in stacks:
            stack.stop()
        for d in doubles:
            lt.run(d.stop())


@pytest.fixture
def make_stack(lt: LoopThread, tmp_path: Path) -> Iterator[Callable[..., BatchStack]]:
    """Stacks for one test (see ``_stacks``)."""
    with _stacks(lt, tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def make_module_stack(
    lt: LoopThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., BatchStack]]:
    """Stacks the tests of one module share (see ``_stacks``): each started once."""
    with _stacks(lt, tmp_path_factory.mktemp("stacks")) as make:
        yield make
