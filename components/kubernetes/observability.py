"""ServiceMonitors, alerts and dashboards: a thin component over ``components.render.observability``."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi

from components.core.decisions import ModelDecisions
from components.kubernetes.manifests import apply
from components.render import observability
from components.spec import PlatformSpec


class Observability(pulumi.ComponentResource):
    """Scrape targets, the PrometheusRule and the Grafana dashboards of one platform."""

    def __init__(
        self,
        spec: PlatformSpec,
        units: Mapping[str, ModelDecisions],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``units``: the serving units' decisions."""
        super().__init__("inferstack:kubernetes:Observability", f"{spec.name}-{spec.environment}", None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.manifests = observability.render(spec, units)
        self.resources = [apply(m, child) for m in self.manifests]
        self.register_outputs({"objects": len(self.manifests)})
