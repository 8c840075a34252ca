"""A bounded wait line per model for when every replica is at its concurrency cap.

Waiters are woken one per freed slot, in arrival order; each waits at most until its deadline, then
the app answers ``429`` with ``Retry-After``. Beyond ``max_waiting`` nobody waits at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class QueueFullError(Exception):
    """The wait line is at its bound."""


class WaitQueue:
    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout_s: float, front: bool = False) -> bool:
        """Wait for a wake-up; False if the deadline passed first. ``front`` re-queues a request
        that was woken but lost the slot, ahead of later arrivals."""
        if len(self._waiters) >= self.max_waiting and not front:
            raise QueueFullError
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if front:
            self._waiters.appendleft(fut)
        else:
            self._waiters.append(fut)
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
                self._waiters.remove(fut)

    def wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def wake_all(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
