"""What the stack renders to watch itself, chosen by ``spec.observability``. Pure.

The objects come from one module each: ``monitors`` (ServiceMonitors), ``alerts`` (the PrometheusRule),
``dashboards`` (Grafana ConfigMaps). This module only decides which of them a stack gets.
"""

from __future__ import annotations

from components.render import alerts, dashboards, monitors
from components.render.common import Manifest
from components.spec import PlatformSpec


def render(spec: PlatformSpec) -> list[Manifest]:
    """Scrape targets and alerts need the Prometheus operator; dashboards need only Grafana's sidecar."""
    o = spec.observability
    out: list[Manifest] = []
    if o.prometheus:
        out += monitors.render(spec)
        if o.alerts:
            out.append(alerts.prometheus_rule(spec))
    if o.grafana_dashboards:
        out += dashboards.render(spec)
    return out


def promql(spec: PlatformSpec) -> list[str]:
    """Every PromQL expression of the alerts and dashboards, for the parser check."""
    return alerts.promql(spec) + dashboards.promql(spec)
