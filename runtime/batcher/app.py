"""The batcher's HTTP surface: ``POST /v1/embeddings`` (coalesced), score/rerank (passed through),
``/metrics``, ``/healthz``, ``/readyz``. Client mistakes are 4xx with OpenAI-shaped errors.

Run the app with ``handler_cancellation=True``: a client that disconnects cancels its handler,
which cancels its pending record, and its inputs are dropped before the next dispatch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import generate_latest

from runtime.batcher import core
from runtime.batcher.metrics import BatcherMetrics
from runtime.batcher.service import EngineError, ModelBatcher, QueueFullError, WatchFn, error_body
from runtime.config import RuntimeConfig

# Pooling endpoints vLLM serves besides embeddings; forwarded unbatched to a replica of the model.
PASSTHROUGH_PATHS = ("/v1/score", "/score", "/v1/rerank", "/rerank", "/v2/rerank", "/pooling", "/classify")
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(message, kind, status), status=status, headers=headers)


class Batcher:
    """All models' batchers plus the HTTP session they share."""

    def __init__(self, config: RuntimeConfig, *, watch: WatchFn) -> None:
        self.config = config
        self.metrics = BatcherMetrics()
        self._watch = watch
        self.models: dict[str, ModelBatcher] = {}
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        s = self.config.batcher
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=256, ttl_dns_cache=30)
        timeout = aiohttp.ClientTimeout(total=None, connect=s.connect_timeout_ms / 1000)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        for policy in s.policies:
            target = self.config.model(policy.model)
            assert target is not None  # RuntimeConfig validated the reference
            mb = ModelBatcher(target, policy, self._session, self.metrics, self._watch)
            mb.start()
            self.models[policy.model] = mb

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.models.values()))
        if self._session is not None:
            await self._session.close()

    @property
    def ready(self) -> bool:
        return all(m.backends for m in self.models.values())

    async def _json_body(self, request: web.Request) -> tuple[dict[str, Any] | None, web.Response | None]:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.batcher.max_body_bytes
            return None, _error(413, f"request body exceeds {limit} bytes", "invalid_request_error")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None, _error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return None, _error(400, "request body must be a JSON object", "invalid_request_error")
        model = body.get("model")
        if not isinstance(model, str):
            return None, _error(400, "`model` (a string) is required", "invalid_request_error")
        if model not in self.models:
            served = sorted(self.models)
            return None, _error(
                404, f"model {model!r} is not served here; served: {served}", "not_found_error"
            )
        return body, None

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body, problem = await self._json_body(request)
        if problem is not None or body is None:
            return problem or _error(400, "bad request", "invalid_request_error")
        model = str(body["model"])
        mb = self.models[model]
        resp = await self._embeddings(request, mb, body)
        self.metrics.requests.labels(model, str(resp.status)).inc()
        return resp

    async def _embeddings(self, request: web.Request, mb: ModelBatcher, body: dict[str, Any]) -> web.Response:
        try:
            inputs = core.normalize_inputs(body.get("input"))
        except core.BadInputError as err:
            return _error(400, str(err), "invalid_request_error")
        if len(inputs) > mb.policy.max_queue:
            return _error(
                400,
                f"{len(inputs)} inputs exceed this model's queue of {mb.policy.max_queue}",
                "invalid_request_error",
            )
        if not mb.backends:
            return _error(503, f"model {mb.target.name!r} has no replica right now", "service_unavailable")
        transport = request.transport

        def alive() -> bool:
            return transport is not None and not transport.is_closing()

        try:
            pending = mb.submit(body, inputs, alive)
        except QueueFullError as err:
            self.metrics.items.labels(mb.target.name, "rejected").inc(len(inputs))
            return _error(
                429,
                "batcher queue is full; retry later",
                "rate_limit_exceeded",
                {"Retry-After": str(err.retry_after_s)},
            )
        try:
            result = await pending.future
        except EngineError as err:
            return web.json_response(err.body, status=err.status)
        except asyncio.CancelledError:
            pending.future.cancel()  # the client left: its queued inputs are dropped before dispatch
            raise
        # orjson: the float vectors are most of the bytes, and the stdlib encoder is ~10x slower on them
        return web.Response(body=orjson.dumps(result), content_type="application/json")

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        """Score / rerank / classify go straight to a replica: no coalescing (different shapes)."""
        body, problem = await self._json_body(request)
        if problem is not None or body is None:
            return problem or _error(400, "bad request", "invalid_request_error")
        mb = self.models[str(body["model"])]
        backend = min(mb.backends, key=lambda b: b.inflight) if mb.backends else None
        if backend is None or self._session is None:
            return _error(503, "no replica right now", "service_unavailable")
        backend.inflight += 1
        try:
            timeout = aiohttp.ClientTimeout(total=mb.policy.engine_timeout_ms / 1000)
            async with self._session.post(backend.url + request.path, json=body, timeout=timeout) as up:
                payload = await up.read()
                return web.Response(
                    status=up.status, body=payload, content_type=up.content_type or "application/json"
                )
        except TimeoutError:
            return _error(504, "engine timed out", "timeout")
        except aiohttp.ClientError as err:
            return _error(502, f"replica failed: {err}", "bad_gateway")
        finally:
            backend.inflight -= 1


BATCHER_KEY = web.AppKey("batcher", Batcher)


def make_app(batcher: Batcher) -> web.Application:
    app = web.Application(client_max_size=batcher.config.batcher.max_body_bytes)
    app[BATCHER_KEY] = batcher

    async def metrics(_: web.Request) -> web.Response:
        for name, mb in batcher.models.items():
            batcher.metrics.items_per_second.labels(name).set(mb.items_per_second())
        return web.Response(
            body=generate_latest(batcher.metrics.registry), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        return web.json_response({"ready": batcher.ready}, status=200 if batcher.ready else 503)

    app.router.add_post("/v1/embeddings", batcher.embeddings)
    for path in PASSTHROUGH_PATHS:
        app.router.add_post(path, batcher.passthrough)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)

    async def lifecycle(_: web.Application):  # type: ignore[no-untyped-def]
        await batcher.start()
        yield
        await batcher.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
