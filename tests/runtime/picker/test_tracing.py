"""The endpoint picker's traces, exported to a real OTLP/gRPC receiver on loopback: one server span per request,
from its headers to the end of its answer, continuing the caller's trace; the engine gets that span's
``traceparent`` with the pick, so its own spans join the trace; a caller's unsampled trace makes no span and is
passed on as it came; with tracing off the picker adds no header and exports nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpBody, ProcessingRequest

from runtime import tracing
from runtime.config import RuntimeConfig
from runtime.picker.exchange import Exchange
from runtime.picker.protocol import DESTINATION_HEADER
from runtime.picker.service import Picker
from tests.otlp_receiver import OtlpReceiver
from tests.runtime.picker.test_exchange import CHAT, URLS, _body, _headers, _response_headers, _set_headers

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_PARENT = "b7ad6b7169203331"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def _picker(trace: dict[str, object] | None, cap: int = 4) -> Picker:
    cfg = RuntimeConfig.model_validate(
        {
            "models": [
                {
                    "name": "m",
                    "static_backends": [{"url": u} for u in URLS],
                    "max_concurrency_per_backend": cap,
                }
            ],
            "router": {"default_strategy": {"name": "least_load"}},
            **({"tracing": trace} if trace is not None else {}),
        }
    )
    picker = Picker(cfg)
    picker.models["m"].set_replicas(URLS)
    return picker


@pytest.fixture
def traced(receiver: OtlpReceiver) -> Iterator[Picker]:
    picker = _picker({"endpoint": receiver.endpoint, "sample_ratio": 1.0})
    yield picker
    picker.tracing.shutdown()


def _served(picker: Picker, status: int = 200, **headers: str) -> dict[str, str]:
    """One chat request through an exchange, answered with ``status``: the headers the engine's request got."""
    ex = Exchange(picker)
    assert ex.on_message(_headers(**headers)) == []
    routed = _set_headers(ex.on_message(_body(CHAT))[0], "request_headers")
    ex.on_message(_response_headers(status))
    ex.on_message(ProcessingRequest(response_body=HttpBody(body=b"{}", end_of_stream=True)))
    return routed


def _flush(picker: Picker) -> None:
    assert picker.tracing.provider is not None and picker.tracing.provider.force_flush(10_000)


def test_a_request_is_one_span_continuing_the_callers_trace_and_the_engine_gets_its_context(
    traced: Picker, receiver: OtlpReceiver
) -> None:
    routed = _served(traced, traceparent=f"00-{CALLER_TRACE}-{CALLER_PARENT}-01")
    _flush(traced)
    (span,) = receiver.wait_for(lambda s: any(x["name"] == "picker chat" for x in s))
    assert (span["trace_id"], span["parent_span_id"]) == (CALLER_TRACE, CALLER_PARENT)
    assert span["service"] == "inferstack-picker"
    a = span["attributes"]
    assert a[tracing.MODEL] == "m" and a[tracing.STRATEGY] == "least_load"
    assert (a[tracing.TENANT], a[tracing.PRIORITY]) == ("other", "standard")
    assert a[tracing.REPLICA] in URLS and a[tracing.REPLICA].endswith(
        routed[DESTINATION_HEADER].split(",")[0]
    )
    assert a[tracing.STATUS] == 200 and a[tracing.RESPONSE_HEADERS_MS] >= 0
    assert span["end_ns"] >= span["start_ns"]
    # the engine's spans are the picker span's children: its traceparent names this span, sampled
    assert routed["traceparent"] == f"00-{CALLER_TRACE}-{span['span_id']}-01"


def test_a_callers_unsampled_trace_makes_no_span_and_passes_on_unchanged(
    traced: Picker, receiver: OtlpReceiver
) -> None:
    unsampled = f"00-{CALLER_TRACE}-{CALLER_PARENT}-00"
    assert _served(traced, traceparent=unsampled)["traceparent"] == unsampled
    _served(traced)  # a new trace at ratio 1: kept, so the export below is not vacuous
    _flush(traced)
    spans = receiver.wait_for(lambda s: len(s) >= 1)
    assert [s["trace_id"] for s in spans if s["trace_id"] == CALLER_TRACE] == []


def test_a_request_the_picker_refuses_ends_its_span_as_an_error(
    traced: Picker, receiver: OtlpReceiver
) -> None:
    picker = traced
    for r in picker.models["m"].replicas:
        r.inflight = 4  # every replica at its cap: overloaded
    ex = Exchange(picker)
    ex.on_message(_headers())
    (answer,) = ex.on_message(_body(CHAT))
    assert answer.immediate_response.status.code == 503
    _flush(picker)
    (span,) = receiver.wait_for(lambda s: any(x["name"] == "picker chat" for x in s))
    assert span["status"] == 2  # STATUS_CODE_ERROR
    assert span["attributes"][tracing.STATUS] == 503


def test_with_tracing_off_the_picker_adds_no_header_and_has_no_exporter() -> None:
    picker = _picker(None)
    caller = f"00-{CALLER_TRACE}-{CALLER_PARENT}-01"
    assert "traceparent" not in _served(picker, traceparent=caller)  # Envoy passes the caller's own on
    assert picker.tracing.provider is None
