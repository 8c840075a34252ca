"""Per-key rate limits for the router: each replica on its own (``LocalLimits``), or shared by all of them
through a store (``runtime.router.shared_limits``, which the router's app imports only when a store is configured:
the Redis client costs ~10 MiB of resident memory that a router without one should not carry). Both are
``Limits``; this module never imports that one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from runtime.api_keys import Denied, Principal, admit, charge_tokens


class Limits(Protocol):
    """What the router asks of its rate limits, each replica's own or shared through a store."""

    @property
    def store_up(self) -> float | None:
        """1 when the shared store answers, 0 when it does not; None without a store."""

    async def admit(self, principal: Principal, model: str, reserve: int = 0) -> Denied | None: ...

    async def reserve(self, principal: Principal, model: str, reserve: int = 0) -> Denied | Ticket: ...

    def settle(self, ticket: Ticket, principal: Principal, tokens: int) -> None: ...

    def charge(self, principal: Principal | None, tokens: int) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Ticket:
    """Where an admission took its reservation: the limits object of that moment (a reload may have put
    another in its place since) and, for shared limits, whether the store took it or this replica's fallback
    buckets did (the store may have failed, or come back, since). The reservation is settled there and
    nowhere else: settled elsewhere, tokens reserved in one place are never given back and tokens given
    back in the other were never taken."""

    limits: Limits
    shared: bool  # the store took the reservation, not this replica's fallback buckets

    def settle(self, principal: Principal, tokens: int) -> None:
        """Charge ``tokens`` more (negative: give back) where the reservation was taken."""
        self.limits.settle(self, principal, tokens)


class LocalLimits:
    """Each replica limits alone (no store configured): ``auth``'s buckets, as they are."""

    store_up: float | None = None

    def decide(self, principal: Principal, model: str, reserve: int = 0) -> Denied | None:
        """The decision, without a coroutine; when admitted, ``reserve`` tokens are taken from the key's
        token bucket at once."""
        taken = self.take(principal, model, reserve)
        return taken if isinstance(taken, Denied) else None

    def take(self, principal: Principal, model: str, reserve: int = 0) -> Denied | Ticket:
        """``decide``, with the ticket to settle the reservation with (the router's hot path calls this when
        limits are local: no coroutine)."""
        now = time.monotonic()
        denied = admit(principal, model, now)
        if denied is not None:
            return denied
        if reserve:
            charge_tokens(principal, reserve, now)
        return Ticket(self, shared=False)

    async def admit(self, principal: Principal, model: str, reserve: int = 0) -> Denied | None:
        return self.decide(principal, model, reserve)

    async def reserve(self, principal: Principal, model: str, reserve: int = 0) -> Denied | Ticket:
        return self.take(principal, model, reserve)

    def settle(self, ticket: Ticket, principal: Principal, tokens: int) -> None:
        self.charge(principal, tokens)

    def charge(self, principal: Principal | None, tokens: int) -> None:
        """Take tokens (or, negative, give back what a reservation took beyond the usage)."""
        charge_tokens(principal, tokens, time.monotonic())

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
