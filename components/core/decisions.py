"""A stack's decisions, made once: where each model runs, how it gets its weights, how long a cold replica may
take, how it rolls and scales. Pure.

``decide`` makes them once a stack is validated (``components.core.stackfile.Stack.decisions``, when first read;
under `pulumi up`, ``components.deploy.program``), from the spec and the placement ``Layout``, by calling each
decision module of this package once per model. Everything after reads the value: the plan report, the Pulumi program and its components,
the renderers. None of them asks a decision module again, so what the plan shows is what the program deploys.

Decisions are made twice over, once per declared model (``models``: what the plan report shows) and once per
serving unit (``units``: what the renderers see, each version of a model a unit of its own; the same objects when
no model has versions). The stack's bill is not here: its prices and what the target runs besides GPU nodes are
the target profile's, which validation does not need; a loaded stack is priced once, beside its decisions
(``components.core.stackfile.Stack.bill``, by ``components.core.cloud.bill``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from components.core import lifecycle, rollout, scaling, startup
from components.core.lifecycle import Preparation
from components.core.placement import Layout, Placement, PoolPlan
from components.core.rollout import Rollout
from components.core.scaling import Thresholds
from components.core.startup import IdleState, Phase, StartupBudget
from components.core.weights import coldstart
from components.core.weights.coldstart import ColdStart
from components.core.weights.fetch import Fetch
from components.spec import ModelSpec, PlatformSpec


@dataclass(frozen=True)
class ModelDecisions:
    """One model's (or serving unit's) decisions."""

    model: ModelSpec
    placement: Placement
    pool: PoolPlan | None
    """The GPU pool it runs in (None: a CPU engine on the general nodes)."""
    weights_gib: float
    """One replica's weights."""
    cold_starts: tuple[ColdStart, ...]
    """One replica's weights on a fresh node by every fetch path, side by side (the plan's Model weights table)."""
    startup: StartupBudget
    """A cold replica's phases and the budget allowed for them (its weights term is ``fetch``'s cold start)."""
    rollout: Rollout
    """The rolling update: surge into the pool's spare room or replace one at a time, and how long it may take."""
    idle: IdleState
    """What its replicas do when nobody asks, and what coming back costs."""
    scaling: Thresholds
    """When replicas are added and removed (what the scaler and the alerts render)."""

    @property
    def fetch(self) -> Fetch:
        """How its engines get their weights from the model store, with the reason (placement decided it with the
        instance)."""
        return self.placement.fetch

    @property
    def weights_phase(self) -> Phase:
        """The startup budget's weights term: the chosen fetch path's cold start in whole seconds."""
        return next(p for p in self.startup.phases if p.name == "weights")


@dataclass(frozen=True)
class Decisions:
    """Everything decided about one stack."""

    spec: PlatformSpec
    layout: Layout
    """Placement: each model's instance, pool and share, and each pool's plan."""
    models: Mapping[str, ModelDecisions]
    """Per declared model, in stack-file order."""
    served_spec: PlatformSpec
    served_layout: Layout
    """The spec and layout the renderers see: every versioned model replaced by its units."""
    units: Mapping[str, ModelDecisions]
    """Per serving unit, in the served spec's order."""
    preparations: tuple[Preparation, ...]
    """The preparation Jobs the versions need."""
    warnings: tuple[str, ...]
    """Rollouts that drop a model below its minimum, with the pool size that would prevent it; models that span
    nodes over EFA in an image without the EFA userspace (``efa_image_warnings``)."""


NO_EFA_USERSPACE = ("vllm/vllm-openai",)
"""Engine image repositories that ship no EFA userspace (libfabric, the aws-ofi-nccl plugin NCCL needs to use EFA):
vllm-project/vllm issue #55635 (open, September 2026) asks for EFA to work in the vLLM images out of the box, and
the pull request for it (#55783) adds the EFA userspace only to builds with INSTALL_KV_CONNECTORS."""


def efa_image_warnings(spec: PlatformSpec, layout: Layout) -> list[str]:
    """Models that span nodes over EFA in an image without the EFA userspace: NCCL falls back to TCP sockets."""
    out = []
    for model in spec.models:
        placement = layout.placements[model.name]
        pool = layout.pools.get(placement.pool) if placement.pool is not None else None
        image = model.engine.image or ""
        if not (placement.multi_node and pool is not None and pool.efa_interfaces):
            continue
        if image.split(":", 1)[0].split("@", 1)[0] not in NO_EFA_USERSPACE:
            continue
        out.append(
            f"{model.name} spans {placement.nodes} x {pool.instance.name} over EFA, but its image {image} ships no "
            "EFA userspace (libfabric and the aws-ofi-nccl NCCL plugin; vllm-project/vllm#55635): NCCL falls back "
            "to TCP sockets between nodes and the EFA interfaces and huge pages are reserved for nothing. Set "
            "engine.image to an image that ships them (the AWS Deep Learning Containers vLLM image for EC2, or "
            "llm-d's AWS image), at a tag you have checked carries them"
        )
    return out


def _decide_models(spec: PlatformSpec, layout: Layout) -> dict[str, ModelDecisions]:
    out: dict[str, ModelDecisions] = {}
    for model in spec.models:
        placement = layout.placements[model.name]
        gib = startup.weights_gib(model, placement)
        budget = startup.budget(model, placement)
        out[model.name] = ModelDecisions(
            model=model,
            placement=placement,
            pool=layout.pools[placement.pool] if placement.pool is not None else None,
            weights_gib=gib,
            cold_starts=tuple(coldstart.compare(gib, placement.instance, placement.gpus_per_replica)),
            startup=budget,
            rollout=rollout.plan(spec, layout, model, budget),
            idle=startup.idle_state(model, placement, budget),
            scaling=scaling.thresholds(model),
        )
    return out


def decide(spec: PlatformSpec, layout: Layout) -> Decisions:
    """Every decision about a validated spec and its layout, each made once."""
    models = _decide_models(spec, layout)
    served_spec, served_layout = lifecycle.expand(spec, layout)
    units = models if served_spec is spec else _decide_models(served_spec, served_layout)
    rollouts = {name: d.rollout for name, d in models.items()}
    return Decisions(
        spec=spec,
        layout=layout,
        models=models,
        served_spec=served_spec,
        served_layout=served_layout,
        units=units,
        preparations=tuple(lifecycle.preparations(spec, layout)),
        warnings=(*rollout.warnings(spec, layout, rollouts), *efa_image_warnings(spec, layout)),
    )
