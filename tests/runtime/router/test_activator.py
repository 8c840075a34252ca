"""The activator: requests for a model with no ready replica wait for one (bounded, with a deadline), are
counted in the queue depth that wakes the model, and leave the line at once when their client does.

Replicas come and go through file discovery, the way `make local` scales a model (and EndpointSlices in a
cluster): a replica appears in the file once it is ready.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg

SERVICE = "m-engine"


def _publish(path: Path, doubles: list[Double]) -> None:
    """Rewrite the discovery file atomically, as the local supervisor does."""
    groups = [{"targets": [f"127.0.0.1:{d.port}"], "labels": {"service": SERVICE}} for d in doubles]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


def _cold_router(lt: LoopThread, tmp_path: Path, hold_ms: int, **router: Any) -> RouterUnderTest:
    endpoints = tmp_path / "endpoints.json"
    _publish(endpoints, [])
    cfg = router_cfg(
        [],
        models=[
            {
                "name": "m",
                "discovery": {"path": str(endpoints), "service": SERVICE, "poll_interval_ms": 50},
                "max_concurrency_per_backend": 64,
            }
        ],
        routes=[{"model": "m", "cold_start_hold_ms": hold_ms}],
        **router,
    )
    return RouterUnderTest(lt, cfg).start()


def _queue_depth(r: RouterUnderTest) -> int:
    return r.call(lambda: len(r.router.fleet.models["m"].queue))  # type: ignore[union-attr]


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def started(lt: LoopThread) -> Any:
    made: list[Any] = []
    yield made
    for thing in made:
        if isinstance(thing, Double):
            lt.run(thing.stop())
        else:
            thing.stop()


def test_requests_wait_for_a_replica_to_start_streams_and_not(lt, tmp_path: Path, started) -> None:
    r = _cold_router(lt, tmp_path, hold_ms=20_000)
    started.append(r)
    # a model at zero is still served: listed, and the router is ready
    status, _, body = r.request("GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["m"]
    assert r.request("GET", "/readyz")[0] == 200

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    calls = [
        _in_background(lambda: r.request("POST", "/v1/chat/completions", chat)),
        _in_background(lambda: r.request("POST", "/v1/chat/completions", {**chat, "stream": True})),
        _in_background(lambda: r.request("POST", "/v1/completions", {"model": "m", "prompt": "x"})),
    ]
    _wait_for(lambda: _queue_depth(r) == 3)
    assert 'inferstack_router_queue_depth{model="m"} 3.0' in r.metrics()
    time.sleep(0.3)
    assert all(thread.is_alive() for thread, _ in calls)  # held, not refused

    engine = Double("d0")
    lt.run(engine.start())
    started.append(engine)
    _publish(tmp_path / "endpoints.json", [engine])  # ready: the replica appears
    answers = []
    for thread, out in calls:
        thread.join(10)
        answers.append(out[0])
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert b"data: [DONE]" in answers[1][2]
    assert len(engine.requests) == 3 and _queue_depth(r) == 0
    metrics = r.metrics()
    assert 'inferstack_router_queue_wait_seconds_count{model="m"} 3.0' in metrics


def test_past_the_hold_deadline_the_answer_is_503_with_retry_after(lt, tmp_path: Path, started) -> None:
    r = _cold_router(lt, tmp_path, hold_ms=300, breaker_open_ms=7_000)
    started.append(r)
    began = time.monotonic()
    status, headers, body = r.request("POST", "/v1/completions", {"model": "m", "prompt": "x"})
    assert time.monotonic() - began >= 0.3
    assert status == 503 and headers["retry-after"] == "7"
    error = json.loads(body)["error"]
    assert error["code"] == "no_healthy_backend" and "none became ready within 0.3s" in error["message"]
    assert _queue_depth(r) == 0
    assert 'inferstack_router_rejections_total{model="m",reason="no_backend"} 1.0' in (r.metrics())


def test_hold_zero_is_the_activator_off_503_at_once(lt, tmp_path: Path, started) -> None:
    r = _cold_router(lt, tmp_path, hold_ms=0)
    started.append(r)
    began = time.monotonic()
    status, headers, _ = r.request("POST", "/v1/completions", {"model": "m", "prompt": "x"})
    # at once: nowhere near the queue's 10 s deadline (the bound leaves a loaded machine room)
    assert status == 503 and "retry-after" in headers and time.monotonic() - began < 5
    assert r.request("GET", "/v1/models")[2] == b'{"object": "list", "data": []}'


def test_a_client_that_leaves_is_dropped_from_the_line_at_once(lt, tmp_path: Path, started) -> None:
    r = _cold_router(lt, tmp_path, hold_ms=30_000)
    started.append(r)
    body = json.dumps({"model": "m", "prompt": "x", "stream": True}).encode()
    socks = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", r.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        socks.append(sock)
    _wait_for(lambda: _queue_depth(r) == 2)
    socks[0].close()
    _wait_for(lambda: _queue_depth(r) == 1)  # long before the 30 s hold would end its wait
    socks[1].close()
    _wait_for(lambda: _queue_depth(r) == 0)


def test_the_hold_line_is_bounded(lt, tmp_path: Path, started) -> None:
    r = _cold_router(lt, tmp_path, hold_ms=30_000, queue_max_requests=1)
    started.append(r)
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"model": "m", "prompt": "x"}), {"Content-Type": "x"})
    _wait_for(lambda: _queue_depth(r) == 1)
    status, headers, _ = r.request("POST", "/v1/completions", {"model": "m", "prompt": "y"})
    assert status == 503 and "retry-after" in headers  # beyond the bound nobody waits
    conn.close()
    _wait_for(lambda: _queue_depth(r) == 0)
