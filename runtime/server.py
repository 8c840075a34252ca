"""A lean HTTP/1.1 server: asyncio protocol + httptools (llhttp) parser, nothing else.

Shared by the router and the batcher. Why not aiohttp or an ASGI stack: the router's budget is
~120 us of CPU per proxied request, and a bare aiohttp proxy already spends ~160 us (bench/README.md
has the numbers). Per request this server does one C parse, one task, and one ``transport.write``
per response (or per streamed chunk); there is no middleware chain, no request object graph and no
header multidict.

Scope is deliberately small: keep-alive, Content-Length and chunked request bodies, a body size
limit (413), chunked streaming responses with write back-pressure, and cancellation of the handler
when the client goes away (which is how a disconnect reaches the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools

from runtime.http import REASONS, error_body

log = logging.getLogger("inferstack.server")

Headers = dict[bytes, bytes]


class Request:
    """One parsed request; header names are lower-case bytes."""

    __slots__ = ("body", "headers", "keep_alive", "method", "path", "query")

    def __init__(self, method: bytes, path: bytes, query: bytes, headers: Headers, body: bytes) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = True


class _HeadTooLargeError(Exception):
    """Raised inside the parser's callbacks: the request head is over the limit (answered 431)."""


class ClientGoneError(Exception):
    """The client closed the connection; whatever we were doing for it can stop."""


Handler = Callable[[Request, "Connection"], Awaitable[None]]
#: The body limit for a request target, when some paths take larger bodies than the rest (uploads).
BodyLimit = Callable[[bytes], int]


def _head(status: int, headers: list[tuple[bytes, bytes]], tail: bytes) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, "Unknown").encode())]
    for name, value in headers:
        lines.append(name + b": " + value + b"\r\n")
    lines.append(tail)
    return b"".join(lines)


class Connection(asyncio.Protocol):
    """One client connection; requests on it are handled one at a time, in order."""

    def __init__(
        self,
        handler: Handler,
        max_body_bytes: int,
        connections: set[Connection],
        max_header_bytes: int | None = None,
        body_limit: BodyLimit | None = None,
    ) -> None:
        self._handler = handler
        self._default_max_body = self._max_body = max_body_bytes
        self._body_limit = body_limit
        self._max_head = max_header_bytes
        self._head_bytes = 0
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: Headers = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._too_large = False
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self.closed = False
        self.idle = True  # no request in flight (graceful shutdown closes idle connections at once)
        self._chunked = False
        self._keep_alive = True
        self._head_only = False
        self.last_active = time.monotonic()

    # --- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio and uvloop both set this today; a streamed token must never wait for an ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserCallbackError as err:
            if isinstance(err.__context__, _HeadTooLargeError):
                self._reject(431, f"request line and headers exceed {self._max_head} bytes")
            else:
                self._reject(400, "malformed HTTP request")
        except httptools.HttpParserError:
            self._reject(400, "malformed HTTP request")
        if self._too_large and self._task is None and not self.closed:
            # answer an oversized body at once instead of reading all of it first
            self._reject(413, f"request body exceeds {self._max_body} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._connections.discard(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ClientGoneError())

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # --- httptools callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._max_body = self._default_max_body
        self._head_bytes = 0
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_len = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value
        self._count_head(len(name) + len(value) + 4)

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._max_head is not None and self._head_bytes > self._max_head:
            raise _HeadTooLargeError

    def on_headers_complete(self) -> None:
        if self._body_limit is not None:
            self._max_body = self._body_limit(self._url)
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            self._too_large = True
        elif self._headers.get(b"expect", b"").lower() == b"100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s for this otherwise

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._body_len += len(body)
        if self._body_len > self._max_body:
            self._too_large = True
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = self._url
        qpos = url.find(b"?")
        path, query = (url, b"") if qpos < 0 else (url[:qpos], url[qpos + 1 :])
        method: bytes = self._parser.get_method()
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        req = Request(method, path, query, self._headers, body)
        req.keep_alive = bool(self._parser.should_keep_alive())
        if self._too_large:
            req.keep_alive = False
            req.path = b"\x00too-large"  # answered by the dispatcher without calling the handler
        self._pending.append(req)
        if self._task is None:
            self._next()

    # --- request dispatch ------------------------------------------------------------------------
    def _next(self) -> None:
        if self.closed or not self._pending:
            self._task = None
            self.idle = True
            return
        self.idle = False
        req = self._pending.popleft()
        self._keep_alive = req.keep_alive
        self._head_only = req.method == b"HEAD"
        self._chunked = False
        if req.path == b"\x00too-large":
            self.send(413, error_body(413, f"request body exceeds {self._max_body} bytes"))
            self._task = None
            return
        self._task = asyncio.get_running_loop().create_task(self._run(req))

    async def _run(self, req: Request) -> None:
        try:
            await self._handler(req, self)
        except (asyncio.CancelledError, ClientGoneError):
            return
        except Exception:  # a bug must cost one request, not the connection
            log.exception("handler failed")
            if not self.closed:
                if self._chunked:
                    self.close()
                    return
                self.send(500, error_body(500, "internal server error"))
        self._task = None
        self._next()

    def _reject(self, status: int, message: str) -> None:
        self._keep_alive = False
        self.send(status, error_body(status, message))

    # --- responses -------------------------------------------------------------------------------
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
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        if extra:
            headers.extend(extra)
        if not self._keep_alive:
            headers.append((b"connection", b"close"))
        self._transport.write(_head(status, headers, b"\r\n") + (b"" if self._head_only else body))
        if not self._keep_alive:
            self.close()

    def start(self, status: int, headers: list[tuple[bytes, bytes]], first: bytes = b"") -> None:
        """Begin a chunked response (streams); ``first`` is sent as the first chunk in the same write."""
        if self.closed or self._transport is None:
            raise ClientGoneError
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
        if self._paused:
            loop = asyncio.get_running_loop()
            self._drain = loop.create_future()
            await self._drain

    def end_sized(self) -> None:
        self._chunked = False
        if not self._keep_alive:
            self.close()

    def end(self) -> None:
        """Finish a chunked response."""
        if self.closed or self._transport is None:
            return
        self._transport.write(b"0\r\n\r\n")
        self._chunked = False
        if not self._keep_alive:
            self.close()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()
        self.closed = True

    def idle_for(self, now: float) -> float:
        """Seconds since the client last sent anything, or 0 while a request is being handled."""
        if self._task is not None:
            return 0.0
        return now - self.last_active

    def peer(self) -> Any:
        return self._transport.get_extra_info("peername") if self._transport else None


class Server:
    """The listener; :meth:`shutdown` stops accepting and closes connections as they go idle."""

    def __init__(
        self,
        handler: Handler,
        max_body_bytes: int,
        idle_timeout_s: float = 75.0,
        max_header_bytes: int | None = None,
        body_limit: BodyLimit | None = None,
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.body_limit = body_limit
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(
                self.handler, self.max_body_bytes, self.connections, self.max_header_bytes, self.body_limit
            ),
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
        clients that stopped half-way through a request): one pass every few seconds, no timer per
        connection on the hot path."""
        period = min(5.0, self.idle_timeout_s / 2)
        while True:
            await asyncio.sleep(period)
            self.close_silent(time.monotonic())

    def close_silent(self, now: float) -> int:
        closed = 0
        for conn in list(self.connections):
            if conn.idle_for(now) > self.idle_timeout_s:
                conn.close()
                closed += 1
        return closed

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
