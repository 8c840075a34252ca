"""The router's HTTP surface with engine doubles: proxying, streaming, bad input, endpoints."""

from __future__ import annotations

import asyncio
import http.client
import json
from concurrent.futures import ThreadPoolExecutor

from tests.local.helpers import wait_for
from tests.runtime.batcher.conftest import batcher_config, start_batcher
from tests.runtime.router.harness import completion

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def test_non_stream_is_proxied_byte_for_byte_with_request_id(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "weird_extra": {"kept": true}}'
    status, headers, body = r.request(
        "POST", "/v1/chat/completions", raw, {"X-Request-Id": "abc-123", "Authorization": "Bearer x"}
    )
    assert status == 200
    assert body == completion("m")
    assert headers["x-request-id"] == "abc-123"
    seen = d.requests[0]
    assert seen["raw"] == raw  # unknown keys and formatting pass through untouched
    assert seen["headers"]["x-request-id"] == "abc-123"
    assert "authorization" not in seen["headers"]  # the client's key is never forwarded


def test_request_id_is_generated_when_absent_or_unsafe(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    _, h1, _ = r.request("POST", "/v1/chat/completions", CHAT)
    _, h2, _ = r.request("POST", "/v1/chat/completions", CHAT, {"X-Request-Id": "bad id\twith spaces"})
    assert h1["x-request-id"] and h2["x-request-id"] and h1["x-request-id"] != h2["x-request-id"]
    assert d.requests[1]["headers"]["x-request-id"] == h2["x-request-id"]


def test_stream_passes_through_chunk_by_chunk(doubles, make_router) -> None:
    (d,) = doubles(1, chunks=4)
    r = make_router([d.url])
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode())
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("content-type") == "text/event-stream"
    events = [e for e in resp.read().split(b"\n\n") if e]
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:4]] == [
        "t0",
        "t1",
        "t2",
        "t3",
    ]
    assert events[-1] == b"data: [DONE]"
    conn.close()
    metrics = r.metrics()
    assert 'inferstack_router_tokens_total{direction="out",model="m"} 3.0' in metrics  # from the final chunk


def test_bad_input_is_4xx_openai_shaped(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url], max_body_bytes=2048)
    cases = [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        (b'{"messages": []}', 400, None),
        (b'{"model": 7}', 400, None),
        (b'{"model": "m", "stream": "yes"}', 400, None),
        (b'{"model": "other"}', 404, "model_not_found"),
        (b"\xff\xfe", 400, "invalid_json"),
        (b'{"model": "m", "pad": "' + b"x" * 4096 + b'"}', 413, None),
    ]
    for raw, status, code in cases:
        got, _, body = r.request("POST", "/v1/chat/completions", raw)
        assert got == status, raw[:40]
        err = json.loads(body)["error"]
        assert err["message"] and err["type"]
        if code:
            assert err["code"] == code
    _, _, body = r.request("POST", "/v1/chat/completions", {"model": "other"})
    assert "served: m" in json.loads(body)["error"]["message"]
    assert not d.requests  # nothing bad reached the engine


def test_stream_null_means_false(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    status, _, body = r.request("POST", "/v1/completions", {"model": "m", "prompt": "x", "stream": None})
    assert status == 200 and json.loads(body)["object"] == "chat.completion"


def test_methods_paths_and_service_endpoints(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    assert r.request("GET", "/v1/chat/completions")[0] == 405
    assert r.request("POST", "/v1/models")[0] == 405
    assert r.request("GET", "/nope")[0] == 404
    assert r.request("GET", "/healthz")[0] == 200
    assert r.request("GET", "/readyz")[0] == 200
    status, _, body = r.request("GET", "/v1/models")
    models = json.loads(body)
    assert status == 200 and models["object"] == "list" and models["data"][0]["id"] == "m"
    r.request("POST", "/v1/chat/completions", CHAT)
    metrics = r.metrics()
    for name in (
        "inferstack_router_requests_total",
        "inferstack_router_request_duration_seconds_bucket",
        "inferstack_router_ttft_seconds_bucket",
        "inferstack_router_tokens_total",
        "inferstack_router_queue_depth",
        "inferstack_router_circuit_state",
        "inferstack_router_backend_inflight",
    ):
        assert name in metrics
    assert "vllm:" not in metrics


def test_embeddings_route(doubles, make_router) -> None:
    (d,) = doubles(1)
    models = [{"name": "e", "task": "embed", "static_backends": [{"url": d.url}]}]
    r = make_router([], models=models)
    status, _, body = r.request("POST", "/v1/embeddings", {"model": "e", "input": ["a"]})
    assert status == 200 and json.loads(body)["data"][0]["embedding"] == [0.1, 0.2]


def test_embeddings_go_through_the_batcher_when_configured(doubles, make_router) -> None:
    engine, batcher = doubles(2)
    models = [{"name": "e", "task": "embed", "static_backends": [{"url": engine.url}]}]
    routes = [{"model": "e", "batcher_url": batcher.url}]
    r = make_router([], models=models, routes=routes)
    status, _, _ = r.request("POST", "/v1/embeddings", {"model": "e", "input": "a"})
    assert status == 200
    assert len(batcher.requests) == 1 and not engine.requests


def test_a_full_batchers_503_reaches_the_client_with_its_retry_after(doubles, make_router, lt) -> None:
    """A full batcher queue is load, and the batcher's own verdict: the client gets its 503 ``overloaded`` and
    ``Retry-After`` as they are (not ``upstream_error``), it counts as a refusal (not in the 5xx series the error
    alerts read), and the batcher keeps its place (no breaker strike)."""
    (engine,) = doubles(1)
    engine.hold = asyncio.Event()  # the engine holds each call: one in the engine, one queued, then full
    config = batcher_config([engine.url], max_queue=1, max_wait_ms=0, max_inflight_batches_per_backend=1)
    batcher = lt.run(start_batcher(config))
    try:
        wait_for(lambda: batcher.batcher.ready, 20, "the batcher to see its engine")
        models = [{"name": "emb", "task": "embed", "static_backends": [{"url": engine.url}]}]
        r = make_router([], models=models, routes=[{"model": "emb", "batcher_url": batcher.url}])
        embed = {"model": "emb", "input": "a"}
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(r.request, "POST", "/v1/embeddings", embed)]
            wait_for(lambda: len(engine.requests) == 1, 20, "the first request to reach the engine")
            held.append(pool.submit(r.request, "POST", "/v1/embeddings", embed))
            wait_for(lambda: batcher.batcher.models["emb"].depth == 1, 20, "the second request to queue")
            status, headers, body = r.request("POST", "/v1/embeddings", embed)
            assert status == 503 and json.loads(body)["error"]["code"] == "overloaded", body
            assert int(headers["retry-after"]) >= 1
            metrics = r.metrics()  # a refusal for load, like the router's own: not a 5xx of a replica
            assert 'inferstack_router_rejections_total{model="emb",reason="batcher_queue"} 1.0' in metrics
            assert 'status="503"' not in metrics
            engine.release()
            assert [f.result(timeout=30)[0] for f in held] == [200, 200]
        status, _, _ = r.request("POST", "/v1/embeddings", embed)
        assert status == 200, "the batcher still takes the model's requests"
    finally:
        lt.run(batcher.close())


def test_keep_alive_serves_many_requests_on_one_connection(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
    for _ in range(20):
        conn.request("POST", "/v1/chat/completions", json.dumps(CHAT).encode())
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read()
    conn.close()
    assert len(d.requests) == 20
    # and the router reused one keep-alive connection to the engine for all of them
    assert len({req["peer"] for req in d.requests}) == 1


def test_chunked_request_body_is_accepted(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
    body = json.dumps(CHAT).encode()
    conn.request("POST", "/v1/chat/completions", iter([body[:10], body[10:]]), encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 200
    assert d.requests[0]["raw"] == body


def test_silent_connections_are_swept_but_busy_ones_are_not(doubles, make_router) -> None:
    import asyncio
    import socket
    import time

    (d,) = doubles(1, mode="trickle", chunks=20, trickle_s=0.05, hold=asyncio.Event())  # busy until released
    r = make_router([d.url])
    half = socket.create_connection(("127.0.0.1", r.port))
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")  # stops half-way
    busy = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    try:
        busy.request("POST", "/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode())
        deadline = time.monotonic() + 20
        while not (d.requests and r.call(lambda: len(r.server.connections)) == 2):
            assert time.monotonic() < deadline, "the half-sent and the streaming connection never both showed"
            time.sleep(0.02)
        closed = r.call(lambda: r.server.close_silent(time.monotonic() + 10_000))
    finally:
        d.release()
    assert closed == 1
    assert half.recv(10) == b""  # the silent one was closed
    half.close()
    resp = busy.getresponse()
    assert resp.status == 200
    assert resp.read().rstrip().endswith(b"data: [DONE]")  # the streaming one was left alone
    busy.close()


def test_expect_100_continue_is_answered(doubles, make_router) -> None:
    import socket

    (d,) = doubles(1)
    r = make_router([d.url])
    body = json.dumps(CHAT).encode()
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        assert sock.recv(1000).startswith(b"HTTP/1.1 200")


def test_large_answers_pass_through_whole_sized_or_chunked(doubles, make_router) -> None:
    for mode in ("big", "big_chunked"):
        (d,) = doubles(1, mode=mode)
        r = make_router([d.url])
        status, headers, body = r.request("POST", "/v1/embeddings", {"model": "m", "input": ["x"] * 300})
        assert status == 200, mode
        out = json.loads(body)
        assert len(out["data"]) == 300 and out["data"][299]["index"] == 299
        assert ("content-length" in headers) == (mode == "big")
        metrics = r.metrics()
        assert 'inferstack_router_tokens_total{direction="in",model="m"} 300.0' in metrics


def test_engine_connections_stay_bounded_under_concurrency(doubles, make_router) -> None:
    from concurrent.futures import ThreadPoolExecutor

    a, b = doubles(2)
    r = make_router([a.url, b.url], default_strategy={"name": "least_load"})

    def client(n: int) -> list[int]:
        conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
        out = []
        for _ in range(n):
            conn.request("POST", "/v1/chat/completions", json.dumps(CHAT).encode())
            resp = conn.getresponse()
            resp.read()
            out.append(resp.status)
        conn.close()
        return out

    with ThreadPoolExecutor(6) as pool:
        statuses = [s for f in [pool.submit(client, 30) for _ in range(6)] for s in f.result()]
    assert statuses == [200] * 180
    peers = {req["peer"] for d in (a, b) for req in d.requests}
    assert len(peers) <= 12  # never more engine connections than requests in flight at once


def test_head_has_no_body_and_keeps_the_connection_usable(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url])
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
    conn.request("HEAD", "/healthz")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    conn.request("GET", "/healthz")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read()) == {"status": "ok"}
    conn.close()


def test_answer_names_the_replica_that_served_it(doubles, make_router) -> None:
    from runtime.router.replicas import replica_tag

    d1, d2 = doubles(2)
    r = make_router([d1.url, d2.url], default_strategy={"name": "round_robin"})
    tags = {replica_tag(d1.url), replica_tag(d2.url)}
    seen: set[str] = set()
    for _ in range(2):
        status, headers, _ = r.request("POST", "/v1/chat/completions", CHAT)
        assert status == 200
        seen.add(headers["x-inferstack-backend"])
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode())
    resp = conn.getresponse()
    seen.add(resp.getheader("x-inferstack-backend") or "")
    resp.read()
    conn.close()
    assert seen <= tags and len(seen) == 2  # opaque (no address leaks), stable, and both replicas served
