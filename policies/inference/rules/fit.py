"""Fit: each engine's model fits its GPUs, its parallelism fits its node, its requests fit the node."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from components.base import catalog, sizing
from policies.inference.rules.base import Category, Config, Finding, Res, Rule, Setting, Severity, number
from policies.inference.rules.engines import (
    POOL_INSTANCE_TYPES_SCHEMA,
    engines,
    gpu_pool_of,
    node_pools,
)
from policies.inference.rules.k8s import GPU_RESOURCE, containers, cpu_cores, memory_gib

POOL_SETTING = Setting(
    "pool_instance_types",
    POOL_INSTANCE_TYPES_SCHEMA,
    {},
    "For clusters the stack does not create: node pool name (inferstack.io/pool label) -> AWS instance type.",
)


def _advice(arch: catalog.ModelArch, shape: sizing.EngineShape, instance: catalog.InstanceType) -> str:
    for tp in sizing.parallel_options(instance, shape.pipeline_parallel_size):
        if tp > shape.tensor_parallel_size:
            trial = sizing.EngineShape(**{**shape.__dict__, "tensor_parallel_size": tp})
            if sizing.memory_fit(arch, trial, instance.gpu_spec).fits:
                return (
                    f"set tensor_parallel_size to {tp} (and request {tp * shape.pipeline_parallel_size} GPUs)"
                )
    ranked = sizing.candidates(arch, shape, fixed_parallelism=False)
    if ranked:
        best = ranked[0]
        return (
            f"move it to a pool of {best.instance.name} with tensor_parallel_size {best.tensor_parallel_size}, "
            "or quantize (awq, gptq, fp8), or lower max_model_len"
        )
    return (
        "quantize it (awq, gptq, fp8) or lower max_model_len; no single instance type holds it as configured"
    )


def _model_fits(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    pools = node_pools(resources, config)
    for e in engines(resources):
        pool = gpu_pool_of(e, pools)
        found = e.arch()
        if pool is None or pool.instance is None or found is None or not e.uses_gpu:
            continue
        device = e.device(pool.instance)
        if device is None:
            yield Finding(
                f"{e.res.display}: requests {e.shared_gpu}, a MIG instance the {pool.instance.gpu} GPUs of "
                f"{pool.instance.name} (pool {pool.name}) do not have; request one of their profiles",
                e.res.urn,
            )
            continue
        repo, arch = found
        shape = e.args.shape(arch)
        instance = pool.instance
        unsupported = sizing.gpu_supports(instance.gpu_spec, shape)
        if unsupported:
            yield Finding(
                f"{e.res.display}: {unsupported} (pool {pool.name}, {instance.name}); change the dtype or "
                "quantization, or select a pool with a newer GPU",
                e.res.urn,
            )
            continue
        fit = sizing.memory_fit(arch, shape, device)
        if fit.fits:
            continue
        breakdown = "\n".join(fit.lines())
        yield Finding(
            f"{e.res.display}: {repo} ({shape.quantization if shape.quantization != 'none' else shape.dtype}, "
            f"TP {shape.tensor_parallel_size} x PP {shape.pipeline_parallel_size}, max_model_len "
            f"{shape.max_model_len:,}) does not fit "
            + (f"the {instance.gpu} GPUs" if device is instance.gpu_spec else f"its {device.name} instance")
            + f" of {instance.name} (pool {pool.name}); "
            f"{_advice(arch, shape, instance)}.\n{breakdown}",
            e.res.urn,
        )


MODEL_FITS = Rule(
    name="engine-model-fits-gpus",
    category=Category.FIT,
    severity=Severity.CRITICAL,
    description="Each engine's model fits the GPUs it gets: weights + activations + runtime + the KV cache of "
    "one max_model_len sequence within gpu_memory_utilization of each GPU of the node it selects.",
    remediation="Raise tensor_parallel_size, quantize (awq, gptq, fp8), lower max_model_len, or select a pool "
    "with larger GPUs; `inferstack size MODEL` lists instance types that fit.",
    stack_check=_model_fits,
    settings=(POOL_SETTING,),
)


def _divisors(gpus: int) -> str:
    return ", ".join(str(d) for d in (1, 2, 4, 8) if d <= gpus and gpus % d == 0)


def _parallelism(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    pools = node_pools(resources, config)
    for e in engines(resources):
        pool = gpu_pool_of(e, pools)
        if pool is None or pool.instance is None:
            continue
        have, need = pool.instance.gpus, e.args.gpus_per_node
        if need > have or have % need:
            per = f" over {e.args.nnodes} nodes, {need} a node," if e.args.nnodes > 1 else ""
            yield Finding(
                f"{e.res.display}: tensor x pipeline parallel = {e.args.tp} x {e.args.pp} = {e.args.gpus} GPUs{per} "
                f"{'exceeds' if need > have else 'does not divide'} the {have} GPUs of {pool.instance.name} "
                f"(pool {pool.name}); use a parallel size of {_divisors(have)}, whole nodes across a group, or a "
                "larger instance type",
                e.res.urn,
            )


PARALLELISM = Rule(
    name="engine-parallelism-divides-node",
    category=Category.FIT,
    severity=Severity.HIGH,
    description="Tensor x pipeline parallel GPUs of each engine process (per node, for a multi-node group) are "
    "at most, and divide, the GPU count of the node it selects.",
    remediation="Pick a tensor_parallel_size that divides the node's GPUs (1, 2, 4 or 8) or a larger instance type.",
    stack_check=_parallelism,
    settings=(POOL_SETTING,),
)


def _gpu_request(res: Res, config: Config) -> Iterator[str]:
    for e in engines([res]):
        for c in containers(e.pod, init=False):
            request, limit = number(c.request(GPU_RESOURCE)), number(c.limit(GPU_RESOURCE))
            if c.name != e.container.name:
                if request or limit:
                    yield (
                        f"{res.display}: container {c.name} asks for GPUs besides the engine container; "
                        "only the engine container may request nvidia.com/gpu"
                    )
                continue
            need = e.args.gpus_per_node  # one pod per node of a multi-node group
            if request is None and limit is None and need == 1:
                continue  # a CPU engine (one process, no GPUs)
            if request != limit:
                yield (
                    f"{res.display}: container {c.name} requests {_count(request)} nvidia.com/gpu but limits "
                    f"{_count(limit)}; set both to {need}"
                )
            elif (limit or 0) != need:
                yield (
                    f"{res.display}: container {c.name} gets {_count(limit)} nvidia.com/gpu but runs tensor x "
                    f"pipeline parallel {e.args.tp} x {e.args.pp} = {need}; set requests and limits of "
                    f"nvidia.com/gpu to {need}, or change the parallel size"
                )


def _count(value: float | None) -> str:
    return "no" if value is None else f"{value:g}"


GPU_REQUEST = Rule(
    name="engine-gpu-request-matches-parallelism",
    category=Category.FIT,
    severity=Severity.HIGH,
    description="An engine container's nvidia.com/gpu request equals its limit and equals tensor x pipeline "
    "parallel size; no other container of the pod asks for GPUs.",
    remediation="Set resources.requests and resources.limits of nvidia.com/gpu to tensor_parallel_size x "
    "pipeline_parallel_size.",
    resource_check=_gpu_request,
)


def _resources_fit(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    pools = node_pools(resources, config)
    reserved_cpu = float(config["reserved_cpu"])
    reserved_memory = float(config["reserved_memory_fraction"])
    for e in engines(resources):
        pool = gpu_pool_of(e, pools)
        if pool is None or pool.instance is None or e.gpus == 0:
            continue
        instance = pool.instance
        share = min(1.0, e.gpus / instance.gpus)
        cpu_share = (instance.vcpus - reserved_cpu) * share
        mem_share = instance.memory_gib * (1 - reserved_memory) * share
        cpu = sum(cpu_cores(c.request("cpu")) or 0.0 for c in containers(e.pod, init=False))
        mem = sum(memory_gib(c.request("memory")) or 0.0 for c in containers(e.pod, init=False))
        problems = []
        if cpu > cpu_share + 1e-6:
            problems.append(f"CPU {cpu:g} cores > {cpu_share:.1f}")
        if mem > mem_share + 1e-6:
            problems.append(f"memory {mem:.1f} GiB > {mem_share:.1f} GiB")
        if problems:
            yield Finding(
                f"{e.res.display}: requests exceed the allocatable share of {instance.name} for {e.gpus} of its "
                f"{instance.gpus} GPUs ({'; '.join(problems)}), so replicas would stay Pending while GPUs sit "
                f"idle; lower engine.cpu_cores / engine.memory_gib (or cpu_kv_offload_gib) to at most "
                f"{math.floor(cpu_share * 10) / 10:g} cores and {math.floor(mem_share)} GiB",
                e.res.urn,
            )


RESOURCES_FIT = Rule(
    name="engine-requests-fit-node",
    category=Category.FIT,
    severity=Severity.HIGH,
    description="An engine pod's CPU and memory requests fit its node's allocatable share for the GPUs it "
    "takes (node capacity minus kubelet/system reserve, times GPUs used / GPUs on the node).",
    remediation="Lower engine.cpu_cores, engine.memory_gib or cpu_kv_offload_gib, or use a larger instance type.",
    stack_check=_resources_fit,
    settings=(
        POOL_SETTING,
        Setting(
            "reserved_cpu",
            {"type": "number", "minimum": 0},
            2.0,
            "vCPUs per node kept for kubelet and daemons.",
        ),
        Setting(
            "reserved_memory_fraction",
            {"type": "number", "minimum": 0, "maximum": 0.9},
            0.10,
            "Share of node memory kept for kubelet, system daemons and DaemonSets.",
        ),
    ),
)

RULES = (MODEL_FITS, PARALLELISM, GPU_REQUEST, RESOURCES_FIT)
