"""Grafana dashboards: one per model and one for the gateway, from the spec and the engine metric map. Pure.

Each dashboard is a ConfigMap labelled for the Grafana sidecar of kube-prometheus-stack, which loads it
into the ``DASHBOARD_FOLDER`` folder. Panels only show signals the model's engine exports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from components.render import addons, common, scaling, signals
from components.render.common import Manifest
from components.spec import ModelSpec, PlatformSpec
from runtime.engines import Signal

DASHBOARD_FOLDER = "inferstack"
"""Grafana folder the sidecar files the dashboards under."""


@dataclass(frozen=True)
class Panel:
    """A time-series panel: its PromQL targets as (expression, legend) and the unit of its axis."""

    title: str
    targets: tuple[tuple[str, str], ...]
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
    """Traffic, latency, queues, KV cache, prefix cache, replicas and GPU use of one model."""
    ns = signals.namespace_label(spec)
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
    queues = [
        (signals.total(spec, model, s), label)
        for s, label in ((Signal.QUEUED, "waiting"), (Signal.RUNNING, "running"))
        if signals.has(model, s)
    ]
    panels.append(
        Panel("Queued and running requests", (*queues, (scaling.router_queue(spec, model), "router queue")))
    )
    if signals.has(model, Signal.KV_USAGE):
        panels.append(
            Panel(
                "KV cache usage",
                (
                    (signals.average(spec, model, Signal.KV_USAGE), "mean"),
                    (signals.maximum(spec, model, Signal.KV_USAGE), "max"),
                ),
                "percentunit",
            )
        )
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
    """Router traffic, errors, latency, queue, retries, health ejections and the router's own size."""
    ns = signals.namespace_label(spec)
    w = signals.RATE_WINDOW
    return [
        Panel(
            "Requests per second by model",
            ((f"sum by (model) (rate(inferstack_router_requests_total{{{ns}}}[{w}]))", "{{model}}"),),
            "reqps",
        ),
        Panel("5xx ratio by model", ((signals.router_error_ratio(spec, w), "{{model}}"),), "percentunit"),
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
                (signals.health_ejections(spec), "{{model}} ejected"),
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
    """A dashboard's JSON in a ConfigMap the Grafana sidecar picks up."""
    meta = common.metadata(spec, name, "monitoring")
    meta["labels"][addons.GRAFANA_DASHBOARD_LABEL] = "1"
    meta["annotations"] = {"grafana_folder": DASHBOARD_FOLDER}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {f"{name}.json": json.dumps(dashboard, indent=1, sort_keys=True)},
    }


def render(spec: PlatformSpec) -> list[Manifest]:
    """Every dashboard of the stack: each model's, then the gateway's."""
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


def promql(spec: PlatformSpec) -> list[str]:
    """Every panel expression, for the parser check."""
    panels = [p for m in spec.models for p in model_panels(spec, m)] + gateway_panels(spec)
    return [expr for p in panels for expr, _ in p.targets]
