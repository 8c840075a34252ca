"""Small helpers every runtime service shares: OpenAI-shaped errors and metrics exposition.

Framework-free on purpose (bytes in, bytes out) so the router's lean server, and the health monitor
and batcher on whatever server they choose, answer errors and ``/metrics`` identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

# OpenAI's error ``type`` for each status we produce; clients (the openai SDK) map status to exceptions.
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "timeout_error",
}

REASONS: dict[int, str] = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


#: A request refused for load, not for the caller's own limits (those are 429 ``rate_limit_error``): 503 with a
#: ``Retry-After`` header and this ``code``, from the router and the endpoint picker alike, so a client (and the
#: openai SDK's retry) can tell "slow down, you" from "the service is full, try again shortly".
OVERLOADED = 503
OVERLOADED_CODE = "overloaded"


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> bytes:
    """The JSON body OpenAI's API returns for an error, so SDKs raise their usual exceptions."""
    payload = {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def error_code(body: bytes) -> str | None:
    """The ``error.code`` of an OpenAI-shaped error body (``error_body``'s shape); None for anything else."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError, RecursionError):  # not JSON, not an object, or nested past the parser
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


RETRY_AFTER = b"retry-after"


def retry_after(seconds: int) -> tuple[bytes, bytes]:
    """A refusal's Retry-After header: when to come back, in whole seconds."""
    return (RETRY_AFTER, b"%d" % seconds)


def passed_retry_after(upstream: Mapping[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """An upstream answer's Retry-After, to pass on to the client (the upstream knows best); none without one."""
    value = upstream.get(RETRY_AFTER)
    return [(RETRY_AFTER, value)] if value is not None else []


FORWARDED_FOR = b"x-forwarded-for"
"""Kept empty by the server when a request repeats it: which copy a proxy appended to is not known."""


def client_address(forwarded_for: str | None, peer: object, trusted_hops: int) -> str | None:
    """Where a request came from: the ``X-Forwarded-For`` entry ``trusted_hops`` from the right, which the
    nearest of that many proxies in front wrote (a client can forge the entries to its left, not that one),
    else (no header, a repeated one, too few entries) the host of the connection's ``peer`` (a
    ``peername``); None when neither is known."""
    hops = [h.strip() for h in forwarded_for.split(",")] if forwarded_for and trusted_hops else []
    if len(hops) >= trusted_hops > 0 and hops[-trusted_hops]:
        return hops[-trusted_hops]
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return None


def metrics_payload(registry: CollectorRegistry) -> bytes:
    """Prometheus text exposition of one registry (each service keeps its own, never the global one)."""
    return generate_latest(registry)


# The router tells the batch service who calls (a key's name; it owns the files and batches it makes) and
# which models the key may use (comma-separated, empty: all). The router sets both and drops any a client
# sends; the batch service trusts them because only the router reaches it (NetworkPolicy, loopback).
PRINCIPAL_HEADER = b"x-inferstack-key"
SCOPES_HEADER = b"x-inferstack-models"
# The batch service marks its requests low priority; the router admits them only with headroom.
PRIORITY_HEADER = b"x-inferstack-priority"
LOW_PRIORITY = b"low"
