"""The router's request handling: dispatch, then for inference calls authenticate -> read -> admit ->
route with retries. The steps, one job each: ``runtime.api_keys`` (keys, scopes, rates),
``payload`` (what a body says), ``admission`` (a replica with room, or a wait in line), ``proxy`` (one
try on one replica, relayed and accounted), ``runtime.scheduling`` (which replica).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import time

from runtime import tracing
from runtime.api_keys import Denied, KeyTable, Principal
from runtime.config import EngineKind, RuntimeConfig
from runtime.engines import facts
from runtime.http import (
    FORWARDED_FOR,
    LOW_PRIORITY,
    METRICS_CONTENT_TYPE,
    OVERLOADED,
    OVERLOADED_CODE,
    PRIORITY_HEADER,
    client_address,
    error_body,
    metrics_payload,
    retry_after,
)
from runtime.openai_request import visible
from runtime.router.adapters import LoadFailure, ensure_loaded
from runtime.router.admission import Refusal, acquire
from runtime.router.batch_api import BatchApiHooks, api_call_model, is_batch_api, low_priority_avoid
from runtime.router.disagg import Pairing, TwoPhase, without_kv_params
from runtime.router.fleet import Fleet
from runtime.router.limits import Limits, LocalLimits, Ticket
from runtime.router.metrics import RouterMetrics, Snapshot, live_gauges
from runtime.router.migration import Progress, asking_token_ids, migratable
from runtime.router.model_state import ModelState
from runtime.router.payload import (
    BadRequest,
    choices_problem,
    prompt_estimate,
    read_request,
    token_estimate,
    with_usage,
)
from runtime.router.proxy import Broken, Call, Forwarder, forwarded_tail
from runtime.router.replicas import Replica
from runtime.router.retry import RetryBudget, backoff_s
from runtime.router.waitline import Spot
from runtime.scheduling.fair_queue import TenantTable, request_cost
from runtime.server import NOT_CHECKED, Answer, Connection, Headers, Request

log = logging.getLogger("inferstack.router")

PROXY_PATHS = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completions",
    b"/v1/embeddings": "embeddings",
}
_GET_PATHS = frozenset((b"/v1/models", b"/healthz", b"/readyz"))
_RID_OK = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def _header(headers: Headers, name: str) -> str | None:
    """A request header by its lower-case name (the server keeps them as raw bytes)."""
    value = headers.get(name.encode())
    return value.decode("latin-1") if value else None


class Router:
    """Holds the live state; :meth:`handle` is the server's request handler."""

    def __init__(self, cfg: RuntimeConfig, fleet: Fleet | None = None) -> None:
        self.cfg = cfg
        self.metrics = RouterMetrics()
        self.fleet = fleet or Fleet(cfg)
        self.keys = KeyTable(list(cfg.router.api_keys), time.monotonic())
        self.retry_budget = RetryBudget(cfg.router.retry_budget_ratio)
        self.forwarder = Forwarder(self.metrics, cfg.router)
        self.two_phase = TwoPhase(self.metrics, cfg.router.connect_timeout_ms / 1000)
        self.draining = False
        self.inflight = 0
        self.port = 0  # the bound port, once serving
        self.metrics_port = 0  # the metrics listener's bound port, once serving
        self._rid_prefix = os.urandom(4).hex()
        self._rid_counter = 0
        self.batch_api = BatchApiHooks()
        self.limits: Limits = self._new_limits(cfg)
        self.tracing = tracing.Tracing(cfg.tracing, "inferstack-router")
        self._swapping: asyncio.Task[None] | None = None
        self._swapping_tracing: asyncio.Future[None] | None = None
        self._configure(cfg)
        self.metrics.attach_live(self.snapshot)
        self.fleet.on_departed = self.metrics.forget_replica
        self.fleet.sleep.on_slept = self.metrics.slept
        self.fleet.sleep.on_woke = self.metrics.woke
        self.fleet.on_kv_problem = self.metrics.kv_problem

    def _new_limits(self, cfg: RuntimeConfig) -> Limits:
        """Each replica's own limits, or limits shared through the configured store (imported only then: see
        ``runtime.router.limits``)."""
        if cfg.router.limit_store is None:
            return LocalLimits()
        from runtime.router.shared_limits import SharedLimits  # noqa: PLC0415 - see the docstring

        return SharedLimits(cfg.router.limit_store, self.metrics.limit_store_error, self.metrics.limit_check)

    async def start(self) -> None:
        await self.fleet.start()
        await self.limits.start()

    async def stop(self) -> None:
        await self.fleet.stop()
        await self.limits.stop()
        await asyncio.to_thread(self.tracing.shutdown)  # what is buffered is exported

    def _configure(self, cfg: RuntimeConfig) -> None:
        s = cfg.router
        self.cfg = cfg
        self.require_key = s.require_api_key
        self.rid_header = s.request_id_header.lower().encode()
        self.queue_deadline_s = s.queue_deadline_ms / 1000
        self.max_choices = s.max_choices_per_request
        self.retry_budget.ratio = s.retry_budget_ratio
        self.forwarder.configure(s)
        self.two_phase.connect_timeout_s = s.connect_timeout_ms / 1000
        self.batch_api.configure(cfg)
        self.tenants = TenantTable(s.tenants, s.default_band)

    def head(self, req: Request) -> Answer | None:
        """The server's look at a request head, before any body byte is read: the route, and for calls
        that need one the caller's key (401 without reading the body); uploads take a larger, streamed
        body. The principal is kept in ``req.auth``."""
        path, method = req.path, req.method
        req.auth = None
        if self.batch_api.forwarder is not None and is_batch_api(path):
            answer = self._authenticate(req)
            if answer is None:
                self.batch_api.on_head(req)
            return answer
        if path in PROXY_PATHS:
            if method != b"POST":
                return Answer.error(405, f"{path.decode()} accepts POST")
            return self._authenticate(req)
        if method not in (b"GET", b"HEAD"):
            status = 405 if path in _GET_PATHS else 404
            return Answer.error(status, f"{method.decode('latin-1')} is not allowed here")
        if path == b"/v1/models":  # which models there are is the keys' business too
            return self._authenticate(req)
        return None

    def _authenticate(self, req: Request) -> Answer | None:
        caller: Principal | Denied | None = None
        if self.require_key or len(self.keys):
            caller = who = self.keys.authenticate(req.headers.get(b"authorization"), self.require_key)
            if not isinstance(who, Denied):  # a batch's line: its owner's scopes and limits
                who = self.batch_api.on_behalf(who, req.headers, self.keys)
            if isinstance(who, Denied):
                self.metrics.reject("auth", "")
                return Answer.error(who.status, who.message, code=who.code)
            req.auth = who
        if req.headers.get(PRIORITY_HEADER) == LOW_PRIORITY and not self.batch_api.may_lower_priority(caller):
            req.headers.pop(PRIORITY_HEADER, None)  # anyone else's batch mark is dropped, not passed on
        return None

    def reconfigure(self, cfg: RuntimeConfig, keys: KeyTable | None = None) -> None:
        """Install a new config (and key table) without dropping a connection; if the fleet cannot
        take it (it raises), nothing changed."""
        self.fleet.apply(cfg)
        if cfg.router.limit_store != self.cfg.router.limit_store:  # a new store: start it, stop the old
            old, self.limits = self.limits, self._new_limits(cfg)
            self._swapping = asyncio.get_running_loop().create_task(_replace(old, self.limits))
        # new tracing settings: a new provider; the old one flushes and stops
        if cfg.tracing != self.cfg.tracing:
            old_tracing, self.tracing = self.tracing, tracing.Tracing(cfg.tracing, "inferstack-router")
            self._swapping_tracing = asyncio.get_running_loop().run_in_executor(None, old_tracing.shutdown)
        self._configure(cfg)
        if keys is not None:
            self.keys = keys

    # --- entry point -----------------------------------------------------------------------------
    async def handle(self, req: Request, conn: Connection) -> None:
        if req.auth is NOT_CHECKED:  # a server without the head hook: check the head now
            answer = self.head(req)
            if answer is not None:
                conn.send(answer.status, answer.body, extra=answer.extra)
                return
        path = req.path
        if self.batch_api.forwarder is not None and is_batch_api(path):
            self.inflight += 1
            try:
                await self.batch_api_call(req, conn)
            finally:
                self.inflight -= 1
            return
        kind = PROXY_PATHS.get(path)
        if kind is not None:
            self.inflight += 1
            try:
                with self.tracing.request(f"router {kind}", req.headers, {tracing.KIND: kind}):
                    await self.proxy(req, conn, kind)
            finally:
                self.inflight -= 1
            return
        if path == b"/v1/models":
            conn.send(200, self.models_body(req.auth))
        elif path == b"/healthz":
            conn.send(200, b'{"status":"ok"}')
        elif path == b"/readyz":
            ready = not self.draining and any(m.servable() for m in self.fleet.models.values())
            conn.send(200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))
        else:  # /metrics among them: it names every replica's address, so it has a listener of its own
            conn.send(404, error_body(404, f"no route for {path.decode('latin-1')[:100]}"))

    async def handle_ops(self, req: Request, conn: Connection) -> None:
        """The metrics listener (``router.metrics_port``, which no ingress routes): /metrics and /healthz."""
        if req.method not in (b"GET", b"HEAD"):
            conn.send(405, error_body(405, f"{req.method.decode('latin-1')} is not allowed here"))
        elif req.path == b"/metrics":
            conn.send(200, metrics_payload(self.metrics.registry), METRICS_CONTENT_TYPE.encode())
        elif req.path == b"/healthz":
            conn.send(200, b'{"status":"ok"}')
        else:
            conn.send(
                404, error_body(404, f"no route for {req.path.decode('latin-1')[:100]} on the metrics port")
            )

    def models_body(self, principal: Principal | None = None) -> bytes:
        """Servable models (a model served in versions once), then their LoRA adapters, each with ``parent`` (as
        vLLM lists them); for a key scoped to some models, only those."""
        scope = _scope(principal)
        data: list[dict[str, object]] = []
        for name, states in self.fleet.public_models().items():
            if not any(s.servable() for s in states):
                continue
            entry = {"id": name, "object": "model", "created": 0, "owned_by": "inferstack"}
            max_len = min(s.target.max_model_len_tokens for s in states)
            data.append({**entry, "parent": None, "max_model_len": max_len})
            # an adapter's base model is named only to a key that may use it too
            parent = name if visible([name], scope) else None
            data += [{**entry, "id": adapter, "parent": parent} for s in states for adapter in s.adapters]
        if scope is not None:
            shown = set(visible([str(d["id"]) for d in data], scope))
            data = [d for d in data if d["id"] in shown]
        return json.dumps({"object": "list", "data": data}).encode()

    def snapshot(self) -> Snapshot:
        """Live gauges for /metrics."""
        snap = live_gauges(self.fleet.models, self.fleet.splits)
        if self.limits.store_up is not None:
            snap["limit_store_up"] = [((), self.limits.store_up)]
        return snap

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
            extra = [retry_after(max(1, int(retry_after_s + 0.999)))]
        conn.send(status, error_body(status, message, code=code, param=param), extra=extra)

    def _request_id(self, req: Request) -> bytes:
        rid = req.headers.get(self.rid_header)
        if rid is not None and _RID_OK.match(rid):
            return rid
        self._rid_counter += 1
        return b"%s-%x" % (self._rid_prefix.encode(), self._rid_counter)

    async def batch_api_call(self, req: Request, conn: Connection) -> None:
        """Files and Batches: the caller's key and rate limits, then the batch service."""
        forwarder = self.batch_api.forwarder
        assert forwarder is not None
        principal: Principal | None = req.auth  # the key was checked at the request head
        if principal is not None:
            denied = await self.limits.admit(principal, api_call_model(principal))  # shared when shared
            if denied is not None:
                reason = "forbidden" if denied.status == 403 else "rate_limited"
                self._fail(
                    conn,
                    denied.status,
                    denied.message,
                    reason,
                    code=denied.code,
                    retry_after_s=denied.retry_after_s,
                )
                return
        await forwarder.forward(req, conn, principal, self.rid_header, self._request_id(req))

    async def proxy(self, req: Request, conn: Connection, kind: str) -> None:
        started = time.monotonic()
        headers = req.headers
        rid = self._request_id(req)
        # 1. who is calling: checked at the request head, before its body was read (``head``)
        principal: Principal | None = req.auth
        # 2. what they ask for
        asked = read_request(req.body)
        if isinstance(asked, BadRequest):
            self._fail(conn, 400, asked.message, "bad_request", code=asked.code, param=asked.param)
            return
        too_many = choices_problem(asked.payload, self.max_choices)
        if too_many is not None:
            self._fail(conn, 400, too_many.message, "bad_request", code=too_many.code, param=too_many.param)
            return
        model = asked.model
        client = self._client(principal, headers, conn)  # a judged canary's share is per client
        state = self.fleet.lookup(model, self._session_key(headers, model), client)
        adapter: str | None = None
        if state is None and (parent := self.fleet.adapter_parents.get(model)) is not None:
            state, adapter = self.fleet.models.get(parent), model  # a LoRA adapter: its base model's replicas
        if state is None:  # name only what the key may use: a scoped key learns nothing of other models
            names = [*self.fleet.public_models(), *self.fleet.adapter_parents]
            served = ", ".join(visible(names, _scope(principal))) or "none"
            message = f"The model `{model}` does not exist here; served: {served}"
            self._fail(conn, 404, message, "unknown_model", code="model_not_found", param="model")
            return
        # what the request is, on its span (never the key, never the prompt unless asked)
        if tracing.current() is not None:
            self._trace_request(state, adapter, rid, asked.payload)
        # 3. may they (a low-priority request without headroom is refused first: that costs nobody's limit)
        avoid: frozenset[str] | None = None
        if headers.get(PRIORITY_HEADER) == LOW_PRIORITY:  # the batch service: only into headroom
            avoid = low_priority_avoid(state, self.batch_api.low_priority_share, started)
            if avoid is None:
                batch_line = self.tenants.place(principal.key if principal is not None else None, "batch", 0)
                self.metrics.fair_shed(state.name, batch_line)
                message = f"no headroom for low-priority requests to {model!r} now"
                self._fail(conn, OVERLOADED, message, "low_priority", code=OVERLOADED_CODE, retry_after_s=1)
                return
        # a key with a token limit reserves what the request may cost now, settled when it ends where it was
        # taken (the ticket: the limits of this moment, the store or the fallback share that took it)
        reserve = 0
        ticket: Ticket | None = None
        if principal is not None and principal.key.tokens_per_minute:
            reserve = token_estimate(req.body, asked.payload, kind, state.target.max_model_len_tokens)
        if principal is not None:
            limits = self.limits
            taken = (
                limits.take(principal, model, reserve)
                if type(limits) is LocalLimits
                else await limits.reserve(principal, model, reserve)
            )
            if isinstance(taken, Ticket):
                ticket = taken
            else:
                self._fail(
                    conn,
                    taken.status,
                    taken.message,
                    "forbidden" if taken.status == 403 else "rate_limited",
                    model=model,
                    code=taken.code,
                    retry_after_s=taken.retry_after_s,
                )
                return
        # 4. route and proxy: fill only what the strategy's scorers declared they read. From here on the
        # reservation is settled whatever happens (answered, failed, the client left, a bug raised)
        call: Call | None = None
        # its place in line when the replicas are full: its key's tenant and band, or a lower band it asks for
        asked_band = "batch" if avoid is not None else _header(headers, PRIORITY_HEADER.decode())
        cost = request_cost(call_prompt := prompt_estimate(req.body), asked.payload, kind)
        spot = Spot(self.tenants.place(principal.key if principal is not None else None, asked_band, cost))
        tracing.note({tracing.TENANT: spot.place.tenant, tracing.PRIORITY: spot.place.band.value})
        try:
            ctx = state.context(
                started, asked.payload, functools.partial(_header, headers), adapter, kind=kind
            )
            if avoid is not None:
                ctx.exclude = avoid
            body, strip = req.body, False
            if state.prefill is not None:  # where a decode pulls KV from is the router's to say
                body = without_kv_params(body, asked.payload)
            if asked.stream and kind != "embeddings":  # the engine reports a stream's usage only when asked
                asking = with_usage(body, asked.payload)
                if asking is not None:
                    body, strip = asking, True
            tracing.inject(headers)  # the engine's spans join this request's trace
            progress: Progress | None = None
            # A stream that can move to another replica mid-way (the continuation's request fields are vLLM's):
            # the engine's token ids make it exact.
            if (
                self.cfg.router.max_migrations_per_request
                and state.prefill is None
                and state.target.engine == EngineKind.VLLM
                and migratable(asked.payload, kind)
            ):
                asking = asking_token_ids(body, asked.payload)
                if asking is not None:
                    body = asking
                resend = functools.partial(forwarded_tail, headers, self.rid_header, rid)
                progress = Progress(
                    kind, asked.payload, state.target.max_model_len_tokens, strip, asking is not None, resend
                )
            tail = forwarded_tail(headers, self.rid_header, rid, body)
            self.retry_budget.deposit()
            call = Call(
                conn, state, ctx, req.path, tail, asked.stream, rid, principal, started, strip, reserve
            )
            call.prompt = call_prompt if reserve else 0  # a leaver pays it + what it read
            call.progress = progress
            if state.prefill is not None:  # disaggregated: a prefill phase first (``disagg``)
                call.pd = Pairing(
                    asked.payload,
                    kind,
                    adapter,
                    functools.partial(_header, headers),
                    functools.partial(forwarded_tail, headers, self.rid_header, rid),
                    body,
                )
            try:
                await self._route(call, spot)
            finally:
                if call.pd is not None:  # a prefill replica's circuit is never left waiting for a verdict
                    self.two_phase.settle(call.pd, None)
        finally:  # the key pays what it used; nothing, when no call was made; so does its tenant's fair share
            spot.settle(_used(call))
            if ticket is not None and principal is not None and principal.key.tokens_per_minute:
                ticket.settle(principal, call.settlement() if call is not None else -reserve)

    def _trace_request(
        self,
        state: ModelState,
        adapter: str | None,
        rid: bytes,
        payload: dict[str, object],
    ) -> None:
        """The request span's attributes: what was asked and how it is routed (who asked, its tenant and band,
        once its place in line is known)."""
        tracing.note(
            {
                tracing.MODEL: state.name,
                tracing.VERSION: state.version if state.versioned else None,
                tracing.ADAPTER: adapter,
                tracing.STRATEGY: state.route.strategy.name,
                tracing.REQUEST_ID: rid.decode("latin-1"),
                tracing.PROMPT: tracing.prompt_text(payload) if self.tracing.capture_prompts else None,
            }
        )

    def _waited(self, kind: str, model: str, seconds: float) -> None:
        """A request waited for a replica: counted, and on its span (how long, and what it waited for)."""
        self.metrics.waited(model, seconds)
        tracing.note({tracing.QUEUE_WAIT_MS: round(seconds * 1000, 3)})
        tracing.past(kind, seconds)

    def _client(self, principal: Principal | None, headers: Headers, conn: Connection) -> str:
        """Who sends a request, for a judged canary's per-client share: its key's name, else its address (a
        session key would not do: a client without a key chooses one per request, each landing on the canary)."""
        if principal is not None:
            return principal.name
        forwarded = _header(headers, FORWARDED_FOR.decode())
        address = client_address(forwarded, conn.peer(), self.cfg.router.trusted_proxy_hops)
        return f"address:{address}"

    def _session_key(self, headers: Headers, model: str) -> str | None:
        """A versioned model's session key (its stable version's session header), so a session stays on
        one version; None for models without versions."""
        split = self.fleet.splits.get(model)
        if split is None:
            return None
        stable = self.fleet.lookup_version(model, split.stable)
        return _header(headers, stable.session_header)

    async def _adapter_ready(
        self, state: ModelState, replica: Replica, adapter: str | None
    ) -> LoadFailure | None:
        """For a LoRA adapter request: its adapter loaded on ``replica`` (once, whoever else waits for it)."""
        lora = facts(state.target.engine).lora
        if adapter is None or lora is None or replica is state.batcher:
            return None

        def counted(name: str, failure: LoadFailure | None, seconds: float) -> None:
            outcome = "ok" if failure is None else "failed" if failure.retryable else "refused"
            self.metrics.adapter_load(state.name, outcome)
            log.info("adapter %s on %s: %s in %.3fs", name, replica.url, outcome, seconds)
            tracing.past(
                "router.adapter_load", seconds, {tracing.ADAPTER: name, tracing.REPLICA: replica.url}
            )

        return await ensure_loaded(
            self.fleet.session,
            replica.url,
            replica.adapters,
            lora,
            adapter,
            state.adapters[adapter],
            limit=state.target.max_adapters_per_replica,
            backoff_s=self.cfg.router.adapter_load_backoff_ms / 1000,
            on_load=counted,
        )

    async def _route(self, call: Call, spot: Spot | None = None) -> None:
        conn, state, ctx, rid = call.conn, call.state, call.ctx, call.rid
        settings = state.settings
        last_error: tuple[int, str] = (502, "no replica answered")
        attempt = 0
        tried: set[str] = set()
        reloaded = False
        while True:
            spot = spot if spot is not None else Spot()
            waited = self.metrics.waited
            if tracing.current() is not None:
                waited = functools.partial(self._waited, tracing.hold_kind(state.awake(), state.sleepers()))
            replica = await acquire(state, ctx, self.queue_deadline_s, waited, spot)
            if (
                isinstance(replica, Refusal | None)
                and call.resumed
                and (stable := self.fleet.fallback(state))
            ):
                call.state = state = (
                    stable  # no other replica of the session's version: the stable one goes on
                )
                settings = state.settings
                continue
            if isinstance(replica, Refusal) and (stable := self.fleet.fallback(state)) is not None:
                call.state = state = stable  # the canary cannot take it now: the stable version can
                settings = state.settings
                continue
            if call.resumed and not isinstance(replica, Replica):  # no replacement: the stream's error event
                message = replica.message if replica is not None else last_error[1]
                await self._end_moved(call, message)
                return
            if isinstance(replica, Refusal):
                r = replica
                self.metrics.fair_shed(state.name, spot.place)
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
            if replica is None:  # every usable replica failed this request already
                self._fail(conn, last_error[0], last_error[1], "upstream", code="upstream_error")
                return
            if spot.admitted(state.queue):
                self.metrics.fair_admitted(state.name, spot.place)
            outcome: tuple[int, str] | None
            failure = None if ctx.adapter is None else await self._adapter_ready(state, replica, ctx.adapter)
            if failure is not None and not failure.retryable and call.resumed:
                await self._end_moved(call, failure.message)
                return
            if failure is not None and not failure.retryable:  # the engine refused the adapter itself
                self._fail(
                    conn,
                    failure.status,
                    failure.message,
                    "adapter",
                    state.name,
                    code="adapter_unavailable",
                    param="model",
                )
                return
            if failure is not None:
                outcome = (failure.status, failure.message)
            else:
                if replica is not state.batcher:
                    state.strategy.on_routed(replica, ctx)
                pd = call.pd
                if pd is not None and not pd.prefilled and state.prefill is not None:
                    decode = await self.two_phase.prefill(
                        pd, state, state.prefill, rid, call.path, self._adapter_ready
                    )
                    call.tail = pd.tail_of(decode)
                carried = call.carries_kv
                tracing.note({tracing.REPLICA: replica.url})
                with tracing.phase(
                    "router.attempt", {tracing.ATTEMPT: attempt + 1, tracing.REPLICA: replica.url}
                ) as sp:
                    moved = await self.forwarder.attempt(call, replica)
                    tracing.failed(sp, (502, moved.message) if isinstance(moved, Broken) else moved)
                if isinstance(moved, Broken):  # the stream broke after its client got its head: move it
                    tried.add(replica.url)
                    ctx.exclude = frozenset(tried)
                    last_error = (502, moved.message)
                    attempt += 1
                    if await self._move(call, replica, moved.reason, moved.message):
                        continue
                    return
                outcome = moved
                if outcome is None:
                    if pd is not None:
                        self.two_phase.served(pd, state)
                    return
                if pd is not None and carried and not conn.closed:  # the KV did not make it: decode-only
                    plain, transfer = self.two_phase.decode_failed(pd, state, *outcome, rid)
                    call.tail = pd.tail_of(plain)
                    if transfer:  # not the decode replica's fault: any may take it, no retry spent
                        continue
                if outcome[0] == 404 and ctx.adapter is not None and not reloaded:
                    replica.adapters.loaded.pop(ctx.adapter, None)  # our view was behind: load it again
                    reloaded = True
                    continue
            # a retryable failure before the client saw anything (of this replica, for a stream being moved)
            last_error = outcome
            tried.add(replica.url)
            attempt += 1
            if call.resumed:  # a replacement failed before its first event: the next one, within the limit
                ctx.exclude = frozenset(tried)
                if conn.closed or not await self._move(call, replica, "replacement_failed", outcome[1]):
                    return
                continue
            # A canary's failure is retried on the stable version outside the retry budget: at most the
            # canary's (small) share of traffic, and a bad canary must cost clients nothing.
            stable = self.fleet.fallback(state)
            if conn.closed or (
                stable is None
                and (
                    attempt > settings.retries_max
                    or replica is state.batcher
                    or not self.retry_budget.withdraw()
                )
            ):
                self._fail(conn, last_error[0], last_error[1], "upstream", code="upstream_error")
                return
            self.metrics.retry(state.name, str(last_error[0]))
            tracing.add(tracing.RETRIES)
            log.info(
                "retrying on another replica",
                extra={"request_id": rid.decode(), "failed": replica.url, "error": last_error[1]},
            )
            if stable is not None:  # a canary failed this request: the stable version takes the retry
                call.state = state = stable
                settings = state.settings
            ctx.exclude = frozenset(tried)
            delay = backoff_s(settings.retry_backoff_ms, attempt)
            if delay:
                await asyncio.sleep(delay)

    async def _move(self, call: Call, replica: Replica, reason: str, message: str) -> bool:
        """A stream's engine failed mid-way: True when its continuation is ready to go to another replica;
        False when the stream ended here (the limit of moves, nothing left to generate, or it cannot go on)."""
        progress = call.progress
        assert progress is not None
        limit = self.cfg.router.max_migrations_per_request
        if progress.migrations >= limit or not progress.can_continue():
            why = (
                f"moved {progress.migrations} times already" if progress.can_continue() else "it cannot go on"
            )
            await self._end_moved(call, f"the engine stream broke ({message}); {why}")
            return False
        carried = progress.generated()
        cont = progress.continuation()
        if cont is None:  # max_tokens (or the context) is used up: the stream ends as the engine would end it
            await self.forwarder.end_here(call, "length")
            return False
        call.path, call.tail = cont.path, progress.resend(cont.body)
        self.metrics.migration(call.state.name, reason, carried)
        tracing.add(tracing.MIGRATIONS)
        log.warning(
            "stream moved to another replica",
            extra={
                "request_id": call.rid.decode(),
                "model": call.state.name,
                "failed": replica.url,
                "reason": reason,
                "tokens_carried": carried,
                "migration": progress.migrations,
                "by": "token_ids" if progress.via_ids else "text",
            },
        )
        return True

    async def _end_moved(self, call: Call, message: str) -> None:
        """A moved stream no replica can go on with: its client gets an error event, not a cut socket."""
        self.metrics.reject("upstream", call.state.name)
        await self.forwarder.end_stream(call, 502, message)


def _used(call: Call | None) -> int | None:
    """The tokens a request used, for its tenant's fair share: the answer's usage; nothing when no engine worked
    for it; None (the admission's charge stands) when one did but said no usage."""
    if call is None or call.used is not None:
        return None if call is None else call.used
    return None if call.answered or call.abandoned else 0


def _scope(principal: Principal | None) -> tuple[str, ...] | None:
    """The models a caller's key is scoped to; None: any (no key, or a key without a scope)."""
    return tuple(principal.key.models) if principal is not None and principal.key.models else None


async def _replace(old: Limits, new: Limits) -> None:
    """A reload changed the limit store: the new one takes over, the old one lets go of its connections."""
    await new.start()
    await old.stop()
