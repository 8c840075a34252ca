"""A real OTLP/gRPC trace receiver on loopback for the tests: the collector's TraceService, from the OpenTelemetry
protocol's own generated stubs (``opentelemetry-proto``), keeping every span it is sent and counting the calls.

Spans come back as plain dicts (trace and span ids in hex, attributes as Python values, the resource's
``service.name``) so tests read them without the protobuf API."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        spans = []
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        {
                            "name": s.name,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "kind": s.kind,
                            "start_ns": s.start_time_unix_nano,
                            "end_ns": s.end_time_unix_nano,
                            "status": s.status.code,
                            "attributes": {kv.key: _value(kv.value) for kv in s.attributes},
                            "events": [e.name for e in s.events],
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            "service": resource.get("service.name"),
                        }
                    )
        with self.receiver.lock:
            self.receiver.calls += 1
            self.receiver.spans.extend(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """Start with :meth:`start`; ``endpoint`` is what a tracer exports to."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.spans: list[dict[str, Any]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(0)

    def wait_for(self, predicate: Any, timeout_s: float = 30) -> list[dict[str, Any]]:
        """The spans once ``predicate(spans)`` holds; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans never matched within {timeout_s}s: {[s['name'] for s in spans]}")
            time.sleep(0.05)
