"""One model's engine on Kubernetes: a thin component over ``components.render.engine``."""

from __future__ import annotations

import pulumi

from components.kubernetes.manifests import apply
from components.placement import Placement
from components.render import common, engine
from components.spec import ModelSpec, PlatformSpec


class ModelEngine(pulumi.ComponentResource):
    """The Deployment and Service (and engine ConfigMap) serving one model."""

    service_name: str

    def __init__(
        self,
        spec: PlatformSpec,
        model: ModelSpec,
        placement: Placement,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("inferstack:kubernetes:ModelEngine", model.name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.manifests = engine.render(spec, model, placement)
        self.resources = [apply(m, child) for m in self.manifests]
        self.service_name = common.engine_name(model.name)
        self.register_outputs({"service": self.service_name})
