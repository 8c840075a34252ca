"""Where every model runs: pools resolved to instance types, models to pools, with the reasons.

The rules that need the catalog (fit, parallelism against a node's GPUs, precision against the GPU,
pool capacity) are checked here, once, and reported with the spec's field paths. Everything downstream
(renderers, AWS node groups, cost, policies) reads the resulting ``Layout`` instead of deciding again.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from components.base import catalog, packing, sizing
from components.base.catalog import Instances
from components.base.packing import Mechanism
from components.base.problems import Problem, SpecError
from components.core import multinode
from components.core.planned import Planned, PlanRule
from components.core.weights import fetch
from components.spec import (
    AUTO,
    CapacityType,
    Device,
    GpuPlugin,
    GpuPoolSpec,
    ModelSpec,
    PlatformSpec,
    is_local_path,
)

# Node resources the kubelet, system daemons and DaemonSets keep; the rest is shared by the GPUs' replicas.
NODE_RESERVED_CPU = 2.0
NODE_RESERVED_MEMORY_FRACTION = 0.10
HOST_ENGINE_BASE_GIB = 16
"""Host memory a GPU engine needs for itself, besides what it parks there (a KV offload buffer, slept weights)."""
IMAGE_DISK_GIB = 60  # engine images (vLLM's is ~10 GiB compressed) and the kubelet's working space
DISK_STEP_GIB = 50


def engine_shape(model: ModelSpec) -> sizing.EngineShape:
    e = model.engine
    return sizing.EngineShape(
        quantization=e.quantization.value,
        dtype=e.dtype.value,
        kv_cache_dtype=e.kv_cache_dtype.value,
        tensor_parallel_size=e.tensor_parallel_size,
        pipeline_parallel_size=e.pipeline_parallel_size,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        gpu_memory_utilization=model.memory_utilization,
        enforce_eager=e.enforce_eager,
        lora_slots=e.lora.max_per_batch if model.adapters else 0,
        lora_max_rank=e.lora.max_rank if model.adapters else 0,
    )


@dataclass(frozen=True)
class Share:
    """How one replica shares a GPU: its pool's mechanism, what it takes, what it is charged."""

    mechanism: Mechanism
    fraction: float | None  # time-slicing: share of the GPU's memory
    profile: catalog.MigProfile | None  # mig: its instance profile
    slots_per_gpu: int  # time-slicing: engines per GPU on its pool; 1 for mig

    @property
    def gpu_fraction(self) -> float:
        """The share of one GPU a replica is charged for (``packing.gpu_share``)."""
        return packing.gpu_share(self.engine(""), self.slots_per_gpu)

    def engine(self, model: str) -> packing.Engine:
        return packing.Engine(model, fraction=self.fraction, profile=self.profile)

    @property
    def per_gpu(self) -> int:
        """Replicas of this model one GPU can hold."""
        return self.profile.max_instances if self.profile is not None else self.slots_per_gpu

    def describe(self) -> str:
        if self.profile is not None:
            return f"MIG {self.profile.name} ({self.gpu_fraction:.3g} of a GPU)"
        return (
            f"time-sliced {self.fraction:g} of a GPU's memory (one of {self.slots_per_gpu} engines per GPU, "
            f"gpu_memory_utilization {packing.shared_memory_utilization(self.fraction or 0):g})"
        )


def pool_slots(spec: PlatformSpec, pool: GpuPoolSpec) -> int:
    """Time-sliced engines per GPU of ``pool``: its engines_per_gpu, else what its largest fraction allows."""
    if pool.sharing is not Mechanism.TIME_SLICING:
        return 1
    if pool.engines_per_gpu is not None:
        return pool.engines_per_gpu
    fractions = [
        m.gpu_share.fraction
        for m in spec.models
        if m.pool == pool.name and m.gpu_share is not None and m.gpu_share.fraction is not None
    ]
    return packing.slots_for(fractions)


@dataclass(frozen=True)
class Placement:
    """One model's resolved home."""

    model: str
    arch: catalog.ModelArch
    pool: str | None  # None: a CPU engine on the general nodes
    instance: catalog.InstanceType | None
    gpus_per_replica: int
    fit: sizing.MemoryFit | None
    fetch: fetch.Fetch
    """How its engines get their weights, decided here with the instance (it depends on the node's disks): the
    pool's node cache is sized from it, and the startup budget's weights term is its cold start."""
    reason: str
    share: Share | None = None  # on a shared pool: its slice of one GPU

    @property
    def replicas_per_node(self) -> int:
        if self.instance is None or self.gpus_per_replica == 0:
            return 1
        if self.share is not None:
            return self.instance.gpus * self.share.per_gpu
        return max(1, self.instance.gpus // self.gpus_per_replica)

    @property
    def nodes(self) -> int:
        """Nodes one replica spans: 1, or the whole nodes of a multi-node group (``components.core.multinode``)."""
        if self.instance is None:
            return 1
        return max(1, self.gpus_per_replica // self.instance.gpus)

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def gpu_fraction(self) -> float:
        """GPUs one replica is charged for: whole GPUs, or its share of one."""
        return self.share.gpu_fraction if self.share is not None else float(self.gpus_per_replica)

    @property
    def weights_gib(self) -> float:
        return self.fit.weights_gib * self.gpus_per_replica if self.fit else 0.0


@dataclass(frozen=True)
class PoolPlan:
    """A GPU pool with its instance type and node bounds derived from the models placed on it."""

    name: str
    instance: catalog.InstanceType
    capacity_type: CapacityType
    min_nodes: int
    max_nodes: int
    root_disk_gib: int
    labels: dict[str, str]
    models: tuple[str, ...]
    reason: str
    packing: packing.Packing | None = None  # a shared pool: its models' max replicas on GPUs

    @property
    def sharing(self) -> Mechanism:
        return self.packing.mechanism if self.packing is not None else Mechanism.NONE

    multi_node: bool = False
    """A model on it spans nodes (LeaderWorkerSet groups)."""
    efa_interfaces: int = 0
    """EFA interfaces per node (the instance type's count; 0: no EFA)."""
    placement_group: bool = False
    """Its nodes launch into one cluster placement group (one zone)."""
    model_cache_gib: int = 0
    """Node-level cache per node: one copy of each node-cache model's weights, whatever its replicas per node."""
    cache_medium: fetch.CacheMedium | None = None
    fallbacks: tuple[catalog.InstanceType, ...] = ()
    """The pool's fallback instance types (gpu_pools[].fallback_instance_types), in order: its nodes may be any of
    these or ``instance``, so what is static about them (node labels) holds for all."""

    @property
    def instance_types(self) -> tuple[catalog.InstanceType, ...]:
        """Every instance type its nodes may be: its own, then the fallbacks."""
        return (self.instance, *self.fallbacks)


@dataclass(frozen=True)
class Layout:
    placements: dict[str, Placement] = field(default_factory=dict)
    pools: dict[str, PoolPlan] = field(default_factory=dict)


def _nodes_for(gpus: int, per_node: int) -> int:
    return math.ceil(gpus / per_node) if gpus else 0


def _model_path(spec: PlatformSpec, model: ModelSpec) -> str:
    return f"models[{spec.models.index(model)}]"


def members(spec: PlatformSpec) -> list[tuple[ModelSpec, str]]:
    """What placement places, each with its path in the stack file: every model, and the prefill role of a
    disaggregated model that names a pool of its own ('<model>-prefill', ``ModelSpec.pd_roles``), placed, sized
    and billed as a unit of its own in that pool. A prefill role in the model's pool is part of the model's
    placement (``ModelSpec.unit_replicas`` counts it)."""
    out: list[tuple[ModelSpec, str]] = []
    for i, model in enumerate(spec.models):
        out.append((model, f"models[{i}]"))
        if model.prefill_pool is not None:
            out.append((model.pd_roles()[1], f"models[{i}].disaggregation.prefill"))
    return out


def _check_on_instance(
    path: str, model: ModelSpec, arch: catalog.ModelArch, instance: catalog.InstanceType, table: Instances
) -> tuple[list[Problem], sizing.MemoryFit | None]:
    """Parallelism, precision and memory of ``model`` on one node of ``instance`` (``table``: the target's
    instance types, where advice looks for one that fits)."""
    shape = engine_shape(model)
    gpus = shape.gpus
    group = multinode.group_problems(path, model, instance)
    if group:
        return group, None
    if gpus < instance.gpus and instance.gpus % gpus:
        return [
            Problem(
                f"{path}.engine.tensor_parallel_size",
                f"{model.engine.tensor_parallel_size} x pipeline {model.engine.pipeline_parallel_size} does not "
                f"divide the {instance.gpus} GPUs of {instance.name}; use {_divisors(instance.gpus)}",
            )
        ], None
    unsupported = sizing.gpu_supports(instance.gpu_spec, shape)
    if unsupported:
        return [Problem(f"{path}.engine", unsupported)], None
    if model.gpu_share is not None:
        return _check_share(path, model, arch, instance, shape)
    fit = sizing.memory_fit(arch, shape, instance.gpu_spec)
    if not fit.fits:
        return [
            Problem(
                f"{path}",
                f"{model.name} does not fit {instance.name} with tensor_parallel_size "
                f"{model.engine.tensor_parallel_size}: {_fit_advice(model, arch, instance, table)}",
                tuple(fit.lines()),
            )
        ], fit
    return [], fit


def _check_share(
    path: str,
    model: ModelSpec,
    arch: catalog.ModelArch,
    instance: catalog.InstanceType,
    shape: sizing.EngineShape,
) -> tuple[list[Problem], sizing.MemoryFit | None]:
    """A replica's share of one GPU of ``instance``: the MIG profile exists there and holds it, or the
    time-sliced fraction of the GPU's memory does; else what would."""
    share = model.gpu_share
    assert share is not None
    gpu = instance.gpu_spec
    if share.mig_profile is not None:
        profiles = gpu.mig_profiles
        if not profiles:
            with_mig = ", ".join(sorted(g.name for g in catalog.GPUS.values() if g.mig_profiles))
            return [
                Problem(
                    f"{path}.gpu_share.mig_profile",
                    f"{gpu.name} ({instance.name}) has no MIG; MIG needs one of {with_mig} (e.g. p5.48xlarge), or "
                    "share this GPU with time-slicing (pool sharing: time-slicing, gpu_share.fraction)",
                )
            ], None
        profile = gpu.mig_profile(share.mig_profile)
        if profile is None:
            return [
                Problem(
                    f"{path}.gpu_share.mig_profile",
                    f"{gpu.name} has no MIG profile {share.mig_profile!r}; its profiles are "
                    f"{', '.join(p.name for p in profiles)}",
                )
            ], None
        fit = sizing.memory_fit(arch, shape, packing.mig_device(gpu, profile))
        if fit.fits:
            return [], fit
        smallest = packing.smallest_mig_profile(arch, shape, gpu)
        advice = (
            f"the smallest that holds it is {smallest.name}"
            if smallest
            else "no MIG instance holds it: remove gpu_share"
        )
        return [
            Problem(
                f"{path}.gpu_share.mig_profile",
                f"{model.name} does not fit a {share.mig_profile} instance of {gpu.name} "
                f"({profile.memory_gib(gpu):.1f} GiB); {advice} (or lower max_model_len / max_num_seqs, or quantize)",
                tuple(fit.lines()),
            )
        ], fit
    fit = sizing.memory_fit(arch, shape, gpu)
    if fit.fits:
        return [], fit
    least = packing.smallest_fraction(arch, shape, gpu)
    advice = (
        f"it needs a fraction of at least {least:g} of a {gpu.name}"
        if least is not None
        else f"no share of a {gpu.name} holds it: remove gpu_share (a whole GPU) or use a larger GPU"
    )
    return [
        Problem(
            f"{path}.gpu_share.fraction",
            f"{model.name} does not fit {share.fraction:g} of a {gpu.name} ({instance.name}; gpu_memory_utilization "
            f"{shape.gpu_memory_utilization:g}): {advice} (or lower max_model_len / max_num_seqs, or quantize)",
            tuple(fit.lines()),
        )
    ], fit


def _divisors(gpus: int) -> str:
    options = [str(d) for d in (1, 2, 4, 8) if gpus % d == 0 and d <= gpus]
    return ", ".join(options[:-1]) + (" or " if len(options) > 1 else "") + options[-1]


def _fit_advice(
    model: ModelSpec, arch: catalog.ModelArch, instance: catalog.InstanceType, table: Instances
) -> str:
    """What would make it fit: a larger tensor-parallel size on this node, quantization, or another type."""
    shape = engine_shape(model)
    for tp in sizing.parallel_options(instance, shape.pipeline_parallel_size):
        if tp <= shape.tensor_parallel_size:
            continue
        trial = sizing.EngineShape(**{**shape.__dict__, "tensor_parallel_size": tp})
        if sizing.memory_fit(arch, trial, instance.gpu_spec).fits:
            return f"set engine.tensor_parallel_size to {tp}"
    cheaper = sizing.candidates(arch, shape, fixed_parallelism=False, instances=list(table.values()))
    if cheaper:
        best = cheaper[0]
        return (
            f"use instance {best.instance.name} with tensor_parallel_size {best.tensor_parallel_size}, "
            "or quantize (awq, gptq, fp8), or lower max_model_len"
        )
    return (
        "quantize it (awq, gptq, fp8) or lower max_model_len; no single instance type holds it as configured"
    )


def _resolve_arch(spec: PlatformSpec, model: ModelSpec) -> tuple[catalog.ModelArch | None, list[Problem]]:
    arch = model.arch()
    if arch is None:
        return None, [
            Problem(
                f"{_model_path(spec, model)}.architecture",
                f"the catalog does not know {model.source!r}; add an architecture block (params_b, layers, kv_heads, "
                "head_dim, hidden_size) from the model's config.json, or use a known model "
                f"(e.g. {', '.join(sorted(catalog.ALIASES)[:4])}, ...)",
            )
        ]
    return arch, []


def plan(
    spec: PlatformSpec, table: Instances = catalog.INSTANCE_TYPES
) -> tuple[Layout | None, list[Problem]]:
    """Resolve pools and placements on the instance types of ``table`` (the target's: ``Profile.instances``), with
    every problem found doing it. The layout is None where the spec leaves nothing to place (an unknown
    architecture, instance type or pool, a name used twice, a share on the wrong pool, a model that fits
    nowhere); where only the pools' sizes are wrong it is there beside the problems, so the plan-time rules that
    read it still run (``components.core.plan_rules``)."""
    problems: list[Problem] = []
    archs: dict[str, catalog.ModelArch] = {}
    for model in spec.models:
        arch, found = _resolve_arch(spec, model)
        problems += found
        if arch is not None:
            archs[model.name] = arch
    problems += _unique_names(spec)
    problems += _pool_references(spec)
    if not problems:
        problems += _share_rules(spec)
    problems += _known_instance_types(spec, table)  # after the share rules, which it would not stop
    if problems:
        return None, problems

    placed = members(spec)
    for model, _ in placed:  # a prefill role loads its model's weights
        archs.setdefault(model.name, archs[model.served_name])
    instances, pool_reasons, found = _resolve_pool_instances(spec, placed, archs, table)
    problems += found
    placements: dict[str, Placement] = {}
    for model, path in placed:
        placement, found = _place_model(spec, model, path, archs[model.name], instances, table)
        problems += found
        if placement is not None:
            placements[model.name] = placement
    if problems:
        return None, problems

    pools, found = _pool_plans(spec, placed, placements, instances, pool_reasons, table)
    return Layout(placements=placements, pools=pools), found


def place(spec: PlatformSpec, source: str = "<spec>", table: Instances = catalog.INSTANCE_TYPES) -> Layout:
    """The layout of a spec at hand; raise ``SpecError`` with every problem placement finds, its rules' included.
    A stack file goes through ``components.core.stackfile``, which reports these with every other rule's."""
    layout, problems = plan(spec, table)
    problems += [p for rule in RULES for p in rule(Planned(spec, layout, instances=table))]
    if problems or layout is None:
        raise SpecError(source, problems)
    return layout


def local_sources_need_target_local(planned: Planned) -> Iterator[Problem]:
    """A model or adapter read from a local path exists on this machine only."""
    spec = planned.spec
    if spec.cluster.on_this_machine:
        return
    for i, model in enumerate(spec.models):
        if model.is_local_path:
            yield Problem(
                f"models[{i}].source",
                f"a local path ({model.source}) only works with target: local; on {spec.target.value}, "
                "upload the weights to S3 ('s3://bucket/prefix') or use a Hugging Face repo id",
            )
        for j, adapter in enumerate(model.adapters):
            if is_local_path(adapter.source):
                yield Problem(
                    f"models[{i}].adapters[{j}].source",
                    f"a local path ({adapter.source}) only works with target: local; on {spec.target.value}, "
                    "upload the adapter to S3 ('s3://bucket/prefix/') or use a Hugging Face repo id",
                )


def gpu_engines_need_a_cluster(planned: Planned) -> Iterator[Problem]:
    """`make local` runs engines on this machine's CPU."""
    if not planned.spec.cluster.on_this_machine:
        return
    for i, model in enumerate(planned.spec.models):
        if model.engine.device is Device.GPU:
            yield Problem(
                f"models[{i}].engine.device",
                "target: local runs engines on this machine's CPU; set engine.device: cpu",
            )


def _unique_names(spec: PlatformSpec) -> list[Problem]:
    problems = []
    for kind, names in (
        ("models", [m.name for m in spec.models]),
        ("gpu_pools", [p.name for p in spec.gpu_pools]),
    ):
        seen: set[str] = set()
        for i, name in enumerate(names):
            if name in seen:
                problems.append(
                    Problem(
                        f"{kind}[{i}].name", f"{name!r} is used twice; names must be unique within {kind}"
                    )
                )
            seen.add(name)
    models = {m.name for m in spec.models}
    owner: dict[str, str] = {}
    for i, model in enumerate(spec.models):
        for j, adapter in enumerate(model.adapters):
            path = f"models[{i}].adapters[{j}].name"
            if adapter.name in models:
                problems.append(
                    Problem(
                        path, f"{adapter.name!r} is also a model's name; clients could not tell them apart"
                    )
                )
            elif adapter.name in owner and owner[adapter.name] != model.name:
                problems.append(
                    Problem(
                        path,
                        f"{adapter.name!r} is also an adapter of {owner[adapter.name]}; adapter names must be "
                        "unique in the stack (clients ask for them by name alone)",
                    )
                )
            owner.setdefault(adapter.name, model.name)
    return problems


def _pool_references(spec: PlatformSpec) -> list[Problem]:
    problems = []
    names = [p.name for p in spec.gpu_pools]
    for i, model in enumerate(spec.models):
        prefill_pool = model.prefill_pool
        if prefill_pool is not None and (
            model.engine.device is Device.CPU or prefill_pool not in [*names, AUTO]
        ):
            known = ", ".join(names) if names else "none are declared"
            problems.append(
                Problem(
                    f"models[{i}].disaggregation.prefill.pool",
                    "CPU engines run on the general nodes; remove the prefill role's pool"
                    if model.engine.device is Device.CPU
                    else f"unknown pool {prefill_pool!r}; declared pools: {known} (or remove it: the model's pool)",
                )
            )
        if model.engine.device is Device.CPU:
            if model.pool != AUTO:
                problems.append(
                    Problem(
                        f"models[{i}].pool",
                        "CPU engines run on the general nodes; remove pool or set it to auto",
                    )
                )
            continue
        if model.pool != AUTO and model.pool not in names:
            known = ", ".join(names) if names else "none are declared"
            problems.append(
                Problem(
                    f"models[{i}].pool", f"unknown pool {model.pool!r}; declared pools: {known} (or use auto)"
                )
            )
        if model.pool == AUTO and not names:
            problems.append(
                Problem(
                    f"models[{i}].pool",
                    "no gpu_pools are declared; add one under gpu_pools (instance_type auto works)",
                )
            )
    return problems


_SHARE_KIND = {Mechanism.TIME_SLICING: "fraction", Mechanism.MIG: "mig_profile"}


def _share_rules(spec: PlatformSpec) -> list[Problem]:
    """Shared pools hold only models with a matching gpu_share, and time-sliced GPUs never hold more
    engines than the largest fraction allows."""
    problems: list[Problem] = []
    for i, model in enumerate(spec.models):
        share = model.gpu_share
        if model.engine.device is Device.CPU:
            if share is not None and not spec.cluster.on_this_machine:
                problems.append(
                    Problem(
                        f"models[{i}].gpu_share",
                        "on a CPU engine gpu_share.fraction shares the memory `make local` gives its engines "
                        f"(target local); on {spec.target.value} a CPU engine's memory is engine.memory_gib: remove "
                        "gpu_share",
                    )
                )
            continue
        pool = spec.pool(model.pool)
        if share is None:
            if pool is not None and pool.sharing is not Mechanism.NONE:
                problems.append(
                    Problem(
                        f"models[{i}].pool",
                        f"pool {pool.name} shares its GPUs ({pool.sharing.value}) and {model.name} sets no gpu_share, "
                        "so it needs whole GPUs: put it on a pool with sharing none, or give it a gpu_share",
                    )
                )
            continue
        kind = "fraction" if share.fraction is not None else "mig_profile"
        if pool is None:
            shared = [p.name for p in spec.gpu_pools if _SHARE_KIND.get(p.sharing) == kind]
            problems.append(
                Problem(
                    f"models[{i}].pool",
                    "a model with gpu_share names its shared pool"
                    + (
                        f": {', '.join(shared)}"
                        if shared
                        else f"; declare one with sharing {_mechanism_of(kind)}"
                    ),
                )
            )
            continue
        if _SHARE_KIND.get(pool.sharing) != kind:
            want = _mechanism_of(kind)
            problems.append(
                Problem(
                    f"models[{i}].gpu_share.{kind}",
                    f"pool {pool.name} has sharing {pool.sharing.value}; a gpu_share.{kind} needs a pool with sharing "
                    f"{want}"
                    + (
                        f", or use gpu_share.{_SHARE_KIND[pool.sharing]} on this one"
                        if pool.sharing in _SHARE_KIND
                        else ""
                    ),
                )
            )
    shared = [p.name for p in spec.gpu_pools if p.sharing is not Mechanism.NONE]
    if shared and spec.addons.gpu_plugin is not GpuPlugin.DEVICE_PLUGIN:
        problems.append(
            Problem(
                "addons.gpu_plugin",
                f"pool(s) {', '.join(shared)} share their GPUs through the NVIDIA device plugin's config, which this "
                f"stack renders for gpu_plugin nvidia-device-plugin only, not {spec.addons.gpu_plugin.value}; set "
                "addons.gpu_plugin: nvidia-device-plugin or sharing: none",
            )
        )
    for j, pool in enumerate(spec.gpu_pools):
        if pool.sharing is not Mechanism.TIME_SLICING or pool.engines_per_gpu is None:
            continue
        shares = {
            m.name: m.gpu_share.fraction
            for m in spec.models
            if m.pool == pool.name and m.gpu_share is not None and m.gpu_share.fraction is not None
        }
        if not shares:
            continue
        largest = max(shares.values())
        worst = pool.engines_per_gpu * largest
        if worst > 1 + 1e-9:
            name = max(shares, key=lambda n: shares[n])
            problems.append(
                Problem(
                    f"gpu_pools[{j}].engines_per_gpu",
                    f"{pool.engines_per_gpu} engines per GPU and {name}'s gpu_share.fraction {largest:g}: Kubernetes may "
                    f"put {pool.engines_per_gpu} such replicas on one GPU, {worst:.2f} of its memory; set engines_per_gpu "
                    f"to at most {packing.slots_for([largest])}, or the fractions to at most {1 / pool.engines_per_gpu:.3g}",
                )
            )
    return problems


def _mechanism_of(kind: str) -> str:
    return next(m.value for m, k in _SHARE_KIND.items() if k == kind)


def _share(spec: PlatformSpec, model: ModelSpec, instance: catalog.InstanceType) -> Share | None:
    pool = spec.pool(model.pool)
    if model.gpu_share is None or pool is None:
        return None
    profile = (
        instance.gpu_spec.mig_profile(model.gpu_share.mig_profile) if model.gpu_share.mig_profile else None
    )
    return Share(pool.sharing, model.gpu_share.fraction, profile, pool_slots(spec, pool))


def _known_instance_types(spec: PlatformSpec, table: Instances) -> list[Problem]:
    """Every pool's instance type and fallbacks are the target's (``table``); an unknown one names its
    families and its cheapest and largest types."""
    problems: list[Problem] = []
    for i, pool in enumerate(spec.gpu_pools):
        if pool.instance_type != AUTO and pool.instance_type not in table:
            problems.append(
                Problem(
                    f"gpu_pools[{i}].instance_type",
                    f"unknown GPU instance type {pool.instance_type!r}; use 'auto' or {_known_types(table)}",
                )
            )
        unknown = [t for t in pool.fallback_instance_types if t not in table]
        if unknown:
            problems.append(
                Problem(
                    f"gpu_pools[{i}].fallback_instance_types",
                    f"unknown GPU instance type(s) {', '.join(map(repr, unknown))}; use {_known_types(table)}",
                )
            )
    return problems


def _known_types(table: Instances) -> str:
    """What the target has, for a message: its families, and its cheapest and largest types."""
    if not table:
        return "nothing else: this target has no GPU instance types"
    cheapest = min(table.values(), key=lambda i: (i.on_demand_usd_per_hour, i.name))
    largest = max(table.values(), key=lambda i: (i.gpus, i.on_demand_usd_per_hour, i.name))
    examples = ", ".join(dict.fromkeys(repr(t.name) for t in (cheapest, largest)))
    return f"one of the families {', '.join(sorted({t.family for t in table.values()}))} (e.g. {examples})"


def _resolve_pool_instances(
    spec: PlatformSpec,
    placed: list[tuple[ModelSpec, str]],
    archs: dict[str, catalog.ModelArch],
    table: Instances,
) -> tuple[dict[str, catalog.InstanceType], dict[str, str], list[Problem]]:
    """Pools with instance_type auto take the cheapest type that fits every model that names them."""
    instances: dict[str, catalog.InstanceType] = {}
    reasons: dict[str, str] = {}
    problems: list[Problem] = []
    for i, pool in enumerate(spec.gpu_pools):
        if pool.instance_type != AUTO:
            instances[pool.name] = table[pool.instance_type]
            reasons[pool.name] = "instance type set in the stack file"
            continue
        on_pool = [m for m, _ in placed if m.pool == pool.name and m.engine.device is Device.GPU]
        if not on_pool:
            problems.append(
                Problem(
                    f"gpu_pools[{i}].instance_type",
                    f"pool {pool.name!r} has instance_type auto but no model names it; name it from a model's pool "
                    "or set instance_type",
                )
            )
            continue
        best: tuple[float, catalog.InstanceType] | None = None
        for instance in table.values():
            costs = []
            for model in on_pool:
                found, _ = _check_on_instance("", model, archs[model.name], instance, table)
                if found:
                    break
                costs.append(instance.on_demand_usd_per_hour * model.engine.gpus / instance.gpus)
            else:
                total = sum(costs)
                if best is None or total < best[0]:
                    best = (total, instance)
        if best is None:
            problems.append(
                Problem(
                    f"gpu_pools[{i}].instance_type",
                    f"no single instance type fits every model on pool {pool.name!r} "
                    f"({', '.join(m.name for m in on_pool)}) with their parallel sizes; split them across pools "
                    "or raise tensor_parallel_size",
                )
            )
            continue
        instances[pool.name] = best[1]
        reasons[pool.name] = (
            f"auto: {best[1].name} is the cheapest type where {', '.join(m.name for m in on_pool)} fit "
            f"({best[1].gpus} x {best[1].gpu}, ${best[1].on_demand_usd_per_hour:.2f}/h on demand)"
        )
    return instances, reasons, problems


def _place_model(
    spec: PlatformSpec,
    model: ModelSpec,
    path: str,
    arch: catalog.ModelArch,
    instances: dict[str, catalog.InstanceType],
    table: Instances,
) -> tuple[Placement | None, list[Problem]]:
    if model.engine.device is Device.CPU:
        way = fetch.decide(model, None)
        return Placement(model.name, arch, None, None, 0, None, way, "CPU engine on the general nodes"), []
    if model.pool != AUTO:
        instance = instances.get(model.pool)
        if instance is None:
            return None, []  # the pool's own problem is already reported
        problems, fit = _check_on_instance(path, model, arch, instance, table)
        if problems:
            return None, problems
        share = _share(spec, model, instance)
        return Placement(
            model.name,
            arch,
            model.pool,
            instance,
            model.engine.gpus,
            fit,
            fetch.decide(model, instance),
            f"pool {model.pool} named in the stack file" + (f"; {share.describe()}" if share else ""),
            share,
        ), []
    options: list[tuple[float, str, sizing.MemoryFit]] = []
    rejected: list[str] = []
    for pool_name, instance in instances.items():
        pool_spec = spec.pool(pool_name)
        if pool_spec is not None and pool_spec.sharing is not Mechanism.NONE:
            rejected.append(
                f"{pool_name}: shares its GPUs ({pool_spec.sharing.value}); {model.name} needs whole GPUs"
            )
            continue
        found, fit = _check_on_instance(path, model, arch, instance, table)
        if found or fit is None:
            rejected.append(f"{pool_name} ({instance.name}): {found[0].message.split(': ', 1)[-1]}")
            continue
        options.append((instance.on_demand_usd_per_hour * model.engine.gpus / instance.gpus, pool_name, fit))
    if not options:
        return None, [
            Problem(
                f"{path}.pool",
                f"pool auto found no declared pool where {model.name} fits; add a pool with a larger GPU",
                tuple(rejected),
            )
        ]
    cost, pool_name, fit = min(options)
    instance = instances[pool_name]
    reason = f"auto: cheapest pool that fits ({pool_name}: {instance.name}, ${cost * catalog.HOURS_PER_MONTH:,.0f}/month per replica)"
    way = fetch.decide(model, instance)
    return Placement(model.name, arch, pool_name, instance, model.engine.gpus, fit, way, reason), []


def _pool_plans(
    spec: PlatformSpec,
    placed: list[tuple[ModelSpec, str]],
    placements: dict[str, Placement],
    instances: dict[str, catalog.InstanceType],
    reasons: dict[str, str],
    table: Instances,
) -> tuple[dict[str, PoolPlan], list[Problem]]:
    plans: dict[str, PoolPlan] = {}
    problems: list[Problem] = []
    for i, pool in enumerate(spec.gpu_pools):
        instance = instances[pool.name]
        on_pool = [m for m, _ in placed if (p := placements.get(m.name)) is not None and p.pool == pool.name]
        packed: packing.Packing | None = None
        if pool.sharing is Mechanism.NONE:
            gpus_min = sum(m.unit_replicas("min_replicas") * m.engine.gpus for m in on_pool)
            gpus_max = sum(m.unit_replicas("max_replicas") * m.engine.gpus for m in on_pool)
            need_min = _nodes_for(gpus_min, instance.gpus)
        else:
            packed = _packing(pool, on_pool, placements, instance, "max_replicas")
            gpus_max = packed.nodes * instance.gpus
            need_min = _packing(pool, on_pool, placements, instance, "min_replicas").nodes
            if pool.sharing is Mechanism.MIG and packed.node_layout is None:
                problems.append(
                    Problem(
                        f"gpu_pools[{i}].sharing",
                        f"a node group's nodes are cut into MIG instances alike, and one {instance.name} cannot hold "
                        f"a replica of each of {', '.join(m.name for m in on_pool)} ({instance.gpus} GPUs); split "
                        "them across pools or use smaller profiles",
                    )
                )
        need_max = _nodes_for(gpus_max, instance.gpus)
        min_nodes = max(pool.min_nodes, need_min)
        max_nodes = pool.max_nodes if pool.max_nodes is not None else max(need_max, min_nodes, 1)
        if pool.max_nodes is not None and pool.max_nodes < need_max:
            problems.append(
                Problem(
                    f"gpu_pools[{i}].max_nodes",
                    f"{pool.max_nodes} nodes of {instance.name} cannot hold the max replicas of "
                    f"{', '.join(m.name for m in on_pool)} ({gpus_max} GPUs = {need_max} nodes); raise max_nodes to "
                    f"{need_max} or lower the models' max_replicas",
                )
            )
        if min_nodes > max_nodes:
            problems.append(
                Problem(f"gpu_pools[{i}].min_nodes", f"min_nodes {min_nodes} is above max_nodes {max_nodes}")
            )
        links, found = _group_links(spec, i, pool, instance, [placements[m.name] for m in on_pool], table)
        problems += found
        cache_gib, medium, found = _node_cache(i, pool.model_cache_gib, instance, on_pool, placements)
        problems += found
        # Weights on the root disk: the node cache where the instance has no NVMe (one copy per model, shared
        # by the node's replicas); streamed models and an NVMe cache need none.
        on_root = cache_gib if medium is fetch.CacheMedium.ROOT_DISK else 0
        disk = pool.root_disk_gib or int(
            math.ceil((on_root + IMAGE_DISK_GIB) / DISK_STEP_GIB) * DISK_STEP_GIB
        )
        plans[pool.name] = PoolPlan(
            name=pool.name,
            instance=instance,
            capacity_type=pool.capacity_type,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            root_disk_gib=disk,
            labels=dict(pool.labels),
            models=tuple(m.name for m in on_pool),
            reason=reasons[pool.name],
            packing=packed,
            **links,
            model_cache_gib=cache_gib,
            cache_medium=medium,
            fallbacks=tuple(table[n] for n in pool.fallback_instance_types if n in table),
        )
    return plans, problems


def _packing(
    pool: GpuPoolSpec,
    members: list[ModelSpec],
    placements: dict[str, Placement],
    instance: catalog.InstanceType,
    bound: str,
) -> packing.Packing:
    """A shared pool's replicas (at min or max) packed onto its GPUs."""
    engines: list[packing.Engine] = []
    slots = 1
    for m in members:
        share = placements[m.name].share
        assert share is not None  # _share_rules: every model on a shared pool has one
        slots = share.slots_per_gpu
        engines += [share.engine(m.name)] * m.unit_replicas(bound)
    return packing.pack(pool.sharing, engines, instance.gpu, instance.gpus, slots)


def host_share(instance: catalog.InstanceType, gpus: float) -> tuple[float, int]:
    """CPU cores and memory GiB of a node that a replica taking ``gpus`` of its GPUs gets (whole or a share)."""
    share = gpus / instance.gpus
    cores = max(1.0, math.floor((instance.vcpus - NODE_RESERVED_CPU) * share))
    return cores, math.floor(instance.memory_gib * (1 - NODE_RESERVED_MEMORY_FRACTION) * share)


def host_memory_needed_gib(model: ModelSpec, placement: Placement) -> int:
    """Host memory one engine pod needs at least: its own, plus a KV offload buffer, plus (sleep level 1) its
    weights, which sleeping moves to host memory (only single-node replicas sleep); 0 when it parks nothing
    there."""
    parked = model.engine.cpu_kv_offload_gib
    if model.scaling.sleep_after_idle_s is not None:
        parked += placement.weights_gib
    return math.ceil(parked + HOST_ENGINE_BASE_GIB) if parked else 0


def sleep_fits_the_host(planned: Planned) -> list[Problem]:
    """A sleeping replica keeps its weights in host memory: its share of the node must hold them. A replica that
    spans nodes does not sleep: the router's sleep and wake calls reach the group's leader, and whether every
    worker of a multi-node engine follows them is not established here."""
    spec, layout = planned.spec, planned.layout
    if layout is None:
        return []
    placements = layout.placements
    problems = []
    for i, model in enumerate(spec.models):
        placement = placements.get(model.name)
        if model.scaling.sleep_after_idle_s is None or placement is None or placement.instance is None:
            continue
        if placement.multi_node:
            problems.append(
                Problem(
                    f"models[{i}].scaling.sleep_after_idle_s",
                    f"a replica of {model.name} spans {placement.nodes} x {placement.instance.name} (a "
                    "LeaderWorkerSet group), and sleep mode is supported on replicas of one node only: remove it "
                    "(min_replicas: 0 scales the groups to zero instead)",
                )
            )
            continue
        need = host_memory_needed_gib(model, placement)
        _, share = host_share(placement.instance, placement.gpu_fraction)
        have = model.engine.memory_gib or share
        if need > have:
            problems.append(
                Problem(
                    f"models[{i}].scaling.sleep_after_idle_s",
                    f"a sleeping replica of {model.name} moves its weights ({placement.weights_gib:.1f} GiB) to host "
                    f"memory and needs {need} GiB there, but gets {have:g} GiB of {placement.instance.name} "
                    f"({'engine.memory_gib' if model.engine.memory_gib else 'its share of the node'}); use an instance "
                    "with more memory per GPU, set engine.memory_gib if the node has room, or remove sleep",
                )
            )
    return problems


def _group_links(
    spec: PlatformSpec,
    index: int,
    pool: GpuPoolSpec,
    instance: catalog.InstanceType,
    members: list[Placement],
    table: Instances,
) -> tuple[dict[str, Any], list[Problem]]:
    """EFA and placement group of a pool: on by default where a model spans nodes; asked for where the instance
    type lacks them, a problem naming the types that have them."""
    multi = any(p.multi_node for p in members)
    link = multinode.interconnect(instance)
    problems: list[Problem] = []
    unlinked = spec.cluster.multi_node_problem(pool.name) if multi else None
    if unlinked is not None:
        problems.append(unlinked)
    if pool.efa and not link.has_efa:
        problems.append(
            Problem(
                f"gpu_pools[{index}].efa",
                f"{instance.name} has no EFA; use an instance type with EFA "
                f"({', '.join(multinode.efa_instance_types(table=table)) or 'none known'}) or set efa: false",
            )
        )
    if pool.placement_group and not link.cluster_placement:
        problems.append(
            Problem(
                f"gpu_pools[{index}].placement_group",
                f"{instance.family} instances cannot launch into a cluster placement group; use a family that can "
                f"({', '.join(sorted({i.family for i in table.values() if i.family_facts.cluster_placement}))}) "
                "or set "
                "placement_group: false",
            )
        )
    efa = link.has_efa and (pool.efa if pool.efa is not None else multi)
    placed = link.cluster_placement and (pool.placement_group if pool.placement_group is not None else multi)
    unplaced = spec.cluster.placement_group_problem() if placed else None
    if unplaced is not None:
        problems.append(Problem(f"gpu_pools[{index}].placement_group", unplaced))
    return {
        "multi_node": multi,
        "efa_interfaces": link.efa_interfaces if efa else 0,
        "placement_group": placed,
    }, problems


NODE_CACHE_SLACK = 1.1


def _node_cache(
    index: int,
    asked_gib: int | None,
    instance: catalog.InstanceType,
    members: list[ModelSpec],
    placements: dict[str, Placement],
) -> tuple[int, fetch.CacheMedium | None, list[Problem]]:
    """Size of a pool's node cache (GiB per node) and where it is; a cache larger than the NVMe is refused."""
    cached = [m for m in members if placements[m.name].fetch.path is fetch.FetchPath.NODE_CACHE]
    if not cached and asked_gib is None:
        return 0, None, []
    # A model served in versions keeps a copy per version (each loads its own store prefix).
    need = math.ceil(sum(placements[m.name].weights_gib * m.serving_units for m in cached) * NODE_CACHE_SLACK)
    size = asked_gib if asked_gib is not None else need
    medium, _ = fetch.cache_medium(instance)
    problems = []
    nvme = fetch.nvme_gib(instance)
    if medium is fetch.CacheMedium.NVME and size > nvme:
        fix = (
            f"lower it to at most {math.floor(nvme):,}"
            if asked_gib is not None and need <= nvme
            else "stream the models instead (weights.fetch: streamer, vLLM) or use an instance type with more"
        )
        problems.append(
            Problem(
                f"gpu_pools[{index}].model_cache_gib",
                f"a {size:,} GiB node cache does not fit the {nvme:,.0f} GiB of local NVMe of {instance.name}: "
                f"{fix}",
            )
        )
    if asked_gib is not None and asked_gib < need:
        problems.append(
            Problem(
                f"gpu_pools[{index}].model_cache_gib",
                f"{asked_gib:,} GiB cannot hold the weights of {', '.join(m.name for m in cached)} "
                f"({need:,} GiB with slack); raise it to at least {need:,}",
            )
        )
    return size, medium, problems


def misfits(
    model: ModelSpec, arch: catalog.ModelArch, instance: catalog.InstanceType, table: Instances
) -> list[str]:
    """Why ``model`` cannot run on one node of ``instance`` (parallelism, precision, memory); empty when it can."""
    found, _ = _check_on_instance("", model, arch, instance, table)
    return [p.message for p in found]


RULES: tuple[PlanRule, ...] = (
    local_sources_need_target_local,
    gpu_engines_need_a_cluster,
    sleep_fits_the_host,
)
"""Placement's plan-time rules, beside what ``plan`` finds placing (``components.core.plan_rules`` runs them all)."""
