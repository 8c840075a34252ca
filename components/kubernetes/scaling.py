"""One model's scaler and disruption budget: a thin component over ``components.render.scaling``."""

from __future__ import annotations

import pulumi

from components.core.decisions import ModelDecisions
from components.kubernetes.manifests import apply
from components.render import common, hardening, scaling
from components.spec import PlatformSpec


def render(spec: PlatformSpec, unit: ModelDecisions) -> list[common.Manifest]:
    """The scaler and a disruption budget of one pod at a time: in a multi-node group, one pod down is its whole
    group down (it restarts together), so the budget still allows one replica."""
    name = common.engine_name(unit.model.name)
    budget = hardening.pdb(spec, name, "engine", common.engine_selector(spec, unit.model.name))
    return [*scaling.render(spec, unit), budget]


class ModelScaling(pulumi.ComponentResource):
    """The ScaledObject (keda) or HPA (hpa) of one model's engines (a serving unit, from its decisions), and their
    PodDisruptionBudget."""

    def __init__(
        self, spec: PlatformSpec, unit: ModelDecisions, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("inferstack:kubernetes:ModelScaling", unit.model.name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.manifests = render(spec, unit)
        self.resources = [apply(m, child) for m in self.manifests]
        self.register_outputs({"thresholds": unit.scaling.__dict__})
