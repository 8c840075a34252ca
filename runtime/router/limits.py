"""Per-key rate limits for the router: each replica on its own (``LocalLimits``), or shared by all of them
through a store (``runtime.router.shared_limits``, imported only when a store is configured: the Redis
client costs ~10 MiB of resident memory that a router without one should not carry).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

from runtime.api_keys import Denied, Principal, admit, charge_tokens
from runtime.config import LimitStore

if TYPE_CHECKING:
    from runtime.router.shared_limits import SharedLimits


class LocalLimits:
    """Each replica limits alone (no store configured): ``auth``'s buckets, as they are."""

    store_up: float | None = None

    def decide(self, principal: Principal, model: str, reserve: int = 0) -> Denied | None:
        """The decision, without a coroutine (the router's hot path calls this when limits are local);
        when admitted, ``reserve`` tokens are taken from the key's token bucket at once."""
        now = time.monotonic()
        denied = admit(principal, model, now)
        if denied is None and reserve:
            charge_tokens(principal, reserve, now)
        return denied

    async def admit(self, principal: Principal, model: str, reserve: int = 0) -> Denied | None:
        return self.decide(principal, model, reserve)

    def charge(self, principal: Principal | None, tokens: int) -> None:
        """Take tokens (or, negative, give back what a reservation took beyond the usage)."""
        charge_tokens(principal, tokens, time.monotonic())

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


Limits: TypeAlias = "LocalLimits | SharedLimits"


def make_limits(
    settings: LimitStore | None,
    on_error: Callable[[str], None] = lambda cause: None,
    on_check: Callable[[str], None] = lambda mode: None,
) -> Limits:
    if settings is None:
        return LocalLimits()
    from runtime.router.shared_limits import SharedLimits  # noqa: PLC0415 - see the module's docstring

    return SharedLimits(settings, on_error, on_check)
