"""A model's wait line: requests that found every replica busy (or none ready) wait here, woken one per
freed slot in arrival order, each until its own deadline; beyond ``max_waiting`` nobody waits at all.
``runtime.router.admission`` decides who waits and for how long."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class QueueFullError(Exception):
    """The wait line is at its bound."""


class WaitQueue:
    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self.waiters: deque[asyncio.Future[None]] = (
            deque()
        )  # read directly on the hot path: non-empty = a line

    def __len__(self) -> int:
        return len(self.waiters)

    async def wait(self, timeout_s: float, front: bool = False) -> bool:
        """Wait for a wake-up; False if the deadline passed first. ``front`` re-queues a request
        that was woken but lost the slot, ahead of later arrivals."""
        if len(self.waiters) >= self.max_waiting and not front:
            raise QueueFullError
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if front:
            self.waiters.appendleft(fut)
        else:
            self.waiters.append(fut)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
            return True
        except TimeoutError:
            return fut.done() and not fut.cancelled()  # woken as the deadline hit: still a wake-up
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.wake_one()  # we were handed a slot but are leaving: pass it on
            raise
        finally:
            if not fut.done():
                fut.cancel()
            with contextlib.suppress(ValueError):
                self.waiters.remove(fut)

    def wake_one(self) -> None:
        waiters = self.waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def wake_all(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
