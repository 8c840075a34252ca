"""Traces (``observability.tracing``): the OpenTelemetry Collector add-on, where the runtime services and the engines
send their spans, and what each side of that traffic is allowed. Pure.

The collector is the upstream chart ``opentelemetry-collector`` (github.com/open-telemetry/opentelemetry-helm-charts,
charts/opentelemetry-collector, tag opentelemetry-collector-<version>); the values set here are read in that
chart's ``values.yaml`` at the pinned version (0.170.0):

- ``mode`` and ``image.repository`` have no default and the chart fails without them (templates/NOTES.txt);
- ``fullnameOverride`` names the Deployment and the Service (templates/_helpers.tpl ``opentelemetry-collector.fullname``,
  templates/service.yaml), so the endpoint the services export to is known here;
- ``config`` is merged into the chart's default pipeline config; the traces pipeline is replaced (lists are not
  merged) so spans come in over OTLP only and leave to the chosen backend; the Jaeger and Zipkin receivers and their
  ports are turned off (``ports.<name>.enabled``);
- ``networkPolicy`` (templates/networkpolicy.yaml) opens the enabled ports to ``allowIngressFrom`` only and, with
  ``egressRules``, lets the collector reach DNS and the backend's port and nothing else.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from components.engines.common import EngineCommand
from components.render.common import Manifest
from components.spec import ModelSpec, PlatformSpec, TraceBackend
from runtime.engines import facts

CHART = "opentelemetry-collector"
REPOSITORY = "https://open-telemetry.github.io/opentelemetry-helm-charts"
RELEASE = "otel-collector"
#: The collector's own distribution for Kubernetes (OTLP receiver and exporter, batch, memory_limiter,
#: health_check); the chart runs its appVersion tag.
IMAGE = "otel/opentelemetry-collector-k8s"
OTLP_GRPC_PORT = 4317
#: The chart's ports besides OTLP/gRPC (values.yaml ``ports``): none is used here.
UNUSED_PORTS = ("otlp-http", "jaeger-compact", "jaeger-thrift", "jaeger-grpc", "zipkin")
#: The labels of the collector's pods (templates/_helpers.tpl ``selectorLabels``).
POD_LABELS = {"app.kubernetes.io/name": CHART, "app.kubernetes.io/instance": RELEASE}
MEMORY_LIMIT = "512Mi"
CPU_LIMIT = "500m"


def enabled(spec: PlatformSpec) -> bool:
    return spec.observability.tracing.enabled


def namespace(spec: PlatformSpec) -> str:
    """The collector runs beside Prometheus and Grafana."""
    return spec.observability.namespace


def collector_endpoint(spec: PlatformSpec) -> str:
    """Where the runtime services and the engines send spans (OTLP/gRPC)."""
    return f"http://{RELEASE}.{namespace(spec)}.svc:{OTLP_GRPC_PORT}"


def exporter_name(spec: PlatformSpec) -> str:
    return f"otlp/{spec.observability.tracing.backend.value}"


def backend_target(spec: PlatformSpec) -> tuple[str, int, bool]:
    """The backend's host, port and whether it is spoken to in plain text (an http:// endpoint)."""
    endpoint = spec.observability.tracing.endpoint
    assert endpoint is not None, "the spec requires an endpoint when tracing is enabled"
    parts = urlsplit(endpoint)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port, parts.scheme == "http"


def backend_namespace(host: str) -> str | None:
    """The namespace of an in-cluster backend (``<service>.<namespace>.svc[.cluster.local]``); None: outside."""
    labels = host.split(".")
    if len(labels) >= 3 and labels[2] == "svc":
        return labels[1]
    return None


def _egress(spec: PlatformSpec) -> list[Manifest]:
    """DNS, and the backend's port: in its namespace when it runs in the cluster, anywhere otherwise (an ADOT or
    vendor endpoint)."""
    host, port, _ = backend_target(spec)
    inside = backend_namespace(host)
    to: list[Manifest] = (
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": inside}}}]
        if inside is not None
        else [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    )
    dns = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
    }
    return [dns, {"to": to, "ports": [{"port": port, "protocol": "TCP"}]}]


def collector_values(spec: PlatformSpec) -> dict[str, Any]:
    host, port, plain = backend_target(spec)
    exporter = exporter_name(spec)
    return {
        "mode": "deployment",
        "fullnameOverride": RELEASE,
        "image": {"repository": IMAGE},
        "ports": {name: {"enabled": False} for name in UNUSED_PORTS},
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"cpu": CPU_LIMIT, "memory": MEMORY_LIMIT},
        },
        "config": {
            "receivers": {"jaeger": None, "zipkin": None},
            "exporters": {exporter: {"endpoint": f"{host}:{port}", "tls": {"insecure": plain}}},
            "service": {
                "pipelines": {
                    "traces": {
                        "receivers": ["otlp"],
                        "processors": ["memory_limiter", "batch"],
                        "exporters": [exporter],
                    }
                }
            },
        },
        "networkPolicy": {
            "enabled": True,
            # the stack's pods; which of them may send is the stack's own egress policies' business
            "allowIngressFrom": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": spec.cluster.namespace}
                    }
                }
            ],
            "egressRules": _egress(spec),
        },
    }


def traced_engine(spec: PlatformSpec, model: ModelSpec, cmd: EngineCommand) -> EngineCommand:
    """The engine's command with its own tracing on, exporting to the collector, when tracing is on and the engine
    has the option (``runtime.engines``: vLLM's ``--otlp-traces-endpoint``); as it was otherwise."""
    flag = facts(model.engine.kind).cli.otlp_traces
    if not enabled(spec) or flag is None:
        return cmd
    return replace(cmd, args=[*cmd.args, flag.name, collector_endpoint(spec)])


def plan_line(spec: PlatformSpec) -> str | None:
    """What the plan says about traces: None when off."""
    t = spec.observability.tracing
    if not t.enabled:
        return None
    where = {
        TraceBackend.TEMPO: "Tempo",
        TraceBackend.JAEGER: "Jaeger",
        TraceBackend.OTLP: "an OTLP endpoint",
    }[t.backend]
    prompts = "prompts captured" if t.capture_prompts else "no prompt text"
    return (
        f"traces: the runtime services and the vLLM engines -> {collector_endpoint(spec)} -> {where} "
        f"at {t.endpoint}; {t.sample_ratio:.2%} of new traces sampled (parent-based), {prompts}"
    )
