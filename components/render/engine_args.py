"""Engine command lines from the spec: the only place one is built, every flag taken from ``runtime.engines``.

One function per engine writes its arguments in that engine's order. A cluster pod and ``make local`` get
their vLLM command line from the same ``vllm()``: only ``Where`` differs (what to load, host, port, and
the model cache downloads go to), so a knob added here reaches both. The policy pack reads command lines
back through the same table.

vLLM's rendered command lines are parsed by vLLM's own argument parser in the tests; SGLang's and
TensorRT-LLM's follow their documented CLIs (``sglang.srt.server_args``, ``trtllm-serve serve``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike

from components.render.common import ENGINE_PORT
from components.sizing import DEFAULT_BATCHED_TOKENS
from components.spec import Device, EngineSpec, KvCacheDType, ModelSpec
from runtime.config import EngineKind, Task
from runtime.engines import TELEMETRY_OFF_ENV, EngineCli, Flag, Switch, facts

MODEL_DIR = "/models"  # the model cache volume: downloads, S3 syncs and the Hugging Face cache
HF_CACHE_DIR = f"{MODEL_DIR}/hf"
TRTLLM_OPTIONS_FILE = "extra-llm-api-options.yaml"
TRTLLM_CONFIG_DIR = "/etc/inferstack/engine"

POD_ENV = {
    **TELEMETRY_OFF_ENV,
    "HF_HOME": HF_CACHE_DIR,
    "HOME": "/tmp",  # read-only root filesystem: caches (torch, triton, flashinfer) go to an emptyDir
}
"""The environment of every engine container in a cluster."""


@dataclass(frozen=True)
class EngineCommand:
    """How to start one engine container."""

    command: list[str]
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # file name -> content, mounted from a ConfigMap


@dataclass(frozen=True)
class Where:
    """Where an engine runs, as far as its command line says; every other argument comes from the spec."""

    model: str
    """What the engine loads: a Hugging Face id, the directory an init container synced from S3, a local one."""
    host: str
    port: int
    download_dir: str | None
    """Where the engine downloads weights to; None where nothing is downloaded."""
    served_name: str | None = None
    """The name clients send; None: the spec's model name."""


def s3_model_dir(model: ModelSpec) -> str:
    """Where the init container syncs an S3 model: a directory named after the model, because trtllm-serve
    (which has no served-name flag before 2026, NVIDIA/TensorRT-LLM#11711) serves a local directory under its
    base name (``openai_server.py``: ``self.model = model_dir.name``). Clients then ask for the model's name."""
    return f"{MODEL_DIR}/{model.name}"


def model_location(model: ModelSpec) -> str:
    """What a cluster engine loads: the Hugging Face id, or the directory an init container synced from S3."""
    return s3_model_dir(model) if model.source.startswith("s3://") else model.source


def in_cluster(model: ModelSpec) -> Where:
    """An engine pod: every interface, the Service's port, the model cache volume."""
    return Where(model_location(model), "0.0.0.0", ENGINE_PORT, HF_CACHE_DIR)


def on_this_machine(
    model_dir: str | PathLike[str], host: str, port: int, served_name: str | None = None
) -> Where:
    """An engine of ``make local`` (or a test): a model directory on disk, a loopback port, no downloads
    (the engines run with HF_HUB_OFFLINE=1, and there is no model cache volume)."""
    return Where(str(model_dir), host, port, download_dir=None, served_name=served_name)


def _valued(flag: Flag | None, value: object) -> list[str]:
    """``[flag, value]``, or nothing where the engine has no such flag or there is no value."""
    return [] if flag is None or value is None else [flag.name, str(value)]


def _switched(switch: Switch | None, value: bool) -> list[str]:
    return [] if switch is None else switch.args(value)


def _start(cli: EngineCli, model: ModelSpec, where: Where) -> list[str]:
    """The arguments every engine begins with: the model, its served name, where it listens."""
    named = [where.model] if cli.model_positional else _valued(cli.model, where.model)
    return [
        *cli.leading_args,
        *named,
        *_valued(cli.served_name, where.served_name or model.name),
        *_valued(cli.host, where.host),
        *_valued(cli.port, where.port),
    ]


def _quantization(cli: EngineCli, e: EngineSpec) -> list[str]:
    return _valued(cli.quantization, cli.quantization_values.get(e.quantization.value))


def _kv_cache_dtype(cli: EngineCli, e: EngineSpec) -> list[str]:
    if e.kv_cache_dtype is KvCacheDType.AUTO:
        return []
    value = e.kv_cache_dtype.value
    return _valued(cli.kv_cache_dtype, cli.kv_cache_dtype_values.get(value, value))


def vllm(model: ModelSpec, where: Where | None = None) -> EngineCommand:
    """The vLLM command line of ``model``, in a pod unless ``where`` says otherwise (``make local``)."""
    e, cli = model.engine, facts(EngineKind.VLLM).cli
    where = where or in_cluster(model)
    pooling = model.resolved_task() is Task.EMBED
    args = [
        *_start(cli, model, where),
        *_valued(cli.tensor_parallel_size, e.tensor_parallel_size),
        *_valued(cli.pipeline_parallel_size, e.pipeline_parallel_size),
        *_valued(cli.dtype, e.dtype.value),
        *_valued(cli.max_model_len, e.max_model_len),
        *_valued(cli.max_num_seqs, e.max_num_seqs),
        *_valued(cli.download_dir, where.download_dir),
    ]
    if e.device is Device.GPU:
        args += _valued(cli.gpu_memory_utilization, f"{model.memory_utilization:g}")
    if e.cpu_kv_offload_gib:
        args += _valued(cli.cpu_kv_offload_gib, f"{e.cpu_kv_offload_gib:g}")
    args += _quantization(cli, e) + _kv_cache_dtype(cli, e)
    args += _valued(cli.max_num_batched_tokens, e.max_num_batched_tokens)
    # Pooling models: vLLM turns prefix caching and chunked prefill on only where the architecture supports
    # them (not for bidirectional encoders such as BERT, where forcing them "may crash or produce incorrect
    # outputs", vLLM warns), so there only an explicit "off" is passed on.
    for switch, on in (
        (cli.prefix_caching, e.enable_prefix_caching),
        (cli.chunked_prefill, e.enable_chunked_prefill),
    ):
        if not (pooling and on):
            args += _switched(switch, on)
    args += _switched(cli.enforce_eager, e.enforce_eager)
    args += _switched(cli.trust_remote_code, e.trust_remote_code)
    if pooling:
        args += cli.embedding
    env = dict(POD_ENV)
    sleep = facts(EngineKind.VLLM).sleep
    if model.scaling.sleep_after_idle_s is not None and sleep is not None:
        args += sleep.args
        env.update(sleep.env)
    args += [*cli.fixed_args, *e.extra_args]
    return EngineCommand(command=list(cli.command), args=args, env=env)


def sglang(model: ModelSpec, where: Where | None = None) -> EngineCommand:
    """The SGLang command line of ``model`` (``python3 -m sglang.launch_server ...``)."""
    engine = facts(EngineKind.SGLANG)
    e, cli = model.engine, engine.cli
    where = where or in_cluster(model)
    args = [
        *_start(cli, model, where),
        *_valued(cli.tensor_parallel_size, e.tensor_parallel_size),
        *_valued(cli.pipeline_parallel_size, e.pipeline_parallel_size),
        *_valued(cli.dtype, e.dtype.value),
        *_valued(cli.gpu_memory_utilization, f"{model.memory_utilization:g}"),
        *_valued(cli.max_model_len, e.max_model_len),
        *_valued(cli.max_num_seqs, e.max_num_seqs),
        *_valued(cli.download_dir, where.download_dir),
        *engine.metrics_flag,
        *_quantization(cli, e),
        *_kv_cache_dtype(cli, e),
    ]
    # SGLang sizes prefill chunks instead of switching chunking: -1 turns it off, and then the batched-token
    # budget is the prefill limit.
    if e.enable_chunked_prefill:
        args += _valued(cli.chunked_prefill_size, e.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS)
    else:
        args += _valued(cli.chunked_prefill_size, -1)
        args += _valued(cli.max_num_batched_tokens, e.max_num_batched_tokens)
    args += _switched(cli.prefix_caching, e.enable_prefix_caching)
    args += _switched(cli.enforce_eager, e.enforce_eager)
    args += _switched(cli.trust_remote_code, e.trust_remote_code)
    if model.resolved_task() is Task.EMBED:
        args += cli.embedding
    args += [*cli.fixed_args, *e.extra_args]
    return EngineCommand(command=list(cli.command), args=args, env=dict(POD_ENV))


def _trtllm_options(e: EngineSpec) -> str:
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


def trtllm(model: ModelSpec, where: Where | None = None) -> EngineCommand:
    """The ``trtllm-serve`` command line of ``model``, and the options file it reads."""
    e, cli = model.engine, facts(EngineKind.TRTLLM).cli
    args = [
        *_start(cli, model, where or in_cluster(model)),
        *cli.fixed_args,
        *_valued(cli.tensor_parallel_size, e.tensor_parallel_size),
        *_valued(cli.pipeline_parallel_size, e.pipeline_parallel_size),
        *_valued(cli.max_num_seqs, e.max_num_seqs),
        *_valued(cli.max_model_len, e.max_model_len),
        *_valued(cli.max_num_batched_tokens, e.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS),
        *_valued(cli.gpu_memory_utilization, f"{e.gpu_memory_utilization:g}"),
        *_valued(cli.options_file, f"{TRTLLM_CONFIG_DIR}/{TRTLLM_OPTIONS_FILE}"),
        *_switched(cli.trust_remote_code, e.trust_remote_code),
        *e.extra_args,
    ]
    return EngineCommand(
        command=list(cli.command),
        args=args,
        env=dict(POD_ENV),
        files={TRTLLM_OPTIONS_FILE: _trtllm_options(e)},
    )


RENDERERS: dict[EngineKind, Callable[[ModelSpec], EngineCommand]] = {
    EngineKind.VLLM: vllm,
    EngineKind.SGLANG: sglang,
    EngineKind.TRTLLM: trtllm,
}


def engine_command(model: ModelSpec) -> EngineCommand:
    """The cluster command line of ``model``'s engine."""
    return RENDERERS[model.engine.kind](model)
