"""One ext_proc stream, which is one HTTP request through the gateway: headers, body, the pick, the outcome.

A state machine over the gateway's messages; every message in gets its answers out (possibly none yet:
in full-duplex mode the headers are answered only once the body that names the model is in). What a
request costs a replica is counted from the pick to the end of the stream: the gateway closes the stream
when the request is over, whatever the processing mode, so a stream's end is the request's end.

Bad input never ends in a hang or a crash: an unreadable body is an immediate 400, a body past the
limit a 413, a stream that ends before its body is complete is logged and forgotten.

API keys are the router's (``runtime.api_keys``): with a key table an inference request (and the model
list) is checked at its headers (401 before any body is read), then against the key's model scope and
request rate once the body names the model (403, 429), before anything touches that model: a key scoped
to one model can neither wake another (a 503 ``no_backend`` is what wakes a model at zero) nor learn the
names of the others (a 404 and ``/v1/models`` name only the key's).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Protocol

from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from runtime import tracing
from runtime.api_keys import Denied, KeyTable, Principal, admit
from runtime.config import Band, BodyMode, PickerSettings, QueueOrder
from runtime.http import PRIORITY_HEADER
from runtime.openai_request import INFERENCE_PATHS
from runtime.picker import protocol
from runtime.picker.decide import Answer, Pick, decide, refuse
from runtime.picker.metrics import PickerMetrics
from runtime.picker.replicas import ModelPool, Replica
from runtime.scheduling.fair_queue import Place, TenantTable
from runtime.tracing import Held, Tracing

#: The model list: keyed like the inference paths, and listing only the key's models.
MODELS_PATH = "/v1/models"

log = logging.getLogger("inferstack.picker")

#: Statuses from a replica that count against its circuit (the router retries on the same ones).
FAILURE_STATUSES = frozenset((502, 503, 504))
#: Refusals for want of a replica: a tenant's requests shed, in the per-tenant metrics.
SHED_REASONS = frozenset(("overloaded", "low_priority", "no_backend"))
_PRIORITY = PRIORITY_HEADER.decode()
#: The trace context a request's span continues (``runtime.tracing``).
_TRACE_HEADERS = (tracing.TRACEPARENT, tracing.TRACESTATE)


class PickerState(Protocol):
    """What an exchange reads from the running picker."""

    @property
    def models(self) -> dict[str, ModelPool]: ...

    @property
    def settings(self) -> PickerSettings: ...

    @property
    def max_body_bytes(self) -> int: ...

    @property
    def max_choices(self) -> int: ...

    @property
    def metrics(self) -> PickerMetrics: ...

    @property
    def keys(self) -> KeyTable: ...

    @property
    def tenants(self) -> TenantTable: ...

    @property
    def headroom_share(self) -> float: ...

    @property
    def settings_order(self) -> QueueOrder: ...

    @property
    def tracing(self) -> Tracing: ...


class Exchange:
    """The picker's side of one request."""

    __slots__ = (
        "answered",
        "body",
        "body_size",
        "done",
        "full_duplex",
        "headers",
        "method",
        "path",
        "pick",
        "principal",
        "sent_at",
        "served",
        "state",
        "status",
        "subset",
        "trace",
    )

    def __init__(self, state: PickerState) -> None:
        self.state = state
        self.full_duplex = state.settings.body_mode is BodyMode.FULL_DUPLEX_STREAMED
        self.headers: dict[str, str] = {}
        self.method = ""
        self.path = ""
        self.subset: frozenset[str] | None = None
        self.body: list[bytes] = []
        self.body_size = 0
        self.answered = False  # the request is decided: picked or answered by the gateway
        self.pick: Pick | None = None
        self.principal: Principal | None = None
        self.sent_at = 0.0
        self.served: Replica | None = None
        self.status = 0
        self.done = False
        self.trace: Held | None = None  # the request's span, from its headers to its end (None: tracing off)

    @property
    def request_id(self) -> str:
        return self.headers.get("x-request-id", "")

    # --- the gateway's messages ---------------------------------------------------------------
    def on_message(self, request: ProcessingRequest) -> list[ProcessingResponse]:
        which = request.WhichOneof("request")
        if which == "request_headers":
            return self._request_headers(request)
        if which == "request_body":
            return self._request_body(request.request_body.body, request.request_body.end_of_stream)
        if which == "request_trailers":
            return [*self._decide(trailers=True), protocol.continue_trailers()]
        if which == "response_headers":
            return self._response_headers(request)
        if which == "response_body":
            chunk = request.response_body
            if chunk.end_of_stream:
                self.close()
            if self.full_duplex:
                return [protocol.streamed_body(chunk.body, chunk.end_of_stream, request_side=False)]
            return [protocol.continue_body(request_side=False)]
        if which == "response_trailers":
            self.close()
            return [protocol.continue_trailers(request_side=False)]
        return []

    def _request_headers(self, request: ProcessingRequest) -> list[ProcessingResponse]:
        self.headers = protocol.header_map(request.request_headers)
        self.method = self.headers.get(":method", "")
        self.path = self.headers.get(":path", "").split("?", 1)[0]
        self.subset = protocol.subset_hint(request)
        kind = INFERENCE_PATHS.get(self.path)
        if kind is not None:  # the request's span, continuing its caller's trace
            context = {
                h: self.headers[h.decode()].encode("latin-1")
                for h in _TRACE_HEADERS
                if h.decode() in self.headers
            }
            self.trace = self.state.tracing.hold(f"picker {kind}", context, {tracing.KIND: kind})
        if self.path in INFERENCE_PATHS or self.path == MODELS_PATH:
            denied = self._authenticate()
            if denied is not None:
                return self._answer(refuse(denied.status, denied.message, "auth", code=denied.code))
        too_large = self._declared_too_large()
        if too_large is not None:
            return self._answer(too_large)
        if request.request_headers.end_of_stream:  # no body: a GET, or a POST without one
            return self._decide()
        return [] if self.full_duplex else [protocol.continue_headers()]

    def _authenticate(self) -> Denied | None:
        """The router's key check on the request's Authorization header; keeps the caller for ``admit``."""
        required = self.state.settings.require_api_key
        keys = self.state.keys
        if not required and not len(keys):
            return None
        authorization = self.headers.get("authorization")
        who = keys.authenticate(None if authorization is None else authorization.encode("latin-1"), required)
        if isinstance(who, Denied):
            return who
        self.principal = who
        return None

    def _place(self) -> Place:
        """The request's tenant and band: its key's, or a lower band its header asks for (never a higher one); the
        default band for every request when the line is ``fifo``."""
        key = self.principal.key if self.principal is not None else None
        place = self.state.tenants.place(key, self.headers.get(_PRIORITY), 0)
        if self.state.settings_order is QueueOrder.FIFO:
            return Place(place.tenant, Band.STANDARD, place.weight)
        return place

    def _declared_too_large(self) -> Answer | None:
        """A declared ``Content-Length`` past the limit is a 413 at the headers, before the body is sent: the
        gateway answers at once instead of taking in (or buffering) a body nobody will read."""
        declared = self.headers.get("content-length", "")
        limit = self.state.max_body_bytes
        if declared.isdigit() and int(declared) > limit:
            return refuse(413, f"request body of {declared} bytes exceeds {limit} bytes", "too_large")
        return None

    def _admit(self, model: str) -> Answer | None:
        """The key's scope and request rate on ``model`` (``decide`` asks before touching the model)."""
        principal = self.principal
        if principal is None:
            return None
        denied = admit(principal, model, time.monotonic())
        if denied is None:
            return None
        reason = "forbidden" if denied.status == 403 else "rate_limited"
        retry = None if denied.retry_after_s is None else math.ceil(denied.retry_after_s)
        return refuse(denied.status, denied.message, reason, model, code=denied.code, retry_after_s=retry)

    def _request_body(self, chunk: bytes, end_of_stream: bool) -> list[ProcessingResponse]:
        if self.done:  # answered by the gateway already: nothing more goes anywhere
            return []
        if self.answered:
            return [protocol.streamed_body(chunk, end_of_stream)] if self.full_duplex else []
        self.body_size += len(chunk)
        if self.body_size > self.state.max_body_bytes:
            limit = self.state.max_body_bytes
            return self._answer(refuse(413, f"request body exceeds {limit} bytes", "too_large"))
        self.body.append(chunk)
        return self._decide() if end_of_stream else []

    def _decide(self, trailers: bool = False) -> list[ProcessingResponse]:
        """Pick (or answer) once the whole body is in; ``trailers``: the body ended with trailers."""
        if self.answered:
            return []
        body = b"".join(self.body)
        state = self.state
        now = time.monotonic()
        scope = self.principal.key.models if self.principal is not None else None
        place = self._place()
        decision = decide(
            state.models,
            self.method,
            self.path,
            self.headers,
            body,
            now,
            subset=self.subset,
            most_fallbacks=state.settings.fallback_endpoints,
            max_choices=state.max_choices,
            scope=frozenset(scope) if scope else None,
            admit=self._admit,
            band=place.band,
            headroom_share=state.headroom_share,
        )
        if isinstance(decision, Answer):
            if decision.reason in SHED_REASONS and decision.model:
                state.metrics.fair("shed", decision.model, place)
            return self._answer(decision)
        state.metrics.fair("admitted", decision.pool.name, place)
        self.answered = True
        self.pick = decision
        primary = decision.primary
        decision.pool.strategy.on_routed(primary, decision.ctx)
        primary.inflight += 1
        primary.breaker.on_start(now)
        self.sent_at = now
        state.metrics.picked(decision.pool.name, primary.url, time.monotonic() - now)
        destination = decision.destination()
        model = decision.pool.name
        passed: tuple[tuple[str, str], ...] = ()
        if self.trace is not None:  # the engine's spans join this request's trace
            self.trace.note(
                {
                    tracing.MODEL: model,
                    tracing.TENANT: place.tenant,
                    tracing.PRIORITY: place.band.value,
                    tracing.STRATEGY: decision.pool.strategy.name,
                    tracing.REPLICA: primary.url,
                }
            )
            passed = ((tracing.TRACEPARENT.decode(), self.trace.traceparent.decode("latin-1")),)
        if not self.full_duplex:
            return [protocol.routed_body(destination, model, passed)]
        return [
            protocol.routed_headers(destination, model, passed),
            protocol.streamed_body(body, not trailers),
        ]

    def _answer(self, answer: Answer) -> list[ProcessingResponse]:
        self.answered = True
        self.done = True
        if self.trace is not None:  # answered here: the span ends with the answer
            self.trace.note({tracing.MODEL: answer.model})
            self.trace.end(
                (answer.status, answer.reason or "answered by the picker") if answer.status >= 400 else None
            )
        if answer.reason:
            self.state.metrics.rejected(answer.reason, answer.model)
            if answer.status < 500:
                log.info(
                    "answered by the picker",
                    extra={
                        "request_id": self.request_id,
                        "status": answer.status,
                        "reason": answer.reason,
                        "path": self.path[:100],
                    },
                )
        return [
            protocol.immediate(
                answer.status, answer.body, answer.headers, f"inferstack_picker_{answer.reason or 'answer'}"
            )
        ]

    def _response_headers(self, request: ProcessingRequest) -> list[ProcessingResponse]:
        headers = protocol.header_map(request.response_headers)
        try:
            self.status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = 0
        pick = self.pick
        if pick is not None and self.served is None:
            endpoint = protocol.served_endpoint(request)
            served = pick.pool.by_endpoint.get(endpoint) if endpoint else None
            primary = pick.primary
            if served is not None and served is not primary:
                # the pick could not be reached and the gateway fell back: count the request where it is
                primary.inflight -= 1
                primary.breaker.on_failure(time.monotonic())
                served.inflight += 1
            self.served = served or primary
            if self.status == 200:
                self.served.observe_ttft(time.monotonic() - self.sent_at, pick.pool.ewma_alpha)
            if self.trace is not None:
                self.trace.note(
                    {
                        tracing.REPLICA: self.served.url,
                        tracing.STATUS: self.status,
                        tracing.RESPONSE_HEADERS_MS: round((time.monotonic() - self.sent_at) * 1000, 3),
                    }
                )
        if request.response_headers.end_of_stream:
            self.close()
        return [protocol.continue_headers(request_side=False)]

    # --- the end ------------------------------------------------------------------------------
    def close(self) -> None:
        """The request is over (its stream ended, or its response did): account for it, once."""
        if self.done:
            return
        self.done = True
        pick = self.pick
        if self.trace is not None:
            failed = self.status in FAILURE_STATUSES or (pick is not None and self.status == 0)
            self.trace.end((self.status, "no answer from the replica") if failed else None)
        if pick is None:
            if self.method:
                log.info(
                    "ext_proc stream ended before the request was complete; nothing was routed",
                    extra={"request_id": self.request_id, "path": self.path[:100]},
                )
            return
        replica = self.served or pick.primary
        replica.inflight -= 1
        now = time.monotonic()
        if self.status == 0:
            replica.breaker.on_abandon()  # no answer seen: the client left, or the gateway gave up
        elif self.status in FAILURE_STATUSES:
            replica.breaker.on_failure(now)
        else:
            replica.breaker.on_success()
        self.state.metrics.finished(pick.pool.name, replica.url, self.status, now - self.sent_at)
