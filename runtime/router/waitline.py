"""A model's wait line: requests that found every replica busy (or none ready) wait here, each until its own
deadline; beyond ``max_waiting`` nobody waits at all. A freed slot wakes one waiter, the next in the order of
``runtime.scheduling.fair_queue``: a higher band first, then the waiting tenant served the fewest weighted
tokens, then arrival (or arrival alone, ``fifo``). ``runtime.router.admission`` decides who waits and for how
long."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from runtime.scheduling.fair_queue import ANYONE, Entry, FairQueue, Place, Share


class QueueFullError(Exception):
    """The wait line is at its bound."""


@dataclass(slots=True)
class Spot:
    """One request's place across its waits (woken but beaten to the slot, it goes back where it stood), and the
    counters its admission was charged to (settled there when it ends: a retry may move it to another model's
    line)."""

    place: Place = ANYONE
    entry: Entry[asyncio.Future[None]] | None = None
    charged: Share | None = None

    def admitted(self, queue: WaitQueue) -> bool:
        """Charge the request's expected cost to its tenant, once; True the first time (it is admitted)."""
        if self.charged is not None:
            return False
        self.charged = queue.waiters.share
        self.charged.charge(self.place, self.place.cost)
        return True

    def settle(self, used: int | None) -> None:
        """The request ended: its tenant's counter takes the real usage (``used``; None: unknown, the charge
        stands)."""
        if self.charged is not None and used is not None:
            self.charged.charge(self.place, used - self.place.cost)


class WaitQueue:
    def __init__(self, max_waiting: int, fifo: bool = False) -> None:
        self.max_waiting = max_waiting
        #: read directly on the hot path: non-empty = a line
        self.waiters: FairQueue[asyncio.Future[None]] = FairQueue(fifo)

    def __len__(self) -> int:
        return len(self.waiters)

    async def wait(
        self, timeout_s: float, front: bool = False, spot: Spot | None = None, wake_first: bool = False
    ) -> bool:
        """Wait for a wake-up; False if the deadline passed first. ``front`` re-queues a request that was
        woken but lost the slot, at its place before (``spot``) or else ahead of later arrivals.
        ``wake_first``: a slot is free already; it goes to whoever is next, this request included."""
        if len(self.waiters) >= self.max_waiting and not front:
            raise QueueFullError
        spot = spot if spot is not None else Spot()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        again = spot.entry if front else None
        entry = self.waiters.push(fut, spot.place, again, front=front)
        spot.entry = entry
        if wake_first:
            self.wake_one()
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
            self.waiters.remove(entry)

    def wake_one(self) -> None:
        waiters = self.waiters
        while waiters:
            entry = waiters.pop()
            if entry is not None and not entry.item.done():
                entry.item.set_result(None)
                return

    def wake_all(self) -> None:
        """Every waiter re-decides, in line order (the event loop runs them in the order they were woken)."""
        while self.waiters:
            entry = self.waiters.pop()
            if entry is not None and not entry.item.done():
                entry.item.set_result(None)
