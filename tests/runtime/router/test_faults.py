"""Fault injection with engine doubles: retries, breakers, timeouts, broken streams, overload."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from runtime.router.replicas import Circuit

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metric(r, prefix: str) -> float:
    text = r.metrics()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_connection_refused_is_retried_on_another_replica(doubles, make_router) -> None:
    (d,) = doubles(1)
    dead = f"http://127.0.0.1:{_free_port()}"
    r = make_router([dead, d.url], default_strategy={"name": "round_robin"})
    for _ in range(6):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert len(d.requests) == 6
    assert _metric(r, "inferstack_router_retries_total") >= 1


def test_503_is_retried_and_opens_the_breaker(doubles, make_router) -> None:
    bad, good = doubles(2)
    bad.mode = "503"
    r = make_router([bad.url, good.url], default_strategy={"name": "round_robin"}, breaker_failures=2)
    for _ in range(10):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    # after two failures the circuit is open and the bad replica gets no more traffic
    assert len(bad.requests) == 2
    state = r.call(lambda: r.router.fleet.models["m"].by_url[bad.url].breaker.state)
    assert state is Circuit.OPEN
    assert 'inferstack_router_circuit_state{backend="' + bad.url + '",model="m"} 2.0' in r.metrics()


def test_all_replicas_failing_gives_a_502_family_error_not_a_hang(doubles, make_router) -> None:
    a, b = doubles(2, mode="503")
    r = make_router([a.url, b.url], retries_max=1)
    status, _, body = r.request("POST", "/v1/chat/completions", CHAT)
    assert status == 503
    assert json.loads(body)["error"]["code"] == "upstream_error"
    assert len(a.requests) + len(b.requests) == 2


def test_retry_budget_caps_retries(doubles, make_router) -> None:
    a, b = doubles(2, mode="503")
    r = make_router([a.url, b.url], retries_max=1, retry_budget_ratio=0.0, breaker_failures=100)
    for _ in range(4):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 503
    assert len(a.requests) + len(b.requests) == 4  # zero budget: no retries at all


def test_hang_before_first_byte_times_out_and_is_retried(doubles, make_router) -> None:
    hung, good = doubles(2)
    hung.mode = "hang"
    r = make_router(
        [hung.url, good.url], default_strategy={"name": "round_robin"}, first_byte_timeout_ms=1000
    )
    for _ in range(2):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert len(hung.requests) >= 1


def test_hang_everywhere_is_a_504(doubles, make_router) -> None:
    (hung,) = doubles(1, mode="hang")
    r = make_router([hung.url], first_byte_timeout_ms=150)
    status, _, body = r.request("POST", "/v1/chat/completions", CHAT)
    assert status == 504
    assert "within" in json.loads(body)["error"]["message"]


def test_reset_before_answer_and_garbage_and_wrong_content_type_are_retried(doubles, make_router) -> None:
    for mode in ("reset_before", "garbage", "wrong_ctype"):
        bad, good = doubles(2)
        bad.mode = mode
        r = make_router([bad.url, good.url], default_strategy={"name": "round_robin"})
        for _ in range(4):
            status, _, _ = r.request("POST", "/v1/chat/completions", CHAT)
            assert status == 200, mode
        assert bad.requests, mode


def _stream_events(port: int, body: dict) -> tuple[int, list[bytes]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}).encode())
    resp = conn.getresponse()
    raw = resp.read()  # raises if the chunked framing is broken
    conn.close()
    return resp.status, [e for e in raw.split(b"\n\n") if e]


def test_reset_mid_stream_ends_with_an_error_event(doubles, make_router) -> None:
    (d,) = doubles(1, mode="reset_mid_stream", chunks=5)
    r = make_router([d.url])
    status, events = _stream_events(r.port, CHAT)
    assert status == 200
    assert events[0].startswith(b"data: {")
    last = json.loads(events[-1][6:])
    assert last["error"]["code"] == "stream_error"


def test_slow_trickle_is_relayed_and_idle_timeout_cuts_a_stalled_stream(doubles, make_router) -> None:
    (d,) = doubles(1, mode="trickle", chunks=3, trickle_s=0.05)
    r = make_router([d.url], stream_idle_timeout_ms=2000)
    status, events = _stream_events(r.port, CHAT)
    assert status == 200 and events[-1] == b"data: [DONE]"
    d.trickle_s = 1.0
    r2 = make_router([d.url], stream_idle_timeout_ms=200)
    status, events = _stream_events(r2.port, CHAT)
    assert status == 200
    assert json.loads(events[-1][6:])["error"]["code"] == "stream_error"


def test_client_disconnect_mid_stream_cancels_the_engine_request(doubles, make_router, lt) -> None:
    (d,) = doubles(1, mode="trickle", chunks=50, trickle_s=0.05)
    r = make_router([d.url])
    sock = socket.create_connection(("127.0.0.1", r.port))
    body = json.dumps({**CHAT, "stream": True}).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    assert sock.recv(100).startswith(b"HTTP/1.1 200")
    sock.close()
    for _ in range(100):
        if d.cancelled:
            break
        threading.Event().wait(0.05)
    assert d.cancelled == 1
    for _ in range(100):
        if r.call(lambda: r.router.inflight) == 0:
            break
        threading.Event().wait(0.05)
    assert r.call(lambda: r.router.fleet.models["m"].replicas[0].inflight) == 0


def _until(cond, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.01)
    return True


def test_full_replicas_queue_then_503_overloaded_with_retry_after(doubles, make_router) -> None:
    (d,) = doubles(1, hold=asyncio.Event())  # the first request holds the only slot until released
    r = make_router([d.url], cap=1, queue_max_requests=1, queue_deadline_ms=20000)
    with ThreadPoolExecutor(3) as pool:
        try:
            first = pool.submit(r.request, "POST", "/v1/chat/completions", CHAT)
            assert _until(lambda: r.call(lambda: r.router.fleet.models["m"].replicas[0].inflight) == 1)
            second = pool.submit(r.request, "POST", "/v1/chat/completions", CHAT)  # waits in line
            assert _until(lambda: r.call(lambda: len(r.router.fleet.models["m"].queue)) == 1)
            status, headers, body = r.request("POST", "/v1/chat/completions", CHAT)  # line is full
        finally:
            d.release()
        assert status == 503  # the service is full: not the client's own limit (that is 429)
        assert int(headers["retry-after"]) >= 1
        error = json.loads(body)["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "overloaded")
        assert first.result()[0] == 200
        assert second.result()[0] == 200


def test_queue_deadline_gives_503_overloaded(doubles, make_router) -> None:
    (d,) = doubles(1, hold=asyncio.Event())  # the first request holds the only slot until released
    r = make_router([d.url], cap=1, queue_deadline_ms=100)
    with ThreadPoolExecutor(2) as pool:
        try:
            first = pool.submit(r.request, "POST", "/v1/chat/completions", CHAT)
            assert _until(lambda: r.call(lambda: r.router.fleet.models["m"].replicas[0].inflight) == 1)
            status, headers, body = r.request("POST", "/v1/chat/completions", CHAT)
            assert status == 503 and int(headers["retry-after"]) >= 1
            assert json.loads(body)["error"]["code"] == "overloaded"
        finally:
            d.release()
        assert first.result()[0] == 200


def test_no_request_lost_while_one_of_two_replicas_is_killed_under_load(doubles, make_router, lt) -> None:
    a, b = doubles(2, delay_s=0.01)
    r = make_router([a.url, b.url], default_strategy={"name": "round_robin"}, retries_max=2)
    results: list[int] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
        for _ in range(n):
            conn.request("POST", "/v1/chat/completions", json.dumps(CHAT).encode())
            resp = conn.getresponse()
            resp.read()
            with lock:
                results.append(resp.status)
        conn.close()

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client, 40) for _ in range(8)]
        for _ in range(200):
            if len(results) > 60:
                break
            threading.Event().wait(0.01)
        lt.run(a.stop())  # kill one replica mid-load
        for f in futures:
            f.result()
    assert len(results) == 320
    assert set(results) == {200}
    assert b.requests


def test_graceful_drain_finishes_in_flight_streams(doubles, make_router, lt) -> None:
    (d,) = doubles(1, mode="trickle", chunks=6, trickle_s=0.05)
    r = make_router([d.url])
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(_stream_events, r.port, CHAT)
        for _ in range(100):
            if d.requests:
                break
            threading.Event().wait(0.01)
        from runtime.router.__main__ import drain

        lt.run(drain(r.router, r.server, 10))
        status, events = fut.result()
    assert status == 200 and events[-1] == b"data: [DONE]"
    assert r.call(lambda: r.router.draining)
    with socket.socket() as s:  # no longer accepting
        assert s.connect_ex(("127.0.0.1", r.port)) != 0
