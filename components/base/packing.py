"""Packing engines onto shared GPUs: pure functions over plain values (no spec, no cloud).

Two mechanisms, as the NVIDIA device plugin offers them. Time-slicing advertises each GPU ``slots`` times
and Kubernetes may put *any* ``slots`` engines of the pool on one GPU (it does not know memory), so memory
is safe only if the ``slots`` largest shares fit together: ``slots <= 1 / largest fraction``. Every engine's
``gpu_memory_utilization`` is its fraction of ``SHARED_GPU_SAFE_TOTAL``; fractions that sum to at most 1
keep the card under that total. MIG cuts a GPU into isolated instances: an instance takes a contiguous run
of the eight memory slices starting at one of its profile's placements, and instances never overlap
(``catalog.MigProfile``). A replica without a share takes whole GPUs and is never packed with another.

``placement`` checks the spec against these rules and reports mistakes; ``cost`` charges a replica
``gpu_share``; plan prints ``Packing.lines``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from components.base import catalog, sizing

SHARED_GPU_SAFE_TOTAL = 0.90
"""The most of a time-sliced GPU's memory its engines together may take (vLLM's default
gpu_memory_utilization for one engine alone): the rest is the driver's and the allocators' slack."""
MAX_TIME_SLICES = 16
"""Most time-sliced engines per GPU planned: each carries its own CUDA context and copy of its weights."""


class Mechanism(StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MIG = "mig"


def shared_memory_utilization(fraction: float) -> float:
    """A time-sliced engine's gpu_memory_utilization: its fraction of the safe total, rounded down (so a sum
    of fractions at most 1 stays at most ``SHARED_GPU_SAFE_TOTAL``)."""
    return math.floor(fraction * SHARED_GPU_SAFE_TOTAL * 10_000) / 10_000


def host_device(memory_gib: float) -> catalog.Gpu:
    """The memory a machine gives its CPU engines, as the device they share (vLLM-CPU keeps weights, activations
    and KV cache in host memory): the same sizing then budgets a CPU engine's share as a GPU engine's."""
    return catalog.Gpu("host memory", catalog.GpuArch.AMPERE, memory_gib, 0.0, 0.0, "", ())


FRACTION_STEP = 0.05
"""The grain of the fractions plan suggests."""


def mig_device(gpu: catalog.Gpu, profile: catalog.MigProfile) -> catalog.Gpu:
    """A MIG instance as the engine sees it: a GPU with the instance's memory, compute and bandwidth."""
    return catalog.Gpu(
        f"{gpu.name} MIG {profile.name}",
        gpu.arch,
        profile.memory_gib(gpu),
        gpu.bf16_dense_tflops * profile.compute_slices / catalog.MIG_COMPUTE_SLICES,
        gpu.memory_bandwidth_gbps * profile.memory_slices / catalog.MIG_MEMORY_SLICES,
        gpu.product_label,
        (),  # a MIG instance is not cut again
    )


def smallest_mig_profile(
    arch: catalog.ModelArch, shape: sizing.EngineShape, gpu: catalog.Gpu
) -> catalog.MigProfile | None:
    """The smallest MIG instance of ``gpu`` that holds one replica; None when none does or it has no MIG."""
    fitting = [p for p in gpu.mig_profiles if sizing.memory_fit(arch, shape, mig_device(gpu, p)).fits]
    return min(fitting, key=lambda p: (p.memory_slices, p.compute_slices), default=None)


def smallest_fraction(arch: catalog.ModelArch, shape: sizing.EngineShape, gpu: catalog.Gpu) -> float | None:
    """The smallest time-sliced fraction of ``gpu`` (in FRACTION_STEP) that holds one replica; None when none."""
    for i in range(1, round(1 / FRACTION_STEP)):
        fraction = round(FRACTION_STEP * i, 2)
        trial = dataclasses.replace(shape, gpu_memory_utilization=shared_memory_utilization(fraction))
        if sizing.memory_fit(arch, trial, gpu).fits:
            return fraction
    return None


def cpu_kv_cache_space_gib(fit: sizing.MemoryFit) -> int:
    """vLLM-CPU's KV cache (``VLLM_CPU_KVCACHE_SPACE``, whole GiB): what an engine's budget leaves after weights,
    activations and runtime, rounded down. 0 means the share is too small for any KV cache."""
    return max(0, math.floor(fit.kv_budget_gib))


def slots_for(fractions: Sequence[float]) -> int:
    """Time-sliced engines one GPU may take when any of them may land together: 1 / the largest fraction."""
    if not fractions:
        return 1
    return max(1, min(MAX_TIME_SLICES, math.floor(1 / max(fractions) + 1e-9)))


@dataclass(frozen=True)
class Engine:
    """One replica to place: a time-sliced fraction, a MIG profile, or neither (whole GPUs)."""

    model: str
    fraction: float | None = None
    profile: catalog.MigProfile | None = None
    gpus: int = 1  # whole GPUs, when it shares none

    @property
    def whole(self) -> bool:
        return self.fraction is None and self.profile is None


@dataclass(frozen=True)
class Seat:
    """An engine on one GPU: what it takes there."""

    model: str
    gpu_fraction: float  # the share of the GPU it blocks (and is charged for)
    memory_fraction: float  # the share of the GPU's memory it may use
    start: int | None = None  # MIG: the first memory slice of its instance
    profile: str | None = None


@dataclass(frozen=True)
class GpuLoad:
    """One GPU and the engines packed onto it."""

    seats: tuple[Seat, ...]

    @property
    def memory_fraction(self) -> float:
        return sum(s.memory_fraction for s in self.seats)


@dataclass(frozen=True)
class Packing:
    """Every replica of a pool at its max, on GPUs, and the nodes those GPUs need."""

    mechanism: Mechanism
    gpu: str
    gpus_per_node: int
    slots_per_gpu: int  # time-slicing: engines per GPU (the device plugin's replicas); 1 otherwise
    gpus: tuple[GpuLoad, ...]
    node_layout: tuple[GpuLoad, ...] | None = None
    """MIG: one node's GPUs, cut the same way on every node of the pool (``mig_node_layout``)."""
    node_count: int | None = None

    @property
    def nodes(self) -> int:
        if self.node_count is not None:
            return self.node_count
        return math.ceil(len(self.gpus) / self.gpus_per_node) if self.gpus else 0

    def lines(self, memory_gib: float) -> list[str]:
        """The packing for plan: each GPU, its engines and their memory (GPUs with the same load once)."""
        out: list[str] = []
        groups: list[tuple[tuple[Seat, ...], int]] = []
        for load in self.gpus:
            if groups and groups[-1][0] == load.seats:
                groups[-1] = (load.seats, groups[-1][1] + 1)
            else:
                groups.append((load.seats, 1))
        index = 0
        for seats, count in groups:
            label = f"GPU {index}" if count == 1 else f"GPUs {index}-{index + count - 1}"
            index += count
            parts = []
            for s in seats:
                if s.profile:  # an isolated instance: its own memory
                    gib = s.memory_fraction * memory_gib
                    parts.append(f"{s.model} (mig {s.profile} @slice {s.start}, {gib:.1f} GiB)")
                else:  # a share: the engine takes its fraction of the safe total
                    gib = shared_memory_utilization(s.memory_fraction) * memory_gib
                    parts.append(f"{s.model} ({s.memory_fraction:.2f} share, engine {gib:.1f} GiB)")
            total = sum(s.memory_fraction for s in seats)
            out.append(f"{label}: {', '.join(parts)}; {total:.0%} of its {memory_gib:.1f} GiB taken")
        return out


def gpu_share(engine: Engine, slots_per_gpu: int) -> float:
    """GPUs one replica is charged for: its time slice, its MIG instance's slices, or its whole GPUs."""
    if engine.profile is not None:
        return engine.profile.gpu_fraction
    if engine.fraction is not None:
        return 1 / slots_per_gpu
    return float(engine.gpus)


def _whole(engines: Sequence[Engine]) -> list[GpuLoad]:
    """Whole-GPU replicas: each GPU alone."""
    return [GpuLoad((Seat(e.model, 1.0, 1.0),)) for e in engines if e.whole for _ in range(e.gpus)]


def pack_time_sliced(engines: Sequence[Engine], slots_per_gpu: int) -> list[GpuLoad]:
    """First-fit decreasing by fraction: at most ``slots_per_gpu`` engines and a memory sum of at most 1 per GPU."""
    shared = sorted(
        (e for e in engines if e.fraction is not None), key=lambda e: (-(e.fraction or 0), e.model)
    )
    bins: list[list[Engine]] = []
    for e in shared:
        f = e.fraction or 0.0
        home = next(
            (b for b in bins if len(b) < slots_per_gpu and sum(x.fraction or 0 for x in b) + f <= 1 + 1e-9),
            None,
        )
        if home is None:
            bins.append([e])
        else:
            home.append(e)
    loads = [GpuLoad(tuple(Seat(e.model, 1 / slots_per_gpu, e.fraction or 0.0) for e in b)) for b in bins]
    return _whole(engines) + loads


def _free_start(profile: catalog.MigProfile, used: set[int], compute: int) -> int | None:
    if compute + profile.compute_slices > catalog.MIG_COMPUTE_SLICES:
        return None
    for start in profile.placements:
        if not set(range(start, start + profile.memory_slices)) & used:
            return start
    return None


def pack_mig(engines: Sequence[Engine]) -> list[GpuLoad]:
    """First-fit decreasing by memory slices: each instance at a free placement of its profile, within the
    GPU's seven compute slices."""
    shared = sorted(
        (e for e in engines if e.profile is not None),
        key=lambda e: (-(e.profile.memory_slices if e.profile else 0), e.model),
    )
    gpus: list[tuple[set[int], list[tuple[Engine, int]]]] = []
    for e in shared:
        profile = e.profile
        assert profile is not None
        for used, seated in gpus:
            start = _free_start(profile, used, sum(x.profile.compute_slices for x, _ in seated if x.profile))
            if start is not None:
                used |= set(range(start, start + profile.memory_slices))
                seated.append((e, start))
                break
        else:
            start = profile.placements[0]
            gpus.append((set(range(start, start + profile.memory_slices)), [(e, start)]))
    loads = [
        GpuLoad(
            tuple(
                Seat(e.model, e.profile.gpu_fraction, e.profile.gpu_fraction, start, e.profile.name)
                for e, start in sorted(seated, key=lambda x: x[1])
                if e.profile is not None
            )
        )
        for _, seated in gpus
    ]
    return _whole(engines) + loads


def mig_node_layout(engines: Sequence[Engine], gpus_per_node: int) -> tuple[int, tuple[GpuLoad, ...]] | None:
    """A node group's nodes are cut alike: the fewest nodes ``n`` for which one node, partitioned once, holds
    ceil(replicas / n) of every model; (n, that node's GPUs). None when even one replica of each does not fit a
    node (the pool's models need more GPUs than a node has, with one partitioning)."""
    counts: dict[str, tuple[catalog.MigProfile, int]] = {}
    for e in engines:
        if e.profile is not None:
            profile, count = counts.get(e.model, (e.profile, 0))
            counts[e.model] = (profile, count + 1)
    if not counts:
        return 0, ()
    most = max(count for _, count in counts.values())
    start = max(1, math.ceil(len(pack_mig(engines)) / gpus_per_node))
    for nodes in range(start, most + 1):
        per_node = [
            Engine(model, profile=profile)
            for model, (profile, count) in counts.items()
            for _ in range(math.ceil(count / nodes))
        ]
        layout = pack_mig(per_node)
        if len(layout) <= gpus_per_node:
            return nodes, tuple(layout)
    return None


def mig_parted_config(name: str, layout: Sequence[GpuLoad], gpus_per_node: int) -> dict[str, object]:
    """One node's partitioning in nvidia-mig-parted's config format (``nvidia-mig-parted apply -f <file> -c
    <name>``, or the GPU operator's MIG manager): GPUs cut alike share an entry; the rest stay whole."""
    entries: list[dict[str, object]] = []
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for index, load in enumerate(layout):
        devices: dict[str, int] = {}
        for seat in load.seats:
            if seat.profile is not None:
                devices[seat.profile] = devices.get(seat.profile, 0) + 1
        groups.setdefault(tuple(sorted(devices.items())), []).append(index)
    for devices_key, indices in groups.items():
        entries.append({"devices": indices, "mig-enabled": True, "mig-devices": dict(devices_key)})
    rest = list(range(len(layout), gpus_per_node))
    if rest:
        entries.append({"devices": rest, "mig-enabled": False})
    return {"version": "v1", "mig-configs": {name: entries}}


def pack(
    mechanism: Mechanism,
    engines: Sequence[Engine],
    gpu: str,
    gpus_per_node: int,
    slots_per_gpu: int = 1,
) -> Packing:
    """All ``engines`` of one pool on GPUs of model ``gpu``, by the pool's mechanism."""
    if mechanism is Mechanism.TIME_SLICING:
        loads = pack_time_sliced(engines, slots_per_gpu)
    elif mechanism is Mechanism.MIG:
        loads = pack_mig(engines)
        node = mig_node_layout(engines, gpus_per_node)
        if node is not None:  # nodes cut alike: the node count follows one node's layout
            count, layout = node
            return Packing(mechanism, gpu, gpus_per_node, 1, tuple(loads), layout, count)
    else:
        loads = _whole(engines)
        slots_per_gpu = 1
    return Packing(mechanism, gpu, gpus_per_node, slots_per_gpu, tuple(loads))
