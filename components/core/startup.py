"""How long one engine replica takes from nothing to ready: the startup budget `pulumi up` waits for. Pure.

A cold replica waits for a node of its pool's instance type to start and join, pulls the engine image, gets its
weights from the model store into the engine (fetch + load), then the engine starts (compile, graph capture, KV
profiling). Each phase comes from the catalog's figures (an instance family's ``node_start_s`` and the rest, with their
sources); the budget is their sum plus
``catalog.STARTUP_MARGIN``, in whole minutes, unless the model's ``rollout.startup_budget_s`` sets it (never below
the estimate). The engine's startup probe, its Deployment's progress deadline and the Deployment's Pulumi
create timeout are this one number (``components.render.engine``, ``components.kubernetes.engine``).

The weights term is the model store's cold-start estimate for the fetch path placement chose (the streamer, or a
node cache missing on a fresh node): ``components.core.weights.coldstart.expected``, the same figure the plan's
Model weights table shows. A plan makes these once, in ``components.core.decisions``, which passes in the fetch path
it decided; called without one, they decide it here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.base import catalog, sizing
from components.base.packing import Mechanism
from components.base.problems import Problem
from components.core.placement import Layout, Placement
from components.core.planned import Planned, PlanRule
from components.core.weights import coldstart
from components.engines import profile
from components.spec import ModelSpec, PlatformSpec

MIB_PER_GIB = 1024


@dataclass(frozen=True)
class Phase:
    """One step of a cold start: its name, seconds, and how the seconds were reached."""

    name: str
    seconds: int
    basis: str


@dataclass(frozen=True)
class StartupBudget:
    """The phases of one replica's cold start, their estimate, and the budget allowed for it."""

    phases: tuple[Phase, ...]
    budget_s: int
    set_in_spec: bool = False

    @property
    def estimate_s(self) -> int:
        return sum(p.seconds for p in self.phases)

    def describe(self) -> str:
        """'node 600 s + image 410 s + weights 10 s + engine 120 s = 1,140 s; budget 24 min (estimate + 25%)'."""
        parts = " + ".join(f"{p.name} {p.seconds:,} s" for p in self.phases)
        how = "set in the stack file" if self.set_in_spec else f"estimate + {catalog.STARTUP_MARGIN:.0%}"
        return f"{parts} = {self.estimate_s:,} s; budget {minutes(self.budget_s)} ({how})"


def minutes(seconds: int) -> str:
    return f"{seconds / 60:.0f} min" if seconds % 60 == 0 else f"{seconds:,} s"


def _transfer_s(gib: float, mibps: float) -> int:
    return math.ceil(gib * MIB_PER_GIB / mibps) if gib and mibps else 0


def node_start(placement: Placement) -> Phase:
    """A new node of the pool's instance type, started and joined with its GPUs advertised; CPU engines run on
    the general nodes, which are there already."""
    if placement.instance is None:
        return Phase("node", 0, "general nodes, already running")
    family = placement.instance.family_facts
    return Phase("node", family.node_start_s, f"{placement.instance.name} ({family.name}) start and join")


def image_pull(model: ModelSpec) -> Phase:
    """The engine image, pulled and unpacked on a node that has never had it."""
    gib = profile(model.engine.kind).image_gib[model.engine.device.value]
    seconds = _transfer_s(gib, catalog.IMAGE_PULL_MIBPS)
    return Phase("image", seconds, f"{gib:g} GiB at {catalog.IMAGE_PULL_MIBPS:g} MiB/s")


def weights_gib(model: ModelSpec, placement: Placement) -> float:
    """One replica's weights: the GPU fit's, or (CPU engines, which have none) the architecture's at its precision."""
    if placement.fit is not None:
        return placement.weights_gib
    e = model.engine
    precision = sizing.weight_precision(e.quantization.value, e.dtype.value)
    return sizing.weight_bytes(placement.arch, precision, e.dtype.value) / sizing.GIB


def weights_fetch(model: ModelSpec, placement: Placement) -> Phase:
    """The weights from the model store into the engine on a fresh node (fetch + load), by the path placement
    chose: the model store's cold-start estimate (``coldstart.expected``), in whole seconds rounded up."""
    gib = weights_gib(model, placement)
    way = placement.fetch
    seconds = math.ceil(coldstart.expected(way, gib, placement.instance, placement.gpus_per_replica).total_s)
    return Phase("weights", seconds, f"{gib:.1f} GiB by {way.path.value}, fetch + load")


def engine_start(model: ModelSpec) -> Phase:
    """The engine's own start once the weights are in: compile, CUDA graph capture, KV cache profiling."""
    init = profile(model.engine.kind).init_s
    return Phase("engine", init, f"{init} s engine start ({model.engine.kind.value})")


def estimate(model: ModelSpec, placement: Placement) -> tuple[Phase, ...]:
    return (
        node_start(placement),
        image_pull(model),
        weights_fetch(model, placement),
        engine_start(model),
    )


def with_margin(estimate_s: int) -> int:
    """The estimate plus the margin, rounded up to whole minutes."""
    return math.ceil(estimate_s * (1 + catalog.STARTUP_MARGIN) / 60) * 60


def budget(model: ModelSpec, placement: Placement) -> StartupBudget:
    """A cold replica's phases and the budget allowed for them: the stack file's, else the estimate with margin."""
    phases = estimate(model, placement)
    total = sum(p.seconds for p in phases)
    chosen = model.rollout.startup_budget_s
    if chosen is not None:
        return StartupBudget(phases, chosen, set_in_spec=True)
    return StartupBudget(phases, with_margin(total))


def budget_covers_a_cold_start(planned: Planned) -> list[Problem]:
    """A budget set in the stack file that a cold replica cannot meet: the kubelet would kill it mid-load."""
    spec, decided = planned.spec, planned.decisions
    if decided is None:
        return []
    out: list[Problem] = []
    for i, model in enumerate(spec.models):
        b = decided.models[model.name].startup
        if b.set_in_spec and b.budget_s < b.estimate_s:
            out.append(
                Problem(
                    f"models[{i}].rollout.startup_budget_s",
                    f"{b.budget_s:,} s is less than the ~{b.estimate_s:,} s a cold replica of {model.name} needs "
                    f"({', '.join(f'{p.name} {p.seconds:,} s' for p in b.phases)}): the startup probe would kill it "
                    f"mid-load and `pulumi up` would give up; use at least {with_margin(b.estimate_s):,} or remove it",
                )
            )
    return out


@dataclass(frozen=True)
class IdleState:
    """What a model's replicas do when nobody asks: stay hot, sleep, or go to zero; and what coming back costs."""

    state: str  # "hot", "sleep" or "zero"
    after_s: int | None  # idle seconds before it sleeps or goes; None when it stays hot
    wake_s: int | None  # estimate: a sleeping replica back to serving
    cold_start_s: int  # estimate: a replica started from nothing

    def describe(self) -> str:
        cold = f"cold start ~{self.cold_start_s:,} s"
        if self.state == "sleep":
            return f"sleeps after {self.after_s:,} s idle; wakes in ~{self.wake_s} s (est.) vs {cold}"
        if self.state == "zero":
            return f"scales to zero after {self.after_s:,} s idle; {cold}"
        return f"stays hot (min_replicas >= 1, no sleep); {cold} only when scaling up"


def wake_s(model: ModelSpec, placement: Placement) -> int:
    """A sleeping (level 1) replica's wake: its weights back onto the GPU from host memory, plus a fixed part."""
    return _transfer_s(weights_gib(model, placement), catalog.SLEEP_WAKE_MIBPS) + catalog.SLEEP_WAKE_FIXED_S


def idle_state(model: ModelSpec, placement: Placement, startup: StartupBudget) -> IdleState:
    """``startup``: the model's startup budget (its estimate is the cold start)."""
    cold = startup.estimate_s
    scaling = model.scaling
    if scaling.sleep_after_idle_s is not None:
        return IdleState("sleep", scaling.sleep_after_idle_s, wake_s(model, placement), cold)
    if scaling.min_replicas == 0:
        return IdleState("zero", scaling.idle_before_zero_s, None, cold)
    return IdleState("hot", None, None, cold)


def staggered(spec: PlatformSpec, layout: Layout) -> dict[str, str]:
    """Engines that start after another on the first `pulumi up`: each model of a time-sliced pool after the one
    before it in the stack file. Time-sliced engines share a GPU's memory, and vLLM sizes its KV cache from the
    memory it sees change while it profiles at start: a neighbour loading its weights at the same moment counts
    against it (too small a cache, or no room for one and the engine exits). Ordered, the second starts once the
    first is ready. This covers the first deploy only: replicas the scaler adds later, or a node's engines coming
    back together after a restart, may still start side by side (the plan says so)."""
    out: dict[str, str] = {}
    for pool in layout.pools.values():
        if pool.sharing is not Mechanism.TIME_SLICING:
            continue
        members = [m.name for m in spec.models if m.name in pool.models]
        out |= dict(zip(members[1:], members[:-1], strict=True))
    return out


RULES: tuple[PlanRule, ...] = (budget_covers_a_cold_start,)
"""The startup budget's plan-time rule (``components.core.plan_rules``)."""
