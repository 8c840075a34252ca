"""One ext_proc stream message by message, on the generated Envoy messages: what the gateway is told at each
step, the protocol's metadata and headers, fallbacks, the subset hint, the served endpoint's accounting,
and bad input (a body past the limit, a stream that ends early) answered or logged, never hung."""

from __future__ import annotations

import json
import logging

import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    HttpTrailers,
    ProcessingRequest,
    ProcessingResponse,
)
from google.protobuf.struct_pb2 import Struct

from runtime.breaker import Circuit
from runtime.config import BodyMode, RuntimeConfig
from runtime.picker.exchange import Exchange
from runtime.picker.protocol import DESTINATION_HEADER, MODEL_HEADER
from runtime.picker.service import Picker

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]


def _picker(body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED, cap: int = 4, **picker: object) -> Picker:
    cfg = RuntimeConfig.model_validate(
        {
            "models": [
                {
                    "name": "m",
                    "static_backends": [{"url": u} for u in URLS],
                    "max_concurrency_per_backend": cap,
                }
            ],
            "router": {"default_strategy": {"name": "least_load"}, "max_body_bytes": 4096},
            "picker": {"body_mode": body_mode.value, **picker},
        }
    )
    p = Picker(cfg)
    p.models["m"].set_replicas(URLS)
    return p


def _headers(
    path: str = "/v1/chat/completions", method: str = "POST", end: bool = False, **extra: str
) -> ProcessingRequest:
    pairs = {":path": path, ":method": method, "content-type": "application/json", **extra}
    values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return ProcessingRequest(
        request_headers=HttpHeaders(headers=HeaderMap(headers=values), end_of_stream=end)
    )


def _body(data: bytes, end: bool = True) -> ProcessingRequest:
    return ProcessingRequest(request_body=HttpBody(body=data, end_of_stream=end))


def _response_headers(status: int, served: str | None = None) -> ProcessingRequest:
    values = [HeaderValue(key=":status", raw_value=str(status).encode())]
    request = ProcessingRequest(response_headers=HttpHeaders(headers=HeaderMap(headers=values)))
    if served is not None:
        attrs = Struct()
        attrs.update({"upstream.address": served})
        request.attributes["envoy.filters.http.ext_proc"].CopyFrom(attrs)
    return request


def _set_headers(answer: ProcessingResponse, side: str) -> dict[str, str]:
    common = getattr(answer, side).response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_full_duplex_answers_the_headers_once_the_body_is_in_then_returns_the_body() -> None:
    picker = _picker()
    ex = Exchange(picker)
    assert ex.on_message(_headers()) == []  # the model is in the body: nothing to say yet
    assert ex.on_message(_body(CHAT[:10], end=False)) == []
    headers, body = ex.on_message(_body(CHAT[10:]))
    assert headers.WhichOneof("response") == "request_headers"
    set_headers = _set_headers(headers, "request_headers")
    assert headers.request_headers.response.clear_route_cache
    primary, *fallbacks = set_headers[DESTINATION_HEADER].split(",")
    assert len(fallbacks) == 2 and len({primary, *fallbacks}) == 3
    assert set_headers[MODEL_HEADER] == "m"
    metadata = headers.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert metadata[DESTINATION_HEADER].string_value == set_headers[DESTINATION_HEADER]
    streamed = body.request_body.response.body_mutation.streamed_response
    assert streamed.body == CHAT and streamed.end_of_stream
    assert sum(r.inflight for r in picker.models["m"].replicas) == 1
    ex.close()
    assert sum(r.inflight for r in picker.models["m"].replicas) == 0


def test_buffered_lets_the_headers_through_and_routes_on_the_body() -> None:
    ex = Exchange(_picker(BodyMode.BUFFERED))
    (first,) = ex.on_message(_headers())
    assert (
        first.WhichOneof("response") == "request_headers"
        and not first.request_headers.response.header_mutation.set_headers
    )
    (answer,) = ex.on_message(_body(CHAT))
    assert answer.WhichOneof("response") == "request_body"
    assert DESTINATION_HEADER in _set_headers(answer, "request_body")


def test_trailers_end_the_body_in_full_duplex() -> None:
    ex = Exchange(_picker())
    ex.on_message(_headers())
    assert ex.on_message(_body(CHAT, end=False)) == []
    headers, body, trailers = ex.on_message(ProcessingRequest(request_trailers=HttpTrailers()))
    assert headers.WhichOneof("response") == "request_headers"
    assert not body.request_body.response.body_mutation.streamed_response.end_of_stream
    assert trailers.WhichOneof("response") == "request_trailers"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (json.dumps({"model": "other", "messages": []}).encode(), 404, "model_not_found"),
        (b"x" * 5000, 413, None),
        (json.dumps({"model": "m", "messages": [], "n": 1000}).encode(), 400, "invalid_value"),
    ],
    ids=["malformed", "unknown-model", "too-large", "too-many-choices"],
)
def test_bad_bodies_are_answered_by_the_gateway(body: bytes, status: int, code: str | None, caplog) -> None:
    picker = _picker()
    ex = Exchange(picker)
    ex.on_message(_headers())
    with caplog.at_level(logging.INFO, logger="inferstack.picker"):
        answers = ex.on_message(_body(body))
    (answer,) = answers
    immediate = answer.immediate_response
    assert immediate.status.code == status
    error = json.loads(immediate.body)["error"]
    assert error["code"] == code and error["message"]
    assert "answered by the picker" in caplog.text
    assert ex.on_message(_body(b"more")) == []  # nothing goes anywhere after the gateway's own answer
    ex.close()
    assert all(r.inflight == 0 for r in picker.models["m"].replicas)


def test_full_replicas_are_an_overloaded_503_with_retry_after_and_none_ready_a_503() -> None:
    picker = _picker(cap=1)
    held = []
    for _ in URLS:
        ex = Exchange(picker)
        ex.on_message(_headers())
        ex.on_message(_body(CHAT))
        held.append(ex)
    ex = Exchange(picker)
    ex.on_message(_headers())
    (answer,) = ex.on_message(_body(CHAT))
    assert answer.immediate_response.status.code == 503  # the service is full: not the client's own limit
    assert json.loads(answer.immediate_response.body)["error"]["code"] == "overloaded"
    assert {h.header.key for h in answer.immediate_response.headers.set_headers} >= {"retry-after"}
    for r in picker.models["m"].replicas:
        r.healthy = False
    ex = Exchange(picker)
    ex.on_message(_headers())
    (answer,) = ex.on_message(_body(CHAT))
    assert answer.immediate_response.status.code == 503


def test_the_subset_hint_restricts_the_pick() -> None:
    picker = _picker()
    request = _headers()
    hint = Struct()
    hint.update({"x-gateway-destination-endpoint-subset": ["10.0.0.3:8000"]})
    request.metadata_context.CopyFrom(Metadata(filter_metadata={"envoy.lb.subset_hint": hint}))
    ex = Exchange(picker)
    ex.on_message(request)
    headers, _ = ex.on_message(_body(CHAT))
    assert _set_headers(headers, "request_headers")[DESTINATION_HEADER] == "10.0.0.3:8000"
    request = _headers()
    hint.update({"x-gateway-destination-endpoint-subset": ["10.9.9.9:8000"]})
    request.metadata_context.CopyFrom(Metadata(filter_metadata={"envoy.lb.subset_hint": hint}))
    ex = Exchange(picker)
    ex.on_message(request)
    (answer,) = ex.on_message(_body(CHAT))
    assert answer.immediate_response.status.code == 503


def test_a_fallback_that_served_carries_the_request_and_the_pick_counts_a_failure() -> None:
    picker = _picker()
    ex = Exchange(picker)
    ex.on_message(_headers())
    headers, _ = ex.on_message(_body(CHAT))
    primary, fallback, _ = _set_headers(headers, "request_headers")[DESTINATION_HEADER].split(",")
    by_endpoint = picker.models["m"].by_endpoint
    (answer,) = ex.on_message(_response_headers(200, served=fallback))
    assert answer.WhichOneof("response") == "response_headers"
    assert by_endpoint[primary].inflight == 0 and by_endpoint[fallback].inflight == 1
    assert by_endpoint[primary].breaker.failures == 1
    assert by_endpoint[fallback].ttft_ewma_s is not None
    ex.close()
    assert by_endpoint[fallback].inflight == 0


def test_engine_errors_open_the_circuit() -> None:
    picker = _picker(cap=64)
    pool = picker.models["m"]
    for _ in range(pool.settings.breaker_failures * len(URLS)):
        ex = Exchange(picker)
        ex.on_message(_headers())
        ex.on_message(_body(CHAT))
        ex.on_message(_response_headers(503))
        ex.close()
    assert {r.breaker.state for r in pool.replicas} == {Circuit.OPEN}
    ex = Exchange(picker)
    ex.on_message(_headers())
    (answer,) = ex.on_message(_body(CHAT))
    assert answer.immediate_response.status.code == 503


def test_a_stream_that_ends_before_its_body_is_logged_and_nothing_is_routed(caplog) -> None:
    picker = _picker()
    ex = Exchange(picker)
    ex.on_message(_headers(**{"x-request-id": "r-1"}))
    ex.on_message(_body(CHAT[:5], end=False))
    with caplog.at_level(logging.INFO, logger="inferstack.picker"):
        ex.close()
    assert "ended before the request was complete" in caplog.text
    assert all(r.inflight == 0 for r in picker.models["m"].replicas)
    assert (
        picker.metrics.registry.get_sample_value(
            "inferstack_picker_picks_total", {"model": "m", "backend": URLS[0]}
        )
        is None
    )


def test_models_list_and_unknown_paths_without_a_body() -> None:
    ex = Exchange(_picker())
    (answer,) = ex.on_message(_headers("/v1/models", "GET", end=True))
    assert answer.immediate_response.status.code == 200
    assert [m["id"] for m in json.loads(answer.immediate_response.body)["data"]] == ["m"]
    ex = Exchange(_picker())
    (answer,) = ex.on_message(_headers("/admin", "GET", end=True))
    assert answer.immediate_response.status.code == 404
