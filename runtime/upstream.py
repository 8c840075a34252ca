"""Keep-alive HTTP/1.1 connections to engines: asyncio protocol + httptools response parser.

Why our own client: per proxied request it costs one ``transport.write`` and one C parse; aiohttp's
client session adds ~40 us of Python per call (see bench/README.md). The proxy never re-serialises
bodies: it writes the client's bytes through and hands back the engine's bytes as they arrive.

A response is consumed with :meth:`Exchange.head` (status + headers, bounded by the first-byte
timeout) and then :meth:`Exchange.next_chunk` (each bounded by the idle timeout). A connection goes
back to the pool only after its response was read to the end; anything else closes it, which is how
an abandoned request is cancelled on the engine.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import cast

import httptools

MAX_BUFFERED_BYTES = 1 << 20  # stop reading from the engine while this much waits for a slow client


class UpstreamError(Exception):
    """The engine could not be reached or broke the exchange; ``retryable`` if nothing was received."""

    def __init__(self, message: str, *, retryable: bool, kind: str) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.kind = kind  # connect | reset | timeout | protocol


class _Conn(asyncio.Protocol):
    __slots__ = (
        "_buffered",
        "_chunks",
        "_headers",
        "_parser",
        "_paused",
        "_waiter",
        "closed",
        "done",
        "error",
        "got_bytes",
        "headers_done",
        "keep_alive",
        "status",
        "transport",
        "write_paused",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[bytes, bytes] = {}
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers_done = False
        self.done = False
        self.closed = False
        self.keep_alive = True
        self.got_bytes = False
        self.error: UpstreamError | None = None
        self.write_paused = False

    def reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._headers = {}
        self._chunks.clear()
        self._buffered = 0
        self.status = 0
        self.headers_done = False
        self.done = False
        self.got_bytes = False
        self.error = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self.error = UpstreamError(
                f"malformed response from engine: {err}", retryable=False, kind="protocol"
            )
            self.keep_alive = False
            if self.transport is not None:
                self.transport.close()
        self._wake()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.done and self.error is None:
            self.error = UpstreamError(
                f"engine closed the connection{': ' + str(exc) if exc else ''}",
                retryable=not self.got_bytes,
                kind="reset",
            )
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = bool(self._parser.should_keep_alive())
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > MAX_BUFFERED_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.done = True

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout_s: float, what: str) -> None:
        """Until the engine sends something (or the connection breaks); ``UpstreamError`` after ``timeout_s``.

        A bare timer that fails the waiter, not ``asyncio.timeout``: this runs once or more per proxied
        request, and the context manager costs several Python calls and a task lookup each time."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter, timeout_s, what)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def take(self) -> bytes:
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data


def _expire(waiter: asyncio.Future[None], timeout_s: float, what: str) -> None:
    if not waiter.done():
        waiter.set_exception(
            UpstreamError(f"engine sent no {what} within {timeout_s:g}s", retryable=False, kind="timeout")
        )


class Pool:
    """Idle keep-alive connections to one engine replica (LIFO: the warmest socket first)."""

    def __init__(self, host: str, port: int, max_idle: int = 256) -> None:
        self.host = host
        self.port = port
        self.host_header = f"{host}:{port}".encode()
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self.closed = False  # the replica left the fleet: connections in use close when done

    async def _connect(self, timeout_s: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(_Conn, self.host, self.port)
        except TimeoutError:
            raise UpstreamError(
                f"connect to {self.host}:{self.port} timed out", retryable=True, kind="connect"
            ) from None
        except OSError as err:
            raise UpstreamError(
                f"connect to {self.host}:{self.port} failed: {err}", retryable=True, kind="connect"
            ) from None
        return conn

    def take_idle(self) -> _Conn | None:
        """The warmest idle connection, reset for a new exchange (it may have been closed by the engine)."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reset()
                return conn
        return None

    async def acquire(self, timeout_s: float) -> tuple[_Conn, bool]:
        """A connection and whether it was reused (a reused one may have been closed by the engine)."""
        conn = self.take_idle()
        if conn is not None:
            return conn, True
        return await self._connect(timeout_s), False

    def release(self, conn: _Conn) -> None:
        if (
            not self.closed  # the replica left the fleet: nobody would ever take this connection again
            and conn.done
            and conn.keep_alive
            and not conn.closed
            and conn.error is None
            and len(self._idle) < self.max_idle
        ):
            self._idle.append(conn)
        elif conn.transport is not None and not conn.closed:
            conn.transport.close()

    def close(self) -> None:
        self.closed = True
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()


class Exchange:
    """One request/response with an engine over a pooled connection."""

    __slots__ = (
        "_conn",
        "_connect_timeout_s",
        "_finished",
        "_pool",
        "_request",
        "_reused",
        "headers",
        "status",
    )

    def __init__(
        self, pool: Pool, conn: _Conn, request: bytes, reused: bool, connect_timeout_s: float
    ) -> None:
        self._pool = pool
        self._conn = conn
        self._request = request
        self._reused = reused
        self._connect_timeout_s = connect_timeout_s
        self._finished = False
        self.status = 0
        self.headers: dict[bytes, bytes] = {}

    @classmethod
    async def open(cls, pool: Pool, request: bytes, connect_timeout_s: float) -> Exchange:
        """Send the request (head and body already joined)."""
        conn = pool.take_idle()  # the usual case, without another coroutine
        reused = conn is not None
        if conn is None:
            conn = await pool._connect(connect_timeout_s)
        assert conn.transport is not None
        conn.transport.write(request)
        return cls(pool, conn, request, reused, connect_timeout_s)

    @classmethod
    async def open_streaming(cls, pool: Pool, head: bytes, connect_timeout_s: float) -> Exchange:
        """Send a request head whose body follows in pieces (:meth:`send`), on a new connection: a body
        sent in part cannot be sent again on another if a pooled one turns out closed."""
        conn = await pool._connect(connect_timeout_s)
        assert conn.transport is not None
        conn.transport.write(head)
        return cls(pool, conn, b"", False, connect_timeout_s)

    async def send(self, data: bytes, timeout_s: float) -> bool:
        """More of the request body; waits while the peer reads slower than we write. False when the peer
        answered (or failed) already and wants no more of it."""
        conn = self._conn
        if conn.headers_done or conn.error is not None or conn.closed or conn.transport is None:
            return False
        conn.transport.write(data)
        while conn.write_paused and not conn.headers_done and conn.error is None:
            await conn.wait(timeout_s, "progress reading the request body")
        return not conn.headers_done and conn.error is None

    @classmethod
    async def complete(
        cls, pool: Pool, request: bytes, timeout_s: float, connect_timeout_s: float
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        """One request read to the end within ``timeout_s`` (raises ``TimeoutError``) -> status, headers, body.

        On any failure or cancellation the connection is closed, which is how the engine learns to stop; an
        answer read to the end leaves it in the pool.
        """
        ex: Exchange | None = None
        try:
            async with asyncio.timeout(timeout_s):
                ex = await cls.open(pool, request, connect_timeout_s)
                await ex.head(timeout_s)
                raw = await ex.read_all(timeout_s)
        except BaseException:
            if ex is not None:
                ex.abort()
            raise
        return ex.status, ex.headers, raw

    async def head(self, timeout_s: float) -> None:
        """Wait for the status line and headers.

        A reused keep-alive socket that the engine had closed before answering is replaced once by a
        fresh connection to the same engine (the request never reached it), as HTTP clients do.
        """
        conn = self._conn
        while not conn.headers_done:
            err = conn.error
            if err is not None:
                if self._reused and err.retryable and err.kind == "reset":
                    self._reused = False
                    conn = self._conn = await self._pool._connect(self._connect_timeout_s)
                    assert conn.transport is not None
                    conn.transport.write(self._request)
                    continue
                raise err
            await conn.wait(timeout_s, "response")
        self.status = conn.status
        self.headers = conn._headers

    @property
    def drained(self) -> bool:
        """The whole body arrived and was taken."""
        return self._conn.done and not self._conn._chunks

    def whole_body(self) -> bytes | None:
        """The entire body when it has all arrived already (the usual small answer), else None; no coroutine."""
        conn = self._conn
        if not conn.done:
            return None
        data = conn.take() if conn._chunks else b""
        self.finish()
        return data

    async def next_chunk(self, timeout_s: float) -> bytes | None:
        """The body bytes received since the last call, or None at the end of the response."""
        conn = self._conn
        while True:
            if conn._chunks:
                data = conn.take()
                if conn.done:
                    self.finish()  # the body is complete: the connection goes back to the pool now
                return data
            if conn.done:
                self.finish()
                return None
            if conn.error is not None:
                raise conn.error
            await conn.wait(timeout_s, "data")

    async def read_all(self, timeout_s: float) -> bytes:
        parts = []
        while (chunk := await self.next_chunk(timeout_s)) is not None:
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def finish(self) -> None:
        """Return the connection to the pool if the response was read to the end; otherwise close it."""
        if self._finished:
            return
        self._finished = True
        self._pool.release(self._conn)

    def abort(self) -> None:
        if self._finished:
            return
        self._finished = True
        conn = self._conn
        conn.keep_alive = False
        if conn.transport is not None and not conn.closed:
            conn.transport.close()
