"""OpenTelemetry traces for the runtime services: one tracer provider per service, built from ``tracing`` in
the runtime config, and the few calls the services' code makes to describe a request.

Off (no ``tracing`` in the config) nothing of OpenTelemetry is imported: there is no provider, no exporter
thread and no export traffic, and every call below costs one context-variable read. On, the provider samples
parent-based with the configured ratio (a request that arrives with a W3C ``traceparent`` keeps its caller's
decision; a new trace is kept with probability ``sample_ratio``), batches finished spans and exports them over
OTLP/gRPC with the SDK's own exporter.

How a service uses it: :meth:`Tracing.request` opens the one span of a request (its parent taken from the
request's ``traceparent``) and makes it current for the task; :func:`note` sets attributes on the current
request span, :func:`phase` opens a child span for one phase (a queue wait, an upstream attempt), and
:func:`inject` writes the current span's ``traceparent`` into the headers sent upstream, so the engine's own
spans (vLLM's ``--otlp-traces-endpoint``) join the same trace.

What never goes on a span: API keys, headers, and (unless ``capture_prompts``) the prompt or messages.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanContext, Tracer

    from runtime.config import TracingSettings

log = logging.getLogger("inferstack.tracing")

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
#: How much of a prompt a span carries when prompt capture is on.
PROMPT_CAPTURE_BYTES = 4096

# Attribute names: OpenTelemetry's GenAI semantic conventions where one fits, ``inferstack.*`` otherwise.
MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
PROMPT = "gen_ai.prompt"
REQUEST_ID = "inferstack.request_id"
KIND = "inferstack.api"
VERSION = "inferstack.model_version"
ADAPTER = "inferstack.adapter"
TENANT = "inferstack.tenant"
PRIORITY = "inferstack.priority"
STRATEGY = "inferstack.strategy"
REPLICA = "inferstack.replica"
QUEUE_WAIT_MS = "inferstack.queue_wait_ms"
RETRIES = "inferstack.retries"
MIGRATIONS = "inferstack.migrations"
TTFT_MS = "inferstack.ttft_ms"
#: The endpoint picker's view of an answer: the engine's response headers (it sees no tokens).
RESPONSE_HEADERS_MS = "inferstack.response_headers_ms"
ATTEMPT = "inferstack.attempt"
STATUS = "http.response.status_code"
ERROR = "inferstack.error"

# The current request's span and the tracer that made it; None: tracing is off here, or no request is open.
_CURRENT: ContextVar[tuple[Tracer, Span] | None] = ContextVar("inferstack_span", default=None)
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext(None)

Attribute = str | bool | int | float


class Tracing:
    """One service's tracing: on with a provider and an exporter, or off with neither."""

    def __init__(
        self,
        settings: TracingSettings | None,
        service: str,
        *,
        exporter: SpanExporter | None = None,
        resource: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        self.provider: TracerProvider | None = None
        self._tracer: Tracer | None = None
        self._stopped = False
        self._ratio = settings.sample_ratio if settings is not None else 0.0
        if settings is not None:
            self.provider = _provider(settings, service, exporter, resource or {})
            self._tracer = self.provider.get_tracer("inferstack")

    @property
    def on(self) -> bool:
        return self._tracer is not None

    @property
    def capture_prompts(self) -> bool:
        return self.settings is not None and self.settings.capture_prompts

    def request(
        self, name: str, headers: Mapping[bytes, bytes], attributes: Mapping[str, Attribute] | None = None
    ) -> contextlib.AbstractContextManager[Span | None]:
        """The span of one request received (a server span), child of the caller's ``traceparent`` when it sent
        one, current for the task until the block ends. Off: a shared no-op. Not sampled (the caller's decision,
        or for a new trace the ratio): no span at all, only the ``traceparent`` that tells the engine not to
        record either (see :func:`inject`)."""
        if self._tracer is None:
            return _OFF
        caller = headers.get(TRACEPARENT)
        parsed = _parse(caller) if caller is not None else None
        if parsed is not None:  # the caller decided
            if not parsed:
                assert caller is not None
                return _Unsampled(caller)
        elif not self._head():
            return _Unsampled(_new_traceparent(sampled=False))
        return _request(self._tracer, name, headers, attributes or {}, server=True)

    def hold(
        self, name: str, headers: Mapping[bytes, bytes], attributes: Mapping[str, Attribute] | None = None
    ) -> Held | None:
        """The span of one request received, held across callbacks rather than a block (the endpoint picker's
        ext_proc exchange: its headers, its body, the engine's answer, its end), sampled as :meth:`request`
        samples. None when tracing is off."""
        if self._tracer is None:
            return None
        caller = headers.get(TRACEPARENT)
        parsed = _parse(caller) if caller is not None else None
        if parsed is False:
            assert caller is not None
            return Held(None, caller)
        if parsed is None and not self._head():
            return Held(None, _new_traceparent(sampled=False))
        from opentelemetry import trace  # noqa: PLC0415 - loaded once tracing is on

        span = self._tracer.start_span(
            name, context=_callers_context(headers), kind=trace.SpanKind.SERVER, attributes=attributes or {}
        )
        sent = span.get_span_context()
        return Held(span, b"00-%032x-%016x-%02x" % (sent.trace_id, sent.span_id, int(sent.trace_flags)))

    def _head(self) -> bool:
        """A new trace's sampling decision: kept with probability ``sample_ratio``."""
        return self._ratio >= 1.0 or (self._ratio > 0.0 and _RANDOM.random() < self._ratio)

    def outgoing(
        self,
        name: str,
        attributes: Mapping[str, Attribute] | None = None,
        links: Sequence[SpanContext | None] = (),
    ) -> contextlib.AbstractContextManager[Span | None]:
        """The span of one request this service makes on its own (a batch line, an engine batch): the root of
        its trace, or a child of the request being served; current for the task until the block ends. ``links``:
        the requests it does work for (an engine batch's members, each in a trace of its own): the span joins the
        trace of the first sampled one (so it is kept when they are) and links to the others."""
        if self._tracer is None:
            return _OFF
        within = _UNSAMPLED.get()  # the request this work is for is not sampled
        if (
            _CURRENT.get() is None
            and not any(c is not None and c.trace_flags.sampled for c in links)
            and (within is not None or not self._head())
        ):
            return _Unsampled(within or _new_traceparent(sampled=False))
        return _request(self._tracer, name, {}, attributes or {}, server=False, links=links)

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporter thread (once: later calls do nothing)."""
        if self.provider is not None and not self._stopped:
            self._stopped = True
            self.provider.shutdown()


def _provider(
    settings: TracingSettings, service: str, exporter: SpanExporter | None, resource: Mapping[str, str]
) -> TracerProvider:
    """The SDK's provider: parent-based sampling, a batching processor, the OTLP/gRPC exporter (or the one given,
    for tests and benchmarks). Imported here, only when tracing is on. A new trace's ratio is drawn before the SDK
    is asked (``Tracing.request``): an unsampled request then costs a random draw and one formatted header, not
    an SDK span; what reaches the SDK is kept (its root sampler is ALWAYS_ON), and its children follow it."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased  # noqa: PLC0415

    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "service.namespace": "inferstack", **resource}),
        sampler=ParentBased(ALWAYS_ON),
    )
    if exporter is None:
        exporter = OTLPSpanExporter(
            endpoint=settings.endpoint,
            insecure=settings.endpoint.startswith("http://"),
            timeout=settings.export_timeout_ms / 1000,
        )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


@contextlib.contextmanager
def _request(
    tracer: Tracer,
    name: str,
    headers: Mapping[bytes, bytes],
    attributes: Mapping[str, Attribute],
    *,
    server: bool,
    links: Sequence[SpanContext | None] = (),
) -> Iterator[Span]:
    from opentelemetry import trace  # noqa: PLC0415 - loaded once tracing is on

    current = _CURRENT.get()
    parent: Context | None
    if server:
        parent = _callers_context(headers)
    elif current is not None:
        parent = trace.set_span_in_context(current[1])
    else:  # work done for other requests: in the trace of the first of them that is sampled, linked to the rest
        first = next((c for c in links if c is not None and c.trace_flags.sampled), None)
        parent = trace.set_span_in_context(trace.NonRecordingSpan(first)) if first is not None else None
        links = [c for c in links if c is not first]
    kind = trace.SpanKind.SERVER if server else trace.SpanKind.CLIENT
    linked = [trace.Link(c) for c in links if c is not None]
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes, links=linked
    ) as span:
        token = _CURRENT.set((tracer, span))
        try:
            yield span
        finally:
            _CURRENT.reset(token)


class Held:
    """A request span held by its service across callbacks (``Tracing.hold``): what goes on it, the
    ``traceparent`` its upstream gets (the span's own context; for a request that is not sampled, the caller's or
    a new unsampled one, so the engine does not record it either), and its end, once."""

    __slots__ = ("span", "traceparent")

    def __init__(self, span: Span | None, traceparent: bytes) -> None:
        self.span = span
        self.traceparent = traceparent

    def note(self, attributes: Mapping[str, Attribute | None]) -> None:
        if self.span is not None:
            self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def end(self, outcome: tuple[int, str] | None = None) -> None:
        """The request is over; ``outcome``: its failure (status, why), as :func:`failed` records it."""
        span, self.span = self.span, None
        if span is not None:
            failed(span, outcome)
            span.end()


def _callers_context(headers: Mapping[bytes, bytes]) -> Context:
    """The trace context a request arrived with (W3C ``traceparent``/``tracestate``): the parent of its span."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # noqa: PLC0415

    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items() if k in _CONTEXT_HEADERS}
    return TraceContextTextMapPropagator().extract(carrier)


_CONTEXT_HEADERS = frozenset((TRACEPARENT, TRACESTATE))
# W3C Trace Context: version-traceid-parentid-flags (a later version may append fields, read as version 00 is)
_TRACEPARENT = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?$")
_RANDOM = random.Random()
# The traceparent of an unsampled request in this task: what ``inject`` passes on (no span was made).
_UNSAMPLED: ContextVar[bytes | None] = ContextVar("inferstack_unsampled", default=None)


def _parse(value: bytes) -> bool | None:
    """A caller's ``traceparent``: whether it is sampled, or None when it is not a valid one (then ignored, as
    the SDK's propagator ignores it)."""
    m = _TRACEPARENT.match(value.strip())
    if m is None or m[1] == b"ff" or m[2] == b"0" * 32 or m[3] == b"0" * 16 or (m[1] == b"00" and m[5]):
        return None
    return bool(int(m[4], 16) & 1)


def _new_traceparent(*, sampled: bool) -> bytes:
    trace_id = _RANDOM.getrandbits(128) or 1
    span_id = _RANDOM.getrandbits(64) or 1
    return b"00-%032x-%016x-%02x" % (trace_id, span_id, 1 if sampled else 0)


class _Unsampled:
    """The context of a request that is not traced: no span, the ``traceparent`` to pass on kept for
    :func:`inject` (the engine then does not record it either)."""

    __slots__ = ("_token", "traceparent")

    def __init__(self, traceparent: bytes) -> None:
        self.traceparent = traceparent

    def __enter__(self) -> None:
        self._token = _UNSAMPLED.set(self.traceparent)

    def __exit__(self, *exc: object) -> None:
        _UNSAMPLED.reset(self._token)


def current() -> Span | None:
    """The request span open in this task, if tracing is on and one is."""
    held = _CURRENT.get()
    return held[1] if held is not None else None


def link_context() -> SpanContext | None:
    """The current request span's context, kept to link later work done for it (a batch) to its trace."""
    held = _CURRENT.get()
    if held is None or not held[1].is_recording():
        return None
    return held[1].get_span_context()


def note(attributes: Mapping[str, Attribute | None]) -> None:
    """Set attributes on the current request span (None values are skipped); nothing when off or unsampled."""
    held = _CURRENT.get()
    if held is None or not held[1].is_recording():
        return
    held[1].set_attributes({k: v for k, v in attributes.items() if v is not None})


def add(name: str, amount: int = 1) -> None:
    """Add to a count attribute of the current request span (retries, migrations)."""
    held = _CURRENT.get()
    if held is None or not held[1].is_recording():
        return
    span = held[1]
    was = getattr(span, "attributes", None) or {}
    span.set_attribute(name, int(was.get(name, 0)) + amount)


def event(name: str, attributes: Mapping[str, Attribute] | None = None) -> None:
    """An event on the current request span (a moment rather than a phase)."""
    held = _CURRENT.get()
    if held is not None and held[1].is_recording():
        held[1].add_event(name, attributes or {})


def phase(
    name: str, attributes: Mapping[str, Attribute] | None = None
) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the current request span for one phase of it; a no-op when there is none."""
    held = _CURRENT.get()
    if held is None or not held[1].is_recording():
        return _OFF
    return _phase(held[0], held[1], name, attributes or {})


@contextlib.contextmanager
def _phase(tracer: Tracer, parent: Span, name: str, attributes: Mapping[str, Attribute]) -> Iterator[Span]:
    from opentelemetry import trace  # noqa: PLC0415

    with tracer.start_as_current_span(
        name, context=trace.set_span_in_context(parent), kind=trace.SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield span


def past(name: str, seconds: float, attributes: Mapping[str, Attribute] | None = None) -> None:
    """A child span of the current request span for a phase that just ended after ``seconds`` (a wait that
    is only known to have been one once it is over)."""
    held = _CURRENT.get()
    if held is None or not held[1].is_recording():
        return
    from opentelemetry import trace  # noqa: PLC0415

    end = time.time_ns()
    span = held[0].start_span(
        name,
        context=trace.set_span_in_context(held[1]),
        start_time=end - int(seconds * 1e9),
        attributes=attributes or {},
    )
    span.end(end_time=end)


def hold_kind(awake: Sequence[Any], sleepers: Sequence[Any]) -> str:
    """What a request that waits for a replica waits for: a free slot on a ready replica, a sleeping replica
    to wake, or (none ready) a replica to start."""
    if any(r.healthy for r in awake):
        return "router.queue_wait"
    return "router.wake_hold" if sleepers else "router.cold_start_hold"


def failed(span: Span | None, outcome: tuple[int, str] | None) -> None:
    """Mark a phase span (an upstream attempt) with its failure; None: it succeeded."""
    if span is None or not span.is_recording():
        return
    if outcome is None:
        return
    from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

    span.set_attributes({STATUS: outcome[0], ERROR: outcome[1][:200]})
    span.set_status(Status(StatusCode.ERROR, outcome[1][:200]))


def inject(headers: MutableMapping[bytes, bytes]) -> None:
    """Write the current span's W3C trace context into headers going upstream, replacing the caller's (the
    upstream's spans are children of this service's span). Nothing when tracing is off: a caller's
    ``traceparent`` then passes through as it came."""
    held = _CURRENT.get()
    if held is None:
        unsampled = _UNSAMPLED.get()
        if unsampled is not None:  # traced here but not this request: the engine is told not to record it
            headers[TRACEPARENT] = unsampled
            headers.pop(TRACESTATE, None)
        return
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # noqa: PLC0415

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(held[1]))
    headers.pop(TRACESTATE, None)
    for key, value in carrier.items():
        headers[key.encode("latin-1")] = value.encode("latin-1")


def traceparent() -> bytes | None:
    """The current span's ``traceparent`` header value, for a request assembled as bytes; None when off."""
    headers: dict[bytes, bytes] = {}
    inject(headers)
    return headers.get(TRACEPARENT)


def prompt_text(payload: Mapping[str, Any]) -> str:
    """What prompt capture records: the messages (or prompt, or input) as JSON, cut to
    :data:`PROMPT_CAPTURE_BYTES`."""
    import json  # noqa: PLC0415

    for field in ("messages", "prompt", "input"):
        if field in payload:
            return json.dumps(payload[field], ensure_ascii=False)[:PROMPT_CAPTURE_BYTES]
    return ""
