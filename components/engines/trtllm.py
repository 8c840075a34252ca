"""TensorRT-LLM: the ``trtllm-serve serve`` command line and the options file it reads, where its image writes,
and its start-up figures."""

from __future__ import annotations

from components.base.sizing import DEFAULT_BATCHED_TOKENS
from components.engines.common import (
    ENGINE_CONFIG_DIR,
    FLASHINFER_JIT,
    POD_ENV,
    EngineCommand,
    EngineProfile,
    ImageFacts,
    Where,
    start,
    switched,
    valued,
)
from components.spec import EngineSpec, KvCacheDType, ModelSpec
from runtime.config import EngineKind
from runtime.engines import facts

KIND = EngineKind.TRTLLM
OPTIONS_FILE = "extra-llm-api-options.yaml"


def _options(e: EngineSpec) -> str:
    """TensorRT-LLM's options file: the knobs trtllm-serve takes as keys, not flags (see ``runtime.engines``)."""
    kv_dtype = "fp8" if e.kv_cache_dtype is not KvCacheDType.AUTO else "auto"
    return (
        "enable_chunked_prefill: " + ("true" if e.enable_chunked_prefill else "false") + "\n"
        # Iteration stats behind trtllm-serve's JSON /metrics. No return_perf_metrics: that option came with
        # /prometheus/metrics (NVIDIA/TensorRT-LLM#5785), after 1.0.0, whose strict options reject unknown keys.
        "enable_iter_perf_stats: true\n"
        "kv_cache_config:\n"
        f"  enable_block_reuse: {'true' if e.enable_prefix_caching else 'false'}\n"
        f"  dtype: {kv_dtype}\n"
        f"  free_gpu_memory_fraction: {e.gpu_memory_utilization:g}\n"
        "cuda_graph_config: "
        + ("null" if e.enforce_eager else f"{{max_batch_size: {min(e.max_num_seqs, 512)}}}")
        + "\n"
    )


def command(model: ModelSpec, where: Where) -> EngineCommand:
    """The ``trtllm-serve`` command line of ``model``, and the options file it reads."""
    e, cli = model.engine, facts(KIND).cli
    args = [
        *start(cli, model, where),
        *cli.fixed_args,
        *valued(cli.tensor_parallel_size, e.tensor_parallel_size),
        *valued(cli.pipeline_parallel_size, e.pipeline_parallel_size),
        *valued(cli.max_num_seqs, e.max_num_seqs),
        *valued(cli.max_model_len, e.max_model_len),
        *valued(cli.max_num_batched_tokens, e.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS),
        *valued(cli.gpu_memory_utilization, f"{e.gpu_memory_utilization:g}"),
        *valued(cli.options_file, f"{ENGINE_CONFIG_DIR}/{OPTIONS_FILE}"),
        *switched(cli.trust_remote_code, e.trust_remote_code),
        *e.extra_args,
    ]
    return EngineCommand(
        command=list(cli.command),
        args=args,
        env=dict(POD_ENV),
        files={OPTIONS_FILE: _options(e)},
    )


IMAGE = ImageFacts(
    user="root",
    writes=FLASHINFER_JIT,
    source=(
        "TensorRT-LLM 1.0.0 (nvcr.io/nvidia/tensorrt-llm/release:1.0.0): the release stage of "
        "docker/Dockerfile.multi has no USER (root, WORKDIR /app/tensorrt_llm); the quick-start guide runs it "
        "with --ipc=host; the PyTorch backend downloads to the Hugging Face cache and JIT-compiles FlashInfer "
        "and Triton kernels under the home directory; OpenMPI keeps its session directory in TMPDIR (/tmp)."
    ),
)


# The NGC release image is the largest of the three (about 20 GB compressed); its engine start adds the
# PyTorch backend's warm-up.
PROFILE = EngineProfile(kind=KIND, command=command, image=IMAGE, image_gib={"gpu": 20.0}, init_s=180)
