"""Per-key rate limits that hold across router replicas: token buckets in Redis, updated by one Lua script.

Why Redis and a script: N replicas must draw from one bucket, and "refill, compare, take" must be one
step, or two replicas both take the last request. A Lua script runs atomically in Redis and reads Redis's
own clock (``TIME``), so replicas with skewed clocks still agree (the field does the same: Envoy's
ratelimit service, AIBrix's gateway). Buckets are the ones ``auth`` keeps per replica: ``requests_per_minute``
is charged one per request on admission, ``tokens_per_minute`` an estimate on admission (in the same step)
that is settled to the real usage when the answer is known, and a key whose token bucket is below zero is
refused until it refills. Keys in Redis carry the API key's
hash (never the key), with a hash tag so both buckets of a key live in one Redis Cluster slot, and expire
once they would be full again (a full bucket needs no state).

**When the store is down or slow** (an error, or no answer within ``timeout_ms``), the policy is: keep
serving, with each key's limits divided by the router replicas last seen alive in the store (each replica
says it is alive every ``check_interval_ms``; before the store ever answered, the configured
``replicas``). So the fleet as a whole stays near the shared limit without a store. The switch is logged
once per cause, counted (``inferstack_router_limit_store_errors_total{cause}``) and shown
(``inferstack_router_limit_store_up``); requests stop trying the store until the background check reaches
it again, so a slow store costs one timeout, not one per request; then the shared buckets are used again.
A reservation is settled where it was taken (``runtime.router.limits.Ticket``): one taken in the fallback
share is settled there, one the store took is held back while the store is down and sent to it on return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runtime import tracing
from runtime.api_keys import Bucket, Denied, Principal, admit, charge_tokens, replica_share, scope_denied
from runtime.config import LimitStore
from runtime.router.limits import Ticket

log = logging.getLogger("inferstack.router.limits")

#: One call: refill both buckets to Redis's clock, then admit (check tokens >= 0, take one request and
#: reserve ARGV[4] tokens) or charge tokens (negative: give back, up to the capacity). Returns {admitted
#: 0/1, which bucket refused, milliseconds until it would admit}.
BUCKETS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function level(key, per_minute)
  local v = redis.call('HMGET', key, 'l', 't')
  local l, at = tonumber(v[1]), tonumber(v[2])
  if l == nil or at == nil then return per_minute end
  return math.min(per_minute, l + math.max(0, now - at) * per_minute / 60)
end
local function save(key, l, per_minute)
  redis.call('HSET', key, 'l', tostring(l), 't', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((per_minute - l) / per_minute * 60000) + 1000)
end
local requests, tokens, charge = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local reserve = tonumber(ARGV[4] or '0')
if charge ~= 0 then
  if tokens > 0 then save(KEYS[2], math.min(tokens, level(KEYS[2], tokens) - charge), tokens) end
  return {1, '', 0}
end
local tl = 0
if tokens > 0 then
  tl = level(KEYS[2], tokens)
  if tl < 0 then return {0, 'tokens', math.ceil(-tl / tokens * 60000)} end
end
if requests > 0 then
  local l = level(KEYS[1], requests)
  if l < 1 then return {0, 'requests', math.ceil((1 - l) / requests * 60000)} end
  save(KEYS[1], l - 1, requests)
end
if tokens > 0 and reserve > 0 then save(KEYS[2], tl - reserve, tokens) end
return {1, '', 0}
"""

#: Say this replica is alive; forget replicas silent for ARGV[2] seconds; return how many are alive.
ALIVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000))
return redis.call('ZCARD', KEYS[1])
"""

MAX_PENDING_CHARGES = 10_000  # token charges waiting for the store; beyond it they are charged locally


def error_cause(err: BaseException) -> str:
    """A short fixed word for a store failure (a metric label, and one log line each)."""
    if isinstance(err, (TimeoutError, RedisTimeoutError)):
        return "timeout"
    if isinstance(err, AuthenticationError) or (isinstance(err, ResponseError) and "NOAUTH" in str(err)):
        return "auth"
    if isinstance(err, (RedisConnectionError, OSError)):
        return "connection"
    if isinstance(err, ResponseError):
        return "error_reply"
    return "other"


class SharedLimits:
    """Buckets in Redis; per-replica buckets divided by the live replica count while it is unreachable."""

    def __init__(
        self,
        settings: LimitStore,
        on_error: Callable[[str], None] = lambda cause: None,
        on_check: Callable[[str], None] = lambda mode: None,
    ) -> None:
        self.settings = settings
        self.timeout_s = settings.timeout_ms / 1000
        self.on_error = on_error
        self.on_check = on_check
        password = _read_token(settings.auth_token_file)
        self.url = settings.url or _read_token(settings.url_file) or ""
        pool = redis.BlockingConnectionPool.from_url(
            self.url,
            password=password,
            max_connections=64,
            timeout=self.timeout_s,  # waiting for a free connection counts against the same budget
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), retries=0),  # a failed call is the fallback's business, not a retry's
        )
        self.client = redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), retries=0))
        self._buckets = self.client.register_script(BUCKETS_LUA)
        self._alive = self.client.register_script(ALIVE_LUA)
        self.replica_id = f"{os.uname().nodename}-{os.getpid()}-{os.urandom(3).hex()}"
        self.up = True  # optimistic until the first failure: the first request finds out
        self.replicas = settings.replicas
        self._reported: set[str] = set()
        self._fallback: dict[str, tuple[int, Bucket | None, Bucket | None]] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._owed: dict[str, tuple[Principal, int]] = {}  # settlements the store missed, by key hash
        self._checker: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def store_up(self) -> float:
        return 1.0 if self.up else 0.0

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.check()
        self._checker = asyncio.get_running_loop().create_task(self._check_loop())

    async def stop(self) -> None:
        self._stopping = True
        # A cancel that lands as redis' own socket timeout expires comes back as a redis TimeoutError, which
        # check() takes for a store fault: the loop would go on. So cancel until it is done (the flag ends it
        # after that check at the latest).
        while self._checker is not None and not self._checker.done():
            self._checker.cancel()
            await asyncio.wait([self._checker], timeout=0.2)
        if self._pending:  # token charges in flight: a moment to land, then they go
            _, late = await asyncio.wait(list(self._pending), timeout=1.0)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(max(self.timeout_s, 0.5)):
                await self.client.zrem(self._key("routers"), self.replica_id)
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(2.0):  # a stalled store must not hold up a shutdown
                await self.client.aclose()

    async def _check_loop(self) -> None:
        interval = self.settings.check_interval_ms / 1000
        while not self._stopping:
            await asyncio.sleep(interval)
            await self.check()

    async def check(self) -> None:
        """Say we are alive and learn how many replicas are; the only way back from the fallback."""
        ttl_s = 3 * self.settings.check_interval_ms / 1000
        try:
            async with asyncio.timeout(max(self.timeout_s, 0.5)):
                alive = await self._alive(keys=[self._key("routers")], args=[self.replica_id, ttl_s])
        except (RedisError, OSError, TimeoutError) as err:
            self._down(err)
            return
        self.replicas = max(1, int(alive))
        if not self.up:
            await self.client.connection_pool.disconnect()  # pooled connections went with the old server
            log.warning("rate-limit store %s is reachable again: limits are shared", self._where())
            self._reported.clear()
        self.up = True
        if self._owed and not self._stopping:
            self._pay_owed()

    # --- decisions --------------------------------------------------------------------------------
    async def admit(self, principal: Principal, model: str, reserve: int = 0) -> Denied | None:
        """Scope and limits; when admitted, ``reserve`` tokens are taken from the key's token bucket in the
        same step (settled later with :meth:`settle` on the ticket :meth:`reserve` gives)."""
        taken = await self.reserve(principal, model, reserve)
        return taken if isinstance(taken, Denied) else None

    async def reserve(self, principal: Principal, model: str, reserve: int = 0) -> Denied | Ticket:
        """``admit``, with the ticket that says which buckets took the reservation: the store's, or (it is
        down) this replica's fallback share."""
        denied = scope_denied(principal, model)
        if denied is not None:
            return denied
        key = principal.key
        if not (key.requests_per_minute or key.tokens_per_minute):
            return Ticket(self, shared=False)
        if self.up:
            try:
                async with asyncio.timeout(self.timeout_s):
                    with tracing.phase("router.rate_limit_store"):  # a child of the request's span
                        ok, which, wait_ms = await self._buckets(
                            keys=self._bucket_keys(principal),
                            args=[key.requests_per_minute or 0, key.tokens_per_minute or 0, 0, reserve],
                        )
            except (RedisError, OSError, TimeoutError) as err:
                self._down(err)
            else:
                self.on_check("shared")
                if ok:
                    return Ticket(self, shared=True)
                return _refusal(principal, _text(which), int(wait_ms) / 1000)
        self.on_check("fallback")
        local, now = self._local(principal), time.monotonic()
        denied = admit(local, model, now)
        if denied is not None:
            return denied
        if reserve:
            charge_tokens(local, reserve, now)
        return Ticket(self, shared=False)

    def settle(self, ticket: Ticket, principal: Principal, tokens: int) -> None:
        """Settle a reservation where it was taken: a fallback one in this replica's share, whatever the
        store does now; a shared one in the store, held back (``_owed``) while the store is unreachable and
        sent when it answers again, never to the fallback buckets, which did not take it."""
        if principal.key.tokens_per_minute is None or tokens == 0:
            return
        if not ticket.shared:
            charge_tokens(self._local(principal), tokens, time.monotonic())
        elif not self.up or len(self._pending) >= MAX_PENDING_CHARGES:
            self._owe(principal, tokens)
        else:
            self._spawn(self._charge(principal, tokens, owe=True))

    def charge(self, principal: Principal | None, tokens: int) -> None:
        """Take tokens (or, negative, give back what a reservation took beyond the usage), in the background."""
        if principal is None or principal.key.tokens_per_minute is None or tokens == 0:
            return
        if not self.up or len(self._pending) >= MAX_PENDING_CHARGES:
            charge_tokens(self._local(principal), tokens, time.monotonic())
            return
        self._spawn(self._charge(principal, tokens))

    def _spawn(self, charge: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(charge)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _owe(self, principal: Principal, tokens: int) -> None:
        """Keep a settlement for the store until it answers (one sum per key: bounded by the key table)."""
        owed = self._owed.get(principal.key.sha256)
        self._owed[principal.key.sha256] = (principal, tokens + (owed[1] if owed is not None else 0))

    async def _charge(self, principal: Principal, tokens: int, *, owe: bool = False) -> None:
        """One charge in the store; when it fails, an ``owe`` (a settlement of a reservation the store took)
        waits for the store, a plain charge goes to the fallback share."""
        key = principal.key
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._buckets(
                    keys=self._bucket_keys(principal),
                    args=[key.requests_per_minute or 0, key.tokens_per_minute or 0, tokens],
                )
        except (RedisError, OSError, TimeoutError) as err:
            self._down(err)
            if owe:
                self._owe(principal, tokens)
            else:
                charge_tokens(self._local(principal), tokens, time.monotonic())

    def _pay_owed(self) -> None:
        """The store answers again: the settlements it missed go to it now."""
        owed, self._owed = self._owed, {}
        for principal, tokens in owed.values():
            if tokens:
                self._spawn(self._charge(principal, tokens, owe=True))

    # --- helpers ----------------------------------------------------------------------------------
    def _down(self, err: BaseException) -> None:
        cause = error_cause(err)
        self.on_error(cause)
        if cause not in self._reported:
            self._reported.add(cause)
            log.warning(
                "rate-limit store %s failed (%s: %s); limiting per replica at 1/%d of each key's limits"
                " until it answers again",
                self._where(),
                cause,
                str(err)[:200] or type(err).__name__,
                self.replicas,
            )
        self.up = False

    def _local(self, principal: Principal) -> Principal:
        """This replica's share of the key's limits (its buckets persist while the count stays)."""
        key = principal.key
        n = max(1, self.replicas)
        found = self._fallback.get(key.sha256)
        if found is None or found[0] != n:
            now = time.monotonic()
            per = [
                replica_share(limit, n) if limit else None
                for limit in (key.requests_per_minute, key.tokens_per_minute)
            ]
            found = (n, Bucket(per[0], now) if per[0] else None, Bucket(per[1], now) if per[1] else None)
            self._fallback[key.sha256] = found
        return Principal(key, found[1], found[2])

    def _key(self, name: str) -> str:
        return f"{self.settings.key_prefix}{name}"

    def _bucket_keys(self, principal: Principal) -> list[str]:
        tag = principal.key.sha256[:32]
        return [self._key(f"limit:{{{tag}}}:requests"), self._key(f"limit:{{{tag}}}:tokens")]

    def _where(self) -> str:
        return self.url.split("@")[-1]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusal(principal: Principal, which: str, wait_s: float) -> Denied:
    key = principal.key
    limit = key.tokens_per_minute if which == "tokens" else key.requests_per_minute
    return Denied(
        429,
        f"key {principal.name!r} exceeded {limit} {which} per minute",
        "rate_limit_exceeded",
        max(1.0, wait_s),
    )


def _read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    return path.read_text().strip() or None
