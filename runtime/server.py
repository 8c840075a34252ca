"""A lean HTTP/1.1 server: asyncio protocol + httptools (llhttp) parser, nothing else.

Shared by the router, the batch service, the batcher and the picker's metrics listener. Why not aiohttp
or an ASGI stack: the router's budget is ~120 us of CPU per proxied request, and a bare aiohttp proxy
already spends ~160 us (bench/README.md has the numbers). Per request this server does one C parse, one
task, and one ``transport.write`` per response (or per streamed chunk); there is no middleware chain, no
request object graph and no header multidict.

Scope is deliberately small: keep-alive, Content-Length and chunked request bodies, chunked streaming
responses, and cancellation of the handler when the client goes away (which is how a disconnect reaches
the engine). What one client may hold is bounded (:class:`Limits`):

- the request head: its size and number of headers (431), and the time it may take to arrive (a client
  trickling it byte by byte is cut off, however often it sends);
- the body: a limit per request (413), checked at the head when the length is declared; a service's
  ``head`` hook looks at each request head before any body byte is read, and may refuse it there (a
  missing API key: 401), give its path a larger limit, or take its body as a stream (uploads), read by
  the handler as it arrives with no more than :data:`STREAM_BUFFER_BYTES` held here;
- the body's pace: it must arrive at :attr:`Limits.min_body_rate` bytes a second or faster, after a grace of the
  head timeout (a body of N bytes has ``head_timeout_s + N / min_body_rate`` seconds, time the server itself
  did not read excluded); a slower one is answered 408 and the connection closed, so a client trickling a
  byte now and then cannot hold its connection, or a buffered body, forever;
- the server's memory: the bodies it buffers (not streamed) count against one budget,
  ``max_buffered_body_bytes`` (by default a quarter of the container's memory limit: :func:`body_budget`); a
  body declared with its length reserves it at the head. A request whose body does not fit is answered 503
  ``overloaded`` with Retry-After, so many slow clients together cannot exhaust the service's memory;
- the connection: requests sent ahead (pipelined) are not read while one is handled, and none is
  started while the client is not reading its answers (``pause_writing``); answers to the client wait
  when it reads slower than they are written; a client that stops reading is closed after the idle
  timeout;
- the listener: at most ``max_connections`` connections; past it a new connection's request is
  answered 503 and the connection closed.

A refusal before the body was read ends the connection; what the client still sends is drained for a
moment (:data:`LINGER_BYTES`) so it reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httptools

from runtime.http import FORWARDED_FOR, OVERLOADED, OVERLOADED_CODE, REASONS, error_body, retry_after

log = logging.getLogger("inferstack.server")

Headers = dict[bytes, bytes]

#: Body bytes of a streamed request held for its handler before the client is read no further.
STREAM_BUFFER_BYTES = 1 << 20
#: Bytes drained (and dropped) after the last answer on a connection the client may still be sending on.
LINGER_BYTES = 1 << 20
#: Requests parsed ahead (pipelined) and waiting behind the one being handled; past it no more are read,
#: the waiting ones are answered and the connection closes (the client retries the rest, RFC 9112 9.3.2).
MAX_PIPELINED = 16

DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_MAX_HEADERS = 100
DEFAULT_HEAD_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 75.0
DEFAULT_MAX_CONNECTIONS = 1024
#: The slowest a request body may arrive, bytes a second (after a grace of the head timeout). 64 KiB/s is
#: a slow mobile link; the router's largest body (8 MiB) then has 138 s, and a trickle is cut off in seconds.
DEFAULT_MIN_BODY_RATE = 64 * 1024
#: The share of the container's memory limit a server's buffered bodies may hold (the rest: the process,
#: answers on their way, the handlers' own copies).
BODY_BUDGET_SHARE = 4
#: The buffered body budget when the container has no memory limit (a developer's machine).
DEFAULT_BODY_BUDGET = 256 * 1024 * 1024
_CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_limit() -> int | None:
    """The container's memory limit in bytes (cgroup v2, else v1), or None when it has none."""
    for path in _CGROUP_MEMORY_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # cgroup v1 says "no limit" with a huge number
            return int(text)
        return None
    return None


def body_budget(max_body_bytes: int) -> int:
    """Bytes of buffered request bodies a server may hold: a quarter of the memory limit (the finding of
    issue #34: 130 slow 8 MiB bodies exhaust a 1 GiB router), never less than one largest body."""
    limit = memory_limit()
    budget = DEFAULT_BODY_BUDGET if limit is None else limit // BODY_BUDGET_SHARE
    return max(budget, max_body_bytes)


class ListenerSettings(Protocol):
    """The listener fields a service's settings carry (runtime/config.py)."""

    @property
    def max_header_bytes(self) -> int: ...
    @property
    def max_headers(self) -> int: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def request_head_timeout_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may hold of the server."""

    max_body_bytes: int
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    min_body_rate: int = DEFAULT_MIN_BODY_RATE
    max_buffered_body_bytes: int | None = None  # None: body_budget(max_body_bytes)

    @classmethod
    def of(
        cls, s: ListenerSettings, max_body_bytes: int, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    ) -> Limits:
        return cls(
            max_body_bytes,
            s.max_header_bytes,
            s.max_headers,
            s.request_head_timeout_s,
            idle_timeout_s,
            s.max_connections,
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer given at the request head (a refusal), instead of calling the handler."""

    status: int
    body: bytes
    extra: list[tuple[bytes, bytes]] | None = None

    @classmethod
    def error(
        cls,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> Answer:
        return cls(status, error_body(status, message, code=code, param=param), extra)


#: ``Request.auth`` before a head hook looked at the request (a handler run without one checks itself).
NOT_CHECKED: Any = object()


class Request:
    """One parsed request; header names are lower-case bytes.

    A head hook may raise ``max_body`` (a path that takes uploads), set ``streamed`` (the handler reads
    ``stream`` as the body arrives, ``body`` stays empty) and keep what it learnt about the caller in
    ``auth`` (the router: the key's principal)."""

    __slots__ = (
        "auth",
        "body",
        "headers",
        "held",
        "keep_alive",
        "max_body",
        "method",
        "path",
        "query",
        "refusal",
        "stream",
        "streamed",
    )

    def __init__(self, method: bytes, path: bytes, query: bytes, headers: Headers, body: bytes) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = True
        self.max_body = 0
        self.streamed = False
        self.stream: Body | None = None
        self.refusal: Answer | None = None
        self.auth: Any = NOT_CHECKED
        self.held = 0  # body bytes counted against the server's budget (Server.body_bytes) for it


class _HeadRefusedError(Exception):
    """Raised inside the parser's callbacks: the request head is over a limit (answered 431)."""


class _StopParsingError(Exception):
    """Raised inside the parser's callbacks: nothing more is read from this connection."""


class ClientGoneError(Exception):
    """The client closed the connection; whatever we were doing for it can stop."""


class BodyError(Exception):
    """A streamed body cannot be read to its end: too large (413) or malformed (400)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> bytes:
        return error_body(self.status, self.message)


class Body:
    """A request body its handler reads as it arrives (``async for chunk in req.stream``). No more than
    :data:`STREAM_BUFFER_BYTES` wait here: past that the connection stops reading until the handler
    catches up. Raises :class:`BodyError` past the request's limit, :class:`ClientGoneError` when the
    client leaves half-way."""

    __slots__ = ("_chunks", "_conn", "_error", "_waiter", "buffered", "done", "received")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self.buffered = 0
        self.received = 0
        self.done = False

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        data = await self.read()
        if not data:
            raise StopAsyncIteration
        return data

    async def read(self) -> bytes:
        """The next piece of the body; b"" at its end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.done:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._chunks.popleft()
        self.buffered -= len(data)
        self._conn._flow()
        return data

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self.buffered += len(data)
        self.received += len(data)
        self._wake()

    def _finish(self) -> None:
        self.done = True
        self._wake()

    def _fail(self, error: Exception) -> None:
        if not self.done and self._error is None:
            self._chunks.clear()
            self.buffered = 0
            self._error = error
            self._wake()


Handler = Callable[[Request, "Connection"], Awaitable[None]]
#: Looks at a request head before its body is read: a refusal to answer instead, or None to go on.
Head = Callable[[Request], Answer | None]


_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (
            status,
            REASONS.get(status, "Unknown").encode(),
        )
    return line


def _head(status: int, headers: list[tuple[bytes, bytes]], tail: bytes) -> bytes:
    lines = [_status_line(status)]
    for name, value in headers:
        lines.append(name + b": " + value + b"\r\n")
    lines.append(tail)
    return b"".join(lines)


def _too_large(limit: int) -> Answer:
    return Answer.error(413, f"request body exceeds {limit} bytes")


class Connection(asyncio.Protocol):
    """One client connection; requests on it are handled one at a time, in order."""

    def __init__(self, server: Server) -> None:
        limits = server.limits
        self._server = server
        self._handler = server.handler
        self._head_hook = server.head
        self._max_body = limits.max_body_bytes
        self._max_head = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._head_bytes = 0
        self._header_count = 0
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: Headers = {}
        self._req: Request | None = None  # the request being received, once its head was accepted
        self._body: list[bytes] = []
        self._body_len = 0
        self._discard = False  # the body being received is not wanted (refused, or over the limit)
        self._incoming = False  # inside a request (its first byte arrived, its end not yet)
        self._pending: deque[Request] = deque()
        self._current: Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False
        self._write_paused_at = 0.0
        self._read_paused = False
        self._no_more = False  # no further request is read on this connection
        self._parser_dead = False
        self._linger_at: float | None = None
        self._lingered = 0
        self._refuse_all: Answer | None = None  # over the connection cap: every request gets this
        self._admitted = False
        self.closed = False
        self.idle = True  # no request in flight (graceful shutdown closes idle connections at once)
        self._chunked = False
        self._keep_alive = True
        self._head_only = False
        self.last_active = time.monotonic()
        self._head_started: float | None = self.last_active  # the deadline for the request head runs
        self._body_started: float | None = None  # the body's pace is checked (shifted by time not read)
        self._paused_at = 0.0

    # --- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio and uvloop both set this today; a streamed token must never wait for an ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = self._server
        if server.admitted < server.limits.max_connections:
            server.admitted += 1
            self._admitted = True
        elif server.overflow < max(8, server.limits.max_connections // 8):
            server.overflow += 1  # read its request head, answer 503, close
            self._refuse_all = Answer.error(
                503,
                f"the server holds its maximum of {server.limits.max_connections} connections; retry later",
                code="too_many_connections",
                extra=[retry_after(1)],
            )
        else:
            self.closed = True  # far past the cap: not even an answer
            transport.close()
            return
        server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self._linger_at is not None:
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self.close()
            return
        if self._parser_dead or self.closed:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail_request(400, "protocol upgrades are not supported")
        except httptools.HttpParserCallbackError as err:
            cause = err.__context__
            if isinstance(cause, _StopParsingError):
                self._parser_dead = True
            elif isinstance(cause, _HeadRefusedError):
                self._fail_request(431, str(cause))
            else:
                log.error("request parsing failed", exc_info=cause)
                self._fail_request(400, "malformed HTTP request")
        except httptools.HttpParserError:
            self._fail_request(400, "malformed HTTP request")

    def eof_received(self) -> bool | None:
        if self._req is not None and self._req.stream is not None:
            self._req.stream._fail(ClientGoneError())
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        server = self._server
        if self in server.connections:
            if self._admitted:
                server.admitted -= 1
            elif self._refuse_all is not None:
                server.overflow -= 1
            server.connections.discard(self)
        self.closed = True
        if self._req is not None:
            self._release(self._req)
            if self._req.stream is not None:
                self._req.stream._fail(ClientGoneError())
        for req in self._pending:
            self._release(req)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ClientGoneError())

    def pause_writing(self) -> None:
        self._write_paused = True
        self._write_paused_at = time.monotonic()
        self._flow()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None
        if self._task is None:
            self._next()  # requests that waited for the client to read its answers
        self._flow()

    # --- flow control ----------------------------------------------------------------------------
    def _flow(self) -> None:
        """Read from the client only while it is useful: not while it does not read its answers, not
        ahead of the request being handled (pipelining), not faster than a streamed body is consumed."""
        transport = self._transport
        if transport is None or self.closed:
            return
        if self._linger_at is not None:
            pause = False
        else:
            req = self._req
            # The streamed body its handler reads is read on to its end, even when no request may follow.
            body_due = (
                req is not None
                and req.stream is not None
                and not (req.stream.done or self._discard or self._parser_dead)
            )
            pause = (
                self._write_paused
                or (self._no_more and not body_due)
                or bool(self._pending)
                or (self._task is not None and self._incoming and req is not self._current)
                or (req is not None and req.stream is not None and req.stream.buffered >= STREAM_BUFFER_BYTES)
            )
        if pause != self._read_paused:
            self._read_paused = pause
            if pause:
                transport.pause_reading()
                self._paused_at = time.monotonic()
            else:
                transport.resume_reading()
                now = time.monotonic()
                if self._head_started is not None:
                    self._head_started = now  # a head's deadline runs only while it is read
                if self._body_started is not None:
                    # nor a body's, while we do not read it (it may have started while reading was paused)
                    self._body_started += now - max(self._paused_at, self._body_started)

    # --- httptools callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._no_more or self.closed:
            raise _StopParsingError
        self._incoming = True
        self._url = b""
        self._headers = {}
        self._head_bytes = 0
        self._header_count = 0
        self._body = []
        self._body_len = 0
        self._discard = False
        self._req = None
        if self._head_started is None:
            self._head_started = self.last_active
        if self._task is not None:
            self._flow()  # pipelined: read no further until the request in flight is answered

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > self._max_head:
            raise _HeadRefusedError(f"request line and headers exceed {self._max_head} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        n = self._head_bytes = self._head_bytes + len(name) + len(value) + 4
        # a repeated X-Forwarded-For: which copy the proxy in front appended to is unknown, so neither is trusted
        self._headers[key] = b"" if key == FORWARDED_FOR and key in self._headers else value
        c = self._header_count = self._header_count + 1
        if n > self._max_head:
            raise _HeadRefusedError(f"request line and headers exceed {self._max_head} bytes")
        if c > self._max_headers:
            raise _HeadRefusedError(f"a request may carry at most {self._max_headers} headers")

    def on_headers_complete(self) -> None:
        self._head_started = None
        url = self._url
        qpos = url.find(b"?")
        path, query = (url, b"") if qpos < 0 else (url[:qpos], url[qpos + 1 :])
        headers = self._headers
        req = Request(self._parser.get_method(), path, query, headers, b"")
        req.keep_alive = bool(self._parser.should_keep_alive())
        req.max_body = self._max_body
        refusal = self._refuse_all
        if refusal is None and self._head_hook is not None:
            try:
                refusal = self._head_hook(req)
            except Exception:  # a bug must cost one request, not the connection
                log.exception("head check failed")
                refusal = Answer.error(500, "internal server error")
        length = headers.get(b"content-length")
        declared = int(length) if length is not None and length.isdigit() else 0
        if refusal is None and declared > req.max_body:
            refusal = _too_large(req.max_body)
        if refusal is None and not req.streamed and declared:
            refusal = self._reserve(req, declared)
        if refusal is not None:
            req.refusal = refusal
            self._discard = True
            if self._refuse_all is not None or b"transfer-encoding" in headers or length not in (None, b"0"):
                req.keep_alive = False  # its body is not read: the connection ends after the answer
            self._queue(req)
            return
        self._req = req
        self._body_started = time.monotonic()
        transport = self._transport
        waits = self._task is not None or bool(self._pending)
        if not waits and transport is not None and headers.get(b"expect", b"").lower() == b"100-continue":
            transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s for this otherwise
        if req.streamed:
            req.stream = Body(self)
            self._queue(req)  # its handler starts now and reads the body as it comes

    def on_body(self, body: bytes) -> None:
        if self._discard:
            return
        req = self._req
        assert req is not None
        n = self._body_len = self._body_len + len(body)
        refusal = _too_large(req.max_body) if n > req.max_body else None
        if refusal is None and req.stream is None and n > req.held:  # a body of undeclared length
            refusal = self._reserve(req, n)
        if refusal is not None:
            self._discard = True
            self._body = []
            self._body_started = None
            if req.stream is not None:
                req.stream._fail(BodyError(413, f"request body exceeds {req.max_body} bytes"))
            else:
                self._release(req)
                req.refusal = refusal
                req.keep_alive = False
                self._queue(req)
            return
        stream = req.stream
        if stream is None:
            self._body.append(body)
        else:
            stream._feed(body)
            if stream.buffered >= STREAM_BUFFER_BYTES:
                self._flow()

    def on_message_complete(self) -> None:
        self._incoming = False
        self._body_started = None
        req = self._req
        self._req = None
        if self._discard or req is None:
            return
        if req.stream is not None:
            req.stream._finish()
            return
        body = self._body
        req.body = body[0] if len(body) == 1 else b"".join(body)
        self._queue(req)

    # --- request dispatch ------------------------------------------------------------------------
    def _queue(self, req: Request) -> None:
        if not req.keep_alive:
            self._no_more = True
        pending = self._pending
        pending.append(req)
        if self._task is None:
            self._next()
        elif len(pending) >= MAX_PIPELINED and not self._no_more:
            self._no_more = True
            pending[-1].keep_alive = False
            self._flow()

    def _next(self) -> None:
        """Start the next request, unless none waits or the client is not reading its answers."""
        self._current = None
        while True:
            if self.closed or not self._pending or self._write_paused:
                self._task = None
                self._current = None
                self.idle = not self._pending
                self._flow()
                return
            self.idle = False
            req = self._pending.popleft()
            self._keep_alive = req.keep_alive
            self._head_only = req.method == b"HEAD"
            self._chunked = False
            refusal = req.refusal
            if refusal is None:
                break
            self._release(req)
            self.send(refusal.status, refusal.body, extra=refusal.extra)
        self._current = req
        self._task = asyncio.get_running_loop().create_task(self._run(req))
        if self._pending or self._incoming:
            self._flow()

    async def _run(self, req: Request) -> None:
        try:
            await self._handler(req, self)
        except (asyncio.CancelledError, ClientGoneError):
            self._release(req)
            return
        except BodyError as err:  # a streamed body over its limit or malformed, not caught by the handler
            if not self.closed:
                if self._chunked:
                    self.close()
                    return
                self.send(err.status, err.body())
        except Exception:  # a bug must cost one request, not the connection
            log.exception("handler failed")
            if not self.closed:
                if self._chunked:
                    self.close()
                    return
                self.send(500, error_body(500, "internal server error"))
        self._release(req)
        self._task = None
        self._next()

    # --- the body budget -----------------------------------------------------------------------
    def _reserve(self, req: Request, size: int) -> Answer | None:
        """Count ``size`` bytes of ``req``'s buffered body against the server's budget, or refuse it."""
        server = self._server
        more = size - req.held
        if server.body_bytes + more > server.body_budget:
            server.bodies_refused += 1
            return Answer.error(
                OVERLOADED,
                "the server holds as many request bodies as its memory allows; retry shortly",
                code=OVERLOADED_CODE,
                extra=[retry_after(1)],
            )
        server.body_bytes += more
        req.held = size
        return None

    def _release(self, req: Request) -> None:
        """``req``'s body no longer counts against the budget (answered, refused or abandoned)."""
        if req.held:
            self._server.body_bytes -= req.held
            req.held = 0

    def _too_slow(self) -> None:
        """The body being received came slower than the minimum rate: 408, and the connection ends."""
        rate = self._server.limits.min_body_rate
        req = self._req
        self._body_started = None
        self._discard = True
        self._body = []
        if req is not None:
            self._release(req)
            self._req = None if req.stream is None else req
        self._fail_request(
            408,
            f"the request body arrived slower than {rate} bytes a second; send it at once, or a smaller one",
        )

    def _fail_request(self, status: int, message: str) -> None:
        """The client sent what cannot be read on (malformed, too large a head): answer it, in turn, and close."""
        self._parser_dead = True
        req = self._req
        if req is not None and req.stream is not None and not req.stream.done:
            req.stream._fail(BodyError(status, message))  # its handler answers
            self._no_more = True
            self._flow()
            return
        failed = Request(b"", b"", b"", {}, b"")
        failed.keep_alive = False
        failed.refusal = Answer.error(status, message)
        self._queue(failed)

    # --- responses -------------------------------------------------------------------------------
    def _answering(self) -> None:
        """An answer starts: one given before its streamed body was read to the end ends the connection."""
        current = self._current
        if current is not None and current.stream is not None and not current.stream.done:
            self._keep_alive = False
            self._no_more = True
            self._discard = True
            self._body = []

    def send(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """A complete response in one write."""
        if self.closed or self._transport is None:
            return
        if self._current is not None and self._current.stream is not None:
            self._answering()
        head = b"%bcontent-type: %b\r\ncontent-length: %d\r\n" % (
            _status_line(status),
            content_type,
            len(body),
        )
        if extra:
            head += b"".join([name + b": " + value + b"\r\n" for name, value in extra])
        if not self._keep_alive:
            head += b"connection: close\r\n"
        self._transport.write(head + b"\r\n" + (b"" if self._head_only else body))
        if not self._keep_alive:
            self._end()

    def start(self, status: int, headers: list[tuple[bytes, bytes]], first: bytes = b"") -> None:
        """Begin a chunked response (streams); ``first`` is sent as the first chunk in the same write."""
        if self.closed or self._transport is None:
            raise ClientGoneError
        if self._current is not None and self._current.stream is not None:
            self._answering()
        self._chunked = True
        hs = [*headers, (b"transfer-encoding", b"chunked")]
        if not self._keep_alive:
            hs.append((b"connection", b"close"))
        tail = b"\r\n" + (b"%x\r\n%b\r\n" % (len(first), first) if first else b"")
        self._transport.write(_head(status, hs, tail))

    async def chunk(self, data: bytes) -> None:
        """Send one chunk now; waits only if the client is slower than the engine (back-pressure)."""
        await self.write(b"%x\r\n%b\r\n" % (len(data), data) if data else b"")

    def start_sized(self, status: int, headers: list[tuple[bytes, bytes]], length: int, first: bytes) -> None:
        """Begin a response of known length whose body follows in pieces (large engine answers)."""
        if self.closed or self._transport is None:
            raise ClientGoneError
        if self._current is not None and self._current.stream is not None:
            self._answering()
        hs = [*headers, (b"content-length", b"%d" % length)]
        if not self._keep_alive:
            hs.append((b"connection", b"close"))
        self._chunked = True  # a failure now can only be reported by closing the connection
        self._transport.write(_head(status, hs, b"\r\n") + first)

    async def write(self, data: bytes) -> None:
        """Raw body bytes (after :meth:`start_sized`), with back-pressure."""
        if self.closed or self._transport is None:
            raise ClientGoneError
        if data:
            self._transport.write(data)
        if self._write_paused:
            loop = asyncio.get_running_loop()
            self._drain = loop.create_future()
            await self._drain

    def end_sized(self) -> None:
        self._chunked = False
        if not self._keep_alive:
            self._end()

    def end(self) -> None:
        """Finish a chunked response."""
        if self.closed or self._transport is None:
            return
        self._transport.write(b"0\r\n\r\n")
        self._chunked = False
        if not self._keep_alive:
            self._end()

    def _end(self) -> None:
        """The last answer on this connection is written. Closing with unread bytes would reset the
        connection, and the client could lose the answer: when it may still be sending, say we are done
        (FIN) and drop what it sends until it closes, :data:`LINGER_BYTES` or the head timeout, whichever
        comes first."""
        transport = self._transport
        if transport is None or self.closed:
            return
        if not (self._incoming or self._parser_dead) or not transport.can_write_eof():
            self.close()
            return
        self._linger_at = time.monotonic()
        for req in self._pending:
            self._release(req)
        self._pending.clear()
        transport.write_eof()
        self._flow()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()
        self.closed = True

    def expire(self, now: float) -> bool:
        """Close this connection if it has been silent, slow or stuck for too long; True if it was."""
        limits = self._server.limits
        if self._linger_at is not None:
            late = now - self._linger_at > limits.head_timeout_s
        elif self._write_paused:
            late = now - self._write_paused_at > limits.idle_timeout_s  # the client stopped reading
        elif self._read_paused:
            late = False  # waiting on us, not on the client
        elif (
            self._body_started is not None
            and now - self._body_started > limits.head_timeout_s + self._body_len / limits.min_body_rate
        ):
            self._too_slow()  # a body trickled on purpose: each byte would reset the idle timer
            return True
        elif self._incoming and self._req is not None and self._req.stream is not None:
            late = now - self.last_active > limits.idle_timeout_s  # a streamed body that stopped coming
        elif self._head_started is not None and now - self._head_started > limits.head_timeout_s:
            late = True  # a request head that takes this long is trickled on purpose (slowloris)
        else:
            late = self._task is None and now - self.last_active > limits.idle_timeout_s
        if late:
            self.close()
        return late

    def idle_for(self, now: float) -> float:
        """Seconds since the client last sent anything, or 0 while a request is being handled."""
        if self._task is not None:
            return 0.0
        return now - self.last_active

    def peer(self) -> Any:
        return self._transport.get_extra_info("peername") if self._transport else None


class Server:
    """The listener; :meth:`shutdown` stops accepting and closes connections as they go idle."""

    def __init__(self, handler: Handler, limits: Limits | int, head: Head | None = None) -> None:
        self.handler = handler
        self.limits = limits if isinstance(limits, Limits) else Limits(limits)
        self.head = head
        self.connections: set[Connection] = set()
        #: Bytes of buffered request bodies held (reserved at the head when declared), and their budget.
        self.body_bytes = 0
        self.body_budget = self.limits.max_buffered_body_bytes or body_budget(self.limits.max_body_bytes)
        self.bodies_refused = 0
        self.admitted = 0
        self.overflow = 0
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self),
            host,
            port,
            backlog=2048,
            reuse_address=True,
        )
        self._sweeper = loop.create_task(self._sweep())
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def _sweep(self) -> None:
        """Close connections that went silent with nothing in flight (abandoned keep-alives, or
        clients that stopped half-way through a request), that trickle a request head, or that stopped
        reading: one pass every few seconds, no timer per connection on the hot path."""
        limits = self.limits
        period = min(5.0, limits.idle_timeout_s / 2, limits.head_timeout_s / 2)
        while True:
            await asyncio.sleep(period)
            self.close_silent(time.monotonic())

    def close_silent(self, now: float) -> int:
        return sum(conn.expire(now) for conn in list(self.connections))

    async def stop_accepting(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            self._server.close()

    def close_idle(self) -> int:
        """Close idle keep-alive connections; returns how many still have a request in flight."""
        busy = 0
        for conn in list(self.connections):
            if conn.idle:
                conn.close()
            else:
                busy += 1
        return busy

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()

    async def drain(self, grace_s: float, busy: Callable[[], int]) -> None:
        """Stop accepting; let requests in flight (``busy()`` of them) finish within ``grace_s``; close the rest."""
        await self.stop_accepting()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.close_idle() or busy()):
            await asyncio.sleep(0.05)
        self.close_all()
