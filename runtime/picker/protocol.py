"""The Endpoint Picker Protocol on Envoy's ext_proc v3 messages: reading what the gateway sends, building
what the picker answers. Messages are the generated ones of PyPI ``xds-protos`` (Envoy's data-plane-api);
nothing is written by hand.

Protocol (Gateway API Inference Extension, docs/proposals/004-endpoint-picker-protocol, v1.0.0 of
2025-07-29, the protocol of the extension's v1 API):

- the pick goes back as the ``x-gateway-destination-endpoint`` request header AND as dynamic metadata
  ``envoy.lb`` / ``x-gateway-destination-endpoint``, both ``ip:port[,ip:port...]``: the chosen endpoint
  first, then fallbacks the gateway tries in order when retrying;
- the gateway may restrict the pick to a subset: request filter metadata ``envoy.lb.subset_hint`` /
  ``x-gateway-destination-endpoint-subset`` (a list of ``ip:port``); none of them eligible is a 503;
- no pick is an ImmediateResponse: 503 when no endpoint is ready, 429 when the request is shed (the
  picker answers 503 ``overloaded`` for the latter, as the router does: see ``decide``);
- the gateway reports the endpoint that served in ``envoy.lb`` / ``x-gateway-destination-endpoint-served``
  (response metadata); Envoy's own ``upstream.address`` attribute says the same where the filter is
  configured to send it (``response_attributes``), which is how the rendered local Envoy reports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    HttpHeaders,
    ImmediateResponse,
    ProcessingRequest,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

DESTINATION_HEADER = "x-gateway-destination-endpoint"
#: The model a request names, for gateways that choose the model's route after the pick (the header the
#: extension's body-based router sets).
MODEL_HEADER = "x-gateway-model-name"
SERVED_KEY = "x-gateway-destination-endpoint-served"
METADATA_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
#: The Envoy attribute with the upstream host that served (requested through ``response_attributes``).
UPSTREAM_ADDRESS_ATTRIBUTE = "upstream.address"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
#: The gRPC service names the picker reports health for (the protocol's Health Checking section).
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


def header_map(headers: HttpHeaders) -> dict[str, str]:
    """Lower-case name -> value (Envoy sends ``raw_value`` bytes; older configurations ``value``)."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        out[h.key.lower()] = h.raw_value.decode("latin-1") if h.raw_value else h.value
    return out


def _metadata_value(namespaces: Mapping[str, Struct], namespace: str, key: str) -> object:
    if namespace not in namespaces:
        return None
    fields = namespaces[namespace].fields
    if key not in fields:
        return None
    value = fields[key]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    return None


def subset_hint(request: ProcessingRequest) -> frozenset[str] | None:
    """The endpoints the gateway allows for this request, or None when it sets no hint."""
    value = _metadata_value(request.metadata_context.filter_metadata, SUBSET_NAMESPACE, SUBSET_KEY)
    if value is None:
        return None
    items = value if isinstance(value, list) else str(value).split(",")
    return frozenset(str(i).strip() for i in items if str(i).strip())


def served_endpoint(request: ProcessingRequest) -> str | None:
    """The ``ip:port`` that served, from the protocol's metadata or Envoy's ``upstream.address``."""
    value = _metadata_value(request.metadata_context.filter_metadata, METADATA_NAMESPACE, SERVED_KEY)
    if isinstance(value, str) and value:
        return value
    attributes = request.attributes
    if EXT_PROC_FILTER in attributes:
        fields = attributes[EXT_PROC_FILTER].fields
        if UPSTREAM_ADDRESS_ATTRIBUTE in fields:
            address = fields[UPSTREAM_ADDRESS_ATTRIBUTE].string_value
            return address or None
    return None


def _set_headers(pairs: Iterable[tuple[str, str]]) -> HeaderMutation:
    return HeaderMutation(
        set_headers=[
            HeaderValueOption(
                header=HeaderValue(key=k, raw_value=v.encode("latin-1")),
                append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for k, v in pairs
        ]
    )


def _destination_metadata(destination: str) -> Struct:
    metadata = Struct()
    metadata.update({METADATA_NAMESPACE: {DESTINATION_HEADER: destination}})
    return metadata


def continue_headers(request_side: bool = True) -> ProcessingResponse:
    """Let the headers through unchanged."""
    if request_side:
        return ProcessingResponse(request_headers=HeadersResponse(response=CommonResponse()))
    return ProcessingResponse(response_headers=HeadersResponse(response=CommonResponse()))


#: Request headers the engine never sees: the client's key stays at the gateway (the router strips it too).
STRIPPED_HEADERS = ("authorization", "proxy-authorization")


def _routed(destination: str, model: str, passed: Iterable[tuple[str, str]]) -> CommonResponse:
    """``passed``: headers the engine gets besides the pick (the request's trace context)."""
    mutation = _set_headers([(DESTINATION_HEADER, destination), (MODEL_HEADER, model), *passed])
    mutation.remove_headers.extend(STRIPPED_HEADERS)
    return CommonResponse(header_mutation=mutation, clear_route_cache=True)


def routed_headers(
    destination: str, model: str, passed: Iterable[tuple[str, str]] = ()
) -> ProcessingResponse:
    """The request headers' answer carrying the pick (full-duplex mode: sent once the body is in)."""
    common = _routed(destination, model, passed)
    return ProcessingResponse(
        request_headers=HeadersResponse(response=common), dynamic_metadata=_destination_metadata(destination)
    )


def routed_body(destination: str, model: str, passed: Iterable[tuple[str, str]] = ()) -> ProcessingResponse:
    """The buffered request body's answer carrying the pick (headers were let through before it)."""
    common = _routed(destination, model, passed)
    return ProcessingResponse(
        request_body=BodyResponse(response=common), dynamic_metadata=_destination_metadata(destination)
    )


def streamed_body(body: bytes, end_of_stream: bool, request_side: bool = True) -> ProcessingResponse:
    """Full-duplex mode: hand a body chunk back to the gateway unchanged."""
    mutation = BodyMutation(streamed_response=StreamedBodyResponse(body=body, end_of_stream=end_of_stream))
    answer = BodyResponse(response=CommonResponse(body_mutation=mutation))
    if request_side:
        return ProcessingResponse(request_body=answer)
    return ProcessingResponse(response_body=answer)


def continue_body(request_side: bool = True) -> ProcessingResponse:
    if request_side:
        return ProcessingResponse(request_body=BodyResponse(response=CommonResponse()))
    return ProcessingResponse(response_body=BodyResponse(response=CommonResponse()))


def continue_trailers(request_side: bool = True) -> ProcessingResponse:
    if request_side:
        return ProcessingResponse(request_trailers=TrailersResponse())
    return ProcessingResponse(response_trailers=TrailersResponse())


def immediate(
    status: int, body: bytes, headers: Iterable[tuple[str, str]], details: str
) -> ProcessingResponse:
    """The gateway answers the client itself with ``status`` and ``body`` (an OpenAI-shaped error)."""
    return ProcessingResponse(
        immediate_response=ImmediateResponse(
            status=HttpStatus(code=status),  # type: ignore[arg-type,unused-ignore]  # StatusCode values are the codes
            headers=_set_headers([("content-type", "application/json"), *headers]),
            body=body,
            details=details,
        )
    )
