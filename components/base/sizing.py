"""GPU memory fit and instance choice: pure functions over the catalog.

How vLLM (and SGLang, TensorRT-LLM) spend a GPU: the engine takes ``gpu_memory_utilization`` of the
card; weights, activations at peak batch and runtime buffers come off the top; what is left is the KV
cache. An engine starts when that KV budget holds at least one sequence of ``max_model_len`` and
serves as many concurrent full-length sequences as the budget holds, up to ``max_num_seqs``. So the
fit is a breakdown, and "fits" means "the engine starts"; how much of ``max_num_seqs`` the KV cache
covers at full length is reported beside it (``kv_coverage``), because demanding the worst case
(every sequence at full length at once) would reject every realistic production configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from components.base import catalog
from runtime.defaults import DEFAULT_MAX_NUM_SEQS

GIB = 1024**3
KIB = 1024

# AWQ/GPTQ store 4-bit weights plus an fp16 scale and zero point per group of 128: 4/8 + 4/128 bytes.
_FOUR_BIT_BYTES = 0.5 + 4 / 128
# Peak activation memory per scheduled token, in units of hidden_size x dtype bytes (attention and MLP
# intermediates alive at once during the profiling forward pass; vLLM's profile lands near 10-14x).
_ACTIVATION_FACTOR = 12
# CUDA context, NCCL and allocator slack per GPU; NCCL buffers grow with tensor parallelism.
_RUNTIME_GIB = 1.0
_NCCL_GIB = 0.5
_CUDA_GRAPHS_GIB = 0.5
# Default chunked-prefill token budget of the engines when the spec leaves it unset.
DEFAULT_BATCHED_TOKENS = 8192


class Precision(StrEnum):
    """Bytes-per-value choices that matter to memory (the spec's dtype/quantization map onto these)."""

    FP32 = "fp32"
    FP16 = "fp16"  # also bf16
    FP8 = "fp8"  # also int8
    INT4 = "int4"  # awq / gptq


BYTES: dict[Precision, float] = {
    Precision.FP32: 4.0,
    Precision.FP16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT4: _FOUR_BIT_BYTES,
}


def weight_precision(quantization: str, dtype: str) -> Precision:
    """Storage precision of the quantized layers for a spec's quantization and dtype."""
    if quantization in ("awq", "gptq"):
        return Precision.INT4
    if quantization in ("fp8", "int8"):
        return Precision.FP8
    return Precision.FP32 if dtype == "float32" else Precision.FP16


def kv_precision(kv_cache_dtype: str, dtype: str) -> Precision:
    if kv_cache_dtype.startswith("fp8"):
        return Precision.FP8
    return Precision.FP32 if dtype == "float32" else Precision.FP16


def weight_bytes(arch: catalog.ModelArch, weights: Precision, dtype: str = "auto") -> float:
    """All weights of one replica. Embeddings and the LM head stay in the model dtype when quantized."""
    embedding_params = 2 * arch.vocab_size * arch.hidden_size
    body_params = max(arch.params_b * 1e9 - embedding_params, 0.0)
    dense = BYTES[weight_precision("none", dtype)]
    quantized = min(BYTES[weights], dense)
    return body_params * quantized + min(embedding_params, arch.params_b * 1e9) * dense


def kv_bytes_per_token(arch: catalog.ModelArch, kv: Precision, tp: int = 1, pp: int = 1) -> float:
    """KV cache bytes one token occupies on one GPU: 2 (K and V) x layers x KV heads x head dim x bytes.

    Tensor parallelism splits KV heads across ranks (replicating them when there are fewer heads than
    ranks); pipeline parallelism splits layers across stages.
    """
    heads_per_rank = math.ceil(arch.kv_heads / tp)
    layers_per_stage = math.ceil(arch.layers / pp)
    return 2 * layers_per_stage * heads_per_rank * arch.head_dim * BYTES[kv]


@dataclass(frozen=True)
class EngineShape:
    """The engine settings that decide memory, independent of which spec or CLI they come from."""

    quantization: str = "none"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int = 8192
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.90
    enforce_eager: bool = False
    lora_slots: int = 0  # LoRA adapters one batch may mix (0: no adapters)
    lora_max_rank: int = 0

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or max(DEFAULT_BATCHED_TOKENS, min(self.max_model_len, 16_384))


@dataclass(frozen=True)
class MemoryFit:
    """Per-GPU memory breakdown of one engine replica, in GiB."""

    gpu: str
    gpu_memory_gib: float
    budget_gib: float  # gpu_memory_utilization x GPU memory
    weights_gib: float
    activations_gib: float
    runtime_gib: float
    kv_budget_gib: float  # what is left for the KV cache (negative: weights alone do not fit)
    adapters_gib: float  # LoRA slots: max per batch x max rank, on every wrapped layer
    kv_per_token_kib: float
    kv_one_sequence_gib: float  # one sequence of max_model_len: the engine's start-up minimum
    kv_all_sequences_gib: float  # max_num_seqs sequences of max_model_len: the worst case
    kv_capacity_tokens: int
    max_model_len: int
    max_num_seqs: int

    @property
    def fits(self) -> bool:
        return self.kv_budget_gib >= self.kv_one_sequence_gib

    @property
    def headroom_gib(self) -> float:
        """KV budget left after one full-length sequence; negative means the engine cannot start."""
        return self.kv_budget_gib - self.kv_one_sequence_gib

    @property
    def full_length_sequences(self) -> int:
        return self.kv_capacity_tokens // self.max_model_len

    @property
    def kv_coverage(self) -> float:
        """Share of max_num_seqs the KV cache holds when every sequence is at max_model_len."""
        return min(1.0, self.full_length_sequences / self.max_num_seqs)

    def lines(self) -> list[str]:
        """The breakdown, one line per part, for error messages and `inferstack size`."""
        verdict = "fits" if self.fits else "does NOT fit"
        return [
            f"per {self.gpu} GPU ({self.gpu_memory_gib:.1f} GiB, usable {self.budget_gib:.1f} GiB): {verdict}",
            f"  weights      {self.weights_gib:8.2f} GiB",
            f"  activations  {self.activations_gib:8.2f} GiB",
            f"  runtime      {self.runtime_gib:8.2f} GiB (CUDA context, NCCL, CUDA graphs)",
            *([f"  adapters     {self.adapters_gib:8.2f} GiB (LoRA slots)"] if self.adapters_gib else []),
            f"  KV budget    {self.kv_budget_gib:8.2f} GiB ({self.kv_per_token_kib:.1f} KiB/token, "
            f"{self.kv_capacity_tokens:,} tokens)",
            f"  KV needed    {self.kv_one_sequence_gib:8.2f} GiB for one {self.max_model_len:,}-token sequence; "
            f"{self.kv_all_sequences_gib:.2f} GiB for all {self.max_num_seqs} at full length "
            f"(holds {self.full_length_sequences}, {self.kv_coverage:.0%})",
        ]


def lora_bytes(arch: catalog.ModelArch, slots: int, rank: int, dtype: str = "auto") -> float:
    """GPU memory vLLM sets aside for LoRA: ``slots`` adapters at ``rank`` on every projection of every layer.

    Each wrapped linear layer of input width ``i`` and output width ``o`` holds A (rank x i) and B (o x rank)
    per slot. A Llama-like layer's projections (q, k, v, o, gate, up, down) add up to ``9 h + 2 kv + 3 f``
    in ``i + o`` (``h`` hidden, ``kv`` KV heads x head dim, ``f`` the MLP width, derived from the parameter
    count: a layer is ``2 h^2 + 2 h kv`` of attention plus ``3 h f`` of MLP).
    """
    if not slots or not rank:
        return 0.0
    h, kv = arch.hidden_size, arch.kv_heads * arch.head_dim
    per_layer = max(arch.params_b * 1e9 - 2 * arch.vocab_size * h, 0.0) / arch.layers
    mlp = max((per_layer - 2 * h * h - 2 * h * kv) / (3 * h), h)
    widths = 9 * h + 2 * kv + 3 * mlp
    return slots * rank * arch.layers * widths * BYTES[weight_precision("none", dtype)]


def memory_fit(arch: catalog.ModelArch, shape: EngineShape, gpu: catalog.Gpu) -> MemoryFit:
    """How one replica's memory lands on each of its GPUs."""
    tp, pp = shape.tensor_parallel_size, shape.pipeline_parallel_size
    dense = BYTES[weight_precision("none", shape.dtype)]
    weights = weight_bytes(arch, weight_precision(shape.quantization, shape.dtype), shape.dtype) / (tp * pp)
    activations = (
        shape.batched_tokens * arch.hidden_size * dense * _ACTIVATION_FACTOR / tp
        + shape.max_num_seqs * arch.vocab_size * 4 / tp  # fp32 logits of the sampled positions
    )
    runtime = (
        _RUNTIME_GIB + (_NCCL_GIB if tp * pp > 1 else 0) + (0 if shape.enforce_eager else _CUDA_GRAPHS_GIB)
    ) * GIB
    adapters = lora_bytes(arch, shape.lora_slots, shape.lora_max_rank, shape.dtype) / tp
    budget = shape.gpu_memory_utilization * gpu.memory_gib * GIB
    kv_budget = budget - weights - activations - runtime - adapters
    per_token = kv_bytes_per_token(arch, kv_precision(shape.kv_cache_dtype, shape.dtype), tp, pp)
    return MemoryFit(
        gpu=gpu.name,
        gpu_memory_gib=gpu.memory_gib,
        budget_gib=budget / GIB,
        weights_gib=weights / GIB,
        activations_gib=activations / GIB,
        runtime_gib=runtime / GIB,
        kv_budget_gib=kv_budget / GIB,
        adapters_gib=adapters / GIB,
        kv_per_token_kib=per_token / KIB,
        kv_one_sequence_gib=per_token * shape.max_model_len / GIB,
        kv_all_sequences_gib=per_token * shape.max_model_len * shape.max_num_seqs / GIB,
        kv_capacity_tokens=max(0, int(kv_budget // per_token)),
        max_model_len=shape.max_model_len,
        max_num_seqs=shape.max_num_seqs,
    )


def gpu_supports(gpu: catalog.Gpu, shape: EngineShape) -> str | None:
    """Why this GPU cannot run this precision, or None when it can."""
    if shape.quantization == "fp8" and not gpu.supports_fp8:
        return f"fp8 weights need an Ada, Hopper or Blackwell GPU; {gpu.name} is {gpu.arch.value}"
    if shape.kv_cache_dtype == "fp8_e4m3" and not gpu.supports_fp8:
        return f"an fp8_e4m3 KV cache needs an Ada, Hopper or Blackwell GPU; {gpu.name} is {gpu.arch.value}"
    if shape.dtype == "bfloat16" and not gpu.supports_bf16:
        return f"{gpu.name} ({gpu.arch.value}) has no bfloat16; use dtype float16 or auto"
    return None


@dataclass(frozen=True)
class Candidate:
    """An instance type that can host a replica, and what a replica costs there."""

    instance: catalog.InstanceType
    tensor_parallel_size: int
    pipeline_parallel_size: int
    fit: MemoryFit

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def nodes(self) -> int:
        """Nodes one replica spans (a multi-node group fills whole nodes, ``components.core.multinode``)."""
        return max(1, self.gpus_per_replica // self.instance.gpus)

    @property
    def replicas_per_node(self) -> int:
        return max(1, self.instance.gpus // self.gpus_per_replica)

    @property
    def usd_per_replica_month(self) -> float:
        """Its share of a node's price: GPUs used over the node's GPUs (a group of N nodes: N node prices)."""
        share = self.gpus_per_replica / self.instance.gpus
        return self.instance.on_demand_usd_per_hour * catalog.HOURS_PER_MONTH * share


def parallel_options(instance: catalog.InstanceType, pp: int = 1) -> list[int]:
    """Tensor-parallel sizes that split evenly across a node's GPUs."""
    return [tp for tp in (1, 2, 4, 8) if tp * pp <= instance.gpus and instance.gpus % (tp * pp) == 0]


def candidates(
    arch: catalog.ModelArch,
    shape: EngineShape,
    *,
    fixed_parallelism: bool,
    instances: list[catalog.InstanceType] | None = None,
) -> list[Candidate]:
    """Every instance type (and, unless fixed, the smallest tensor-parallel size) where a replica fits.

    Ranked by monthly on-demand cost per replica, cheapest first; ties go to fewer GPUs.
    """
    found: list[Candidate] = []
    for instance in instances if instances is not None else catalog.INSTANCE_TYPES.values():
        gpu = instance.gpu_spec
        if gpu_supports(gpu, shape) is not None:
            continue
        pp = shape.pipeline_parallel_size
        options = [shape.tensor_parallel_size] if fixed_parallelism else parallel_options(instance, pp)
        for tp in options:
            if tp * pp > instance.gpus or instance.gpus % (tp * pp):
                continue
            trial = EngineShape(**{**shape.__dict__, "tensor_parallel_size": tp})
            fit = memory_fit(arch, trial, gpu)
            if fit.fits:
                found.append(Candidate(instance, tp, pp, fit))
                break
    return sorted(found, key=lambda c: (c.usd_per_replica_month, c.gpus_per_replica, c.instance.name))
