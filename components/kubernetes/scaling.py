"""One model's scaler and disruption budget: a thin component over ``components.render.scaling``."""

from __future__ import annotations

import pulumi

from components.core.scaling import thresholds
from components.kubernetes.manifests import apply
from components.render import common, hardening, scaling
from components.spec import ModelSpec, PlatformSpec


def render(spec: PlatformSpec, model: ModelSpec, multi_node: bool = False) -> list[common.Manifest]:
    """The scaler and a disruption budget of one pod at a time: in a multi-node group, one pod down is its whole
    group down (it restarts together), so the budget still allows one replica."""
    name = common.engine_name(model.name)
    budget = hardening.pdb(spec, name, "engine", common.engine_selector(spec, model.name))
    return [*scaling.render(spec, model, multi_node), budget]


class ModelScaling(pulumi.ComponentResource):
    """The ScaledObject (keda) or HPA (hpa) of one model's engines, and their PodDisruptionBudget."""

    def __init__(
        self,
        spec: PlatformSpec,
        model: ModelSpec,
        opts: pulumi.ResourceOptions | None = None,
        multi_node: bool = False,
    ) -> None:
        super().__init__("inferstack:kubernetes:ModelScaling", model.name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.manifests = render(spec, model, multi_node)
        self.resources = [apply(m, child) for m in self.manifests]
        self.register_outputs({"thresholds": thresholds(model).__dict__})
