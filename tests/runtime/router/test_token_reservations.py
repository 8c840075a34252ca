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

    def make(backends: list[str], tokens_per_minute: int = TOKENS_PER_MINUTE) -> RouterUnderTest:
        key = {
            "name": "streamer",
            "sha256": hashlib.sha256(RAW_KEY.encode()).hexdigest(),
            "tokens_per_minute": tokens_per_minute,
        }
        r = make_router(backends, require_api_key=True, api_keys=[key], **store)
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
    assert d.requests[-1]["raw"] == json.dumps(stream_body(stream_options={"include_usage": True})).encode()
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
