"""Engine command lines from the spec: one function per engine, each with the engine's real flags.

vLLM's rendered command lines are parsed by vLLM's own argument parser in the tests; SGLang's and
TensorRT-LLM's follow their documented CLIs (``sglang.srt.server_args``, ``trtllm-serve serve``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from components.render.common import ENGINE_PORT
from components.spec import KvCacheDType, ModelSpec, Quantization
from runtime.config import EngineKind

MODEL_DIR = "/models"  # the model cache volume: downloads, S3 syncs and the Hugging Face cache
S3_MODEL_DIR = f"{MODEL_DIR}/weights"


@dataclass(frozen=True)
class EngineCommand:
    """How to start one engine container."""

    command: list[str]
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # file name -> content, mounted from a ConfigMap


def model_location(model: ModelSpec) -> str:
    """What the engine loads: the Hugging Face id, or the directory an init container synced from S3."""
    return S3_MODEL_DIR if model.source.startswith("s3://") else model.source


COMMON_ENV = {
    # Nothing phones home from a serving pod: usage statistics and telemetry are off by default.
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HOME": f"{MODEL_DIR}/hf",
    "HOME": "/tmp",  # read-only root filesystem: caches (torch, triton, flashinfer) go to an emptyDir
}

_VLLM_QUANT = {
    Quantization.AWQ: "awq",
    Quantization.GPTQ: "gptq",
    Quantization.FP8: "fp8",
}


def vllm(model: ModelSpec) -> EngineCommand:
    e = model.engine
    args = [
        model_location(model),
        "--served-model-name", model.name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--tensor-parallel-size", str(e.tensor_parallel_size),
        "--pipeline-parallel-size", str(e.pipeline_parallel_size),
        "--dtype", e.dtype.value,
        "--max-model-len", str(e.max_model_len),
        "--max-num-seqs", str(e.max_num_seqs),
        "--download-dir", f"{MODEL_DIR}/hf",
    ]  # fmt: skip
    if e.device.value == "gpu":
        args += ["--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}"]
    if e.cpu_kv_offload_gib:
        args += ["--kv-offloading-size", f"{e.cpu_kv_offload_gib:g}"]
    if e.quantization in _VLLM_QUANT:
        args += ["--quantization", _VLLM_QUANT[e.quantization]]
    # int8 (W8A8) checkpoints carry their scheme in config.json (compressed-tensors); vLLM detects it.
    if e.kv_cache_dtype is not KvCacheDType.AUTO:
        args += ["--kv-cache-dtype", e.kv_cache_dtype.value]
    if e.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(e.max_num_batched_tokens)]
    args.append("--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching")
    args.append("--enable-chunked-prefill" if e.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if e.enforce_eager:
        args.append("--enforce-eager")
    if e.trust_remote_code:
        args.append("--trust-remote-code")
    if model.resolved_task().value == "embed":
        args += ["--runner", "pooling", "--convert", "embed"]
    args += ["--disable-uvicorn-access-log", *e.extra_args]
    return EngineCommand(command=["vllm", "serve"], args=args, env=dict(COMMON_ENV))


_SGLANG_QUANT = {
    Quantization.AWQ: "awq",
    Quantization.GPTQ: "gptq",
    Quantization.FP8: "fp8",
    Quantization.INT8: "w8a8_int8",
}


def sglang(model: ModelSpec) -> EngineCommand:
    e = model.engine
    args = [
        "-m", "sglang.launch_server",
        "--model-path", model_location(model),
        "--served-model-name", model.name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--tp-size", str(e.tensor_parallel_size),
        "--pp-size", str(e.pipeline_parallel_size),
        "--dtype", e.dtype.value,
        "--mem-fraction-static", f"{e.gpu_memory_utilization:g}",
        "--context-length", str(e.max_model_len),
        "--max-running-requests", str(e.max_num_seqs),
        "--download-dir", f"{MODEL_DIR}/hf",
        "--enable-metrics",
    ]  # fmt: skip
    if e.quantization in _SGLANG_QUANT:
        args += ["--quantization", _SGLANG_QUANT[e.quantization]]
    if e.kv_cache_dtype is not KvCacheDType.AUTO:
        # SGLang names the fp8 KV formats explicitly; plain fp8 means e4m3 on current GPUs.
        kv = "fp8_e4m3" if e.kv_cache_dtype is KvCacheDType.FP8 else e.kv_cache_dtype.value
        args += ["--kv-cache-dtype", kv]
    if e.enable_chunked_prefill:
        args += ["--chunked-prefill-size", str(e.max_num_batched_tokens or 8192)]
    else:
        args += ["--chunked-prefill-size", "-1"]
        if e.max_num_batched_tokens is not None:
            args += ["--max-prefill-tokens", str(e.max_num_batched_tokens)]
    if not e.enable_prefix_caching:
        args.append("--disable-radix-cache")
    if e.enforce_eager:
        args.append("--disable-cuda-graph")
    if e.trust_remote_code:
        args.append("--trust-remote-code")
    if model.resolved_task().value == "embed":
        args.append("--is-embedding")
    args += e.extra_args
    return EngineCommand(command=["python3"], args=args, env=dict(COMMON_ENV))


TRTLLM_OPTIONS_FILE = "extra-llm-api-options.yaml"
TRTLLM_CONFIG_DIR = "/etc/inferstack/engine"


def trtllm(model: ModelSpec) -> EngineCommand:
    e = model.engine
    args = [
        "serve", model_location(model),
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--backend", "pytorch",
        "--tp_size", str(e.tensor_parallel_size),
        "--pp_size", str(e.pipeline_parallel_size),
        "--max_batch_size", str(e.max_num_seqs),
        "--max_seq_len", str(e.max_model_len),
        "--max_num_tokens", str(e.max_num_batched_tokens or 8192),
        "--kv_cache_free_gpu_memory_fraction", f"{e.gpu_memory_utilization:g}",
        "--extra_llm_api_options", f"{TRTLLM_CONFIG_DIR}/{TRTLLM_OPTIONS_FILE}",
    ]  # fmt: skip
    if e.trust_remote_code:
        args.append("--trust_remote_code")
    args += e.extra_args
    kv_dtype = "fp8" if e.kv_cache_dtype is not KvCacheDType.AUTO else "auto"
    options = (
        "enable_chunked_prefill: " + ("true" if e.enable_chunked_prefill else "false") + "\n"
        "enable_iter_perf_stats: true\n"
        "return_perf_metrics: true\n"
        "kv_cache_config:\n"
        f"  enable_block_reuse: {'true' if e.enable_prefix_caching else 'false'}\n"
        f"  dtype: {kv_dtype}\n"
        f"  free_gpu_memory_fraction: {e.gpu_memory_utilization:g}\n"
        "cuda_graph_config: "
        + ("null" if e.enforce_eager else f"{{max_batch_size: {min(e.max_num_seqs, 512)}}}")
        + "\n"
    )
    return EngineCommand(
        command=["trtllm-serve"], args=args, env=dict(COMMON_ENV), files={TRTLLM_OPTIONS_FILE: options}
    )


RENDERERS: dict[EngineKind, Callable[[ModelSpec], EngineCommand]] = {
    EngineKind.VLLM: vllm,
    EngineKind.SGLANG: sglang,
    EngineKind.TRTLLM: trtllm,
}


def engine_command(model: ModelSpec) -> EngineCommand:
    return RENDERERS[model.engine.kind](model)
