"""One model's engine on Kubernetes, and the model store's preparation Jobs: thin components over
``components.render.engine`` and ``components.render.weights``."""

from __future__ import annotations

from typing import Any

import pulumi

from components.kubernetes.manifests import apply
from components.placement import Layout, Placement, PoolPlan
from components.render import common, engine, groups, weights
from components.render.gateway import RuntimeImage
from components.rollout import Rollout
from components.spec import ModelSpec, PlatformSpec

_AWAITED = frozenset({"Deployment", groups.KIND})
"""The workloads `pulumi up` waits for (a LeaderWorkerSet is a custom resource: Pulumi waits for it to exist)."""


class ModelWeights(pulumi.ComponentResource):
    """The preparation Jobs' service account and one Job per model and per LoRA adapter; ``jobs[model]`` are
    what its engine waits for."""

    jobs: dict[str, list[pulumi.Resource]]

    def __init__(
        self,
        spec: PlatformSpec,
        layout: Layout,
        image: RuntimeImage | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("inferstack:kubernetes:ModelWeights", f"{spec.name}-weights", None, opts)
        self.image: Any = image.reference if image is not None else spec.model_store.image
        account = apply(weights.service_account(spec), pulumi.ResourceOptions(parent=self))
        self.jobs = {}
        for m in spec.models:
            placement = layout.placements[m.name]
            # `pulumi up` waits for the Job to complete, as long as the Job itself may run.
            deadline = f"{weights.job_deadline_s(placement)}s"
            awaited = pulumi.ResourceOptions(
                parent=self,
                depends_on=[account],
                custom_timeouts=pulumi.CustomTimeouts(create=deadline, update=deadline),
            )
            self.jobs[m.name] = [
                apply(weights.prepare_job(spec, m, placement, self.image), awaited),
                *(apply(weights.adapter_job(spec, m, a, self.image), awaited) for a in m.adapters),
            ]
        names = [weights.job_name(spec, m) for m in spec.models]
        names += [weights.adapter_job_name(spec, m, a) for m in spec.models for a in m.adapters]
        self.register_outputs({"jobs": sorted(names)})


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
        weights_image: Any = None,
    ) -> None:
        super().__init__("inferstack:kubernetes:ModelEngine", model.name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        awaited = pulumi.ResourceOptions(
            parent=self,
            custom_timeouts=pulumi.CustomTimeouts(
                create=f"{rollout.startup.budget_s}s", update=f"{rollout.update_timeout_s}s"
            ),
        )
        self.manifests = engine.render(spec, model, placement, rollout, pool, weights_image)
        self.resources = [apply(m, awaited if m["kind"] in _AWAITED else child) for m in self.manifests]
        self.service_name = common.engine_name(model.name)
        self.register_outputs({"service": self.service_name})
