"""observability.tracing rendered: the OpenTelemetry Collector add-on from its pinned upstream chart, the engines'
own tracing flag, the runtime services' tracing settings, the network traffic it needs (and no more), and the
plan's line. Chart facts are from open-telemetry/opentelemetry-helm-charts, charts/opentelemetry-collector at tag
opentelemetry-collector-0.170.0 (values.yaml, templates/NOTES.txt, templates/_helpers.tpl, templates/networkpolicy.yaml)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from components.clouds.targets import cloud_for
from components.core.placement import place
from components.render import addons, chart_hooks, engine, network, runtime_config, scaling, tracing
from components.spec import PlatformSpec
from tests.components.helpers import decided, minimal
from tests.components.netpol import Endpoint, allowed

TEMPO = {
    "enabled": True,
    "backend": "tempo",
    "endpoint": "http://tempo.tracing.svc:4317",
    "sample_ratio": 0.1,
}


def _spec(trace: dict[str, Any] | None) -> PlatformSpec:
    raw = minimal()
    if trace is not None:
        raw.setdefault("observability", {})["tracing"] = trace
    return PlatformSpec.model_validate(raw)


def _collector(spec: PlatformSpec) -> addons.Release | None:
    found = [
        r
        for r in addons.releases(spec, scaling.adapter_rules(spec), cloud_for(spec))
        if r.chart == tracing.CHART
    ]
    return found[0] if found else None


def test_off_by_default_no_collector_no_engine_flag_no_runtime_tracing():
    spec = _spec(None)
    assert not spec.observability.tracing.enabled
    assert _collector(spec) is None
    assert runtime_config.runtime_config(spec).tracing is None
    unit = next(iter(decided(spec).units.values()))
    args = engine.deployment(spec, unit)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--otlp-traces-endpoint" not in args
    assert tracing.plan_line(spec) is None


def test_the_collector_is_the_pinned_upstream_chart_with_the_values_it_requires():
    spec = _spec(TEMPO)
    release = _collector(spec)
    assert release is not None
    assert (release.chart, release.repository, release.version) == (
        "opentelemetry-collector",
        "https://open-telemetry.github.io/opentelemetry-helm-charts",
        "0.170.0",
    )
    assert release.namespace == spec.observability.namespace
    v = release.values
    # templates/NOTES.txt fails the install without these two
    assert v["mode"] == "deployment" and v["image"]["repository"] == "otel/opentelemetry-collector-k8s"
    # the Service's name (templates/_helpers.tpl fullname) is what the services export to
    assert v["fullnameOverride"] == "otel-collector"
    assert tracing.collector_endpoint(spec) == "http://otel-collector.monitoring.svc:4317"
    traces = v["config"]["service"]["pipelines"]["traces"]
    assert traces == {
        "receivers": ["otlp"],
        "processors": ["memory_limiter", "batch"],
        "exporters": ["otlp/tempo"],
    }
    assert v["config"]["exporters"]["otlp/tempo"] == {
        "endpoint": "tempo.tracing.svc:4317",
        "tls": {"insecure": True},
    }
    assert all(
        not v["ports"][p]["enabled"] for p in ("jaeger-compact", "jaeger-thrift", "jaeger-grpc", "zipkin")
    )
    # a chart version whose templates were read for hooks (none there)
    assert chart_hooks.gaps(release.chart, release.version, v, release.namespace, []) == []


@pytest.mark.parametrize(
    ("backend", "endpoint", "exporter", "insecure", "egress_to"),
    [
        ("jaeger", "http://jaeger-collector.observability.svc:4317", "otlp/jaeger", True, "observability"),
        ("otlp", "https://adot.example.internal:4317", "otlp/otlp", False, None),
    ],
)
def test_each_backend_is_an_exporter_and_the_collector_may_reach_only_it_and_dns(
    backend, endpoint, exporter, insecure, egress_to
):
    spec = _spec({"enabled": True, "backend": backend, "endpoint": endpoint})
    release = _collector(spec)
    assert release is not None
    host_port = endpoint.split("://", 1)[1]
    assert release.values["config"]["exporters"] == {
        exporter: {"endpoint": host_port, "tls": {"insecure": insecure}}
    }
    policy = release.values["networkPolicy"]
    assert policy["enabled"] is True
    assert policy["allowIngressFrom"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": spec.cluster.namespace}}}
    ]
    dns, backend_rule = policy["egressRules"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert backend_rule["ports"] == [{"port": 4317, "protocol": "TCP"}]
    if egress_to is None:
        assert backend_rule["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    else:
        assert backend_rule["to"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": egress_to}}}
        ]


def test_vllm_engines_export_their_own_spans_to_the_collector():
    spec = _spec(TEMPO)
    unit = next(iter(decided(spec).units.values()))
    args = engine.deployment(spec, unit)["spec"]["template"]["spec"]["containers"][0]["args"]
    at = args.index("--otlp-traces-endpoint")
    assert args[at + 1] == tracing.collector_endpoint(spec)


def test_the_runtime_services_get_the_collector_and_the_sampling():
    spec = _spec({**TEMPO, "capture_prompts": True})
    t = runtime_config.runtime_config(spec).tracing
    assert t is not None
    assert (t.endpoint, t.sample_ratio, t.capture_prompts) == (tracing.collector_endpoint(spec), 0.1, True)
    line = tracing.plan_line(spec)
    assert (
        line is not None and "Tempo at http://tempo.tracing.svc:4317" in line and "prompts captured" in line
    )


def test_the_router_and_the_engines_may_send_spans_to_the_collector_the_health_monitor_may_not():
    spec = _spec(TEMPO)
    policies = [m for m in network.render(spec, cloud_for(spec), place(spec)) if m["kind"] == "NetworkPolicy"]
    ns = spec.cluster.namespace
    collector = Endpoint("collector", "10.0.9.9", spec.observability.namespace, {**tracing.POD_LABELS})

    def pod(component: str, ip: str) -> Endpoint:
        labels = {
            "app.kubernetes.io/instance": f"{spec.name}-{spec.environment}",
            "app.kubernetes.io/component": component,
        }
        return Endpoint(component, ip, ns, labels)

    def may_send(src: Endpoint, port: int) -> bool:
        # the collector's own ingress is its chart's policy (checked above): here the stack's egress side
        open_ingress = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "collector", "namespace": collector.namespace},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]},
        }
        return allowed([*policies, open_ingress], src, collector, "TCP", port)

    assert may_send(pod("router", "10.0.0.1"), 4317)
    assert may_send(pod("engine", "10.0.0.2"), 4317)
    assert not may_send(pod("router", "10.0.0.1"), 4318)
    assert not may_send(pod("health", "10.0.0.3"), 4317)
    off = _spec(None)
    off_policies = [
        m for m in network.render(off, cloud_for(off), place(off)) if m["kind"] == "NetworkPolicy"
    ]
    assert not allowed(
        [
            *off_policies,
            {
                "kind": "NetworkPolicy",
                "metadata": {"namespace": collector.namespace},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]},
            },
        ],
        pod("router", "10.0.0.1"),
        collector,
        "TCP",
        4317,
    )


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ({"enabled": True, "backend": "jaeger"}, "has no endpoint"),
        ({"enabled": True, "endpoint": "tempo:4317"}, "not an OTLP/gRPC endpoint"),
        (
            {"enabled": True, "endpoint": "http://tempo.tracing.svc:4317", "sample_ratio": 2},
            "less than or equal to 1",
        ),
    ],
)
def test_a_tracing_mistake_is_one_clear_error(trace, message):
    with pytest.raises(ValidationError, match=message):
        _spec(trace)
