"""The batcher's traces: each client request a server span (its caller's trace), each engine call a span of its
own that links to every request it carries and whose context the engine receives; off, no export traffic."""

from __future__ import annotations

import asyncio

import aiohttp

from runtime import tracing
from runtime.batcher.service import ReplicaClient
from tests.otlp_receiver import OtlpReceiver
from tests.runtime.batcher.conftest import batcher_config

CALLERS = [f"{i:032x}" for i in range(1, 4)]


async def _post(s: aiohttp.ClientSession, url: str, text: str, trace_id: str) -> int:
    headers = {"traceparent": f"00-{trace_id}-{'ab' * 8}-01"}
    async with s.post(url + "/v1/embeddings", json={"model": "emb", "input": text}, headers=headers) as r:
        await r.read()
        return r.status


async def test_an_engine_batch_is_one_span_linked_to_each_request_it_carries(fake_engine, batcher_at):
    receiver = OtlpReceiver().start()
    try:
        engine = await fake_engine(embed_delay_s=0.2)
        cfg = batcher_config(
            [engine.url], max_batch_size=64, max_wait_ms=50, max_inflight_batches_per_backend=1
        )
        cfg = cfg.model_copy(update={"tracing": tracing_settings(receiver.endpoint, 0.0)})
        b = await batcher_at(cfg)
        async with aiohttp.ClientSession() as s:
            statuses = await asyncio.gather(*(_post(s, b.url, f"text {i}", t) for i, t in enumerate(CALLERS)))
        assert statuses == [200, 200, 200]
        assert b.batcher.tracing.provider is not None
        assert await asyncio.to_thread(b.batcher.tracing.provider.force_flush, 10_000)
        spans = await asyncio.to_thread(
            receiver.wait_for, lambda s: sum(x["name"] == "batcher embeddings" for x in s) == 3
        )
        requests = {x["trace_id"]: x for x in spans if x["name"] == "batcher embeddings"}
        assert set(requests) == set(CALLERS)  # the callers' traces, sampled by them (the ratio is 0)
        batches = [x for x in spans if x["name"] == "batcher batch"]
        assert batches and all(x["service"] == "inferstack-batcher" for x in batches)
        # each batch joins its first member's trace and links to the others: every request reaches its batch
        joined = {(x["trace_id"], x["parent_span_id"]) for x in batches}
        linked = {link for x in batches for link in x["links"]}
        assert joined | linked == {(t, requests[t]["span_id"]) for t in CALLERS}
        assert sum(x["attributes"]["inferstack.batch_inputs"] for x in batches) == 3
        assert all(x["attributes"][tracing.REPLICA] == engine.url for x in batches)
    finally:
        await asyncio.to_thread(b.batcher.tracing.shutdown)  # before its receiver goes
        receiver.stop()


async def test_tracing_off_the_batcher_exports_nothing(fake_engine, batcher_at):
    receiver = OtlpReceiver().start()
    try:
        engine = await fake_engine(embed_delay_s=0.01)
        b = await batcher_at(batcher_config([engine.url]))
        assert b.batcher.tracing.provider is None
        async with aiohttp.ClientSession() as s:
            assert await _post(s, b.url, "hello", CALLERS[0]) == 200
        await b.close()
        assert receiver.calls == 0
    finally:
        receiver.stop()


def test_an_engine_call_carries_its_spans_context_only_when_traced():
    client = ReplicaClient("http://127.0.0.1:9")
    assert b"traceparent" not in client.request(b"/v1/embeddings", b"{}")
    traces = tracing.Tracing(tracing_settings("http://127.0.0.1:9", 1.0), "test", exporter=_Nowhere())
    with traces.outgoing("batch") as span:
        assert span is not None
        head = client.request(b"/v1/embeddings", b"{}")
        want = (
            f"traceparent: 00-{span.get_span_context().trace_id:032x}-{span.get_span_context().span_id:016x}-"
        )
        assert want.encode() in head
    traces.shutdown()


class _Nowhere:
    def export(self, spans):  # the SDK's SpanExporter protocol
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=0):
        return True


def tracing_settings(endpoint: str, ratio: float):
    from runtime.config import TracingSettings

    return TracingSettings(endpoint=endpoint, sample_ratio=ratio)
