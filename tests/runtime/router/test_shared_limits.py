"""Three real router processes behind a round-robin balancer share one rate limit through a real Redis.

The limits are token buckets (``runtime.api_keys``): a key limited to N per minute holds N at once and
gets N more per minute. So over a window of T seconds from a fresh key, under load above the limit, a key
is admitted ``N + N * T / 60``: the bucket, plus what refills. The windows here are 10-20 s instead of a
minute (the arithmetic is the same; the suite stays short), and the expectation must hold within 5 %. With
per-replica limits the same traffic through three routers would be admitted three times that.

Replicas are the benchmarks' fake engine (``bench/router/fake_engine.py``, 9 tokens of usage per answer):
the limits are the router's business, and a real engine would only slow the traffic down.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from components.local.engine_process import free_port
from components.local.redis_process import RedisProcess
from tests.runtime.router.replicas import REPO_ROOT, Replicas, get, metric, post, router_replicas

TOKENS_PER_ANSWER = 9  # the fake engine's usage
TOKEN = "s3cret-limit-store-token"
KEYS = {  # name -> (raw key, requests/min, tokens/min)
    "reqs": ("sk-reqs", 300, None),
    "toks": ("sk-toks", None, 2700),
    "faults": ("sk-faults", 300, None),
}


@dataclass
class Stack:
    replicas: Replicas
    redis: RedisProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("shared-limits")
    token_file = work / "token"
    token_file.write_text(TOKEN + "\n")
    redis = RedisProcess(free_port(), work / "redis", password=TOKEN).start()
    engine_port = free_port()
    engine = subprocess.Popen(
        [sys.executable, "bench/router/fake_engine.py", "--port", str(engine_port)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    config = {
        "models": [{"name": "tiny", "static_backends": [{"url": f"http://127.0.0.1:{engine_port}"}]}],
        "router": {
            "host": "127.0.0.1",
            "require_api_key": True,
            "probe_interval_ms": 1000,
            "api_keys": [
                {
                    "name": name,
                    "sha256": hashlib.sha256(raw.encode()).hexdigest(),
                    **({"requests_per_minute": rpm} if rpm else {}),
                    **({"tokens_per_minute": tpm} if tpm else {}),
                }
                for name, (raw, rpm, tpm) in KEYS.items()
            ],
            "limit_store": {
                "url": redis.url,
                "auth_token_file": str(token_file),
                "timeout_ms": 1000,  # the test is about sharing: no fallback for a loaded machine's hiccup
                "check_interval_ms": 250,
                "replicas": 3,
            },
        },
    }
    try:
        with router_replicas(config, 3, work / "routers") as replicas:
            yield Stack(replicas, redis)
    finally:
        engine.terminate()
        engine.wait(10)
        redis.stop()  # the one object a fault test restarts in place: whatever runs now is stopped


@dataclass
class Outcome:
    at: float
    status: int
    tokens: int


def drive(
    front: str, key: str, rate_per_s: float, seconds: float, threads: int = 3, start: float | None = None
) -> list[Outcome]:
    """Paced load from ``threads`` clients, one new connection per request (round robin per request); times are
    seconds since ``start`` (a ``time.monotonic()`` reading; now when not given)."""
    out: list[Outcome] = []
    lock = threading.Lock()
    start = time.monotonic() if start is None else start
    per_thread = rate_per_s / threads

    def run(offset: float) -> None:
        i = 0
        while True:
            due = start + offset + i / per_thread
            if due - start >= seconds:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            status, body = post(
                front,
                "/v1/chat/completions",
                {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                key,
            )
            usage = body.get("usage") or {}
            with lock:
                out.append(Outcome(time.monotonic() - start, status, int(usage.get("total_tokens", 0))))
            i += 1

    workers = [threading.Thread(target=run, args=(t / rate_per_s,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sorted(out, key=lambda o: o.at)


def admitted(outcomes: list[Outcome], since: float = 0.0, until: float = 1e9) -> list[Outcome]:
    return [o for o in outcomes if since <= o.at < until and o.status == 200]


def assert_only_200_or_429(outcomes: list[Outcome]) -> None:
    statuses = {o.status for o in outcomes}
    assert statuses <= {200, 429}, f"never a 5xx or a hung request: {statuses}"


def bucket_plus_refill(per_minute: int, seconds: float) -> float:
    return per_minute + per_minute * seconds / 60


def test_three_replicas_enforce_one_request_limit_and_one_token_limit(stack: Stack) -> None:
    front = stack.replicas.front
    seconds = 20.0
    results: dict[str, list[Outcome]] = {}

    def run(name: str, rate: float) -> None:
        results[name] = drive(front, KEYS[name][0], rate, seconds)

    threads = [
        threading.Thread(target=run, args=("reqs", 30.0)),
        threading.Thread(target=run, args=("toks", 30.0)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in ("reqs", "toks"):
        assert_only_200_or_429(results[name])
        assert {o.status for o in results[name]} == {200, 429}, f"{name}: the load exceeds the limit"

    # requests: 300/min is a bucket of 300 plus 5 per second
    got = len(admitted(results["reqs"]))
    want = bucket_plus_refill(300, seconds)
    assert abs(got - want) <= 0.05 * want, f"{got} requests admitted over {seconds}s, want {want:.0f} +-5%"
    assert got < 0.5 * 3 * want  # per-replica limits would admit three times as many

    # tokens: 2700/min is a bucket of 2700 plus 45 per second (each answer costs 9)
    tokens = sum(o.tokens for o in admitted(results["toks"]))
    want_tokens = bucket_plus_refill(2700, seconds)
    assert abs(tokens - want_tokens) <= 0.05 * want_tokens, (
        f"{tokens} tokens served over {seconds}s, want {want_tokens:.0f} +-5%"
    )
    for router in stack.replicas.routers:
        assert metric(router, "inferstack_router_limit_store_up") == 1.0
        assert metric(router, "inferstack_router_limit_checks_total", 'mode="shared"') > 0
        assert metric(router, "inferstack_router_limit_checks_total", 'mode="fallback"') == 0


def test_a_dead_store_falls_back_to_a_share_per_replica_and_its_return_restores_the_shared_limit(
    stack: Stack,
) -> None:
    front, routers = stack.replicas.front, stack.replicas.routers
    key = KEYS["faults"][0]
    box: dict[str, list[Outcome]] = {}
    seconds = 24.0
    t0 = time.monotonic()
    load = threading.Thread(target=lambda: box.setdefault("out", drive(front, key, 30.0, seconds, start=t0)))
    load.start()
    wait_until(t0 + 5.0)  # 5 s of traffic on the shared store first: a phase of the load, not a wait for it
    stack.redis.kill()  # mid-run: connections reset, nothing answers
    killed_at = time.monotonic() - t0
    poll(lambda: all(metric(r, "inferstack_router_limit_store_up") == 0.0 for r in routers), 10.0,
         "each replica notices the store is gone")  # fmt: skip
    wait_until(t0 + killed_at + 6.0)  # then 6 s limited per replica
    fallback = [metric(r, "inferstack_router_limit_checks_total", 'mode="fallback"') for r in routers]
    stack.redis.start()  # the same object, restarted in place: the fixture stops whatever runs at the end
    back_at = time.monotonic() - t0
    poll(lambda: all(metric(r, "inferstack_router_limit_store_up") == 1.0 for r in routers), 10.0,
         "the routers go back to the store by themselves")  # fmt: skip
    recovered_at = time.monotonic() - t0
    load.join()
    out = box["out"]
    assert_only_200_or_429(out)
    assert all(f > 0 for f in fallback), "each replica limited on its own while the store was down"
    during = admitted(out, killed_at + 0.5, back_at)
    assert during, "requests kept flowing while the store was down"
    # per replica: a third of the limit each, so together about the shared rate (plus their buckets)
    assert len(during) <= bucket_plus_refill(300, back_at - killed_at) * 1.05
    # the store came back empty: a fresh shared bucket (300) plus 5 per second, across all three
    window = seconds - recovered_at - 0.5
    got = len(admitted(out, recovered_at + 0.5))
    want = bucket_plus_refill(300, window)
    assert abs(got - want) <= 0.05 * want + 5, f"{got} admitted after recovery, want {want:.0f} +-5%"
    for r in routers:
        assert metric(r, "inferstack_router_limit_store_errors_total", 'cause="connection"') > 0
    assert get(front, "/healthz")[0] == 200


def wait_until(at: float) -> None:
    """Sleeps to a point of the load's timeline (``time.monotonic()`` reading): the phases of a paced load."""
    time.sleep(max(0.0, at - time.monotonic()))


def poll(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"within {timeout_s:.0f} s: {what}"
        time.sleep(0.1)
