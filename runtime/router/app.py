"""The router's request handling: dispatch, then for inference calls authenticate -> read -> admit ->
route with retries. The steps live beside it, one job each: ``auth`` (keys, scopes, rates),
``payload`` (what a body says), ``admission`` (a replica with room, or a wait in line), ``proxy`` (one
try on one replica, relayed and accounted), ``runtime.scheduling`` (which replica).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time

from runtime.config import RuntimeConfig
from runtime.http import METRICS_CONTENT_TYPE, error_body, metrics_payload
from runtime.router.admission import Refusal, acquire
from runtime.router.auth import Denied, KeyTable, Principal, admit
from runtime.router.fleet import Fleet
from runtime.router.metrics import RouterMetrics, Snapshot, live_gauges
from runtime.router.payload import BadRequest, prompt_text, read_request
from runtime.router.proxy import Call, Forwarder, forwarded_tail
from runtime.router.retry import RetryBudget, backoff_s
from runtime.scheduling import Context
from runtime.server import Connection, Request

log = logging.getLogger("inferstack.router")

PROXY_PATHS = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completions",
    b"/v1/embeddings": "embeddings",
}
_GET_PATHS = frozenset((b"/v1/models", b"/healthz", b"/readyz", b"/metrics"))
_RID_OK = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


class Router:
    """Holds the live state; :meth:`handle` is the server's request handler."""

    def __init__(self, cfg: RuntimeConfig, fleet: Fleet | None = None) -> None:
        self.cfg = cfg
        self.metrics = RouterMetrics()
        self.fleet = fleet or Fleet(cfg)
        self.keys = KeyTable(list(cfg.router.api_keys), time.monotonic())
        self.retry_budget = RetryBudget(cfg.router.retry_budget_ratio)
        self.forwarder = Forwarder(self.metrics, cfg.router)
        self.draining = False
        self.inflight = 0
        self.port = 0  # the bound port, once serving
        self._rid_prefix = os.urandom(4).hex()
        self._rid_counter = 0
        self._configure(cfg)
        self.metrics.attach_live(self.snapshot)
        self.fleet.on_departed = self.metrics.forget_backend
        self.fleet.on_slept = self.metrics.slept
        self.fleet.on_woke = self.metrics.woke

    def _configure(self, cfg: RuntimeConfig) -> None:
        s = cfg.router
        self.cfg = cfg
        self.require_key = s.require_api_key
        self.rid_header = s.request_id_header.lower().encode()
        self.queue_deadline_s = s.queue_deadline_ms / 1000
        self.retry_budget.ratio = s.retry_budget_ratio
        self.forwarder.configure(s)

    def reconfigure(self, cfg: RuntimeConfig, keys: KeyTable | None = None) -> None:
        """Install a new config (and key table) without dropping a connection; if the fleet cannot
        take it (it raises), nothing changed."""
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
            ready = not self.draining and any(m.servable() for m in self.fleet.models.values())
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
            if state.servable()
        ]
        return json.dumps({"object": "list", "data": data}).encode()

    def snapshot(self) -> Snapshot:
        """Live gauges for /metrics."""
        return live_gauges(self.fleet.models)

    # --- the proxy -------------------------------------------------------------------------------
    def _fail(
        self,
        conn: Connection,
        status: int,
        message: str,
        reason: str,
        model: str = "",
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        """Answer an OpenAI-shaped error; ``model`` only for served models (the autoscaler's wake-up signal)."""
        self.metrics.reject(reason, model)
        extra = None
        if retry_after_s is not None:
            extra = [(b"retry-after", b"%d" % max(1, int(retry_after_s + 0.999)))]
        conn.send(status, error_body(status, message, code=code, param=param), extra=extra)

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
        asked = read_request(req.body)
        if isinstance(asked, BadRequest):
            self._fail(conn, 400, asked.message, "bad_request", code=asked.code, param=asked.param)
            return
        model = asked.model
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
        # 4. route and proxy: fill only what the strategy's scorers declared they read
        ctx = Context(model=model, now=started)
        if state.needs_prompt:
            ctx.prompt = prompt_text(asked.payload)
        if state.needs_session:
            session = headers.get(state.session_header)
            ctx.session = session.decode("latin-1") if session else None
        tail = forwarded_tail(headers, self.rid_header, rid, req.body)
        self.retry_budget.deposit()
        await self._route(Call(conn, state, ctx, req.path, tail, asked.stream, rid, principal, started))

    async def _route(self, call: Call) -> None:
        conn, state, ctx, rid = call.conn, call.state, call.ctx, call.rid
        settings = state.settings
        ctx.notes["kind"] = PROXY_PATHS[call.path]
        last_error: tuple[int, str] = (502, "no replica answered")
        attempt = 0
        tried: set[str] = set()
        while True:
            backend = await acquire(state, ctx, self.queue_deadline_s, self.metrics.waited)
            if isinstance(backend, Refusal):
                r = backend
                self._fail(
                    conn,
                    r.status,
                    r.message,
                    r.reason,
                    model=state.name,
                    code=r.code,
                    retry_after_s=r.retry_after_s,
                )
                return
            if backend is None:  # every usable replica failed this request already
                self._fail(conn, last_error[0], last_error[1], "upstream", code="upstream_error")
                return
            if backend is not state.batcher:
                state.strategy.on_routed(backend, ctx)
            outcome = await self.forwarder.attempt(call, backend)
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
