"""One model's engine on Kubernetes, and the model store's preparation Jobs: thin components over
``components.render.engine`` and ``components.render.weights``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pulumi

from components.core.decisions import ModelDecisions
from components.core.lifecycle import Preparation
from components.core.placement import Layout
from components.kubernetes.manifests import apply
from components.render import common, engine, groups, preparation, weights
from components.render.gateway import RuntimeImage
from components.spec import PlatformSpec

_AWAITED = frozenset({"Deployment", groups.KIND})
"""The workloads `pulumi up` waits for (a LeaderWorkerSet is a custom resource: Pulumi waits for it to exist)."""


def engine_wait(unit: ModelDecisions) -> pulumi.CustomTimeouts:
    """How long `pulumi up` waits for a unit's engine workload: one startup budget when it is created (replicas
    start together), every round of a rolling update when it changes (``Rollout.update_timeout_s``)."""
    rollout = unit.rollout
    return pulumi.CustomTimeouts(create=f"{rollout.startup.budget_s}s", update=f"{rollout.update_timeout_s}s")


def wait_behind(units: Iterable[ModelDecisions]) -> pulumi.CustomTimeouts | None:
    """How long `pulumi up` waits for a workload that is ready only once every one of ``units`` serves (the
    batcher): the longest of their startup budgets, created or changed (it is applied after their engines, so a
    change of its own waits for their replicas at most once). None for no units: the provider's default
    (10 minutes, ``DefaultDeploymentTimeoutMins`` in pulumi-kubernetes provider/pkg/await/deployment.go)."""
    budgets = [u.rollout.startup.budget_s for u in units]
    if not budgets:
        return None
    longest = f"{max(budgets)}s"
    return pulumi.CustomTimeouts(create=longest, update=longest)


class ModelWeights(pulumi.ComponentResource):
    """The preparation Jobs' service account and the Jobs that fill the model store: one per source (model,
    version or LoRA adapter) that copies it in, and for a version with a preparation the Job that makes its
    checkpoint from that copy; ``jobs[unit]`` are what its engine waits for. A Job shared by several units (two
    versions of one source) is one Job."""

    jobs: dict[str, list[pulumi.Resource]]

    def __init__(
        self,
        spec: PlatformSpec,
        layout: Layout,
        image: RuntimeImage | None,
        opts: pulumi.ResourceOptions | None = None,
        preparations: Sequence[Preparation] = (),
    ) -> None:
        super().__init__("inferstack:kubernetes:ModelWeights", f"{spec.name}-weights", None, opts)
        self.image: Any = image.reference if image is not None else spec.model_store.image
        account = apply(weights.service_account(spec), pulumi.ResourceOptions(parent=self))
        made: dict[str, pulumi.Resource] = {}

        def once(manifest: common.Manifest, deadline_s: int, after: list[pulumi.Resource]) -> pulumi.Resource:
            name = manifest["metadata"]["name"]
            if name not in made:
                # `pulumi up` waits for the Job to complete, as long as the Job itself may run.
                deadline = f"{deadline_s}s"
                made[name] = apply(
                    manifest,
                    pulumi.ResourceOptions(
                        parent=self,
                        depends_on=[account, *after],
                        custom_timeouts=pulumi.CustomTimeouts(create=deadline, update=deadline),
                    ),
                )
            return made[name]

        prepared = {p.unit: p for p in preparations}
        self.jobs = {}
        for m in spec.models:
            placement = layout.placements[m.name]
            deadline = weights.job_deadline_s(placement)
            adapter_jobs = [
                once(weights.adapter_job(spec, m, a, self.image), deadline, []) for a in m.adapters
            ]
            p = prepared.get(m.name)
            if p is None:
                self.jobs[m.name] = [once(weights.prepare_job(spec, m, placement, self.image), deadline, [])]
            else:
                source = weights.prepare_job(spec, p.origin, placement, self.image, dense=True)
                copied = once(source, deadline, [])
                job = preparation.job(spec, p, m, placement, self.image)
                self.jobs[m.name] = [once(job, preparation.JOB_DEADLINE_S, [copied])]
            self.jobs[m.name] += adapter_jobs
        self.register_outputs({"jobs": sorted(made)})


class ModelEngine(pulumi.ComponentResource):
    """The Deployment and Service (and engine ConfigMap) serving one model (a serving unit, from its decisions).

    `pulumi up` waits for the Deployment as long as its replicas may take: one startup budget when it is created
    (replicas start together), every round of a rolling update when it changes (``Rollout.update_timeout_s``).
    """

    service_name: str

    def __init__(
        self,
        spec: PlatformSpec,
        unit: ModelDecisions,
        opts: pulumi.ResourceOptions | None = None,
        weights_image: Any = None,
        after: list[pulumi.Resource] | None = None,
    ) -> None:
        """``after``: what the engine's own objects wait for (the model store's preparation Jobs that write what
        it loads)."""
        model = unit.model
        super().__init__("inferstack:kubernetes:ModelEngine", model.name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=after)
        awaited = pulumi.ResourceOptions(parent=self, depends_on=after, custom_timeouts=engine_wait(unit))
        self.manifests = engine.render(spec, unit, weights_image)
        self.resources = [apply(m, awaited if m["kind"] in _AWAITED else child) for m in self.manifests]
        self.service_name = common.engine_name(model.name)
        self.register_outputs({"service": self.service_name})
