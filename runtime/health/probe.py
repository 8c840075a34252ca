"""One probe round against one replica: ``/health``, ``/metrics`` and now and then a one-token call.

A thin HTTP shell: every request is bounded by a timeout and every body by a byte limit, and every
error becomes a ``Reason`` code for the state machine instead of an exception. A misbehaving engine
(garbage, gigabytes, trickling bytes, bad TLS, a name that does not resolve) is its own problem and
never the monitor's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

from runtime.config import EngineKind, Task
from runtime.engines import facts
from runtime.health.state import Outcome, Reason
from runtime.metrics_text import ParsedMetrics, decode, parse

log = logging.getLogger("inferstack.health.probe")

HEALTH_BODY_MAX_BYTES = 64 * 1024
SYNTHETIC_BODY_MAX_BYTES = 1024 * 1024


class BodyTooLargeError(Exception):
    pass


async def read_bounded(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """Read at most ``max_bytes``; a larger body (declared or streamed) is refused, not truncated."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise BodyTooLargeError(f"Content-Length {resp.content_length} > {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLargeError(f"body exceeds {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def classify(err: BaseException) -> tuple[Reason, str]:
    """Map a client error to a bounded reason code plus human detail (order matters: subclasses first)."""
    detail = f"{type(err).__name__}: {err}"[:300]
    if isinstance(err, TimeoutError | asyncio.TimeoutError):
        return Reason.TIMEOUT, detail or "timeout"
    if isinstance(err, BodyTooLargeError):
        return Reason.BODY_TOO_LARGE, detail
    if isinstance(err, aiohttp.ClientConnectorDNSError):
        return Reason.DNS, detail
    if isinstance(err, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return Reason.TLS, detail
    if isinstance(err, aiohttp.ClientConnectorError | ConnectionError):
        return Reason.CONNECT, detail
    return Reason.PROTOCOL, detail


@dataclass(frozen=True)
class ProbeResult:
    outcome: Outcome
    metrics: ParsedMetrics | None  # None: the scrape failed (metrics are stale, not zero)
    adapters: list[str] | None = None  # LoRA adapters the engine lists (models with adapters), if read


@dataclass(frozen=True)
class ProbeSpec:
    url: str
    model: str
    engine: EngineKind
    task: Task
    timeout_s: float
    synthetic_timeout_s: float
    max_metrics_bytes: int
    wanted: frozenset[str]
    adapters: bool = False  # the model has LoRA adapters: read which ones the replica holds


async def _get(
    session: aiohttp.ClientSession, url: str, timeout_s: float, max_bytes: int
) -> tuple[int, bytes]:
    async with asyncio.timeout(timeout_s), session.get(url, allow_redirects=False) as resp:
        return resp.status, await read_bounded(resp, max_bytes)


def synthetic_request(spec: ProbeSpec) -> tuple[str, dict[str, Any]]:
    """The cheapest call that exercises the engine's forward pass: one token, or one tiny embedding."""
    if spec.task is Task.EMBED:
        return "/v1/embeddings", {"model": spec.model, "input": "ping"}
    return "/v1/completions", {"model": spec.model, "prompt": "ping", "max_tokens": 1, "temperature": 0}


async def probe(session: aiohttp.ClientSession, spec: ProbeSpec, *, synthetic: bool) -> ProbeResult:
    """Run one round. Hard failures: ``/health`` and the synthetic call. Soft: ``/metrics``."""
    f = facts(spec.engine)
    base = spec.url.rstrip("/")
    try:
        status, body = await _get(session, base + f.health_path, spec.timeout_s, HEALTH_BODY_MAX_BYTES)
    except (aiohttp.ClientError, TimeoutError, BodyTooLargeError, OSError, ValueError) as err:
        reason, detail = classify(err)
        return ProbeResult(Outcome(hard=reason, detail=f"GET {f.health_path}: {detail}"), None)
    if status != 200:
        return ProbeResult(
            Outcome(
                hard=Reason.HTTP_STATUS, detail=f"GET {f.health_path}: HTTP {status} {decode(body[:200])!r}"
            ),
            None,
        )

    if synthetic:
        hard = await _synthetic(session, spec, base)
        if hard is not None:
            return ProbeResult(hard, None)

    soft: Reason | None = None
    detail = ""
    parsed: ParsedMetrics | None = None
    try:
        status, body = await _get(session, base + f.metrics_path, spec.timeout_s, spec.max_metrics_bytes)
        if status != 200:
            soft, detail = Reason.METRICS_UNAVAILABLE, f"GET {f.metrics_path}: HTTP {status}"
        else:
            # Parsing is CPU work; a thread keeps the loop answering /v1/backends meanwhile.
            parsed = await asyncio.to_thread(parse, decode(body), spec.wanted)
            if parsed.refused:
                soft, detail = Reason.METRICS_MALFORMED, f"GET {f.metrics_path}: refused: {parsed.refused}"
                parsed = None
            elif not parsed.samples:
                soft, detail = Reason.METRICS_MALFORMED, f"GET {f.metrics_path}: no known metric names"
                parsed = None
    except (aiohttp.ClientError, TimeoutError, BodyTooLargeError, OSError, ValueError, RecursionError) as err:
        reason, detail = classify(err)
        soft = Reason.METRICS_MALFORMED if reason is Reason.BODY_TOO_LARGE else Reason.METRICS_UNAVAILABLE
        detail = f"GET {f.metrics_path}: {detail}"
    adapters = await _adapters(session, spec, base) if spec.adapters else None
    return ProbeResult(Outcome(soft=soft, detail=detail), parsed, adapters)


async def _adapters(session: aiohttp.ClientSession, spec: ProbeSpec, base: str) -> list[str] | None:
    """The LoRA adapters the engine lists under this model (``parent``); None when the list is unreadable."""
    path = facts(spec.engine).models_path
    try:
        status, body = await _get(session, base + path, spec.timeout_s, spec.max_metrics_bytes)
        if status != 200:
            return None
        return listed_adapters(json.loads(body), spec.model)
    except (aiohttp.ClientError, TimeoutError, BodyTooLargeError, OSError, ValueError, RecursionError):
        return None  # RecursionError: JSON nested deeper than the interpreter's stack, a hostile body


def listed_adapters(listed: Any, model: str) -> list[str]:
    """The adapter ids a ``/v1/models`` answer lists under ``model`` (as their ``parent``). Ids must be
    strings: anything else in the engine's answer is not an adapter name."""
    data = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(data, list):
        return []
    return sorted(
        m["id"]
        for m in data
        if isinstance(m, dict) and m.get("parent") == model and isinstance(m.get("id"), str) and m["id"]
    )


async def _synthetic(session: aiohttp.ClientSession, spec: ProbeSpec, base: str) -> Outcome | None:
    path, payload = synthetic_request(spec)
    try:
        async with asyncio.timeout(spec.synthetic_timeout_s), session.post(base + path, json=payload) as resp:
            body = await read_bounded(resp, SYNTHETIC_BODY_MAX_BYTES)
            if resp.status != 200:
                return Outcome(
                    hard=Reason.SYNTHETIC_FAILED,
                    detail=f"POST {path}: HTTP {resp.status} {decode(body[:200])!r}",
                )
    except TimeoutError:
        return Outcome(
            hard=Reason.SYNTHETIC_TIMEOUT, detail=f"POST {path}: no answer in {spec.synthetic_timeout_s:g}s"
        )
    except (aiohttp.ClientError, BodyTooLargeError, OSError, ValueError) as err:
        _, detail = classify(err)
        return Outcome(hard=Reason.SYNTHETIC_FAILED, detail=f"POST {path}: {detail}")
    return None
