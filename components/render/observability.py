"""What the stack renders to watch itself, chosen by ``spec.observability``. Pure.

The objects come from one module each: ``monitors`` (ServiceMonitors), ``alerts`` (the PrometheusRule),
``dashboards`` (Grafana ConfigMaps). This module only decides which of them a stack gets.
"""

from __future__ import annotations

from collections.abc import Mapping

from components.core.decisions import ModelDecisions
from components.render import alerts, dashboards, monitors
from components.render.common import Manifest
from components.spec import PlatformSpec


def render(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[Manifest]:
    """Scrape targets and alerts need the Prometheus operator; dashboards need only Grafana's sidecar. ``units``:
    the serving units' decisions (the alerts' thresholds, the dashboards' workloads)."""
    o = spec.observability
    out: list[Manifest] = []
    if o.prometheus:
        out += monitors.render(spec)
        if o.alerts:
            out.append(alerts.prometheus_rule(spec, units))
    if o.grafana_dashboards:
        out += dashboards.render(spec, units)
    return out


def promql(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[str]:
    """Every PromQL expression of the alerts and dashboards, for the parser check."""
    return alerts.promql(spec, units) + dashboards.promql(spec, units)
