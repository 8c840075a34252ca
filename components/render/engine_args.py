"""Engine command lines from the spec: the only place one is built, every flag taken from ``runtime.engines``.

One function per engine writes its arguments in that engine's order. A cluster pod and ``make local`` get
their vLLM command line from the same ``vllm()``: only ``Where`` differs (what to load, host, port, and
the model cache downloads go to), so a knob added here reaches both. The policy pack reads command lines
back through the same table.

vLLM's rendered command lines are parsed by vLLM's own argument parser in the tests; SGLang's and
TensorRT-LLM's follow their documented CLIs (``sglang.srt.server_args``, ``trtllm-serve serve``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike

from components.render.common import ENGINE_PORT
from components.sizing import DEFAULT_BATCHED_TOKENS
from components.spec import Device, EngineSpec, KvCacheDType, ModelSpec
from runtime.config import EngineKind, KvEventsSource, Task
from runtime.engines import TELEMETRY_OFF_ENV, EngineCli, Flag, Switch, facts

MODEL_DIR = "/models"  # where an engine pod sees its node-level cache copy (components.render.weights)
HF_CACHE_DIR = "/tmp/hf"  # the Hugging Face libraries' cache; nothing is downloaded (HF_HUB_OFFLINE)
TRTLLM_OPTIONS_FILE = "extra-llm-api-options.yaml"
TRTLLM_CONFIG_DIR = "/etc/inferstack/engine"

POD_ENV = {
    **TELEMETRY_OFF_ENV,
    # Engines load from the model store or a node cache (components/render/weights.py), never the hub.
    "HF_HUB_OFFLINE": "1",
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
    """What the engine loads: an ``s3://`` store location (streamed), a node cache's copy, a local directory."""
    host: str
    port: int
    download_dir: str | None
    """Where the engine downloads weights to; None where nothing is downloaded."""
    served_name: str | None = None
    """The name clients send; None: the spec's model name."""
    kv_events: tuple[str, str] | None = None
    """Where a model whose routing reads KV events publishes them (events, replay); None: nowhere given."""


_KV = KvEventsSource.model_fields


def kv_events_in_pod() -> tuple[str, str]:
    """An engine pod publishes on every interface (the NetworkPolicy admits only the router's pods)."""
    return f"tcp://*:{_KV['port'].default}", f"tcp://*:{_KV['replay_port'].default}"


def _lora(model: ModelSpec) -> tuple[list[str], dict[str, str]]:
    """LoRA arguments and environment for a model with adapters (none without): slots and rank sized from the
    spec, loading at run time allowed (the router loads each adapter where a request for it lands)."""
    lora = facts(model.engine.kind).lora
    if not model.adapters or lora is None:  # the spec refuses adapters on engines without ``lora``
        return [], {}
    limits = model.engine.lora
    args = [
        *lora.enable,
        *_valued(lora.max_loras, limits.max_per_batch),
        *_valued(lora.max_rank, limits.max_rank),
        *_valued(lora.max_cpu_loras, limits.loaded),
    ]
    return args, dict(lora.env)


def _sleep(model: ModelSpec) -> tuple[list[str], dict[str, str]]:
    """Sleep mode's arguments and environment (its endpoints served) for a model that sleeps when idle (none
    otherwise; the spec refuses sleep on engines and devices without it)."""
    sleep = facts(model.engine.kind).sleep
    if model.scaling.sleep_after_idle_s is None or sleep is None:
        return [], {}
    return list(sleep.args), dict(sleep.env)


def model_env(model: ModelSpec) -> dict[str, str]:
    """The environment the spec itself asks of an engine, wherever it runs (a pod adds ``POD_ENV``): what allows
    loading adapters at run time for a model with adapters, and serving sleep mode's endpoints for one that
    sleeps."""
    return {**_lora(model)[1], **_sleep(model)[1]}


def model_dir(model: ModelSpec) -> str:
    """Where an engine pod sees the node cache's copy of its model: a directory named after the model, because
    trtllm-serve (which has no served-name flag before 2026, NVIDIA/TensorRT-LLM#11711) serves a local
    directory under its base name (``openai_server.py``: ``self.model = model_dir.name``)."""
    return f"{MODEL_DIR}/{model.name}"


def in_cluster(model: ModelSpec, location: str | None = None) -> Where:
    """An engine pod: every interface, the Service's port; it loads ``location`` (the model store, or the node
    cache's copy at ``model_dir``: ``components.render.weights.engine_location``), or the spec's source where
    none is given (command-line checks), and downloads nothing. A model whose routing reads KV events publishes
    them on every interface."""
    events = kv_events_in_pod() if model.publishes_kv_events else None
    return Where(location or model.source, "0.0.0.0", ENGINE_PORT, download_dir=None, kv_events=events)


def on_this_machine(
    model_dir: str | PathLike[str],
    host: str,
    port: int,
    served_name: str | None = None,
    kv_events: tuple[str, str] | None = None,
) -> Where:
    """An engine of ``make local`` (or a test): a model directory on disk, a loopback port, no downloads
    (the engines run with HF_HUB_OFFLINE=1, and there is no model cache volume), KV events (if its routing
    reads them) on ``ipc://`` socket files: a tcp bind would take every interface."""
    return Where(str(model_dir), host, port, download_dir=None, served_name=served_name, kv_events=kv_events)


def _kv_events(cli: EngineCli, model: ModelSpec, where: Where) -> list[str]:
    """Publish KV-cache events where the router follows them, hashed the way the router reproduces."""
    if not model.publishes_kv_events:
        return []
    if where.kv_events is None:
        raise ValueError(f"model {model.name}: its routing reads KV events, but no endpoints were given")
    events, replay = where.kv_events
    topic = KvEventsSource.model_fields["topic"].default
    config = json.dumps(
        facts(model.engine.kind).kv_events_config(events, replay, topic), separators=(",", ":")
    )
    return _valued(cli.kv_events, config) + _valued(cli.block_hash_algo, _KV["hash_algo"].default)


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
        *_valued(cli.served_name, where.served_name or model.served_name),
        *_valued(cli.host, where.host),
        *_valued(cli.port, where.port),
    ]


def _quantization(cli: EngineCli, model: ModelSpec) -> list[str]:
    """The weight format flag; none for a checkpoint that names its own (a version quantized by its preparation)."""
    if model.format_in_checkpoint:
        return []
    return _valued(cli.quantization, cli.quantization_values.get(model.engine.quantization.value))


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
    args += _quantization(cli, model) + _kv_cache_dtype(cli, e)
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
    args += _kv_events(cli, model, where)
    if where.model.startswith("s3://"):
        args += cli.stream_from_s3
    lora_args, lora_env = _lora(model)
    sleep_args, sleep_env = _sleep(model)
    args += [*lora_args, *sleep_args, *cli.fixed_args, *e.extra_args]
    return EngineCommand(command=list(cli.command), args=args, env={**POD_ENV, **lora_env, **sleep_env})


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
        *_quantization(cli, model),
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


RENDERERS: dict[EngineKind, Callable[[ModelSpec, Where], EngineCommand]] = {
    EngineKind.VLLM: vllm,
    EngineKind.SGLANG: sglang,
    EngineKind.TRTLLM: trtllm,
}


def engine_command(model: ModelSpec, location: str | None = None) -> EngineCommand:
    """The cluster command line of ``model``'s engine, loading ``location`` (see ``in_cluster``)."""
    return RENDERERS[model.engine.kind](model, in_cluster(model, location))


# A replica that spans nodes runs as one LeaderWorkerSet group. The LeaderWorkerSet controller (v0.6.0 on) puts these
# variables in every container of a group (its pod webhook): the leader's stable DNS name, and the pod's index in the
# group, 0 on the leader. The kubelet expands $(NAME) in args from the container's environment.
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
LEADER_RANK = "0"


@dataclass(frozen=True)
class GroupMember:
    """One process of a multi-node group, as its command line names it."""

    nodes: int
    rank: str
    """Its node rank: "0" on the leader; on workers "$(LWS_WORKER_INDEX)", or a number on this machine."""
    leader: str
    """Where the leader is: "$(LWS_LEADER_ADDRESS)" in a pod, a host name on this machine."""

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER_RANK


def in_group(nodes: int, leader: bool) -> GroupMember:
    """A pod of a LeaderWorkerSet group: rank and leader address from the variables LeaderWorkerSet sets."""
    rank = LEADER_RANK if leader else f"$({WORKER_INDEX_ENV})"
    return GroupMember(nodes, rank, f"$({LEADER_ADDRESS_ENV})")


def group_args(kind: EngineKind, member: GroupMember) -> list[str]:
    """The arguments that make one engine process a member of a multi-node group (``runtime.engines``)."""
    cli = facts(kind).cli
    if cli.nnodes is None or cli.node_rank is None or cli.master_addr is None:
        raise ValueError(f"{facts(kind).display_name} cannot span nodes: {cli.multi_node_note}")
    if cli.master_port is None:
        rendezvous = [cli.master_addr.name, f"{member.leader}:{cli.rendezvous_port}"]
    else:
        rendezvous = [cli.master_addr.name, member.leader, cli.master_port.name, str(cli.rendezvous_port)]
    args = [cli.nnodes.name, str(member.nodes), cli.node_rank.name, member.rank, *rendezvous]
    return args if member.is_leader else [*args, *cli.worker_args]


def group_command(model: ModelSpec, member: GroupMember, where: Where | None = None) -> EngineCommand:
    """The command line of one member of ``model``'s group: the engine's own, plus its place in the group."""
    base = RENDERERS[model.engine.kind](model, where or in_cluster(model))
    return EngineCommand(
        command=base.command,
        args=[*base.args, *group_args(model.engine.kind, member)],
        env=base.env,
        files=base.files,
    )
