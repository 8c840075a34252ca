"""Attacks on the services' own HTTP server (runtime/server.py), over real sockets on 127.0.0.1: a client
without a key, a huge upload, a trickled request head, a client that pipelines or never reads, too many
connections and too many headers. Each is answered with the service's JSON error or cut off, and costs the
service a bounded amount of memory (peak RSS read from /proc)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.api_keys import hash_key
from runtime.batch_service.api import UPLOAD_SLACK_BYTES
from runtime.config import RuntimeConfig
from runtime.picker.service import Picker
from runtime.picker.service import start as start_picker
from runtime.server import MAX_PIPELINED, Connection, Request, Server
from tests.runtime.batch_service.harness import BatchStack
from tests.runtime.batcher.conftest import batcher_config, start_batcher
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg

MIB = 1 << 20
KEY = "sk-alice"
FILE_LIMIT = 32 * MIB
HEAD_TIMEOUT_S = 1.0
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


# --- the services, started once ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread()
    yield loop_thread
    loop_thread.stop()


@pytest.fixture(scope="module")
def double(lt: LoopThread) -> Iterator[Double]:
    d = Double(name="d0")
    lt.run(d.start())
    yield d
    lt.run(d.stop())


@pytest.fixture(scope="module")
def stack(lt: LoopThread, double: Double, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BatchStack]:
    """Engine double -> router (in this process, keys required) -> batch service (a process)."""
    tmp = tmp_path_factory.mktemp("stack")
    s = BatchStack(
        lt,
        tmp,
        [double],
        batches={"max_file_bytes": FILE_LIMIT},
        router_extra={
            "require_api_key": True,
            "api_keys": [{"name": "alice", "sha256": hash_key(KEY)}],
            "request_head_timeout_s": HEAD_TIMEOUT_S,
        },
    )
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def router(stack: BatchStack) -> RouterUnderTest:
    assert stack.router is not None
    return stack.router


@pytest.fixture
def make_router(lt: LoopThread, double: Double) -> Iterator[Callable[..., RouterUnderTest]]:
    made: list[RouterUnderTest] = []

    def make(**settings: Any) -> RouterUnderTest:
        r = RouterUnderTest(lt, router_cfg([double.url], **settings)).start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.stop()


# --- raw HTTP ----------------------------------------------------------------------------------------
def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def read_answer(sock: socket.socket, buffer: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """One response (Content-Length framed) from ``sock``; ``buffer`` keeps bytes read past it."""
    data = buffer if buffer is not None else bytearray()
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {bytes(data)!r}"
        data += chunk
    head, _, _ = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    start = len(head) + 4
    end = start + int(headers.get("content-length", "0"))
    while len(data) < end:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside an answer"
        data += chunk
    body = bytes(data[start:end])
    del data[:end]
    return int(lines[0].split()[1]), headers, body


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, TimeoutError):
        return False
    return True


def error_of(body: bytes) -> dict[str, Any]:
    error = json.loads(body)["error"]
    assert isinstance(error, dict) and error["message"] and error["type"], error
    return error


def peak_rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


# --- 1. keys are checked at the request head; uploads stream ---------------------------------------------
@pytest.mark.parametrize(
    ("target", "auth", "length", "status"),
    [
        ("/v1/files", "", FILE_LIMIT, 401),  # an upload without a key
        ("/v1/files", "authorization: Bearer sk-wrong\r\n", FILE_LIMIT, 401),
        ("/v1/chat/completions", "", 8 * MIB, 401),
        ("/v1/filesX", f"authorization: Bearer {KEY}\r\n", FILE_LIMIT, 404),  # not the upload path
        (
            "/v1/files/file-1",
            f"authorization: Bearer {KEY}\r\n",
            FILE_LIMIT,
            413,
        ),  # only POST /v1/files uploads
    ],
    ids=["upload without key", "upload with a wrong key", "chat without key", "/v1/filesX", "/v1/files/ID"],
)
def test_a_large_post_is_answered_at_its_head_before_any_body_byte(
    router: RouterUnderTest, target: str, auth: str, length: int, status: int
) -> None:
    with connect(router.port) as sock:
        sock.sendall(
            f"POST {target} HTTP/1.1\r\nhost: x\r\n{auth}content-type: multipart/form-data; boundary=b\r\n"
            f"content-length: {length}\r\n\r\n".encode()
        )
        got, headers, body = read_answer(sock)  # no body byte was sent
        assert got == status, body
        assert headers["connection"] == "close"
        if status == 401:
            assert error_of(body)["code"] == "invalid_api_key"
        assert closed_by_peer(sock)


def _form(size: int) -> tuple[bytes, bytes, bytes]:
    pre = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
    )
    return pre, b"\r\n--b--\r\n", b'{"custom_id": "x"}\n' * (size // 19) + b"\n" * (size % 19)


def _upload(port: int, size: int, chunked: bool = False) -> tuple[int, bytes]:
    """Upload a ``size``-byte file, written to the socket in 256 KiB pieces (never whole in this process)."""
    pre, post, _ = _form(0)
    piece = b'{"custom_id": "x"}\n' * 13797  # 262,143 bytes
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {len(pre) + size + len(post)}"
    with connect(port, 60) as sock:
        sock.sendall(
            f"POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
            f"content-type: multipart/form-data; boundary=b\r\n{framing}\r\n\r\n".encode()
        )

        def send(data: bytes) -> None:
            sock.sendall(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)

        try:
            send(pre)
            left = size
            while left:
                data = piece[:left]
                send(data)
                left -= len(data)
            send(post)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused half-way: the answer is waiting
        status, _, body = read_answer(sock)
    return status, body


def test_an_upload_streams_to_the_file_store_in_bounded_memory(
    stack: BatchStack, router: RouterUnderTest
) -> None:
    assert stack.proc is not None
    service_before = peak_rss_mib(stack.proc.pid)
    reset_peak_rss()
    router_before = peak_rss_mib()
    status, body = _upload(router.port, FILE_LIMIT)
    router_grew = peak_rss_mib() - router_before
    service_grew = peak_rss_mib(stack.proc.pid) - service_before
    assert status == 200, body
    uploaded = json.loads(body)
    assert uploaded["bytes"] == FILE_LIMIT
    assert (stack.state_dir / "files" / "files" / uploaded["id"]).stat().st_size == FILE_LIMIT
    # held whole, the file would cost each at least its size (32 MiB); streamed, a few buffers
    assert router_grew < FILE_LIMIT / MIB / 3, f"the router's peak RSS grew {router_grew:.1f} MiB"
    assert service_grew < FILE_LIMIT / MIB / 3, f"the batch service's peak RSS grew {service_grew:.1f} MiB"


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_an_upload_over_the_limit_is_refused_and_leaves_nothing_behind(
    stack: BatchStack, router: RouterUnderTest, chunked: bool
) -> None:
    files = stack.state_dir / "files" / "files"

    def stored() -> set[Path]:
        return set(files.iterdir()) if files.exists() else set()

    before = stored()
    status, body = _upload(router.port, FILE_LIMIT + UPLOAD_SLACK_BYTES + 1, chunked=chunked)
    error = error_of(body)
    if chunked:  # the router's running limit (413) or the batch service's file limit (400), whichever first
        assert (status, error["code"]) in ((413, None), (400, "file_too_large")), body
    else:  # declared too large: refused at the head
        assert status == 413 and "exceeds" in error["message"], body
    _wait("the refused upload left a file behind", lambda: stored() == before)  # nor a temporary one


# --- 12. the server: heads, pipelining, backpressure, connections ---------------------------------------
def test_a_trickled_request_head_is_cut_off_at_its_deadline(router: RouterUnderTest) -> None:
    with connect(router.port, timeout_s=0.2) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        for i in range(40):  # one header line per 0.2 s: 8 s of trickle at most
            try:
                sock.sendall(b"x-%d: y\r\n" % i)
                if sock.recv(100) == b"":
                    break  # closed by the server
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("the server kept reading a request head trickled over 8 s")
    assert i * 0.2 < HEAD_TIMEOUT_S + 4  # the deadline (1 s) and one sweep, with room for a loaded machine


def _headers(n: int, size: int = 10) -> bytes:
    return b"".join(b"x-%d: %b\r\n" % (i, b"v" * size) for i in range(n))


@pytest.fixture(scope="module")
def services(lt: LoopThread, stack: BatchStack, router: RouterUnderTest) -> Iterator[dict[str, int]]:
    """Every service on the lean server, by name -> port: the router, the batch service, the batcher, the
    picker's HTTP listener."""
    batcher = lt.run(start_batcher(batcher_config(["http://127.0.0.1:9"])))
    cfg = RuntimeConfig.model_validate(
        {"models": [{"name": "m", "static_backends": [{"url": "http://127.0.0.1:9"}]}]}
    )
    picker = lt.run(start_picker(Picker(cfg), port=0, metrics_port=0))
    try:
        yield {
            "router": router.port,
            "batch service": stack.port,
            "batcher": int(batcher.url.rsplit(":", 1)[1]),
            "picker": picker.metrics_port,
        }
    finally:
        lt.run(batcher.close())
        lt.run(picker.stop(0))


@pytest.mark.parametrize("service", ["router", "batch service", "batcher", "picker"])
@pytest.mark.parametrize(
    ("headers", "says"),
    [
        (_headers(101), "at most 100 headers"),
        (_headers(1, 17 * 1024), "exceed 16384 bytes"),
        # a repeated X-Forwarded-For is kept empty (neither copy is trusted), but its bytes still count
        (b"".join(b"x-forwarded-for: %b\r\n" % (b"1" * 9 * 1024) for _ in range(2)), "exceed 16384 bytes"),
    ],
    ids=["101 headers", "a 17 KiB header", "two 9 KiB X-Forwarded-For"],
)
def test_too_many_or_too_large_headers_are_a_431_on_every_service(
    services: dict[str, int], service: str, headers: bytes, says: str
) -> None:
    with connect(services[service]) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n")
        status, _, body = read_answer(sock)
        assert status == 431
        error = error_of(body)
        assert error["type"] == "invalid_request_error" and says in error["message"], error
        assert closed_by_peer(sock)
    with connect(services[service]) as sock:  # the service is fine
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_answer(sock)[0] == 200


def _wait(what: str, condition: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_pipelined_requests_are_bounded_and_answered_in_order(
    router: RouterUnderTest, double: Double
) -> None:
    import asyncio

    ahead = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 200
    chat = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\ncontent-length: %d\r\n\r\n%b"
    seen = len(double.requests)
    double.hold = asyncio.Event()  # the chat request waits in the engine while 200 more are sent behind it
    try:
        with connect(router.port) as sock:
            sock.sendall(chat % (KEY.encode(), len(CHAT), CHAT) + ahead)
            _wait("the chat request never reached the engine", lambda: len(double.requests) > seen)
            double.release()
            buffer = bytearray()
            answers = [read_answer(sock, buffer) for _ in range(1 + MAX_PIPELINED)]
            assert [a[0] for a in answers] == [200] * (1 + MAX_PIPELINED)
            assert b"chat.completion" in answers[0][2] and answers[1][2] == b'{"status":"ok"}'
            assert answers[-1][1]["connection"] == "close"  # the rest is not read: the client sends it again
            assert closed_by_peer(sock)
    finally:
        double.release()
        double.hold = None


def test_answers_wait_for_a_client_that_does_not_read_them(lt: LoopThread) -> None:
    """A whole answer is one ``send`` (the router's ``/metrics``, a small engine answer): the next request
    waits while the client does not read, instead of queueing answer after answer in memory."""

    async def answer(req: Request, conn: Connection) -> None:
        conn.send(200, b"x" * (512 * 1024), b"text/plain")

    server = Server(answer, 1024)
    port = lt.run(server.start("127.0.0.1", 0))
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads slowly, if at all
        sock.settimeout(30)
        sock.connect(("127.0.0.1", port))
        with sock:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n" * 16)  # 8 MiB of answers

            def stalled() -> bool:
                async def probe() -> tuple[int, bool]:
                    if not server.connections:
                        return 0, False  # not accepted yet
                    (conn,) = server.connections
                    waiting = getattr(conn, "_write_paused", False) and bool(conn._pending)
                    return conn._transport.get_write_buffer_size(), waiting

                buffered, waiting = lt.run(probe())
                assert buffered < 3 * MIB, (
                    f"{buffered / MIB:.1f} MiB of answers queued for a client not reading"
                )
                return waiting  # the next requests wait for the client to read

            _wait("the server never waited for the client", stalled)
            buffer = bytearray()  # reading again: every answer, in order
            answers = [read_answer(sock, buffer) for _ in range(16)]
        assert all(a[0] == 200 and len(a[2]) == 512 * 1024 for a in answers)
    finally:
        lt.run(server.stop_accepting())
        server.close_all()


def test_a_streamed_body_after_its_head_is_read_to_its_end_on_a_closing_connection(lt: LoopThread) -> None:
    """``Connection: close`` means no request after this one, not that this one's body is done: the server
    reads the body on to its end. The client sends the body only after the server's ``100 Continue``, so head
    and body arrive in two reads (as they may under load: the upload that got no answer in a CI run)."""

    def stream(req: Request) -> None:
        req.streamed = True

    async def count(req: Request, conn: Connection) -> None:
        assert req.stream is not None
        size = 0
        async for chunk in req.stream:
            size += len(chunk)
        conn.send(200, str(size).encode(), b"text/plain")

    server = Server(count, 1024, head=stream)
    port = lt.run(server.start("127.0.0.1", 0))
    try:
        with connect(port) as sock:
            sock.sendall(
                b"POST /upload HTTP/1.1\r\nhost: x\r\nconnection: close\r\nexpect: 100-continue\r\n"
                b"content-length: 5\r\n\r\n"
            )
            buffer = bytearray()
            assert read_answer(sock, buffer)[0] == 100  # the head was read and handled
            sock.sendall(b"hello")
            status, headers, body = read_answer(sock, buffer)
            assert (status, body) == (200, b"5")
            assert headers["connection"] == "close" and closed_by_peer(sock)
    finally:
        lt.run(server.stop_accepting())
        server.close_all()


def test_connections_past_the_cap_get_a_503_and_are_closed(make_router) -> None:
    r = make_router(max_connections=4)
    held = [connect(r.port) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            assert read_answer(sock)[0] == 200
        with connect(r.port) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            status, headers, body = read_answer(extra)
            assert status == 503 and headers["connection"] == "close" and headers["retry-after"] == "1"
            assert error_of(body)["code"] == "too_many_connections"
            assert closed_by_peer(extra)
        held.pop().close()
        _wait("the closed connection was never let go", lambda: r.call(lambda: r.server.admitted) == 3)
        with connect(r.port) as again:
            again.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            assert read_answer(again)[0] == 200
    finally:
        for sock in held:
            sock.close()


# --- 13. bodies: a minimum pace, and a budget of buffered bytes (issue #34 hardening) --------------------
def _trickle_until_answered(sock: socket.socket, limit_s: float = 20) -> tuple[int, dict[str, str], bytes]:
    """Send one byte each time the socket's 0.2 s read timeout passes, until the server answers; each byte
    would reset an idle timer, so only a deadline on the body's pace cuts this client off."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            sock.sendall(b" ")
            first = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            pytest.fail("the connection was reset instead of answered")
        assert first, "the connection closed without an answer"
        sock.settimeout(10)
        return read_answer(sock, bytearray(first))
    pytest.fail(f"the server kept reading a body trickled over {limit_s} s")


def _buffered(r: RouterUnderTest) -> int:
    """Bytes of request bodies the router's server counts against its budget now."""
    server = r.server
    assert server is not None
    return r.call(lambda: server.body_bytes)


def test_a_trickled_buffered_body_is_answered_408(router: RouterUnderTest) -> None:
    body = CHAT + b" " * MIB
    with connect(router.port, timeout_s=0.2) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
            % (KEY.encode(), len(body), body[:1024])
        )
        status, headers, answer = _trickle_until_answered(sock)
        assert status == 408 and headers["connection"] == "close", answer
        assert "slower than" in error_of(answer)["message"]
    _wait("the body still counts against the budget", lambda: _buffered(router) == 0)


def test_a_trickled_upload_is_answered_408(router: RouterUnderTest) -> None:
    pre, _, lines = _form(16 * 1024)
    with connect(router.port, timeout_s=0.2) as sock:
        sock.sendall(
            f"POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
            f"content-type: multipart/form-data; boundary=b\r\ncontent-length: {FILE_LIMIT}\r\n\r\n".encode()
            + pre
            + lines
        )
        status, headers, answer = _trickle_until_answered(sock)
        assert status == 408 and headers["connection"] == "close", answer


def test_buffered_bodies_past_the_budget_are_refused_503(make_router) -> None:
    r = make_router()
    server = r.server
    assert server is not None
    r.call(lambda: setattr(server, "body_budget", 2 * MIB))  # as a 8 MiB container's server would have
    body = CHAT + b" " * (MIB - len(CHAT))
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    held = [connect(r.port) for _ in range(2)]
    try:
        for sock in held:  # two slow clients: half a body each, the rest never sent
            sock.sendall(head + body[: MIB // 2])
        _wait("the bodies were never counted", lambda: _buffered(r) == 2 * MIB)
        with connect(r.port) as third:
            third.sendall(head)
            status, headers, answer = read_answer(third)
            assert status == 503 and headers["retry-after"] == "1", answer
            assert error_of(answer)["code"] == "overloaded"
            assert closed_by_peer(third)
        held.pop().close()  # a slow client gone: its reservation is given back
        _wait("a closed connection's body still counts", lambda: _buffered(r) == MIB)
        with connect(r.port) as fourth:
            fourth.sendall(head + body)
            assert read_answer(fourth)[0] == 200
        _wait("an answered body still counts", lambda: _buffered(r) == MIB)
    finally:
        for sock in held:
            sock.close()
