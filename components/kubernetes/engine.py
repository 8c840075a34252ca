"""One model's engine on Kubernetes: a thin component over ``components.render.engine``."""

from __future__ import annotations

import pulumi

from components.kubernetes.manifests import apply
from components.placement import Placement, PoolPlan
from components.render import common, engine, groups
from components.rollout import Rollout
from components.spec import ModelSpec, PlatformSpec

_AWAITED = frozenset({"Deployment", groups.KIND})
"""The workloads `pulumi up` waits for (a LeaderWorkerSet is a custom resource: Pulumi waits for it to exist)."""


class ModelEngine(pulumi.ComponentResource):
    """The Deployment and Service (and engine ConfigMap) serving one model.

    `pulumi up` waits for the Deployment as long as its replicas may take: one startup budget when it is created
    (replicas start together), every round of a rolling update when it changes (``Rollout.update_timeout_s``).
    """

    service_name: str

    def __init__(
        self,
        spec: PlatformSpec,
        model: ModelSpec,
        placement: Placement,
        rollout: Rollout,
        opts: pulumi.ResourceOptions | None = None,
        pool: PoolPlan | None = None,
        after: list[pulumi.Resource] | None = None,
    ) -> None:
        """``after``: what the engine's own objects wait for (the preparation Job that writes what it loads)."""
        super().__init__("inferstack:kubernetes:ModelEngine", model.name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=after)
        awaited = pulumi.ResourceOptions(
            parent=self,
            depends_on=after,
            custom_timeouts=pulumi.CustomTimeouts(
                create=f"{rollout.startup.budget_s}s", update=f"{rollout.update_timeout_s}s"
            ),
        )
        self.manifests = engine.render(spec, model, placement, rollout, pool)
        self.resources = [apply(m, awaited if m["kind"] in _AWAITED else child) for m in self.manifests]
        self.service_name = common.engine_name(model.name)
        self.register_outputs({"service": self.service_name})
