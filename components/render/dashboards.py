"""Grafana dashboards: one per model and one for the gateway, from the spec and the engine metric map. Pure.

Built with Grafana's own Python SDK (``grafana-foundation-sdk``, its Grafana 11.6 schema), not hand-written
JSON. Each dashboard is a ConfigMap labelled for the Grafana sidecar of kube-prometheus-stack, which loads it
into the ``DASHBOARD_FOLDER`` folder. Panels only show signals the model's engine exports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as grafana
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

from components.core.decisions import ModelDecisions
from components.render import addons, common, scaling, signals
from components.render.common import Manifest
from components.spec import PlatformSpec
from runtime.engines import Signal

DASHBOARD_FOLDER = "inferstack"
"""Grafana folder the sidecar files the dashboards under."""
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
"""Every panel queries the Prometheus the dashboard's ``datasource`` variable picks."""


@dataclass(frozen=True)
class Panel:
    """A time-series panel: its PromQL targets as (expression, legend) and the unit of its axis.

    ``cluster_only``: it reads exporters that only a cluster runs (kube-state-metrics, cAdvisor, DCGM), so
    ``make local MONITOR=1`` cannot show it (the live check says which panels it skips)."""

    title: str
    targets: tuple[tuple[str, str], ...]
    unit: str = "short"
    cluster_only: bool = False


def _panel(panel: Panel, index: int) -> timeseries.Panel:
    built = (
        timeseries.Panel()
        .id(index + 1)
        .title(panel.title)
        .datasource(DATASOURCE)
        .grid_pos(GridPos(h=8, w=12, x=12 * (index % 2), y=8 * (index // 2)))
        .unit(panel.unit)
    )
    for i, (expr, legend) in enumerate(panel.targets):
        built.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)))
    return built


def _dashboard(uid: str, title: str, panels: list[Panel]) -> dict[str, Any]:
    """The dashboard model, as the JSON Grafana loads."""
    board = (
        grafana.Dashboard(title)
        .uid(uid[:40])
        .tags(["inferstack"])
        .readonly()
        .time("now-6h", "now")
        .refresh("30s")
        .with_variable(grafana.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for i, panel in enumerate(panels):
        board.with_panel(_panel(panel, i))
    doc: dict[str, Any] = json.loads(JSONEncoder().encode(board.build()))
    return doc


def model_panels(spec: PlatformSpec, unit: ModelDecisions) -> list[Panel]:
    """Traffic, latency, queues, KV cache, prefix cache, replicas and GPU use of one model (a serving unit)."""
    model = unit.model
    ns = signals.namespace_label(spec)
    engine = common.engine_name(model.name)
    router_sel = f'{ns},model="{model.name}"'
    front = signals.front(spec)
    panels = [
        Panel(
            f"Requests per second ({front})",
            (
                (
                    f"sum by (status) (rate({signals.front_metric(spec, 'requests_total')}{{{router_sel}}}"
                    f"[{signals.RATE_WINDOW}]))",
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
    if front == common.ROUTER:  # the picker holds no request: no queue of its own
        queues.append((scaling.router_queue(spec, model), "router queue"))
    if queues:
        panels.append(Panel("Queued and running requests", tuple(queues)))
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
    if model.scaling.sleep_after_idle_s is not None:
        # sleep as a warm state: how many replicas sleep, and how long a waking one kept its request waiting
        panels.append(
            Panel(
                "Sleeping replicas and wake time",
                (
                    (f"max(inferstack_router_backends_asleep{{{router_sel}}})", "asleep"),
                    (
                        f"histogram_quantile(0.95, sum by (le) (rate(inferstack_router_wake_seconds_bucket"
                        f"{{{router_sel}}}[{signals.RATE_WINDOW}])))",
                        "wake p95 (s)",
                    ),
                ),
            )
        )
    available, desired = signals.workload_replicas(spec, unit)
    panels.append(
        Panel(
            "Replicas",
            ((available, "available"), (desired, "desired")),
            cluster_only=True,
        )
    )
    if model.engine.gpus:
        panels.append(
            Panel(
                "GPU utilisation (DCGM)",
                ((f'avg by (pod) (DCGM_FI_DEV_GPU_UTIL{{{ns},pod=~"{engine}-.*"}})', "{{pod}}"),),
                "percent",
                cluster_only=True,
            )
        )
    return panels


def gateway_panels(spec: PlatformSpec) -> list[Panel]:
    """Traffic, errors, latency, refusals and health ejections through the part that routes, and its own
    size: the router (with its queue and retries), or behind an inference-extension gateway the endpoint
    picker (which holds and retries nothing; its own time is the pick's)."""
    ns = signals.namespace_label(spec)
    w = signals.RATE_WINDOW
    front = signals.front(spec)
    title = front.capitalize()

    def metric(name: str) -> str:
        return signals.front_metric(spec, name)

    latency = [
        (
            f"histogram_quantile(0.95, sum by (le, model) (rate({metric('request_duration_seconds_bucket')}{{{ns}}}[{w}])))",
            "{{model}} total",
        )
    ]
    refusals = [(f"sum by (reason) (rate({metric('rejections_total')}{{{ns}}}[{w}]))", "reject {{reason}}")]
    if front == common.ROUTER:
        latency.append(
            (
                f"histogram_quantile(0.95, sum by (le, model) (rate(inferstack_router_ttft_seconds_bucket{{{ns}}}[{w}])))",
                "{{model}} first byte",
            )
        )
        refusals.insert(
            0, (f"sum by (reason) (rate(inferstack_router_retries_total{{{ns}}}[{w}]))", "retry {{reason}}")
        )
    else:
        latency.append(
            (
                f"histogram_quantile(0.95, sum by (le, model) (rate({metric('decision_seconds_bucket')}{{{ns}}}[{w}])))",
                "{{model}} pick",
            )
        )
    out = [
        Panel(
            "Requests per second by model",
            ((f"sum by (model) (rate({metric('requests_total')}{{{ns}}}[{w}]))", "{{model}}"),),
            "reqps",
        ),
        Panel("5xx ratio by model", ((signals.router_error_ratio(spec, w), "{{model}}"),), "percentunit"),
        Panel(f"{title} latency p95", tuple(latency), "s"),
    ]
    if front == common.ROUTER:
        out.append(
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
            )
        )
    out += [
        Panel(
            "Retries and rejections" if front == common.ROUTER else "Rejections",
            tuple(refusals),
            "reqps",
        ),
        Panel(
            "Healthy replicas and ejections",
            (
                (f"sum by (model) ({metric('backend_healthy')}{{{ns}}})", "{{model}} healthy"),
                (signals.health_ejections(spec), "{{model}} ejected"),
            ),
        ),
        Panel(
            f"{title} replicas and CPU",
            (
                (
                    f'sum(kube_deployment_status_replicas_available{{{ns},deployment="{common.runtime_name(spec, front)}"}})',
                    "replicas",
                ),
                (
                    f'sum(rate(container_cpu_usage_seconds_total{{{ns},container="{front}"}}[{w}]))',
                    "CPU cores",
                ),
            ),
            cluster_only=True,
        ),
    ]
    return out


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


def render(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[Manifest]:
    """Every dashboard of the stack: each model's (``units``: their decisions), then the gateway's."""
    env = f"{spec.name}-{spec.environment}"
    out = [
        dashboard_config_map(
            spec,
            f"{spec.name}-dashboard-{m.name}",
            _dashboard(f"{env}-{m.name}", f"{env} / model {m.name}", model_panels(spec, units[m.name])),
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


def panels(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[Panel]:
    """Every panel of every dashboard of the stack."""
    return [p for m in spec.models for p in model_panels(spec, units[m.name])] + gateway_panels(spec)


def promql(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[str]:
    """Every panel expression, for the parser check."""
    return [expr for p in panels(spec, units) for expr, _ in p.targets]
