"""Streams are charged to ``tokens_per_minute`` (#34 item 4), over real HTTP, with the limits kept in the
router (``LocalLimits``) and in a real Redis (``SharedLimits``).

A request reserves an estimate at admission (prompt from the body's size + ``max_tokens`` per choice) and
is settled when it ends: to the real usage, which the router asks a stream for (``include_usage``) and
takes out again when the client did not ask; the reservation stands when the client leaves mid-stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis as sync_redis

from components.local.engine_process import free_port
from components.local.redis_process import RedisProcess
from tests.runtime.router.harness import Double, RouterUnderTest

RAW_KEY = "sk-streams"
MAX_TOKENS = 200
# each request reserves ~226 tokens (200 + its body's ~26): a 600-token minute admits 3 at once (the third
# overdraws it; a key is refused once its bucket is below zero), a 4th only if the refill (10 a second)
# brought it back above zero meanwhile
TOKENS_PER_MINUTE = 600


def stream_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": MAX_TOKENS,
        **extra,
    }


@pytest.fixture(scope="module")
def redis_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with RedisProcess(free_port(), tmp_path_factory.mktemp("reservations")) as proc:
        yield proc


@pytest.fixture(params=["local", "shared"])
def keyed_router(
    request: pytest.FixtureRequest, make_router: Callable[..., RouterUnderTest]
) -> Callable[..., RouterUnderTest]:
    """A router whose one key has only a token limit; its buckets in the router or in Redis."""
    store: dict[str, Any] = {}
    if request.param == "shared":
        redis: RedisProcess = request.getfixturevalue("redis_store")
        # a key prefix per test: each starts from a full bucket
        store = {"limit_store": {"url": redis.url, "timeout_ms": 3000, "key_prefix": f"{request.node.name}:"}}

    def make(replica_urls: list[str], tokens_per_minute: int = TOKENS_PER_MINUTE) -> RouterUnderTest:
        key = {
            "name": "streamer",
            "sha256": hashlib.sha256(RAW_KEY.encode()).hexdigest(),
            "tokens_per_minute": tokens_per_minute,
        }
        r = make_router(replica_urls, require_api_key=True, api_keys=[key], **store)
        if request.param == "shared":
            assert r.router is not None and r.router.limits.store_up == 1.0
        return r

    return make


def post(r: RouterUnderTest, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return r.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {RAW_KEY}"})


def until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"within {timeout_s:.0f} s: {what}"
        threading.Event().wait(0.01)


def settled(r: RouterUnderTest) -> None:
    """Wait until no request is in the router and a shared store's charges have landed."""
    assert r.router is not None
    router = r.router
    until(lambda: r.call(lambda: router.inflight) == 0, "the router has no request in flight")
    until(lambda: not r.call(lambda: getattr(router.limits, "_pending", ())), "the charges reached the store")


def test_concurrent_streams_under_a_token_only_limit_are_refused_once_reservations_exceed_it(
    doubles: Callable[..., list[Double]], keyed_router: Callable[..., RouterUnderTest]
) -> None:
    """Without a reservation nothing is charged until a stream's usage arrives: every stream in flight at
    once is admitted, however many. With one, the streams held by the engine use the minute up."""
    (d,) = doubles(1, hold=asyncio.Event())
    r = keyed_router([d.url])
    sent = 8
    with ThreadPoolExecutor(sent) as pool:
        try:
            futures = [pool.submit(post, r, stream_body()) for _ in range(sent)]
            until(
                lambda: len(d.requests) + sum(f.done() for f in futures) == sent,
                "each stream is either held by the engine or answered",
            )
        finally:
            d.release()
        answers = [f.result() for f in futures]
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 429}, statuses
    assert 1 <= statuses.count(200) == len(d.requests) <= 4, f"600 tokens hold 3 reservations: {statuses}"
    refused = [json.loads(raw)["error"] for status, _, raw in answers if status == 429]
    assert len(refused) >= sent - 4
    assert all(
        e["code"] == "rate_limit_exceeded" and "600 tokens per minute" in e["message"] for e in refused
    )


def test_streams_settle_to_their_usage_and_a_client_that_did_not_ask_sees_no_usage_chunk(
    doubles: Callable[..., list[Double]], keyed_router: Callable[..., RouterUnderTest]
) -> None:
    """The engine is asked for its usage; the client that did not ask gets the stream without it, and its key
    pays the usage (10 tokens), not the reservation: one after another, the streams go on being admitted."""
    (d,) = doubles(1)
    r = keyed_router([d.url], tokens_per_minute=300)  # one reservation (~226) at a time, 10 tokens used each
    for options in (
        None,
        {"include_usage": False},
        {"include_usage": False, "continuous_usage_stats": False},
    ):
        body = stream_body() if options is None else stream_body(stream_options=options)
        status, _, raw = post(r, body)
        assert status == 200, raw
        assert d.requests[-1]["body"]["stream_options"]["include_usage"] is True, "the engine was asked"
        if options:
            assert d.requests[-1]["body"]["stream_options"] == {**options, "include_usage": True}
        events = [e for e in raw.split(b"\n\n") if e]
        assert b'"usage"' not in raw, events
        assert events[-1] == b"data: [DONE]" and len(events) == d.chunks + 1, events
        settled(r)
    status, _, raw = post(r, stream_body(stream_options={"include_usage": True}))  # asked: it is theirs
    assert status == 200
    assert b'"usage"' in raw
    # the client's bytes as they came, but for the token ids a stream that may move asks for (router/migration)
    asked = json.dumps(stream_body(stream_options={"include_usage": True})).encode()
    assert d.requests[-1]["raw"] == b'{"return_token_ids":true,' + asked[1:]
    settled(r)
    assert post(r, stream_body())[0] == 200, "4 streams of 10 tokens each left the 300-token minute open"


def test_a_client_that_leaves_mid_stream_is_still_charged(
    doubles: Callable[..., list[Double]], keyed_router: Callable[..., RouterUnderTest]
) -> None:
    """The usage chunk never comes to a stream whose client left: its reservation stands. Before, such a
    stream was free, and a client could stream without limit by hanging up before the end."""
    (d,) = doubles(1, mode="trickle", chunks=200, trickle_s=0.02)  # ~4 s of tokens
    r = keyed_router([d.url], tokens_per_minute=100)  # the reservation (~226) overdraws it by ~126
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    try:
        payload = json.dumps(stream_body()).encode()
        headers = {"Authorization": f"Bearer {RAW_KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.read1(100), "the stream started"
    finally:
        conn.close()  # gone mid-stream
    until(lambda: d.cancelled == 1, "the router stopped the engine's stream")
    settled(r)
    status, _, raw = post(r, stream_body())
    assert status == 429, "the leaver's reservation stands: the key is ~126 tokens below zero"
    assert json.loads(raw)["error"]["code"] == "rate_limit_exceeded"


def test_a_client_that_leaves_before_the_first_byte_is_still_charged(
    doubles: Callable[..., list[Double]], keyed_router: Callable[..., RouterUnderTest]
) -> None:
    """A client that hangs up while the engine works on its request (a prefill, a whole non-streamed answer)
    had its whole reservation back: the engine's work was free, and a key could keep it busy without limit by
    leaving just before each answer. The reservation stands once the request reached an engine."""
    (d,) = doubles(1, mode="hang")  # the engine holds the request without answering
    r = keyed_router([d.url], tokens_per_minute=100)  # the reservation (~226) overdraws it by ~126
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    try:
        payload = json.dumps({**stream_body(), "stream": False}).encode()
        headers = {"Authorization": f"Bearer {RAW_KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
        until(lambda: len(d.requests) == 1, "the engine has the request")
    finally:
        conn.close()  # gone before any answer
    settled(r)  # the router saw the client go and let go of the engine's request
    d.mode = "ok"  # were the key admitted again, it would get its answer (200), not hang
    status, _, raw = post(r, stream_body())
    assert status == 429, f"the leaver's reservation stands: the key is ~126 tokens below zero: {raw!r}"


def test_a_failure_between_admission_and_routing_gives_the_reservation_back(
    doubles: Callable[..., list[Double]],
    keyed_router: Callable[..., RouterUnderTest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reservation taken at admission is settled whatever happens next: a fault injected between admission
    and routing (a bug; the client gets a 500) must not keep the key's tokens."""
    (d,) = doubles(1)
    r = keyed_router([d.url], tokens_per_minute=200)  # one reservation (~226) overdraws the minute

    def broken(*args: object) -> bytes:
        raise RuntimeError("injected fault")

    monkeypatch.setattr("runtime.router.app.forwarded_tail", broken)
    assert post(r, stream_body())[0] == 500
    monkeypatch.undo()
    settled(r)
    assert not d.requests, "nothing reached the engine"
    status, _, raw = post(r, stream_body())
    assert status == 200, f"the failed request's reservation was given back: {raw!r}"


def leave_after(r: RouterUnderTest, body: dict[str, Any], events: int) -> int:
    """Stream ``body``, read at least ``events`` content events, hang up; the events read."""
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {RAW_KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200
        seen = b""
        while seen.count(b'"choices"') < events:
            piece = resp.read1(65536)
            assert piece, "the stream ended before the client left"
            seen += piece
        return seen.count(b'"choices"')
    finally:
        conn.close()  # gone mid-stream


def test_a_stream_without_max_tokens_reserves_the_context_and_is_refunded_when_it_ends(
    doubles: Callable[..., list[Double]], keyed_router: Callable[..., RouterUnderTest]
) -> None:
    """Without ``max_tokens`` the engine may generate up to the model's context (4096 here): a client that
    left mid-stream paid only the 1024 tokens reserved per choice, however much it had read. It now reserves
    what the context leaves (~4096 with the prompt), and an answer that ends gets the unused part back."""
    (d,) = doubles(1, mode="trickle", chunks=100, trickle_s=0.01)
    r = keyed_router([d.url], tokens_per_minute=3000)
    unbounded = stream_body()
    del unbounded["max_tokens"]
    for _ in range(2):  # each reserves more than the minute, and is settled to its 10 tokens
        status, _, raw = post(r, unbounded)
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n"), raw[-200:]
        settled(r)
    leave_after(r, unbounded, 1)
    until(lambda: d.cancelled == 1, "the router stopped the engine's stream")
    settled(r)
    status, _, raw = post(r, unbounded)
    assert status == 429, "the leaver's reservation (the context, ~4096) overdraws the 3000-token minute"
    assert json.loads(raw)["error"]["code"] == "rate_limit_exceeded"


def test_a_client_that_leaves_after_reading_more_than_its_reservation_pays_what_it_read(
    doubles: Callable[..., list[Double]], keyed_router: Callable[..., RouterUnderTest]
) -> None:
    """An engine that streams past the reservation (here it ignores ``max_tokens``: 10): a client that left
    paid only the reservation (~36). It now pays the prompt plus one token per content event relayed."""
    (d,) = doubles(1, mode="trickle", chunks=400, trickle_s=0.005)
    r = keyed_router([d.url], tokens_per_minute=200)  # the reservation leaves ~164; what is read, not
    read = leave_after(r, stream_body(max_tokens=10), 250)
    assert read >= 250
    until(lambda: d.cancelled == 1, "the router stopped the engine's stream")
    settled(r)
    status, _, raw = post(r, stream_body(max_tokens=10))
    assert status == 429, "250+ tokens relayed overdraw the 200-token minute"
    assert json.loads(raw)["error"]["code"] == "rate_limit_exceeded"


def test_a_usage_event_split_across_reads_is_still_counted(
    doubles: Callable[..., list[Double]], keyed_router: Callable[..., RouterUnderTest]
) -> None:
    """The client asked for the usage itself: only the last read naming ``usage`` was scanned, and a usage
    event split across reads settled to nothing (the reservation stood). Events are now assembled first."""
    (d,) = doubles(1, mode="split_usage")
    r = keyed_router([d.url], tokens_per_minute=300)  # one reservation (~226) at a time; 10 tokens used
    for _ in range(3):  # three reservations kept would overdraw the minute by the third
        status, _, raw = post(r, stream_body(stream_options={"include_usage": True}))
        assert status == 200, raw
        assert b'"completion_tokens": 3' in raw, "the client gets the usage it asked for, whole"
        settled(r)


def test_a_reservation_taken_in_the_store_is_settled_in_the_store_after_it_failed_meanwhile(
    doubles: Callable[..., list[Double]],
    make_router: Callable[..., RouterUnderTest],
    redis_store: RedisProcess,
    request: pytest.FixtureRequest,
) -> None:
    """A stream reserved in Redis ends while Redis refuses writes (``maxmemory``: a real error reply). Its
    refund went to this replica's fallback share, which never took the reservation: back on Redis the key
    was still overdrawn. It is now owed to Redis and paid when Redis answers again."""
    (d,) = doubles(1, hold=asyncio.Event())
    key = {
        "name": "streamer",
        "sha256": hashlib.sha256(RAW_KEY.encode()).hexdigest(),
        "tokens_per_minute": 200,  # the reservation (~226) overdraws it; the answer uses 10
    }
    store = {
        "url": redis_store.url,
        "timeout_ms": 3000,
        "check_interval_ms": 100,
        "key_prefix": f"{request.node.name}:",
    }
    r = make_router([d.url], require_api_key=True, api_keys=[key], limit_store=store)
    assert r.router is not None
    router = r.router
    admin = sync_redis.Redis(host="127.0.0.1", port=redis_store.port, socket_timeout=30)
    try:
        with ThreadPoolExecutor(1) as pool:
            try:
                held = pool.submit(post, r, stream_body())
                until(lambda: len(d.requests) == 1, "the stream reserved in Redis and reached the engine")
                admin.config_set("maxmemory-policy", "noeviction")
                admin.config_set("maxmemory", 1)  # every write now an error reply
            finally:
                d.release()
            assert held.result()[0] == 200
            until(lambda: r.call(lambda: router.limits.store_up) == 0.0, "the router saw the store fail")
        admin.config_set("maxmemory", 0)
        until(lambda: r.call(lambda: router.limits.store_up) == 1.0, "the store is used again")
        until(lambda: not r.call(lambda: getattr(router.limits, "_owed", ())), "what was owed was paid")
        settled(r)
        status, _, raw = post(r, stream_body())
        assert status == 200, f"the refund reached Redis, where the reservation was: {raw!r}"
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()


def test_a_reservation_taken_in_the_fallback_share_is_settled_there_after_the_store_returned(
    doubles: Callable[..., list[Double]],
    make_router: Callable[..., RouterUnderTest],
    redis_store: RedisProcess,
    request: pytest.FixtureRequest,
) -> None:
    """A stream reserved in the fallback share (Redis refusing writes) ends once Redis is back: its refund went
    to Redis, which never took the reservation, and the share stayed overdrawn for the next outage."""
    (d,) = doubles(1, hold=asyncio.Event())
    key = {
        "name": "streamer",
        "sha256": hashlib.sha256(RAW_KEY.encode()).hexdigest(),
        "tokens_per_minute": 200,
    }
    store = {
        "url": redis_store.url,
        "timeout_ms": 3000,
        "check_interval_ms": 100,
        "key_prefix": f"{request.node.name}:",
    }
    r = make_router([d.url], require_api_key=True, api_keys=[key], limit_store=store)
    assert r.router is not None
    router = r.router
    admin = sync_redis.Redis(host="127.0.0.1", port=redis_store.port, socket_timeout=30)

    def store_up(up: bool) -> None:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 0 if up else 1)  # 1 byte: every write an error reply
        until(lambda: r.call(lambda: router.limits.store_up) == (1.0 if up else 0.0), f"store up: {up}")

    try:
        store_up(False)
        with ThreadPoolExecutor(1) as pool:
            try:
                held = pool.submit(post, r, stream_body())
                until(lambda: len(d.requests) == 1, "the stream reserved in the fallback share")
                store_up(True)
            finally:
                d.release()
            assert held.result()[0] == 200
        settled(r)
        store_up(False)  # the next outage: the share got its refund back
        status, _, raw = post(r, stream_body())
        assert status == 200, f"the refund went to the fallback share, where the reservation was: {raw!r}"
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
