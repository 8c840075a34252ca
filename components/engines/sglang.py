"""SGLang: its command line (``sglang.srt.server_args``), where its image writes, and its start-up figures."""

from __future__ import annotations

from components.base.sizing import DEFAULT_BATCHED_TOKENS
from components.engines.common import (
    FLASHINFER_JIT,
    POD_ENV,
    EngineCommand,
    EngineProfile,
    ImageFacts,
    Where,
    kv_cache_dtype,
    quantization,
    start,
    switched,
    valued,
)
from components.spec import ModelSpec
from runtime.config import EngineKind, Task
from runtime.engines import facts

KIND = EngineKind.SGLANG


def command(model: ModelSpec, where: Where) -> EngineCommand:
    """The SGLang command line of ``model`` (``python3 -m sglang.launch_server ...``)."""
    engine = facts(KIND)
    e, cli = model.engine, engine.cli
    args = [
        *start(cli, model, where),
        *valued(cli.tensor_parallel_size, e.tensor_parallel_size),
        *valued(cli.pipeline_parallel_size, e.pipeline_parallel_size),
        *valued(cli.dtype, e.dtype.value),
        *valued(cli.gpu_memory_utilization, f"{model.memory_utilization:g}"),
        *valued(cli.max_model_len, e.max_model_len),
        *valued(cli.max_num_seqs, e.max_num_seqs),
        *valued(cli.download_dir, where.download_dir),
        *engine.metrics_flag,
        *quantization(cli, model),
        *kv_cache_dtype(cli, e),
    ]
    # SGLang sizes prefill chunks instead of switching chunking: -1 turns it off, and then the batched-token
    # budget is the prefill limit.
    if e.enable_chunked_prefill:
        args += valued(cli.chunked_prefill_size, e.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS)
    else:
        args += valued(cli.chunked_prefill_size, -1)
        args += valued(cli.max_num_batched_tokens, e.max_num_batched_tokens)
    args += switched(cli.prefix_caching, e.enable_prefix_caching)
    args += switched(cli.enforce_eager, e.enforce_eager)
    args += switched(cli.trust_remote_code, e.trust_remote_code)
    if model.resolved_task() is Task.EMBED:
        args += cli.embedding
    args += [*cli.fixed_args, *e.extra_args]
    return EngineCommand(command=list(cli.command), args=args, env=dict(POD_ENV))


IMAGE = ImageFacts(
    user="root",
    writes=FLASHINFER_JIT,
    source=(
        "SGLang 0.5.3 (lmsysorg/sglang:v0.5.3-cu126): docker/Dockerfile has no USER (root, WORKDIR "
        "/sgl-workspace); docker/compose.yaml mounts ~/.cache/huggingface at /root/.cache/huggingface with "
        "ipc: host; FlashInfer compiles kernels into ~/.cache/flashinfer (FLASHINFER_WORKSPACE_BASE "
        "defaults to the home directory)."
    ),
)


PROFILE = EngineProfile(kind=KIND, command=command, image=IMAGE, image_gib={"gpu": 12.0}, init_s=120)
