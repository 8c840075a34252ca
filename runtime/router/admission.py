"""Admission: a replica with room for a request, or a bounded wait in line for one, or a refusal.

Waiters are woken one per freed slot, in the line's order (``runtime.router.waitline``: a higher band first,
then fair shares between tenants, then arrival); each waits at most until its deadline, then
the app answers ``503`` with ``Retry-After`` and code ``overloaded`` (the service is full: ``429`` is kept
for a key's own limits). Beyond ``max_waiting`` nobody waits at all, and gets the same answer.

The same line is the activator: while a model has no ready replica at all (scaled to zero, or every
replica starting), a request waits up to the model's ``cold_start_hold_ms`` for one to appear (new
replicas wake the whole line), and only past it gets ``503`` with ``Retry-After``. Meanwhile it counts in
the model's queue depth, the signal that wakes the model. A client that leaves is dropped at once (its
handler is cancelled, which takes it out of the line).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.http import OVERLOADED, OVERLOADED_CODE
from runtime.router.model_state import ModelState
from runtime.router.replicas import Replica
from runtime.router.waitline import QueueFullError, Spot
from runtime.scheduling import Context

log = logging.getLogger("inferstack.router")


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request gets no replica: what the client is told (OpenAI-shaped, with Retry-After)."""

    status: int
    message: str
    reason: str  # the rejections metric's label
    code: str
    retry_after_s: float


async def acquire(
    state: ModelState,
    ctx: Context,
    deadline_s: float,
    on_waited: Callable[[str, float], None],
    spot: Spot | None = None,
) -> Replica | Refusal | None:
    """A replica with room (the strategy's pick), waiting in line while all are busy; ``spot``: the
    request's band and tenant, and its place in line across waits (a fresh one: the default band).

    None when the only usable replicas were already tried by this request: the caller reports the
    last failure instead."""
    if state.batcher is not None and ctx.notes.get("kind") == "embeddings":
        return state.batcher
    spot = spot if spot is not None else Spot()
    waited_from = 0.0
    while True:
        ctx.now = time.monotonic()
        # a newcomer does not overtake requests already in line: it joins it, and a free slot goes to
        # whoever the line puts first (the newcomer too, when its band or its tenant's share says so)
        awake = state.awake()
        jump = not waited_from and bool(state.queue.waiters)
        free = jump and any(r.inflight < r.cap and r.healthy for r in awake)
        replica = None if jump else state.strategy.pick(awake, ctx)
        if replica is not None:
            if waited_from:
                on_waited(state.name, ctx.now - waited_from)
            return replica
        now = ctx.now
        usable = [r for r in awake if r.healthy and r.breaker.allows(now) and r.url not in ctx.exclude]
        if usable:
            limit_s, refusal = deadline_s, _busy(state, deadline_s)
        elif ctx.exclude:
            return None
        elif state.sleepers():  # every replica sleeps: wake one and hold the request meanwhile
            state.request_wake()
            limit_s, refusal = state.route.wake_hold_ms / 1000, _asleep(state)
        else:  # no ready replica at all: hold the request while one starts (the activator), or refuse
            limit_s, refusal = state.route.cold_start_hold_ms / 1000, _no_replica(state)
            if limit_s <= 0:
                return refusal
            if not waited_from and not len(state.queue):
                log.info(
                    "%s has no ready replica: holding its requests up to %.0fs while one starts",
                    state.name,
                    limit_s,
                )
        again = bool(waited_from)
        if not waited_from:
            waited_from = now
        remaining = limit_s - (now - waited_from)
        try:
            # woken but beaten to the slot: back to the front of the line, not the end
            woke = remaining > 0 and await state.queue.wait(remaining, again, spot, wake_first=free)
        except QueueFullError:
            if free:
                state.queue.wake_one()  # the slot is still free: the line's next gets it
            woke = False
        if not woke:
            if not usable:
                log.warning(
                    "%s: no replica became ready within %.0fs; refused a request", state.name, limit_s
                )
            return refusal


def _busy(state: ModelState, deadline_s: float) -> Refusal:
    return Refusal(OVERLOADED, state.busy_message(), "queue", OVERLOADED_CODE, max(1.0, deadline_s / 2))


def _asleep(state: ModelState) -> Refusal:
    return Refusal(
        503,
        f"every replica of {state.name!r} is asleep and none woke within {state.route.wake_hold_ms / 1000:g}s",
        "asleep",
        "no_healthy_backend",
        5.0,
    )


def _no_replica(state: ModelState) -> Refusal:
    held = state.route.cold_start_hold_ms
    why = f" (none became ready within {held / 1000:g}s; it is starting)" if held else ""
    return Refusal(
        503,
        state.no_replica_message(why),
        "no_backend",
        "no_healthy_backend",
        state.settings.breaker_open_ms / 1000,
    )
