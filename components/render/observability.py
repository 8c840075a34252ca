"""ServiceMonitors, PrometheusRule alerts and Grafana dashboards, from the spec and the engine metric map. Pure.

Alert thresholds come from the spec: queue backlog is the scaling queue target held while scaling could
not relieve it, TTFT and inter-token alerts are the model's SLO, "pinned at max" is the model's own HPA.
Dashboards are ConfigMaps labelled for the Grafana sidecar of kube-prometheus-stack.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from components.render import addons, common, scaling, signals
from components.render.common import Manifest
from components.render.gateway import parts
from components.spec import ModelSpec, PlatformSpec
from runtime.engines import Signal, facts

KV_CACHE_ALERT_RATIO = 0.9
"""KV cache usage beyond which a replica preempts or rejects work (alert, not a scaling target)."""
ROUTER_5XX_RATIO = 0.05
"""Share of router responses that may be 5xx before paging."""
# Multi-window burn alerts on the p95 objective: (short, long, severity, for).
BURN_WINDOWS = (("5m", "1h", "critical", "2m"), ("30m", "6h", "warning", "15m"))
DASHBOARD_FOLDER = "inferstack"
RUNTIME_METRICS_PATH = "/metrics"


def _ns(spec: PlatformSpec) -> str:
    return f'namespace="{spec.cluster.namespace}"'


# Scrape targets -------------------------------------------------------------------------------------


def engine_service_monitor(spec: PlatformSpec, model: ModelSpec) -> Manifest:
    name = common.engine_name(model.name)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": common.metadata(spec, name, "monitoring"),
        "spec": {
            "selector": {"matchLabels": common.engine_selector(spec, model.name)},
            "namespaceSelector": {"matchNames": [spec.cluster.namespace]},
            "endpoints": [
                {
                    "port": "http",
                    "path": facts(model.engine.kind).metrics_path,
                    "interval": signals.SCRAPE_INTERVAL,
                    "scheme": "http",
                }
            ],
        },
    }


def runtime_service_monitor(spec: PlatformSpec) -> Manifest:
    name = common.runtime_name(spec, "runtime")
    instance = common.labels(spec, name, "monitoring")["app.kubernetes.io/instance"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": common.metadata(spec, name, "monitoring"),
        "spec": {
            "selector": {
                "matchLabels": {"app.kubernetes.io/instance": instance},
                "matchExpressions": [
                    {"key": "app.kubernetes.io/component", "operator": "In", "values": parts(spec)}
                ],
            },
            "namespaceSelector": {"matchNames": [spec.cluster.namespace]},
            "endpoints": [
                {
                    "port": "http",
                    "path": RUNTIME_METRICS_PATH,
                    "interval": signals.SCRAPE_INTERVAL,
                    "scheme": "http",
                }
            ],
        },
    }


# Alerts ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    model: str | None = None

    def rule(self) -> Manifest:
        labels = {"severity": self.severity}
        if self.model:
            labels["model"] = self.model
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": labels,
            "annotations": {"summary": self.summary, "description": self.description},
        }


def _up(spec: PlatformSpec, service: str) -> str:
    return f'up{{{_ns(spec)},service="{service}"}}'


def model_alerts(spec: PlatformSpec, model: ModelSpec) -> list[Alert]:
    t = scaling.thresholds(model)
    engine = common.engine_name(model.name)
    n = model.name
    out = [
        Alert(
            "InferenceEngineDown",
            f"{_up(spec, engine)} == 0",
            "5m",
            "critical",
            f"{n}: an engine replica does not answer /metrics",
            "A replica of {{ $labels.service }} ({{ $labels.pod }}) has been unreachable for 5 minutes.",
            n,
        ),
    ]
    if t.min_replicas > 0:
        out.append(
            Alert(
                "InferenceEngineReplicasBelowMin",
                f"(sum({_up(spec, engine)}) or on() vector(0)) < {t.min_replicas}",
                "10m",
                "critical",
                f"{n}: fewer than {t.min_replicas} replicas up",
                f"{n} should run at least {t.min_replicas} replicas; {{{{ $value }}}} are up.",
                n,
            )
        )
    out.append(
        Alert(
            "InferenceQueueBacklog",
            f"{signals.total(spec, model, Signal.QUEUED)} / clamp_min(sum({_up(spec, engine)}), 1)"
            f" > {t.queue_per_replica:g}",
            "10m",
            "warning",
            f"{n}: requests are queueing in the engines",
            f"More than {t.queue_per_replica:g} requests per replica have waited for 10 minutes "
            "(the scale-up target): scaling is not relieving the load.",
            n,
        )
    )
    out.append(
        Alert(
            "InferenceKVCacheNearlyFull",
            f"{signals.maximum(spec, model, Signal.KV_USAGE)} > {KV_CACHE_ALERT_RATIO:g}",
            "10m",
            "warning",
            f"{n}: KV cache above {KV_CACHE_ALERT_RATIO:.0%}",
            "An engine's KV cache is nearly full: requests are preempted or wait for blocks.",
            n,
        )
    )
    slo_s = model.slo.ttft_p95_ms / 1000
    if signals.has(model, Signal.TTFT):
        for short, long, severity, for_ in BURN_WINDOWS:
            q_short = signals.quantile(spec, model, Signal.TTFT, 0.95, short)
            q_long = signals.quantile(spec, model, Signal.TTFT, 0.95, long)
            out.append(
                Alert(
                    f"InferenceTTFTSLOBurn{short.upper()}",
                    f"({q_short}) > {slo_s:g} and ({q_long}) > {slo_s:g}",
                    for_,
                    severity,
                    f"{n}: TTFT p95 above the {model.slo.ttft_p95_ms} ms objective",
                    f"TTFT p95 has exceeded {model.slo.ttft_p95_ms} ms over both {short} and {long}.",
                    n,
                )
            )
    if signals.has(model, Signal.INTER_TOKEN):
        itl_s = model.slo.inter_token_p95_ms / 1000
        out.append(
            Alert(
                "InferenceInterTokenSLO",
                f"({signals.quantile(spec, model, Signal.INTER_TOKEN, 0.95, '30m')}) > {itl_s:g}",
                "15m",
                "warning",
                f"{n}: inter-token p95 above the {model.slo.inter_token_p95_ms} ms objective",
                f"Streamed tokens are slower than {model.slo.inter_token_p95_ms} ms apart at p95 over 30m.",
                n,
            )
        )
    if scaling.scales(model):
        hpa = f'{_ns(spec)},horizontalpodautoscaler="{scaling.hpa_name(spec, model)}"'
        out.append(
            Alert(
                "InferenceScalingPinnedAtMax",
                f"kube_horizontalpodautoscaler_status_current_replicas{{{hpa}}}"
                f" >= kube_horizontalpodautoscaler_spec_max_replicas{{{hpa}}}",
                "30m",
                "warning",
                f"{n}: at max_replicas ({t.max_replicas}) for 30 minutes",
                "Demand exceeds what the stack allows; raise scaling.max_replicas or add capacity.",
                n,
            )
        )
    return out


def gateway_alerts(spec: PlatformSpec) -> list[Alert]:
    ns = _ns(spec)
    requests = f"inferstack_router_requests_total{{{ns}}}"
    errors = f'inferstack_router_requests_total{{{ns},status=~"5.."}}'
    return [
        Alert(
            "InferenceRouterDown",
            f"(sum({_up(spec, common.runtime_name(spec, common.ROUTER))}) or on() vector(0)) == 0",
            "5m",
            "critical",
            "No router replica is up",
            "Every request to the platform fails: no router answers /metrics.",
        ),
        Alert(
            "InferenceRouter5xxRate",
            f"sum by (model) (rate({errors}[5m])) / clamp_min(sum by (model) (rate({requests}[5m])), 1e-9)"
            f" > {ROUTER_5XX_RATIO:g}",
            "5m",
            "critical",
            "Router 5xx rate above {{ $value | humanizePercentage }} for {{ $labels.model }}",
            f"More than {ROUTER_5XX_RATIO:.0%} of responses for a model are server errors.",
        ),
        Alert(
            "InferenceHealthEjections",
            f"sum by (model) (increase(inferstack_health_ejections_total{{{ns}}}[15m])) > 0",
            "0m",
            "warning",
            "The health monitor ejected replicas of {{ $labels.model }}",
            "{{ $value }} replicas were taken out of rotation in the last 15 minutes.",
        ),
    ]


def alerts(spec: PlatformSpec) -> list[Alert]:
    return [a for m in spec.models for a in model_alerts(spec, m)] + gateway_alerts(spec)


def prometheus_rule(spec: PlatformSpec) -> Manifest:
    groups = [
        {"name": f"inferstack-{m.name}", "rules": [a.rule() for a in model_alerts(spec, m)]}
        for m in spec.models
    ]
    groups.append({"name": "inferstack-gateway", "rules": [a.rule() for a in gateway_alerts(spec)]})
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": common.metadata(spec, f"{spec.name}-alerts", "monitoring"),
        "spec": {"groups": groups},
    }


# Dashboards -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[tuple[str, str], ...]  # (expr, legend)
    unit: str = "short"


def _panel(panel: Panel, index: int) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {"expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
            for i, (expr, legend) in enumerate(panel.targets)
        ],
    }


def _dashboard(uid: str, title: str, panels: list[Panel]) -> dict[str, Any]:
    return {
        "uid": uid[:40],
        "title": title,
        "tags": ["inferstack"],
        "schemaVersion": 39,
        "editable": False,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"}
            ]
        },
        "panels": [_panel(p, i) for i, p in enumerate(panels)],
    }


def model_panels(spec: PlatformSpec, model: ModelSpec) -> list[Panel]:
    ns = _ns(spec)
    engine = common.engine_name(model.name)
    router_sel = f'{ns},model="{model.name}"'
    panels = [
        Panel(
            "Requests per second (router)",
            (
                (
                    f"sum by (status) (rate(inferstack_router_requests_total{{{router_sel}}}[{signals.RATE_WINDOW}]))",
                    "{{status}}",
                ),
            ),
            "reqps",
        ),
    ]
    for signal, title in ((Signal.TTFT, "Time to first token"), (Signal.INTER_TOKEN, "Inter-token latency")):
        if signals.has(model, signal):
            panels.append(
                Panel(
                    title,
                    tuple(
                        (signals.quantile(spec, model, signal, q), f"p{int(q * 100)}") for q in (0.5, 0.95)
                    ),
                    "s",
                )
            )
    panels += [
        Panel(
            "Queued and running requests",
            (
                (signals.total(spec, model, Signal.QUEUED), "waiting"),
                (signals.total(spec, model, Signal.RUNNING), "running"),
                (scaling.router_queue(spec, model), "router queue"),
            ),
        ),
        Panel(
            "KV cache usage",
            (
                (signals.average(spec, model, Signal.KV_USAGE), "mean"),
                (signals.maximum(spec, model, Signal.KV_USAGE), "max"),
            ),
            "percentunit",
        ),
    ]
    hit = signals.prefix_hit_rate(spec, model)
    if hit is not None:
        panels.append(Panel("Prefix cache hit rate", ((hit, "hit rate"),), "percentunit"))
    deployment = f'{ns},deployment="{engine}"'
    panels.append(
        Panel(
            "Replicas",
            (
                (f"sum(kube_deployment_status_replicas_available{{{deployment}}})", "available"),
                (f"sum(kube_deployment_spec_replicas{{{deployment}}})", "desired"),
            ),
        )
    )
    if model.engine.gpus:
        panels.append(
            Panel(
                "GPU utilisation (DCGM)",
                ((f'avg by (pod) (DCGM_FI_DEV_GPU_UTIL{{{ns},pod=~"{engine}-.*"}})', "{{pod}}"),),
                "percent",
            )
        )
    return panels


def gateway_panels(spec: PlatformSpec) -> list[Panel]:
    ns = _ns(spec)
    w = signals.RATE_WINDOW
    return [
        Panel(
            "Requests per second by model",
            ((f"sum by (model) (rate(inferstack_router_requests_total{{{ns}}}[{w}]))", "{{model}}"),),
            "reqps",
        ),
        Panel(
            "5xx ratio by model",
            (
                (
                    f'sum by (model) (rate(inferstack_router_requests_total{{{ns},status=~"5.."}}[{w}]))'
                    f" / clamp_min(sum by (model) (rate(inferstack_router_requests_total{{{ns}}}[{w}])), 1e-9)",
                    "{{model}}",
                ),
            ),
            "percentunit",
        ),
        Panel(
            "Router latency p95",
            (
                (
                    f"histogram_quantile(0.95, sum by (le, model) "
                    f"(rate(inferstack_router_request_duration_seconds_bucket{{{ns}}}[{w}])))",
                    "{{model}} total",
                ),
                (
                    f"histogram_quantile(0.95, sum by (le, model) (rate(inferstack_router_ttft_seconds_bucket{{{ns}}}[{w}])))",
                    "{{model}} first byte",
                ),
            ),
            "s",
        ),
        Panel(
            "Router queue",
            (
                (f"sum by (model) (inferstack_router_queue_depth{{{ns}}})", "{{model}} waiting"),
                (
                    f"histogram_quantile(0.95, sum by (le, model) "
                    f"(rate(inferstack_router_queue_wait_seconds_bucket{{{ns}}}[{w}])))",
                    "{{model}} wait p95",
                ),
            ),
        ),
        Panel(
            "Retries and rejections",
            (
                (f"sum by (reason) (rate(inferstack_router_retries_total{{{ns}}}[{w}]))", "retry {{reason}}"),
                (
                    f"sum by (reason) (rate(inferstack_router_rejections_total{{{ns}}}[{w}]))",
                    "reject {{reason}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Healthy replicas and ejections",
            (
                (f"sum by (model) (inferstack_router_backend_healthy{{{ns}}})", "{{model}} healthy"),
                (
                    f"sum by (model) (increase(inferstack_health_ejections_total{{{ns}}}[15m]))",
                    "{{model}} ejected",
                ),
            ),
        ),
        Panel(
            "Router replicas and CPU",
            (
                (
                    f'sum(kube_deployment_status_replicas_available{{{ns},deployment="{common.runtime_name(spec, common.ROUTER)}"}})',
                    "replicas",
                ),
                (
                    f'sum(rate(container_cpu_usage_seconds_total{{{ns},container="{common.ROUTER}"}}[{w}]))',
                    "CPU cores",
                ),
            ),
        ),
    ]


def dashboard_config_map(spec: PlatformSpec, name: str, dashboard: dict[str, Any]) -> Manifest:
    meta = common.metadata(spec, name, "monitoring")
    meta["labels"][addons.GRAFANA_DASHBOARD_LABEL] = "1"
    meta["annotations"] = {"grafana_folder": DASHBOARD_FOLDER}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {f"{name}.json": json.dumps(dashboard, indent=1, sort_keys=True)},
    }


def dashboards(spec: PlatformSpec) -> list[Manifest]:
    env = f"{spec.name}-{spec.environment}"
    out = [
        dashboard_config_map(
            spec,
            f"{spec.name}-dashboard-{m.name}",
            _dashboard(f"{env}-{m.name}", f"{env} / model {m.name}", model_panels(spec, m)),
        )
        for m in spec.models
    ]
    out.append(
        dashboard_config_map(
            spec,
            f"{spec.name}-dashboard-gateway",
            _dashboard(f"{env}-gateway", f"{env} / gateway", gateway_panels(spec)),
        )
    )
    return out


def render(spec: PlatformSpec) -> list[Manifest]:
    o = spec.observability
    out: list[Manifest] = []
    if o.prometheus:
        out += [engine_service_monitor(spec, m) for m in spec.models]
        out.append(runtime_service_monitor(spec))
        if o.alerts:
            out.append(prometheus_rule(spec))
    if o.grafana_dashboards:
        out += dashboards(spec)
    return out


def promql(spec: PlatformSpec) -> list[str]:
    """Every PromQL expression of the alerts and dashboards, for the parser check."""
    exprs = [a.expr for a in alerts(spec)]
    for m in spec.models:
        exprs += [e for p in model_panels(spec, m) for e, _ in p.targets]
    exprs += [e for p in gateway_panels(spec) for e, _ in p.targets]
    return exprs
