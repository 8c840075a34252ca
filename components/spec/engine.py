"""A model's engine (models[].engine) and its architecture: the serving engine and every launch knob it takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from components.base import catalog
from components.base.enums import Device, DType, KvCacheDType, Quantization
from components.spec.base import PinnedImage, _Spec
from runtime.config import EngineKind
from runtime.defaults import DEFAULT_MAX_NUM_SEQS
from runtime.engines import ENGINES, Capabilities, facts


def engines_that(can: Callable[[Capabilities], bool]) -> str:
    """The engine kinds with a capability, for a message's "use kind: ..." (the engine table decides)."""
    return " or ".join(kind.value for kind, engine in ENGINES.items() if can(engine.can)) or "none here"


class ArchitectureSpec(_Spec):
    """Model shape, for models the catalog does not know."""

    params_b: Annotated[float, Field(gt=0)]
    """Parameters, in billions (all experts for mixture-of-experts)."""
    layers: Annotated[int, Field(ge=1)]
    """Transformer layers (config.json num_hidden_layers); with kv_heads and head_dim, sizes the KV cache."""
    kv_heads: Annotated[int, Field(ge=1)]
    """Key/value heads (grouped-query attention)."""
    head_dim: Annotated[int, Field(ge=1)]
    """Width of one attention head (config.json head_dim, else hidden_size / num_attention_heads)."""
    hidden_size: Annotated[int, Field(ge=1)]
    """Model width (config.json hidden_size); sizes activation memory and the embedding table."""
    max_context_tokens: Annotated[int, Field(ge=1)] = 8192
    """Longest context the model supports, in tokens (config.json max_position_embeddings); the policy pack
    sizes an engine whose command line sets no maximum length with it."""
    vocab_size: Annotated[int, Field(ge=1)] = 32_000
    """Tokens in the vocabulary (config.json vocab_size); sizes the embedding table and the logits."""
    active_params_b: Annotated[float, Field(gt=0)] | None = None
    """Parameters used per token, for mixture-of-experts models."""
    pooling: bool = False
    """An embedding model."""

    def to_catalog(self) -> catalog.ModelArch:
        return catalog.ModelArch(
            params_b=self.params_b,
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            hidden_size=self.hidden_size,
            max_context_tokens=self.max_context_tokens,
            vocab_size=self.vocab_size,
            active_params_b=self.active_params_b,
            pooling=self.pooling,
            source="stack file",
        )


class LoraSpec(_Spec):
    """How many LoRA adapters a replica serves, and how large (for models with adapters)."""

    max_per_batch: Annotated[int, Field(ge=1, le=256)] = 4
    """Adapters one batch may mix: GPU memory is set aside for this many at max_rank (sizing counts it)."""
    max_rank: Annotated[int, Field(ge=1, le=512)] = 16
    """Largest adapter rank a replica serves; every slot is sized for it (vLLM accepts 1, 8, 16, 32, 64,
    128, 256, 320 or 512)."""
    max_loaded: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Adapters a replica holds loaded at once (host memory); the router unloads its least recently used
    one before loading another. Defaults to max_per_batch; at least max_per_batch."""

    @model_validator(mode="after")
    def _loaded_holds_a_batch(self) -> LoraSpec:
        if self.max_loaded is not None and self.max_loaded < self.max_per_batch:
            raise ValueError(
                f"max_loaded ({self.max_loaded}) is below max_per_batch ({self.max_per_batch}): a batch mixes "
                f"only loaded adapters; raise max_loaded to at least {self.max_per_batch}"
            )
        return self

    @property
    def loaded(self) -> int:
        return self.max_loaded or self.max_per_batch


class EngineSpec(_Spec):
    """The serving engine and every launch knob it takes."""

    kind: EngineKind = EngineKind.VLLM
    """vllm, sglang or trtllm."""
    image: PinnedImage | None = None
    """Container image pinned by tag or digest; defaults to the tested image for the engine and device."""
    device: Device = Device.GPU
    """gpu, or cpu for small models on CPU nodes (kind clusters, local)."""
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    """GPUs each layer of a replica is split across; a replica uses tensor x pipeline_parallel_size GPUs,
    which must divide the GPUs of one node of its pool, or fill whole nodes (a multi-node replica: one
    LeaderWorkerSet group, e.g. 8 x 2 on two 8-GPU nodes)."""
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=16)] = 1
    """Stages a replica's layers are split into, each on its own tensor-parallel group of GPUs; 1 = none. Across
    nodes, keep tensor_parallel_size at a node's GPUs and make this the node count (stages talk less than ranks)."""
    nodes: Annotated[int, Field(ge=1, le=64)] | None = None
    """Nodes one replica spans; derived from tensor x pipeline_parallel_size and the pool's GPUs per node (set
    it to state the intent: the plan fails when the two disagree)."""
    dtype: DType = DType.AUTO
    """Activation and weight precision before quantization."""
    quantization: Quantization = Quantization.NONE
    """Weight format: none (dtype), awq or gptq (4-bit checkpoints), fp8 or int8 (8-bit; fp8 needs an Ada,
    Hopper or Blackwell GPU); sizing counts weight memory by it."""
    kv_cache_dtype: KvCacheDType = KvCacheDType.AUTO
    """KV cache precision: auto (the model's dtype) or an fp8 format, half the memory per token of 16-bit
    (fp8_e4m3 needs an Ada, Hopper or Blackwell GPU)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.98)] = 0.90
    """Share of each GPU's memory the engine may use (weights, KV cache, activations)."""
    max_model_len: Annotated[int, Field(ge=16)] = 8192
    """Longest prompt plus completion, in tokens."""
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] = DEFAULT_MAX_NUM_SEQS
    """Sequences decoded together; also the router's per-replica concurrency cap."""
    max_num_batched_tokens: Annotated[int, Field(ge=16)] | None = None
    """Tokens per scheduler step; defaults to the engine's choice (8192 with chunked prefill)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of prompt prefixes already computed (vLLM prefix caching, SGLang radix cache,
    TensorRT-LLM block reuse); prefix-affine routing pays off only with it. For embedding models vLLM
    keeps it only where the architecture supports it (not for BERT-like encoders)."""
    enable_chunked_prefill: bool = True
    """Split long prompts into chunks scheduled beside decode steps, so one long prompt does not stall
    streaming; off, max_num_batched_tokens must hold max_model_len. For embedding models vLLM keeps it
    only where the architecture supports it (not for BERT-like encoders)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (less memory, slower decode)."""
    cpu_kv_offload_gib: Annotated[float, Field(ge=0, le=4096)] = 0
    """CPU memory per replica that extends the KV cache (vLLM --kv-offloading-size, which replaced the
    removed --swap-space: preempted and evicted prefixes are kept in host memory); 0 = off."""
    trust_remote_code: bool = False
    """Let the engine run Python code from the model repository (custom architectures); only for repos you trust."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra command-line arguments appended verbatim."""
    cpu_cores: Annotated[float, Field(gt=0)] | None = None
    """CPU request per replica; defaults to the instance's share (GPU) or 2 (CPU engines)."""
    memory_gib: Annotated[float, Field(gt=0)] | None = None
    """Memory request per replica; defaults to the instance's share (GPU) or 8 (CPU engines)."""
    lora: LoraSpec = Field(default_factory=LoraSpec)
    """LoRA adapter limits of a replica (only for models with adapters)."""

    @field_validator("extra_args")
    @classmethod
    def _no_listener_overrides(cls, value: list[str]) -> list[str]:
        owned = {"--host", "--port", "--served-model-name", "--model", "--model-path"}
        clash = sorted({a.split("=", 1)[0] for a in value} & owned)
        if clash:
            raise ValueError(
                f"extra_args may not set {', '.join(clash)}: inferstack renders them from the spec"
            )
        return value

    @model_validator(mode="after")
    def _engine_rules(self) -> EngineSpec:
        can = facts(self.kind).can
        device = self.device.value
        if device not in can.devices:
            on_device = engines_that(lambda c: device in c.devices)
            raise ValueError(
                f"device: {device} is supported for {on_device} only, not {self.kind.value}; use kind: {on_device}"
            )
        if self.device is Device.CPU and (self.tensor_parallel_size, self.pipeline_parallel_size) != (1, 1):
            raise ValueError(
                "device: cpu runs one engine process; set tensor_parallel_size and pipeline_parallel_size to 1"
            )
        if self.cpu_kv_offload_gib and (not can.kv_offload or self.device is Device.CPU):
            raise ValueError(
                f"cpu_kv_offload_gib works with kind: {engines_that(lambda c: c.kv_offload)} on GPUs only, not "
                f"{self.kind.value} on {device}; set it to 0"
            )
        if (q := self.quantization.value) not in can.quantizations:
            raise ValueError(
                f"quantization: {q} checkpoints are not served by {facts(self.kind).display_name} ({self.kind.value}) "
                "here (it serves "
                f"{', '.join(sorted(can.quantizations - {'none'}))} checkpoints); use one of those, or kind: "
                f"{engines_that(lambda c: q in c.quantizations)}"
            )
        if (
            not self.enable_chunked_prefill
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_model_len "
                f"({self.max_model_len}) with chunked prefill off, so a full-length prompt can never be "
                f"scheduled; raise it to at least {self.max_model_len} or set enable_chunked_prefill: true"
            )
        return self

    @property
    def gpus(self) -> int:
        return 0 if self.device is Device.CPU else self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def resolved_image(self) -> str:
        if self.image:
            return self.image
        return facts(self.kind).images[self.device.value]
