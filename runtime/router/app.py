"""The router's request handling: validate, authenticate, route, proxy with retries, relay, account.

The proxy never re-serialises a body: the client's bytes go to the engine and the engine's bytes
come back. It parses the request JSON once (model, stream, and the prompt when a strategy needs it)
and scans responses for ``usage`` with a regex rather than a JSON parse.

Retries happen only before the client has seen a byte: on connect errors, resets before any
response, ``502/503/504``, a wrong content type, or a stream that dies before its first chunk. For a
stream the router waits for the engine's first chunk before it sends headers, so a replica that
accepts and then fails is retried on another one instead of reaching the client as a broken stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson

from runtime.config import RuntimeConfig
from runtime.http import METRICS_CONTENT_TYPE, error_body, metrics_payload
from runtime.router.admission import QueueFullError
from runtime.router.auth import Denied, KeyTable, Principal, admit, charge_tokens
from runtime.router.backends import BACKEND_HEADER, Backend
from runtime.router.fleet import Fleet, ModelState
from runtime.router.metrics import RouterMetrics
from runtime.router.retry import RetryBudget, backoff_s
from runtime.router.strategies import Context
from runtime.server import ClientGoneError, Connection, Request
from runtime.upstream import Exchange, UpstreamError

log = logging.getLogger("inferstack.router")
access = logging.getLogger("inferstack.router.access")

PROXY_PATHS = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completions",
    b"/v1/embeddings": "embeddings",
}
RETRY_STATUSES = frozenset((502, 503, 504))
HOP_BY_HOP = frozenset(
    (
        b"host",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"content-length",
        b"authorization",
        b"proxy-authorization",
        b"expect",
    )
)
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_RID_OK = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
_JSON = b"application/json"
_TAIL_BYTES = 4096  # enough of a large answer's end to find its usage


def usage_of(body: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens from the last ``usage`` object in a response or stream chunk."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return 0, 0
    tail = body[at:]
    p = _PROMPT_TOKENS.search(tail)
    c = _COMPLETION_TOKENS.search(tail)
    return (int(p.group(1)) if p else 0), (int(c.group(1)) if c else 0)


def prompt_text(payload: dict[str, Any]) -> str:
    """The text a prefix cache would see first: chat messages in order, or the completion prompt."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            parts.append(str(m.get("role", "")))
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return "\x1e".join(parts)
    prompt = payload.get("prompt", payload.get("input"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        try:
            return json.dumps(prompt[:1])
        except RecursionError:  # nested ~1,000 deep (orjson read it): the engine's 400, routed by load
            return ""
    return ""


@dataclass(slots=True)
class Call:
    """One client request on its way through the router."""

    conn: Connection
    state: ModelState
    ctx: Context
    path: bytes
    tail: bytes  # forwarded headers + body, after the request line and host
    stream: bool
    rid: bytes
    principal: Principal | None
    started: float


class Router:
    """Holds the live state; :meth:`handle` is the server's request handler."""

    def __init__(self, cfg: RuntimeConfig, fleet: Fleet | None = None) -> None:
        self.cfg = cfg
        self.metrics = RouterMetrics()
        self.fleet = fleet or Fleet(cfg)
        self.keys = KeyTable(list(cfg.router.api_keys), time.monotonic())
        self.retry_budget = RetryBudget(cfg.router.retry_budget_ratio)
        self.draining = False
        self.inflight = 0
        self.port = 0  # the bound port, once serving
        self._rid_prefix = os.urandom(4).hex()
        self._rid_counter = 0
        self._configure(cfg)
        self.metrics.attach_live(self.snapshot)
        self.fleet.on_departed = self.metrics.forget_backend

    def _configure(self, cfg: RuntimeConfig) -> None:
        s = cfg.router
        self.cfg = cfg
        self.require_key = s.require_api_key
        self.rid_header = s.request_id_header.lower().encode()
        self.connect_timeout_s = s.connect_timeout_ms / 1000
        self.first_byte_timeout_s = s.first_byte_timeout_ms / 1000
        self.idle_timeout_s = s.stream_idle_timeout_ms / 1000
        self.queue_deadline_s = s.queue_deadline_ms / 1000
        self.retry_budget.ratio = s.retry_budget_ratio

    def reconfigure(self, cfg: RuntimeConfig, keys: KeyTable | None = None) -> None:
        """Install a new config (and key table) without dropping a connection."""
        self.fleet.apply(cfg)
        self._configure(cfg)
        if keys is not None:
            self.keys = keys

    # --- entry point -----------------------------------------------------------------------------
    async def handle(self, req: Request, conn: Connection) -> None:
        path = req.path
        kind = PROXY_PATHS.get(path)
        if kind is not None:
            if req.method != b"POST":
                conn.send(405, error_body(405, f"{path.decode()} accepts POST"))
                return
            self.inflight += 1
            try:
                await self.proxy(req, conn, kind)
            finally:
                self.inflight -= 1
            return
        if req.method not in (b"GET", b"HEAD"):
            status = 405 if path in _GET_PATHS else 404
            conn.send(status, error_body(status, f"{req.method.decode('latin-1')} is not allowed here"))
            return
        if path == b"/v1/models":
            conn.send(200, self.models_body())
        elif path == b"/healthz":
            conn.send(200, b'{"status":"ok"}')
        elif path == b"/readyz":
            ready = not self.draining and any(m.healthy_count() for m in self.fleet.models.values())
            conn.send(200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))
        elif path == b"/metrics":
            conn.send(200, metrics_payload(self.metrics.registry), METRICS_CONTENT_TYPE.encode())
        else:
            conn.send(404, error_body(404, f"no route for {path.decode('latin-1')[:100]}"))

    def models_body(self) -> bytes:
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "inferstack",
                "max_model_len": state.target.max_model_len_tokens,
            }
            for name, state in self.fleet.models.items()
            if state.healthy_count() or state.batcher is not None
        ]
        return json.dumps({"object": "list", "data": data}).encode()

    def snapshot(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """Live gauges for /metrics."""
        out: dict[str, list[tuple[tuple[str, ...], float]]] = {
            k: []
            for k in (
                "queue_depth",
                "backend_inflight",
                "circuit_state",
                "backend_healthy",
                "prefix_index_entries",
                "prefix_hit_rate",
                "backends",
            )
        }
        for name, m in self.fleet.models.items():
            out["queue_depth"].append(((name,), float(len(m.queue))))
            out["backends"].append(((name,), float(len(m.backends))))
            for b in m.backends:
                out["backend_inflight"].append(((name, b.url), float(b.inflight)))
                out["circuit_state"].append(((name, b.url), float(b.breaker.state)))
                out["backend_healthy"].append(((name, b.url), 1.0 if b.healthy else 0.0))
            for index, size in m.strategy.index_sizes().items():
                out["prefix_index_entries"].append(((name, index), float(size)))
            for scorer, _ in m.strategy.scorers:
                rate = getattr(scorer, "hit_rate", None)
                if isinstance(rate, float):
                    out["prefix_hit_rate"].append(((name,), rate))
        return out

    # --- the proxy -------------------------------------------------------------------------------
    def _fail(
        self, conn: Connection, status: int, message: str, reason: str, model: str = "", **kw: Any
    ) -> None:
        """Answer an OpenAI-shaped error; ``model`` only for served models (the autoscaler's wake-up signal)."""
        self.metrics.reject(reason, model)
        extra = None
        retry_after = kw.pop("retry_after_s", None)
        if retry_after is not None:
            extra = [(b"retry-after", b"%d" % max(1, int(retry_after + 0.999)))]
        conn.send(status, error_body(status, message, **kw), extra=extra)

    def _request_id(self, req: Request) -> bytes:
        rid = req.headers.get(self.rid_header)
        if rid is not None and _RID_OK.match(rid):
            return rid
        self._rid_counter += 1
        return b"%s-%x" % (self._rid_prefix.encode(), self._rid_counter)

    async def proxy(self, req: Request, conn: Connection, kind: str) -> None:
        started = time.monotonic()
        headers = req.headers
        rid = self._request_id(req)
        # 1. who is calling
        principal: Principal | None = None
        if self.require_key or len(self.keys):
            who = self.keys.authenticate(headers.get(b"authorization"), self.require_key)
            if isinstance(who, Denied):
                self._fail(conn, who.status, who.message, "auth", code=who.code)
                return
            principal = who
        # 2. what they ask for
        try:
            payload = orjson.loads(req.body)  # ~5x faster than json.loads on a chat body, on the hot path
        except orjson.JSONDecodeError:
            self._fail(conn, 400, "request body is not valid JSON", "bad_request", code="invalid_json")
            return
        if not isinstance(payload, dict):
            self._fail(conn, 400, "request body must be a JSON object", "bad_request", code="invalid_json")
            return
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            self._fail(conn, 400, "'model' is required and must be a string", "bad_request", param="model")
            return
        stream = payload.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            self._fail(conn, 400, "'stream' must be true or false", "bad_request", param="stream")
            return
        state = self.fleet.models.get(model)
        if state is None:
            served = ", ".join(sorted(self.fleet.models)) or "none"
            message = f"model {model!r} is not served here; served: {served}"
            self._fail(conn, 404, message, "unknown_model", code="model_not_found")
            return
        # 3. may they
        if principal is not None:
            denied = admit(principal, model, time.monotonic())
            if denied is not None:
                self._fail(
                    conn,
                    denied.status,
                    denied.message,
                    "forbidden" if denied.status == 403 else "rate_limited",
                    model=model,
                    code=denied.code,
                    retry_after_s=denied.retry_after_s,
                )
                return
        # 4. route and proxy
        ctx = Context(model=model, now=started)
        if state.needs_prompt:
            ctx.prompt = prompt_text(payload)
        if state.needs_session:
            session = headers.get(state.session_header)
            ctx.session = session.decode("latin-1") if session else None
        fwd = [
            name + b": " + value + b"\r\n"
            for name, value in headers.items()
            if name not in HOP_BY_HOP and name != self.rid_header
        ]
        fwd.append(self.rid_header + b": " + rid + b"\r\n")
        tail = b"".join(fwd) + b"content-length: %d\r\n\r\n" % len(req.body) + req.body
        self.retry_budget.deposit()
        await self._route(Call(conn, state, ctx, req.path, tail, stream, rid, principal, started))

    async def _acquire(self, conn: Connection, state: ModelState, ctx: Context) -> Backend | None:
        """A replica with room, waiting in line if all are busy; answers the client itself on failure."""
        if state.batcher is not None and ctx.notes.get("kind") == "embeddings":
            return state.batcher
        waited_from = 0.0
        while True:
            ctx.now = time.monotonic()
            # first come, first served: a newcomer does not overtake requests already in line
            jump = not waited_from and len(state.queue) > 0
            if jump and any(b.inflight < b.cap and b.healthy for b in state.backends):
                state.queue.wake_one()  # a slot is free: make sure the head of the line gets it
            backend = None if jump else state.strategy.pick(state.backends, ctx)
            if backend is not None:
                if waited_from:
                    self.metrics.waited(state.name, ctx.now - waited_from)
                return backend
            now = ctx.now
            usable = [
                b for b in state.backends if b.healthy and b.breaker.allows(now) and b.url not in ctx.exclude
            ]
            if not usable:
                if ctx.exclude:
                    return None  # the caller reports the last failure
                self._fail(
                    conn,
                    503,
                    f"no healthy replica of {state.name!r} right now",
                    "no_backend",
                    model=state.name,
                    code="no_healthy_backend",
                    retry_after_s=state.settings.breaker_open_ms / 1000,
                )
                return None
            again = bool(waited_from)
            if not waited_from:
                waited_from = now
            remaining = self.queue_deadline_s - (now - waited_from)
            try:
                # woken but beaten to the slot: back to the front of the line, not the end
                woke = remaining > 0 and await state.queue.wait(remaining, front=again)
            except QueueFullError:
                woke = False
            if not woke:
                self._fail(
                    conn,
                    429,
                    f"all replicas of {state.name!r} are at capacity; try again shortly",
                    "queue",
                    model=state.name,
                    code="overloaded",
                    retry_after_s=max(1.0, self.queue_deadline_s / 2),
                )
                return None

    async def _route(self, call: Call) -> None:
        conn, state, ctx, rid = call.conn, call.state, call.ctx, call.rid
        settings = state.settings
        ctx.notes["kind"] = PROXY_PATHS[call.path]
        last_error: tuple[int, str] = (502, "no replica answered")
        attempt = 0
        tried: set[str] = set()
        while True:
            backend = await self._acquire(conn, state, ctx)
            if backend is None:
                if ctx.exclude:
                    self._fail(conn, last_error[0], last_error[1], "upstream", code="upstream_error")
                return
            if backend is not state.batcher:
                state.strategy.on_routed(backend, ctx)
            outcome = await self._attempt(call, backend)
            if outcome is None:
                return
            # a retryable failure before the client saw anything
            last_error = outcome
            tried.add(backend.url)
            attempt += 1
            if (
                attempt > settings.retries_max
                or backend is state.batcher
                or not self.retry_budget.withdraw()
                or conn.closed
            ):
                self._fail(conn, last_error[0], last_error[1], "upstream", code="upstream_error")
                return
            self.metrics.retry(state.name, str(last_error[0]))
            log.info(
                "retrying on another replica",
                extra={"request_id": rid.decode(), "failed": backend.url, "error": last_error[1]},
            )
            ctx.exclude = frozenset(tried)
            delay = backoff_s(settings.retry_backoff_ms, attempt)
            if delay:
                await asyncio.sleep(delay)

    async def _attempt(self, call: Call, b: Backend) -> tuple[int, str] | None:
        """One try on one replica. None when the client got its answer (or left); otherwise the
        (status, message) of a failure that is safe to retry elsewhere."""
        conn, state, rid, principal = call.conn, call.state, call.rid, call.principal
        b.inflight += 1
        sent_at = time.monotonic()
        b.breaker.on_start(sent_at)
        ex: Exchange | None = None
        status = 0
        ok = False
        try:
            head = b"POST %b HTTP/1.1\r\nhost: %b\r\n" % (call.path, b.pool.host_header)
            ex = await Exchange.open(b.pool, head + call.tail, self.connect_timeout_s)
            await ex.head(self.first_byte_timeout_s)
            status = ex.status
            ctype = ex.headers.get(b"content-type", b"")
            if status in RETRY_STATUSES:
                body = await ex.read_all(self.idle_timeout_s)
                b.breaker.on_failure(time.monotonic())
                return status, f"replica answered {status}: {body[:200].decode('utf-8', 'replace')}"
            if status == 200 and ctype.startswith(b"text/event-stream"):
                return await self._relay_stream(call, b, ex, sent_at)
            if status == 200 and not ctype.startswith(_JSON):
                # neither JSON nor SSE: a proxy error page or a confused engine; try another replica
                ex.abort()
                b.breaker.on_failure(time.monotonic())
                return 502, f"replica answered with content-type {ctype.decode('latin-1')!r}"
            # a JSON answer (or an engine error, passed through as it is)
            body = await ex.next_chunk(self.idle_timeout_s) or b""
            first = time.monotonic()
            extra = [(self.rid_header, rid), (BACKEND_HEADER, b.tag)]
            if ex.drained or not body:
                conn.send(status, body, ctype or _JSON, extra)  # the usual case: one write
            else:
                body = await self._relay_large(call, b, ex, status, ctype or _JSON, body)
            ok = True
            if status == 200:
                b.observe_ttft(first - sent_at, state.ewma_alpha)
                self.metrics.first_byte(state.name, first - sent_at)
                p, c = usage_of(body)
                self._account(state.name, principal, p, c)
            return None
        except UpstreamError as err:
            if ex is not None:
                ex.abort()
            b.breaker.on_failure(time.monotonic())
            # the client has seen nothing yet (relay handles failures after the first chunk itself)
            return (504 if err.kind == "timeout" else 502), str(err)
        except (asyncio.CancelledError, ClientGoneError):
            if ex is not None:
                ex.abort()  # closing the socket is how the engine learns to stop generating
            raise
        finally:
            b.inflight -= 1
            if ok:
                b.breaker.on_success()
            else:
                b.breaker.on_abandon()
            state.queue.wake_one()
            self.metrics.request(state.name, b.url, status or 502, time.monotonic() - call.started)
            if self.cfg.router.access_log:
                access.info(
                    "request",
                    extra={
                        "request_id": rid.decode(),
                        "model": state.name,
                        "backend": b.url,
                        "status": status,
                        "duration_ms": round((time.monotonic() - call.started) * 1000, 2),
                    },
                )

    async def _relay_large(
        self, call: Call, b: Backend, ex: Exchange, status: int, ctype: bytes, first: bytes
    ) -> bytes:
        """Pass a big answer (many embeddings) through piece by piece instead of holding it whole;
        returns its tail, where ``usage`` is."""
        conn = call.conn
        headers = [(b"content-type", ctype), (self.rid_header, call.rid), (BACKEND_HEADER, b.tag)]
        length = ex.headers.get(b"content-length", b"")
        sized = length.isdigit()
        if sized:
            conn.start_sized(status, headers, int(length), first)
        else:
            conn.start(status, headers, first)
        tail = first[-_TAIL_BYTES:]
        try:
            while (piece := await ex.next_chunk(self.idle_timeout_s)) is not None:
                await (conn.write(piece) if sized else conn.chunk(piece))
                tail = (tail + piece)[-_TAIL_BYTES:]
        except UpstreamError as err:
            ex.abort()
            log.warning("answer broke mid-way", extra={"request_id": call.rid.decode(), "error": str(err)})
            conn.close()  # the client sees a short body, never a truncated one passed off as whole
            return tail
        if sized:
            conn.end_sized()
        else:
            conn.end()
        return tail

    async def _relay_stream(
        self, call: Call, b: Backend, ex: Exchange, sent_at: float
    ) -> tuple[int, str] | None:
        conn, state, rid = call.conn, call.state, call.rid
        # wait for the first token before answering: until then a failure is retried elsewhere
        first = await ex.next_chunk(self.first_byte_timeout_s)
        if first is None:
            b.breaker.on_failure(time.monotonic())
            return 502, "replica ended the stream before sending anything"
        now = time.monotonic()
        b.observe_ttft(now - sent_at, state.ewma_alpha)
        self.metrics.first_byte(state.name, now - sent_at)
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (self.rid_header, rid),
            (BACKEND_HEADER, b.tag),
        ]
        conn.start(200, headers, first)
        b.breaker.on_success()
        last = first
        try:
            while (chunk := await ex.next_chunk(self.idle_timeout_s)) is not None:
                await conn.chunk(chunk)
                if b'"usage"' in chunk:
                    last = chunk
        except UpstreamError as err:
            ex.abort()
            b.breaker.on_failure(time.monotonic())
            log.warning(
                "stream broke mid-way",
                extra={"request_id": rid.decode(), "backend": b.url, "error": str(err)},
            )
            event = (
                b"data: " + error_body(502, f"the engine stream broke: {err}", code="stream_error") + b"\n\n"
            )
            await conn.chunk(event)
        conn.end()
        if b'"usage"' in last:
            p, c = usage_of(last)
            self._account(state.name, call.principal, p, c)
        return None

    def _account(self, model: str, principal: Principal | None, prompt: int, completion: int) -> None:
        if prompt or completion:
            self.metrics.usage(model, prompt, completion)
            charge_tokens(principal, prompt + completion, time.monotonic())


_GET_PATHS = frozenset((b"/v1/models", b"/healthz", b"/readyz", b"/metrics"))
