"""The router's traces, against a real OTLP/gRPC receiver on loopback (tests/otlp_receiver.py) and engine
doubles: one server span per request with its attributes, each upstream attempt a child span, the W3C
``traceparent`` passed to the engine, parent-based sampling, no prompt text unless asked, and, with tracing off,
no export traffic at all."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runtime import tracing
from runtime.config import RuntimeConfig
from tests.otlp_receiver import OtlpReceiver
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg

CHAT = {"model": "m", "messages": [{"role": "user", "content": "the secret plan is tangerine"}]}
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_PARENT = "b7ad6b7169203331"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def traced_router(lt: LoopThread) -> Iterator[Callable[..., RouterUnderTest]]:
    started: list[RouterUnderTest] = []

    def make(urls: list[str], trace: dict[str, Any] | None, **router: Any) -> RouterUnderTest:
        cfg = router_cfg(urls, **router)
        if trace is not None:
            cfg["tracing"] = trace
        r = RouterUnderTest(lt, cfg).start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


def _flush(router: RouterUnderTest) -> None:
    assert router.router is not None and router.router.tracing.provider is not None
    assert router.router.tracing.provider.force_flush(10_000)


def _traceparent(double: Double, i: int = -1) -> tuple[str, str, bool]:
    """The engine's view of its request's trace: trace id, parent span id, sampled (W3C trace flags bit 0)."""
    version, trace_id, parent, flags = double.requests[i]["headers"]["traceparent"].split("-")
    assert version == "00"
    return trace_id, parent, bool(int(flags, 16) & 1)


def test_a_request_is_one_server_span_with_its_attributes_and_the_engine_gets_its_traceparent(
    doubles, traced_router, receiver
):
    (d,) = doubles(1)
    router = traced_router([d.url], {"endpoint": receiver.endpoint, "sample_ratio": 1.0})
    status, _, _ = router.request("POST", "/v1/chat/completions", CHAT)
    assert status == 200
    _flush(router)
    spans = receiver.wait_for(lambda s: any(x["name"] == "router chat" for x in s))
    (server,) = [s for s in spans if s["name"] == "router chat"]
    a = server["attributes"]
    assert server["service"] == "inferstack-router"
    assert a[tracing.MODEL] == "m"
    assert a[tracing.STRATEGY] == "least_load"
    assert a[tracing.REPLICA] == d.url
    assert a[tracing.INPUT_TOKENS] == 5 and a[tracing.OUTPUT_TOKENS] == 2
    assert a[tracing.TTFT_MS] > 0
    assert (a[tracing.TENANT], a[tracing.PRIORITY]) == ("other", "standard")  # no key: the shared tenant
    assert tracing.RETRIES not in a
    # the engine's spans would be children of the router's: the engine got this span's context, sampled
    trace_id, parent, flags = _traceparent(d)
    assert (trace_id, parent, flags) == (server["trace_id"], server["span_id"], True)
    # no prompt text anywhere by default, nor the caller's headers
    assert "tangerine" not in json.dumps(spans)


def test_a_retried_request_shows_both_attempts_under_its_span(doubles, traced_router, receiver):
    bad, good = doubles(2)
    bad.mode = "503"
    router = traced_router(
        [bad.url, good.url],
        {"endpoint": receiver.endpoint, "sample_ratio": 1.0},
        default_strategy={"name": "round_robin"},
    )
    # round robin: within two requests one goes to the failing replica first and is retried on the other
    for _ in range(2):
        assert router.request("POST", "/v1/chat/completions", CHAT)[0] == 200
        if bad.requests:
            break
    assert len(bad.requests) == 1
    _flush(router)
    spans = receiver.wait_for(
        lambda s: sum(x["name"] == "router.attempt" for x in s) >= len(good.requests) + 1
    )
    (server,) = [s for s in spans if s["name"] == "router chat" and s["attributes"].get(tracing.RETRIES)]
    attempts = sorted(
        (s for s in spans if s["name"] == "router.attempt" and s["trace_id"] == server["trace_id"]),
        key=lambda s: s["start_ns"],
    )
    assert [s["attributes"][tracing.ATTEMPT] for s in attempts] == [1, 2]
    assert [s["attributes"][tracing.REPLICA] for s in attempts] == [bad.url, good.url]
    assert all(
        s["trace_id"] == server["trace_id"] and s["parent_span_id"] == server["span_id"] for s in attempts
    )
    assert (
        attempts[0]["attributes"][tracing.STATUS] == 503 and attempts[0]["status"] == 2
    )  # STATUS_CODE_ERROR
    assert tracing.STATUS not in attempts[1]["attributes"]
    assert server["attributes"][tracing.RETRIES] == 1
    assert server["attributes"][tracing.REPLICA] == good.url
    # both engines saw the same trace
    assert _traceparent(bad)[0] == _traceparent(good)[0] == server["trace_id"]


def test_sampling_is_parent_based_the_callers_decision_wins_over_the_ratio(doubles, traced_router, receiver):
    (d,) = doubles(1)
    router = traced_router([d.url], {"endpoint": receiver.endpoint, "sample_ratio": 0.0})
    # a new trace at ratio 0: not kept, and the engine is told so (not sampled) under a fresh trace id
    assert router.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert _traceparent(d)[2] is False
    # a caller's sampled trace is kept whatever the ratio, as a child of the caller's span
    sampled = f"00-{CALLER_TRACE}-{CALLER_PARENT}-01"
    assert router.request("POST", "/v1/chat/completions", CHAT, {"traceparent": sampled})[0] == 200
    _flush(router)
    spans = receiver.wait_for(lambda s: any(x["name"] == "router chat" for x in s))
    servers = [s for s in spans if s["name"] == "router chat"]
    assert [(s["trace_id"], s["parent_span_id"]) for s in servers] == [(CALLER_TRACE, CALLER_PARENT)]
    trace_id, parent, flags = _traceparent(d)
    assert (trace_id, parent, flags) == (CALLER_TRACE, servers[0]["span_id"], True)


def test_prompt_capture_is_an_explicit_opt_in(doubles, traced_router, receiver):
    (d,) = doubles(1)
    router = traced_router(
        [d.url], {"endpoint": receiver.endpoint, "sample_ratio": 1.0, "capture_prompts": True}
    )
    assert router.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    _flush(router)
    spans = receiver.wait_for(lambda s: any(x["name"] == "router chat" for x in s))
    (server,) = [s for s in spans if s["name"] == "router chat"]
    assert "tangerine" in server["attributes"][tracing.PROMPT]


def test_tracing_off_sends_no_export_traffic_and_starts_no_exporter(doubles, traced_router, receiver):
    """The attack: a client sends a sampled traceparent to a router without tracing. Nothing reaches the
    receiver (counted at the receiver, over the wire), no exporter thread runs, and the caller's context passes
    through to the engine untouched."""
    (d,) = doubles(1)
    before = {t.name for t in threading.enumerate()}
    router = traced_router([d.url], None)
    assert router.router is not None and router.router.tracing.provider is None
    sampled = f"00-{CALLER_TRACE}-{CALLER_PARENT}-01"
    for _ in range(20):
        assert router.request("POST", "/v1/chat/completions", CHAT, {"traceparent": sampled})[0] == 200
    router.stop()
    assert receiver.calls == 0 and receiver.spans == []
    started = {t.name for t in threading.enumerate()} - before
    assert not any("Otel" in name or "BatchSpan" in name for name in started), started
    assert d.requests[-1]["headers"]["traceparent"] == sampled


def test_the_runtime_config_takes_tracing_and_checks_its_ratio():
    base = router_cfg(["http://127.0.0.1:1"])
    cfg = RuntimeConfig.model_validate({**base, "tracing": {"endpoint": "http://otel-collector:4317"}})
    assert cfg.tracing is not None and cfg.tracing.sample_ratio == 0.01 and not cfg.tracing.capture_prompts
    with pytest.raises(ValueError, match="sample_ratio"):
        RuntimeConfig.model_validate({**base, "tracing": {"endpoint": "http://c:4317", "sample_ratio": 1.5}})
    assert "tracing" not in RuntimeConfig.model_validate(base).to_yaml()


def test_a_callers_unsampled_trace_costs_no_span_and_reaches_the_engine_as_it_came(
    doubles, traced_router, receiver
):
    (d,) = doubles(1)
    router = traced_router([d.url], {"endpoint": receiver.endpoint, "sample_ratio": 1.0})
    unsampled = f"00-{CALLER_TRACE}-{CALLER_PARENT}-00"
    assert router.request("POST", "/v1/chat/completions", CHAT, {"traceparent": unsampled})[0] == 200
    assert d.requests[-1]["headers"]["traceparent"] == unsampled
    _flush(router)
    assert receiver.spans == []


@pytest.mark.parametrize(
    "header",
    [
        b"garbage",
        b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff is invalid
        b"00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
        b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero parent id
        b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # upper case
        b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",  # version 00 has four fields
    ],
)
def test_an_invalid_traceparent_is_ignored_and_the_ratio_decides(header):
    assert tracing._parse(header) is None


def test_a_valid_traceparent_says_whether_the_caller_sampled():
    assert tracing._parse(f"00-{CALLER_TRACE}-{CALLER_PARENT}-01".encode()) is True
    assert tracing._parse(f"00-{CALLER_TRACE}-{CALLER_PARENT}-00".encode()) is False
    assert tracing._parse(f"01-{CALLER_TRACE}-{CALLER_PARENT}-03-future".encode()) is True  # a later version
