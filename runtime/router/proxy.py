"""One try of one request on one replica: send the client's bytes, relay the answer, account for it.

Only failures before the client has seen a byte come back to the caller, to be retried elsewhere:
connect errors, resets before any response, ``502/503/504``, a wrong content type, or a stream that
ends before its first chunk. For a stream the first chunk is awaited before headers go out, so a
replica that accepts and then fails is retried instead of reaching the client as a broken stream.
Every outcome feeds the replica's circuit breaker and the metrics, and the answer's token usage is kept on
the call (``Call.used``) for the app to settle the key's reservation with.

A stream the router can continue elsewhere (``Call.progress``, see ``migration``) is relayed event by event
instead: when its engine fails after the client got its first bytes (a reset, an error event, an end without a
finish, or no token for ``stream_stall_timeout_ms``), the try ends with :class:`Broken` and the app's routing
loop sends the continuation to another replica, whose events this relay rewrites into the same stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass

from runtime import tracing
from runtime.api_keys import Principal
from runtime.config import RouterSettings
from runtime.http import OVERLOADED, OVERLOADED_CODE, error_body, error_code, passed_retry_after
from runtime.router.disagg import Pairing
from runtime.router.metrics import RouterMetrics
from runtime.router.migration import Progress
from runtime.router.model_state import ModelState
from runtime.router.payload import UsageStrip, stream_start, usage_of
from runtime.router.replicas import BACKEND_HEADER, Replica
from runtime.scheduling import Context
from runtime.server import ClientGoneError, Connection
from runtime.upstream import Exchange, UpstreamError

log = logging.getLogger("inferstack.router")
access = logging.getLogger("inferstack.router.access")

RETRY_STATUSES = frozenset((502, 503, 504))
HOP_BY_HOP = frozenset(
    (
        b"host",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"content-length",
        b"authorization",
        b"proxy-authorization",
        b"expect",
    )
)
_JSON = b"application/json"
_TAIL_BYTES = 4096  # enough of a large answer's end to find its usage
#: How often a non-streamed decode waiting on a prefill's KV looks at its prefill replica's health.
PARTNER_CHECK_S = 1.0


def forwarded_tail(headers: Mapping[bytes, bytes], rid_header: bytes, rid: bytes, body: bytes) -> bytes:
    """What follows the request line and host towards an engine: end-to-end headers, the request id,
    the length, the client's body as it came."""
    fwd = [
        name + b": " + value + b"\r\n"
        for name, value in headers.items()
        if name not in HOP_BY_HOP and name != rid_header
    ]
    fwd.append(rid_header + b": " + rid + b"\r\n")
    return b"".join(fwd) + b"content-length: %d\r\n\r\n" % len(body) + body


@dataclass(slots=True)
class Call:
    """One client request on its way through the router."""

    conn: Connection
    state: ModelState
    ctx: Context
    path: bytes
    tail: bytes  # forwarded headers + body, after the request line and host
    stream: bool
    rid: bytes
    principal: Principal | None
    started: float
    strip_usage: bool = False  # the router asked for the stream's usage, not the client: take it out again
    reserved: int = 0  # tokens taken from the key's bucket at admission
    prompt: int = 0  # the prompt's estimate (part of the reservation)
    used: int | None = None  # tokens the answer reported (prompt + completion), once known
    answered: bool = False  # a 200 began to reach the client: the engine generated something
    abandoned: bool = False  # the client left while an engine held its request: the engine worked for it
    relayed: int = 0  # content events of a stream passed on (about one token of one choice each)
    pd: Pairing | None = None  # a disaggregated model's request: its prefill phase (``disagg``)
    progress: Progress | None = None  # a stream that can be continued on another replica (``migration``)

    @property
    def resumed(self) -> bool:
        """The client has this stream's head: whatever happens now reaches it as events of that stream."""
        return self.progress is not None and self.progress.started

    @property
    def carries_kv(self) -> bool:
        """This try is a decode with a prefill's KV: a failure to load it is retried without, not passed on."""
        return self.pd is not None and self.pd.prefill_replica is not None

    def settlement(self) -> int:
        """What to charge the key now that the request ended, beyond its reservation: the difference to the
        real usage when known; when an answer began without one (the client left mid-stream, an engine that
        reports none), or the client left while an engine was working on it (before its first byte: a
        prefill, a whole non-streamed answer), the reservation or what was relayed (prompt + one token per
        content event), whichever is more; the whole reservation back when no engine worked for it (refused,
        failed before the first byte and not retried to an answer)."""
        if self.used is not None:
            return self.used - self.reserved
        worked = self.answered or self.abandoned
        return max(0, self.prompt + self.relayed - self.reserved) if worked else -self.reserved


@dataclass(frozen=True, slots=True)
class Broken:
    """A stream that failed after its client got its first bytes, which can go on elsewhere."""

    reason: str  # reset | timeout | error_event | truncated | protocol (the migrations metric's label)
    message: str


#: How an engine's failure mid-stream is named in the migrations metric.
_REASON_OF_KIND = {"reset": "reset", "timeout": "timeout", "protocol": "protocol", "connect": "reset"}


class Forwarder:
    """Sends calls to replicas with the router's timeouts; reconfigured with the router."""

    def __init__(self, metrics: RouterMetrics, settings: RouterSettings) -> None:
        self.metrics = metrics
        self.configure(settings)

    def configure(self, s: RouterSettings) -> None:
        self.rid_header = s.request_id_header.lower().encode()
        self.connect_timeout_s = s.connect_timeout_ms / 1000
        self.first_byte_timeout_s = s.first_byte_timeout_ms / 1000
        self.idle_timeout_s = s.stream_idle_timeout_ms / 1000
        # a stream that can move waits this long for a token before it does (a hung engine: SIGSTOP, a wedged GPU)
        self.stall_timeout_s = min(s.stream_stall_timeout_ms, s.stream_idle_timeout_ms) / 1000
        self.access_log = s.access_log

    async def attempt(self, call: Call, r: Replica) -> tuple[int, str] | Broken | None:
        """One try on one replica. None when the client got its answer (or left); otherwise the
        (status, message) of a failure that is safe to retry elsewhere, or :class:`Broken` for a stream that
        failed after its client got its first bytes and can be continued elsewhere."""
        conn, state, rid = call.conn, call.state, call.rid
        r.inflight += 1
        sent_at = time.monotonic()
        r.last_used = sent_at
        r.breaker.on_start(sent_at)
        ex: Exchange | None = None
        status = 0
        ok = False
        refused = False
        kv = call.carries_kv
        try:
            head = b"POST %b HTTP/1.1\r\nhost: %b\r\n" % (call.path, r.pool.host_header)
            ex = await Exchange.open(r.pool, head + call.tail, self.connect_timeout_s)
            await self._head(call, ex)
            status = ex.status
            ctype = ex.headers.get(b"content-type", b"")
            if call.resumed and not (status == 200 and ctype.startswith(b"text/event-stream")):
                # a continuation's refusal is never passed on: the client is in the middle of a stream
                body = await ex.read_all(self.idle_timeout_s)
                if status >= 500 or status == 200:
                    r.breaker.on_failure(time.monotonic())
                return (status if status >= 400 else 502), (
                    f"replacement answered {status}: {body[:200].decode('utf-8', 'replace')}"
                )
            if status == 404 and call.ctx.adapter is not None:
                # the replica lost the adapter (a restart) before our view of it caught up: the caller loads
                # it again; the client has seen nothing
                body = await ex.read_all(self.idle_timeout_s)
                return (
                    404,
                    f"replica does not hold adapter {call.ctx.adapter!r}: {body[:200].decode('utf-8', 'replace')}",
                )
            # A canary's engine errors (500 too) go to the stable version instead of the client; a decode's
            # failure to load a prefill's KV (500) is sent again without it.
            if status in RETRY_STATUSES or (status >= 500 and (state.canary or kv)):
                body = await ex.read_all(self.idle_timeout_s)
                if r is state.batcher and status == OVERLOADED and error_code(body) == OVERLOADED_CODE:
                    # the batcher's queue is full: load, its own verdict, for the client as it is (Retry-After
                    # too), counted as a refusal like the router's own, not as a failed replica or a 5xx
                    refused = True
                    self.metrics.reject("batcher_queue", state.name)
                    conn.send(status, body, ctype or _JSON, self._passed_headers(call, r, ex))
                    return None
                if not (kv and status == 500):  # the transfer's failure, not this replica's (``disagg``)
                    r.breaker.on_failure(time.monotonic())
                return status, f"replica answered {status}: {body[:200].decode('utf-8', 'replace')}"
            if status == 200 and ctype.startswith(b"text/event-stream"):
                if call.progress is not None:
                    return await self._relay_movable(call, call.progress, r, ex, sent_at)
                return await self._relay_stream(call, r, ex, sent_at)
            if status == 200 and not ctype.startswith(_JSON):
                # neither JSON nor SSE: a proxy error page or a confused engine; try another replica
                ex.abort()
                r.breaker.on_failure(time.monotonic())
                return 502, f"replica answered with content-type {ctype.decode('latin-1')!r}"
            # a JSON answer (or an engine error, passed through as it is)
            whole = ex.whole_body()
            body = whole if whole is not None else (await ex.next_chunk(self.idle_timeout_s) or b"")
            first = time.monotonic()
            extra = self._passed_headers(call, r, ex)
            call.answered = status == 200
            if ex.drained or not body:
                conn.send(status, body, ctype or _JSON, extra)  # the usual case: one write
            else:
                body = await self._relay_large(call, r, ex, status, ctype or _JSON, body)
            ok = True
            if status == 200:
                r.observe_ttft(first - sent_at, state.ewma_alpha)
                self.metrics.first_byte(state.name, first - sent_at, state.versioned)
                tracing.note({tracing.TTFT_MS: round((first - call.started) * 1000, 3)})
                p, c = usage_of(body)
                self.account(call, p, c)
            return None
        except UpstreamError as err:
            if ex is not None:
                ex.abort()
            if not (kv and err.kind == "timeout"):  # a decode waiting on a stalled transfer is not to blame
                r.breaker.on_failure(time.monotonic())
            # the client has seen nothing yet (relay handles failures after the first chunk itself)
            return (504 if err.kind == "timeout" else 502), str(err)
        except (asyncio.CancelledError, ClientGoneError):
            if ex is not None:
                call.abandoned = True  # the request was sent: the engine may have worked for a while
                ex.abort()  # closing the socket is how the engine learns to stop generating
            raise
        finally:
            r.inflight -= 1
            r.last_used = time.monotonic()
            if ok or refused:
                r.breaker.on_success()
            else:
                r.breaker.on_abandon()
            if state.queue.waiters:
                state.queue.wake_one()
            if not refused:
                self.metrics.request(
                    state.name, r.url, status or 502, time.monotonic() - call.started, state.versioned
                )
            if self.access_log:
                access.info(
                    "request",
                    extra={
                        "request_id": rid.decode(),
                        "model": state.name,
                        "version": state.version,
                        "backend": r.url,
                        "status": status,
                        "duration_ms": round((time.monotonic() - call.started) * 1000, 2),
                    },
                )

    async def _head(self, call: Call, ex: Exchange) -> None:
        """Wait for the answer's head. A non-streamed decode carrying a prefill's KV has its head only with its
        whole answer, so no deadline tells a stalled transfer (a frozen prefill engine holds a NIXL read
        forever) from a long answer: it is given up as a timeout once its prefill replica is unhealthy, or once the
        KV's lease ran out (``disagg``: the prefill engine may have freed the blocks)."""
        pd = call.pd
        partner = pd.prefill_replica if pd is not None and not call.stream else None
        if pd is None or partner is None:
            await ex.head(self._first_byte_s(call))
            return
        deadline = min(time.monotonic() + self.first_byte_timeout_s, pd.kv_expires)  # within the KV's lease
        while True:
            left = deadline - time.monotonic()
            try:
                await ex.head(max(0.001, min(PARTNER_CHECK_S, left)))
                return
            except UpstreamError as err:
                if err.kind != "timeout" or left <= PARTNER_CHECK_S:
                    raise
                if not partner.healthy:
                    raise UpstreamError(
                        f"prefill replica {partner.url} turned unhealthy before the decode answered",
                        retryable=True,
                        kind="timeout",
                    ) from None

    def _first_byte_s(self, call: Call) -> float:
        """How long the answer's head (and a stream's first token) may take: a streamed decode carrying a
        prefill's KV has until its transfer deadline (``disagg``), anything else ``first_byte_timeout_ms``."""
        if call.stream and call.pd is not None and call.pd.prefill_replica is not None:
            return max(0.001, min(self.first_byte_timeout_s, call.pd.transfer_deadline - time.monotonic()))
        return self.first_byte_timeout_s

    def _passed_headers(self, call: Call, r: Replica, ex: Exchange) -> list[tuple[bytes, bytes]]:
        """The headers an answer passed through carries: the request id, the replica, and the upstream's
        Retry-After (when to come back: the upstream knows best)."""
        return [(self.rid_header, call.rid), (BACKEND_HEADER, r.tag), *passed_retry_after(ex.headers)]

    async def _relay_large(
        self, call: Call, r: Replica, ex: Exchange, status: int, ctype: bytes, first: bytes
    ) -> bytes:
        """Pass a big answer (many embeddings) through piece by piece instead of holding it whole;
        returns its tail, where ``usage`` is."""
        conn = call.conn
        headers = [(b"content-type", ctype), *self._passed_headers(call, r, ex)]
        length = ex.headers.get(b"content-length", b"")
        sized = length.isdigit()
        if sized:
            conn.start_sized(status, headers, int(length), first)
        else:
            conn.start(status, headers, first)
        tail = first[-_TAIL_BYTES:]
        try:
            while (piece := await ex.next_chunk(self.idle_timeout_s)) is not None:
                await (conn.write(piece) if sized else conn.chunk(piece))
                tail = (tail + piece)[-_TAIL_BYTES:]
        except UpstreamError as err:
            ex.abort()
            log.warning("answer broke mid-way", extra={"request_id": call.rid.decode(), "error": str(err)})
            conn.close()  # the client sees a short body, never a truncated one passed off as whole
            return tail
        if sized:
            conn.end_sized()
        else:
            conn.end()
        return tail

    async def _relay_stream(
        self, call: Call, r: Replica, ex: Exchange, sent_at: float
    ) -> tuple[int, str] | None:
        conn, state, rid = call.conn, call.state, call.rid
        # wait for the first token before answering: until then a failure is retried elsewhere
        first = await ex.next_chunk(self._first_byte_s(call))
        if first is None:
            r.breaker.on_failure(time.monotonic())
            return 502, "replica ended the stream before sending anything"
        if call.carries_kv:  # an engine that fails to load the KV says so in the stream: read up to a token
            while (verdict := stream_start(first)) == "wait":
                more = await ex.next_chunk(self._first_byte_s(call))
                if more is None:
                    break
                first += more
            if verdict == "error":
                ex.abort()
                return 500, f"decode failed before its first token: {first[:200].decode('utf-8', 'replace')}"
        now = time.monotonic()
        r.observe_ttft(now - sent_at, state.ewma_alpha)
        self.metrics.first_byte(state.name, now - sent_at, state.versioned)
        tracing.note({tracing.TTFT_MS: round((now - call.started) * 1000, 3)})
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (self.rid_header, rid),
            (BACKEND_HEADER, r.tag),
        ]
        # events assembled across reads: the usage (taken out when the router asked for it) and the count of
        # what was relayed, kept even when the client leaves mid-stream (then cancelled, or ClientGoneError)
        tally = UsageStrip(strip=call.strip_usage)
        call.answered = True
        try:
            conn.start(200, headers, tally.feed(first))
            r.breaker.on_success()
            try:
                while (chunk := await ex.next_chunk(self.idle_timeout_s)) is not None:
                    await conn.chunk(tally.feed(chunk))
                await conn.chunk(tally.rest())
            except UpstreamError as err:
                ex.abort()
                r.breaker.on_failure(time.monotonic())
                log.warning(
                    "stream broke mid-way",
                    extra={"request_id": rid.decode(), "backend": r.url, "error": str(err)},
                )
                event = (
                    b"data: "
                    + error_body(502, f"the engine stream broke: {err}", code="stream_error")
                    + b"\n\n"
                )
                await conn.chunk(event)
            conn.end()
        finally:
            call.relayed = tally.content_events
            if tally.usage is not None:
                p, c = usage_of(tally.usage)
                self.account(call, p, c)
        return None

    async def _relay_movable(
        self, call: Call, progress: Progress, r: Replica, ex: Exchange, sent_at: float
    ) -> tuple[int, str] | Broken | None:
        """Relay a stream event by event through ``progress`` (the first engine's, or a replacement's rewritten
        into it). :class:`Broken` when the engine fails after the client got the stream's head; a failure
        before this engine's first event is a plain retryable one (the client saw nothing of this engine)."""
        conn, state = call.conn, call.state
        first = await ex.next_chunk(self._first_byte_s(call))
        if first is None:
            r.breaker.on_failure(time.monotonic())
            return 502, "replica ended the stream before sending anything"
        outcome: Broken | None = None
        try:
            out = progress.feed(first)
            if not progress.started and progress.broken is not None:  # an error before anything: retry it
                ex.abort()
                r.breaker.on_failure(time.monotonic())
                progress.broken = None
                return 502, f"replica failed the stream before its first token: {first[:200]!r}"
            if not progress.started:
                now = time.monotonic()
                r.observe_ttft(now - sent_at, state.ewma_alpha)
                self.metrics.first_byte(state.name, now - sent_at, state.versioned)
                headers = [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                    (self.rid_header, call.rid),
                    (BACKEND_HEADER, r.tag),
                ]
                call.answered = True
                conn.start(200, headers, out)
                progress.started = True
            elif out:
                await conn.chunk(out)
            r.breaker.on_success()
            try:
                while progress.broken is None and not (progress.done and progress.stop_hit):
                    chunk = await ex.next_chunk(self.stall_timeout_s)
                    if chunk is None:
                        break
                    out = progress.feed(chunk)
                    if out:
                        await conn.chunk(out)
            except UpstreamError as err:
                ex.abort()
                r.breaker.on_failure(time.monotonic())
                outcome = Broken(_REASON_OF_KIND.get(err.kind, "reset"), str(err))
            else:
                if progress.broken is not None:
                    ex.abort()
                    r.breaker.on_failure(time.monotonic())
                    outcome = Broken(progress.broken, "the engine sent an error event mid-stream")
                elif progress.done:
                    ex.abort()  # ended here on a stop string across a seam (a no-op when the engine ended it)
                elif not progress.finished:
                    r.breaker.on_failure(time.monotonic())
                    outcome = Broken("truncated", "the engine ended the stream before its finish")
            if outcome is not None and progress.finished and not progress.done:
                # every token reached the client; only the stream's end was lost: the router writes it
                await conn.chunk(progress.closing(progress.local_end(with_finish=False)))
                outcome = None
            if outcome is not None:
                log.warning(
                    "stream broke mid-way",
                    extra={"request_id": call.rid.decode(), "backend": r.url, "error": outcome.message},
                )
                return outcome
            rest = progress.rest()
            if rest:
                await conn.chunk(rest)
            conn.end()
        finally:
            call.relayed = progress.content_events
            if outcome is None and progress.usage is not None:
                self.account(call, *progress.usage)
        return None

    async def end_stream(self, call: Call, status: int, message: str) -> None:
        """End a stream the client has the head of with an error event: no replacement could go on with it."""
        event = b"data: " + error_body(status, message, code="stream_error") + b"\n\n"
        with suppress(ClientGoneError):
            await call.conn.chunk(event)
            call.conn.end()

    async def end_here(self, call: Call, reason: str) -> None:
        """End a stream the router finishes itself (nothing left to generate): its finish, usage, ``[DONE]``."""
        progress = call.progress
        assert progress is not None
        with suppress(ClientGoneError):
            await call.conn.chunk(progress.closing(progress.local_end(with_finish=True, reason=reason)))
            call.conn.end()
        if progress.usage is not None:
            self.account(call, *progress.usage)

    def account(self, call: Call, prompt: int, completion: int) -> None:
        """The answer's usage: counted, and kept for the app to settle the key's tokens with."""
        if prompt or completion:
            state = call.state
            self.metrics.usage(state.name, prompt, completion, state.versioned)
            tracing.note({tracing.INPUT_TOKENS: prompt, tracing.OUTPUT_TOKENS: completion})
            call.used = prompt + completion
