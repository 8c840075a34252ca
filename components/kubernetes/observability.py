"""ServiceMonitors, alerts and dashboards: a thin component over ``components.render.observability``."""

from __future__ import annotations

import pulumi

from components.kubernetes.manifests import apply
from components.render import observability
from components.spec import PlatformSpec


class Observability(pulumi.ComponentResource):
    """Scrape targets, the PrometheusRule and the Grafana dashboards of one platform."""

    def __init__(self, spec: PlatformSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("inferstack:kubernetes:Observability", f"{spec.name}-{spec.environment}", None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.manifests = observability.render(spec)
        self.resources = [apply(m, child) for m in self.manifests]
        self.register_outputs({"objects": len(self.manifests)})
