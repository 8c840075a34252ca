"""The batcher's HTTP surface: ``POST /v1/embeddings`` (coalesced), score/rerank (passed through),
``/metrics``, ``/healthz``, ``/readyz``. Client mistakes are 4xx with OpenAI-shaped errors.

It runs on the lean HTTP/1.1 server the router uses (``runtime/server.py``: asyncio protocol +
httptools): per request one C parse, one task and one write, which costs several times less CPU than
aiohttp's server, and on a machine where the engine shares the cores that CPU is engine throughput.
A client that disconnects cancels its handler (the server does that on ``connection_lost``), which
cancels its pending record and takes its queued inputs off the queue at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from runtime import tracing
from runtime.batcher import core
from runtime.batcher.metrics import BatcherMetrics
from runtime.batcher.service import EngineError, ModelBatcher, QueueFullError, WatchFn, error_body
from runtime.config import RuntimeConfig
from runtime.http import METRICS_CONTENT_TYPE, OVERLOADED, OVERLOADED_CODE, metrics_payload, retry_after
from runtime.server import Connection, Limits, Request, Server
from runtime.upstream import UpstreamError

# Pooling endpoints vLLM serves besides embeddings; forwarded unbatched to a replica of the model.
PASSTHROUGH_PATHS = frozenset(
    (b"/v1/score", b"/score", b"/v1/rerank", b"/rerank", b"/v2/rerank", b"/pooling", b"/classify")
)
EMBEDDINGS = b"/v1/embeddings"
GET_PATHS = frozenset((b"/metrics", b"/healthz", b"/readyz"))
_JSON = b"application/json"
_METRICS_TYPE = METRICS_CONTENT_TYPE.encode()


class ClientError(Exception):
    """A request the batcher answers itself with a 4xx/5xx; carries the OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.body = orjson.dumps(error_body(message, kind, code or status))
        self.headers = headers


# An answer to send: status, body, content type, extra headers.
Reply = tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]


class Batcher:
    """All models' batchers and the HTTP handler in front of them (``handle`` is the server's handler)."""

    def __init__(self, config: RuntimeConfig, *, watch: WatchFn) -> None:
        self.config = config
        self.metrics = BatcherMetrics()
        self._watch = watch
        self.models: dict[str, ModelBatcher] = {}
        self.inflight = 0  # requests being handled (graceful shutdown waits for them)
        self.tracing = tracing.Tracing(config.tracing, "inferstack-batcher")

    async def start(self) -> None:
        s = self.config.batcher
        for policy in s.policies:
            target = self.config.model(policy.model)
            assert target is not None  # RuntimeConfig validated the reference
            mb = ModelBatcher(
                target, policy, self.metrics, self._watch, s.connect_timeout_ms / 1000, traces=self.tracing
            )
            mb.start()
            self.models[policy.model] = mb

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.models.values()))
        await asyncio.to_thread(self.tracing.shutdown)  # what is buffered is exported

    @property
    def ready(self) -> bool:
        return all(m.replicas for m in self.models.values())

    # --- the handler -------------------------------------------------------------------------

    async def handle(self, req: Request, conn: Connection) -> None:
        path, method = req.path, req.method
        self.inflight += 1
        try:
            if method == b"POST":
                if path == EMBEDDINGS:
                    with self.tracing.request("batcher embeddings", req.headers):
                        await self.embeddings(req, conn)
                elif path in PASSTHROUGH_PATHS:
                    await self.passthrough(req, conn)
                elif path in GET_PATHS:
                    _send_error(conn, ClientError(405, f"{path.decode()} takes GET", "invalid_request_error"))
                else:
                    _send_error(conn, ClientError(404, f"no route {path.decode()!r}", "not_found_error"))
            elif method in (b"GET", b"HEAD"):
                if path == b"/metrics":
                    conn.send(200, self.metrics_body(), _METRICS_TYPE)
                elif path == b"/healthz":
                    conn.send(200, b'{"status":"ok"}')
                elif path == b"/readyz":
                    ready = self.ready
                    conn.send(200 if ready else 503, b'{"ready":true}' if ready else b'{"ready":false}')
                elif path == EMBEDDINGS or path in PASSTHROUGH_PATHS:
                    _send_error(
                        conn, ClientError(405, f"{path.decode()} takes POST", "invalid_request_error")
                    )
                else:
                    _send_error(conn, ClientError(404, f"no route {path.decode()!r}", "not_found_error"))
            else:
                _send_error(conn, ClientError(405, "method not allowed", "invalid_request_error"))
        finally:
            self.inflight -= 1

    def metrics_body(self) -> bytes:
        for name, mb in self.models.items():
            self.metrics.items_per_second.labels(name).set(mb.items_per_second())
        return metrics_payload(self.metrics.registry)

    def _json_body(self, req: Request) -> tuple[dict[str, Any], ModelBatcher]:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            raise ClientError(400, "request body is not valid JSON", "invalid_request_error") from None
        if not isinstance(body, dict):
            raise ClientError(400, "request body must be a JSON object", "invalid_request_error")
        model = body.get("model")
        if not isinstance(model, str):
            raise ClientError(400, "`model` (a string) is required", "invalid_request_error")
        mb = self.models.get(model)
        if mb is None:
            served = sorted(self.models)
            raise ClientError(404, f"model {model!r} is not served here; served: {served}", "not_found_error")
        return body, mb

    async def embeddings(self, req: Request, conn: Connection) -> None:
        try:
            body, mb = self._json_body(req)
        except ClientError as err:
            _send_error(conn, err)
            return
        status = 500
        try:
            status, payload, content_type, headers = await self._embeddings(conn, mb, body)
            conn.send(status, payload, content_type, headers)
        except ClientError as err:
            status = err.status
            _send_error(conn, err)
        except asyncio.CancelledError:
            status = 499  # the client went away: not a server error on the dashboards
            raise
        finally:
            mb.count_request(status)

    async def _embeddings(self, conn: Connection, mb: ModelBatcher, body: dict[str, Any]) -> Reply:
        if body.get("encoding_format") not in (None, "float", "base64"):
            # bytes / bytes_only (vLLM's binary answers): one engine call per request, as the client wrote it
            return await self._forward(mb, EMBEDDINGS, _reencode(body))
        if len(body) > 2:  # more than model and input: the engine call will carry these fields
            _reencode({k: v for k, v in body.items() if k != "input"})
        try:
            inputs = core.normalize_inputs(body.get("input"))
        except core.BadInputError as err:
            raise ClientError(400, str(err), "invalid_request_error") from None
        if len(inputs) > mb.policy.max_queue:
            raise ClientError(
                400,
                f"{len(inputs)} inputs exceed this model's queue of {mb.policy.max_queue}",
                "invalid_request_error",
            )
        if not mb.replicas:
            raise ClientError(
                503, f"model {mb.target.name!r} has no replica right now", "service_unavailable"
            )
        try:
            pending = mb.submit(body, inputs, lambda: not conn.closed)
        except QueueFullError as err:
            mb.count_rejected(len(inputs))
            raise _queue_full(err.retry_after_s) from None
        try:
            result = await pending.future
        except EngineError as err:
            return err.status, orjson.dumps(err.body), _JSON, []
        except asyncio.CancelledError:
            pending.future.cancel()  # the client left: results of its inputs in flight are dropped
            mb.withdraw(pending)  # and its queued inputs leave the queue now, freeing their space
            raise
        # orjson: the float vectors are most of the bytes, and the stdlib encoder is ~10x slower on them
        return 200, orjson.dumps(result), _JSON, []

    async def passthrough(self, req: Request, conn: Connection) -> None:
        """Score / rerank / classify go straight to a replica: no coalescing (different shapes)."""
        try:
            _, mb = self._json_body(req)
            status, payload, content_type, headers = await self._forward(mb, req.path, req.body)
        except ClientError as err:
            _send_error(conn, err)
            return
        conn.send(status, payload, content_type, headers)

    async def _forward(self, mb: ModelBatcher, path: bytes, body: bytes) -> Reply:
        """One request to the least busy replica; its answer as it came (status, body, content type,
        and vLLM's ``metadata`` header of binary embedding answers)."""
        replica = min(mb.replicas, key=lambda b: b.inflight) if mb.replicas else None
        if replica is None:
            raise ClientError(503, "no replica right now", "service_unavailable")
        if mb.depth + mb.forwarded >= mb.policy.max_queue:
            # unbatched requests share the model's queue budget: nothing reaches the engines unbounded
            mb.count_rejected(1)
            raise _queue_full(mb.retry_after_s())
        replica.inflight += 1
        mb.forwarded += 1
        try:
            status, headers, payload = await replica.post(
                path, body, mb.policy.engine_timeout_ms / 1000, mb.connect_timeout_s
            )
        except TimeoutError:
            raise ClientError(504, "engine timed out", "timeout") from None
        except UpstreamError as err:
            if err.kind == "timeout":
                raise ClientError(504, "engine timed out", "timeout") from None
            raise ClientError(502, f"replica failed: {err}", "bad_gateway") from None
        finally:
            replica.inflight -= 1
            mb.forwarded -= 1
        meta = headers.get(b"metadata")
        ctype = headers.get(b"content-type") or _JSON
        return status, payload, ctype, [(b"metadata", meta)] if meta is not None else []


def _queue_full(retry_after_s: int) -> ClientError:
    """A full queue is load, not the caller's own limit: 503 ``overloaded`` with ``Retry-After``, as the router
    answers its own load refusals (runtime.http.OVERLOADED); 429 would tell a client its key is over its limits."""
    return ClientError(
        OVERLOADED,
        "the batcher's queue for this model is full; retry shortly",
        "service_unavailable",
        [retry_after(retry_after_s)],
        code=OVERLOADED_CODE,
    )


def _reencode(fields: dict[str, Any]) -> bytes:
    """The client's fields as JSON again for the engine. orjson reads 1,024 levels of nesting but
    writes only 255: a body nested deeper is the client's mistake (400), not an encoding error (500)."""
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:
        raise ClientError(400, "request body is nested too deeply", "invalid_request_error") from None


def _send_error(conn: Connection, err: ClientError) -> None:
    conn.send(err.status, err.body, _JSON, err.headers)


def make_server(batcher: Batcher) -> Server:
    """The listener for ``batcher.handle``; ``start(host, port)`` it after ``batcher.start()``."""
    s = batcher.config.batcher
    return Server(batcher.handle, Limits.of(s, s.max_body_bytes))
