"""vLLM: its command line (a cluster pod and ``make local`` get the same one), where its images write, and its
start-up figures. vLLM's rendered command lines are parsed by vLLM's own argument parser in the tests."""

from __future__ import annotations

from components.engines.common import (
    HF_CACHE,
    POD_ENV,
    SHM,
    TORCH_INDUCTOR,
    TRITON,
    EngineCommand,
    EngineProfile,
    ImageFacts,
    Where,
    Write,
    kv_cache_dtype,
    kv_events,
    kv_transfer_args,
    lora_args,
    quantization,
    sleep_args,
    start,
    switched,
    valued,
)
from components.spec import Device, ModelSpec
from runtime.config import EngineKind, Task
from runtime.engines import facts

KIND = EngineKind.VLLM


def command(model: ModelSpec, where: Where) -> EngineCommand:
    """The vLLM command line of ``model``: a pod's, or ``make local``'s (only ``where`` differs)."""
    e, cli = model.engine, facts(KIND).cli
    pooling = model.resolved_task() is Task.EMBED
    args = [
        *start(cli, model, where),
        *valued(cli.tensor_parallel_size, e.tensor_parallel_size),
        *valued(cli.pipeline_parallel_size, e.pipeline_parallel_size),
        *valued(cli.dtype, e.dtype.value),
        *valued(cli.max_model_len, e.max_model_len),
        *valued(cli.max_num_seqs, e.max_num_seqs),
        *valued(cli.download_dir, where.download_dir),
    ]
    if e.device is Device.GPU:
        args += valued(cli.gpu_memory_utilization, f"{model.memory_utilization:g}")
    if e.cpu_kv_offload_gib:
        args += valued(cli.cpu_kv_offload_gib, f"{e.cpu_kv_offload_gib:g}")
    args += quantization(cli, model) + kv_cache_dtype(cli, e)
    args += valued(cli.max_num_batched_tokens, e.max_num_batched_tokens)
    # Pooling models: vLLM turns prefix caching and chunked prefill on only where the architecture supports
    # them (not for bidirectional encoders such as BERT, where forcing them "may crash or produce incorrect
    # outputs", vLLM warns), so there only an explicit "off" is passed on.
    for switch, on in (
        (cli.prefix_caching, e.enable_prefix_caching),
        (cli.chunked_prefill, e.enable_chunked_prefill),
    ):
        if not (pooling and on):
            args += switched(switch, on)
    args += switched(cli.enforce_eager, e.enforce_eager)
    args += switched(cli.trust_remote_code, e.trust_remote_code)
    if pooling:
        args += cli.embedding
    args += kv_events(cli, model, where)
    if where.model.startswith("s3://"):
        args += cli.stream_from_s3
    lora, lora_env = lora_args(model)
    sleep, sleep_env = sleep_args(model)
    kv, kv_env = kv_transfer_args(model)
    args += [*lora, *sleep, *kv, *cli.fixed_args, *e.extra_args]
    return EngineCommand(
        command=list(cli.command), args=args, env={**POD_ENV, **lora_env, **sleep_env, **kv_env}
    )


IMAGE = ImageFacts(
    user="root",
    writes=(HF_CACHE, Write("~/.cache/vllm"), Write("~/.config/vllm"), TRITON, TORCH_INDUCTOR, SHM),
    source=(
        "vLLM 0.32.0: docker/Dockerfile has no USER (root); docs/deployment/docker.md mounts the Hugging "
        "Face cache at /root/.cache/huggingface and asks for --ipc=host; vllm/envs.py: VLLM_CACHE_ROOT "
        "~/.cache/vllm (torch.compile cache), VLLM_CONFIG_ROOT ~/.config/vllm. The CPU build run under the "
        "rendered context wrote ~/.cache/vllm and /tmp/torchinductor_uid_10001 (tests/integration)."
    ),
)


PROFILE = EngineProfile(
    kind=KIND,
    command=command,
    image=IMAGE,
    # Compressed images: "vLLM, SGLang, and TensorRT-LLM are large, typically exceeding 10 GB"
    # (tensorfuse.io/docs/blogs/snapshotter_graphs); the CPU build is about 3 GB.
    image_gib={"gpu": 10.0, "cpu": 3.0},
    # After the weights: torch.compile, CUDA graph capture, KV cache profiling. vLLM's start-up is dominated by such
    # CPU-bound steps ("Breaking the Ice: Analyzing Cold Start Latency in vLLM", arxiv.org/html/2606.07362).
    init_s=120,
)
