"""The wait line: FIFO wake-ups, bounded size, deadlines, and no lost wake-up when a waiter leaves."""

from __future__ import annotations

import asyncio

import pytest

from runtime.router.waitline import QueueFullError, WaitQueue


async def test_fifo_bound_deadline_and_handoff() -> None:
    q = WaitQueue(max_waiting=2)
    order: list[str] = []

    async def waiter(name: str, timeout: float = 5.0) -> bool:
        ok = await q.wait(timeout)
        order.append(name)
        return ok

    a = asyncio.create_task(waiter("a"))
    b = asyncio.create_task(waiter("b"))
    await asyncio.sleep(0)
    assert len(q) == 2
    with pytest.raises(QueueFullError):
        await q.wait(1.0)
    q.wake_one()
    await asyncio.sleep(0)
    q.wake_one()
    assert await a and await b
    assert order == ["a", "b"]
    assert await q.wait(0.01) is False  # nobody wakes us: the deadline answers

    # a waiter handed a slot that is cancelled passes the slot to the next one
    c = asyncio.create_task(q.wait(5.0))
    d = asyncio.create_task(q.wait(5.0))
    await asyncio.sleep(0)
    q.wake_one()  # c is chosen ...
    c.cancel()  # ... but its client left before it could use the slot
    await asyncio.gather(c, return_exceptions=True)
    assert await asyncio.wait_for(d, 1.0) is True

    # front=True re-queues ahead of later arrivals
    e = asyncio.create_task(q.wait(5.0))
    await asyncio.sleep(0)
    f = asyncio.create_task(q.wait(5.0, front=True))
    await asyncio.sleep(0)
    q.wake_one()
    assert await asyncio.wait_for(f, 1.0) is True
    assert not e.done()
    q.wake_all()
    assert await e
