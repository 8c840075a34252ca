"""``SharedLimits`` against a real redis-server: the Lua buckets, and what a slow or erroring store does.

Faults are real ones: ``DEBUG SLEEP`` stalls the server (a latency spike), ``maxmemory 1`` with
``noeviction`` makes every write an error reply, a wrong AUTH token is refused. Each must switch the
replica to its share of the limit (logged once per cause, counted), never fail or hang a request, and
the store must be used again once it answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis as sync_redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from components.local.engine_process import free_port
from components.local.redis_process import RedisProcess
from runtime.api_keys import KeyTable, Principal
from runtime.config import ApiKey, LimitStore
from runtime.router.shared_limits import SharedLimits, error_cause
from tests.runtime.router.harness import RouterUnderTest

TOKEN = "limit-store-test-token"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    work = tmp_path_factory.mktemp("limit-store")
    debug = ("--enable-debug-command", "local")  # DEBUG SLEEP: a real stall of the real server
    with RedisProcess(free_port(), work, password=TOKEN, extra_args=debug) as proc:
        yield proc


def principal(name: str, rpm: int | None = None, tpm: int | None = None) -> Principal:
    key = ApiKey(
        name=name,
        sha256=hashlib.sha256(name.encode()).hexdigest(),
        requests_per_minute=rpm,
        tokens_per_minute=tpm,
    )
    return KeyTable([key], 0.0).by_hash[key.sha256]


@pytest_asyncio.fixture(loop_scope="function")
async def limits(
    store: RedisProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[SharedLimits]:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    errors: list[str] = []
    checks: list[str] = []
    # a timeout well above a loaded machine's hiccups (a slow call would be a fallback); the stall test asks
    # for a shorter one (indirect parameter), still above hiccups: its stall is seconds long
    timeout_ms = getattr(request, "param", 3000)
    shared = SharedLimits(
        LimitStore(
            url=store.url, auth_token_file=token, timeout_ms=timeout_ms, check_interval_ms=100, replicas=4
        ),
        errors.append,
        checks.append,
    )
    shared.errors = errors  # type: ignore[attr-defined]
    shared.checks = checks  # type: ignore[attr-defined]
    await shared.start()
    yield shared
    await shared.stop()


def admin(store: RedisProcess) -> sync_redis.Redis:
    # redis-py's defaults (a 5 s read timeout, then retries) would send a longer DEBUG SLEEP again and again
    return sync_redis.Redis(
        host="127.0.0.1", port=store.port, password=TOKEN, socket_timeout=30, retry=Retry(NoBackoff(), 0)
    )


def _until_stalled(store: RedisProcess, timeout_s: float = 10.0) -> None:
    """Return once the server has stopped answering (the DEBUG SLEEP has begun). A live server answers a
    PING within a second even on a loaded machine; the stall is longer than the test needs after it."""
    probe = sync_redis.Redis(
        host="127.0.0.1", port=store.port, password=TOKEN, socket_timeout=1.0, retry=Retry(NoBackoff(), 0)
    )
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                probe.ping()
            except sync_redis.TimeoutError:
                return
            assert time.monotonic() < deadline, "the store never stalled"
            time.sleep(0.02)
    finally:
        probe.close()


async def test_the_request_bucket_holds_its_size_and_names_when_to_retry(limits: SharedLimits) -> None:
    who = principal("bucket", rpm=6)
    verdicts = [await limits.admit(who, "m") for _ in range(8)]
    assert verdicts[:6] == [None] * 6
    refused = verdicts[6]
    assert refused is not None and refused.status == 429 and refused.code == "rate_limit_exceeded"
    assert "6 requests per minute" in refused.message
    assert refused.retry_after_s is not None and 1.0 <= refused.retry_after_s <= 10.0  # 1 per 10 s refills
    assert limits.checks == ["shared"] * 8  # type: ignore[attr-defined]


async def test_tokens_are_charged_after_the_answer_and_refuse_once_overdrawn(limits: SharedLimits) -> None:
    who = principal("tokens", tpm=100)
    assert await limits.admit(who, "m") is None
    limits.charge(who, 250)  # one big answer: the bucket goes to -150
    await asyncio.gather(*limits._pending)  # the charge is fire-and-forget: let it land
    refused = await limits.admit(who, "m")
    assert refused is not None and "100 tokens per minute" in refused.message
    assert refused.retry_after_s is not None and refused.retry_after_s >= 60  # 150 tokens at 100/min


async def test_scopes_are_checked_before_the_store(limits: SharedLimits) -> None:
    key = ApiKey(name="scoped", sha256="a" * 64, models=["other"], requests_per_minute=10)
    denied = await limits.admit(KeyTable([key], 0.0).by_hash[key.sha256], "m")
    assert denied is not None and denied.status == 403


@pytest.mark.parametrize("limits", [500], indirect=True)  # timeout_ms
async def test_a_stalled_store_costs_one_timeout_then_the_share_is_used_until_it_answers(
    limits: SharedLimits, store: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # the only replica alive (it told the store so at start): its share is the whole limit
    assert limits.replicas == 1
    who = principal("stall", rpm=2)
    caplog.set_level(logging.WARNING, "inferstack.router.limits")
    stall = threading.Thread(target=lambda: admin(store).execute_command("DEBUG", "SLEEP", "6"))
    stall.start()
    try:
        await asyncio.to_thread(_until_stalled, store)
        clock = asyncio.get_running_loop().time
        started = clock()
        verdicts = [await limits.admit(who, "m")]
        first = clock() - started
        verdicts += [await limits.admit(who, "m") for _ in range(3)]
        rest = clock() - started - first
    finally:
        stall.join()
    assert first < 3.0, "one request waits out the timeout (0.5 s), not the stall (6 s)"
    assert rest < 1.0, "the others do not ask a stalled store (0.5 s each)"
    assert verdicts[:2] == [None, None] and all(v is not None for v in verdicts[2:])
    assert "timeout" in limits.errors  # type: ignore[attr-defined]
    assert sum("failed (timeout" in r.getMessage() for r in caplog.records) == 1
    for _ in range(100):
        if limits.up:
            break
        await asyncio.sleep(0.1)
    assert limits.up, "back to the shared buckets by itself"
    assert await limits.admit(principal("after-stall", rpm=3), "m") is None
    assert limits.checks[-1] == "shared"  # type: ignore[attr-defined]


async def test_error_replies_switch_to_the_share_and_are_logged_once(
    limits: SharedLimits, store: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "inferstack.router.limits")
    r = admin(store)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", "1")
    try:
        for i in range(3):
            assert await limits.admit(principal(f"oom-{i}", rpm=10), "m") is None
        assert "error_reply" in limits.errors  # type: ignore[attr-defined]
        assert sum("error_reply" in r.getMessage() for r in caplog.records) == 1
    finally:
        r.config_set("maxmemory", "0")
    for _ in range(50):
        if limits.up:
            break
        await asyncio.sleep(0.1)
    assert limits.up


async def test_a_wrong_token_is_an_auth_failure_and_requests_still_flow(
    store: RedisProcess, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("not-the-token")
    errors: list[str] = []
    shared = SharedLimits(LimitStore(url=store.url, auth_token_file=token, replicas=2), errors.append)
    await shared.start()
    try:
        who = principal("wrong-token", rpm=4)
        assert [await shared.admit(who, "m") for _ in range(3)][:2] == [None, None]
        assert errors and set(errors) == {"auth"}
    finally:
        await shared.stop()


async def test_the_fallback_divides_by_the_replicas_seen_alive(store: RedisProcess, tmp_path: Path) -> None:
    # alive for 3 check intervals: 3 s, well beyond a loaded machine's stalls between the starts below
    settings = LimitStore(url=store.url, check_interval_ms=1000, key_prefix="alive-test:", replicas=1)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    settings = settings.model_copy(update={"auth_token_file": token})
    replicas = [SharedLimits(settings) for _ in range(3)]
    for r in replicas:
        await r.start()
    try:
        await replicas[0].check()
        assert replicas[0].replicas == 3
    finally:
        for r in replicas:
            await r.stop()


def test_causes_are_a_small_fixed_set() -> None:
    assert error_cause(TimeoutError()) == "timeout"
    assert error_cause(ConnectionRefusedError()) == "connection"
    assert error_cause(ValueError()) == "other"


def test_batch_api_calls_draw_on_the_shared_limit(
    store: RedisProcess, tmp_path: Path, make_router: Callable[..., RouterUnderTest]
) -> None:
    """Files and Batches calls take from the same shared bucket as inference calls: two routers, one limit."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    raw = "sk-batch-api-shared"
    key = {"name": "batch-api", "sha256": hashlib.sha256(raw.encode()).hexdigest(), "requests_per_minute": 3}
    dead = (
        free_port()
    )  # no batch service: an admitted call fails there (502), a refused one never leaves (429)
    routers = [
        make_router(
            [f"http://127.0.0.1:{free_port()}"],
            require_api_key=True,
            api_keys=[key],
            batches_url=f"http://127.0.0.1:{dead}",
            limit_store={"url": store.url, "auth_token_file": str(token), "timeout_ms": 1000},
        )
        for _ in range(2)
    ]
    auth = {"Authorization": f"Bearer {raw}"}
    statuses = [routers[i % 2].request("GET", "/v1/batches", headers=auth)[0] for i in range(5)]
    assert 429 not in statuses[:3] and statuses[3:] == [429, 429], statuses
    assert all(r.router is not None and r.router.limits.store_up for r in routers)


def test_the_routers_fallback_share_is_the_pickers_share() -> None:
    """Front ends that hold a key's buckets on their own divide its limits one way: routers whose shared store is
    down, and the endpoint picker's replicas. A ceiling in one of them let three routers admit 12 a minute of a
    key limited to 10."""
    key = ApiKey(
        name="k", sha256=hashlib.sha256(b"k").hexdigest(), requests_per_minute=10, tokens_per_minute=1000
    )
    shared = SharedLimits(LimitStore(url="redis://127.0.0.1:9", replicas=3))
    shared.replicas = 3
    fallback = shared._local(KeyTable([key], 0.0).by_hash[key.sha256])
    picker = KeyTable([key], 0.0, replicas=3).by_hash[key.sha256]
    assert fallback.requests is not None and picker.requests is not None and fallback.tokens is not None
    assert fallback.requests.rate_per_s == picker.requests.rate_per_s == pytest.approx(10 / 3 / 60)
    assert fallback.tokens.rate_per_s == pytest.approx(1000 / 3 / 60)
