"""The batch service's traces: each line it sends is a span (batch id, line, owner), and the router's span of
that request is its child in the same trace (the line's traceparent); both export to one OTLP receiver."""

from __future__ import annotations

from pathlib import Path

from runtime import tracing
from tests.otlp_receiver import OtlpReceiver
from tests.runtime.batch_service.harness import BatchStack, chat_line, jsonl, run_batch, wait_for
from tests.runtime.router.harness import Double, LoopThread


def test_each_line_is_a_span_and_the_routers_span_is_its_child(tmp_path: Path):
    lt = LoopThread()
    receiver = OtlpReceiver().start()
    engine = Double(name="d0")
    lt.run(engine.start())
    stack = BatchStack(lt, tmp_path, [engine], tracing={"endpoint": receiver.endpoint, "sample_ratio": 1.0})
    try:
        stack.start()
        client = stack.client()
        batch_id = run_batch(client, jsonl(chat_line(f"req-{i}") for i in range(3)))
        assert wait_for(client, batch_id, {"completed", "failed"}).status == "completed"
        spans = receiver.wait_for(
            lambda s: (
                sum(x["name"] == "batch line" for x in s) >= 3
                and sum(x["name"] == "router chat" for x in s) >= 3
            ),
            timeout_s=60,
        )
        lines = {x["span_id"]: x for x in spans if x["name"] == "batch line"}
        assert {x["service"] for x in lines.values()} == {"inferstack-batches"}
        assert sorted(x["attributes"]["inferstack.batch_line"] for x in lines.values()) == [
            1,
            2,
            3,
        ]  # lines count from 1
        assert {x["attributes"]["inferstack.batch_id"] for x in lines.values()} == {batch_id}
        routed = [x for x in spans if x["name"] == "router chat"]
        for span in routed:
            parent = lines[span["parent_span_id"]]
            assert span["trace_id"] == parent["trace_id"]
            assert span["attributes"][tracing.PRIORITY] == "batch"  # a batch line's band in the router's line
    finally:
        stack.stop()
        lt.run(engine.stop())
        receiver.stop()
        lt.stop()
