"""Each serving engine described once, as data: how it is started, where it answers, what it exports.

One table, ``ENGINES``, keyed by ``EngineKind``. The control plane builds every engine command line from it
(``components/render/engine_args.py``: the cluster's, and the same one for ``make local``), the policy pack
reads command lines back with it, the health monitor parses ``/metrics`` with its metric names and the
router falls back to its paths. A renamed flag or metric is fixed here once.

Flags are keyed by the spec's knobs in plain names (``max_num_seqs``, quantization ``"awq"``), never by the
control plane's classes: the runtime images import this module and nothing of ``components``. Every
metric signal lists the current name first and older names after it; readers accept any of them and sum
across the ``engine`` label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from runtime.config import EngineKind


class Signal(StrEnum):
    """Serving signals every engine exposes under its own metric names."""

    QUEUED = "queued"
    RUNNING = "running"
    KV_USAGE = "kv_usage"  # 0..1
    PREFIX_HITS = "prefix_hits"  # counter (vLLM) ...
    PREFIX_QUERIES = "prefix_queries"  # ... over this counter gives the hit rate
    PREFIX_HIT_RATE = "prefix_hit_rate"  # gauge 0..1 (SGLang)
    TTFT = "ttft"  # histogram, seconds
    INTER_TOKEN = "inter_token"  # histogram, seconds
    PREEMPTIONS = "preemptions"  # counter
    PROMPT_TOKENS = "prompt_tokens"  # counter
    GENERATION_TOKENS = "generation_tokens"  # counter


@dataclass(frozen=True)
class Flag:
    """A command-line option that takes a value: the spelling inferstack writes, then others the engine accepts."""

    name: str
    aliases: tuple[str, ...] = ()

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every way a command line may write it (what a reader of command lines looks for)."""
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class Switch:
    """A yes/no knob: the argument that says yes and the one that says no; None where saying nothing does."""

    on: str | None
    off: str | None

    def args(self, value: bool) -> list[str]:
        arg = self.on if value else self.off
        return [arg] if arg is not None else []


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


#: The environment of every engine container, whatever the engine: nothing phones home. vLLM reports usage
#: statistics to its authors' server unless told not to, and the Hugging Face libraries send telemetry.
TELEMETRY_OFF_ENV: Mapping[str, str] = _frozen(
    {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
)


@dataclass(frozen=True)
class EngineCli:
    """How an engine is started, and its spelling of every launch knob the spec has.

    ``None`` means the engine has no such flag: the knob is set another way (TensorRT-LLM takes several in
    its options file, rendered beside its command line) or not at all.
    """

    command: tuple[str, ...]
    """The container's command."""
    leading_args: tuple[str, ...]
    """Arguments before the model and the flags (a subcommand, a python module)."""
    model: Flag | None
    """The option that names the model, where the engine has one."""
    model_positional: bool
    """True: the model is written as the first argument after ``leading_args`` (not with ``model``)."""
    served_name: Flag | None
    host: Flag
    port: Flag
    tensor_parallel_size: Flag
    pipeline_parallel_size: Flag
    dtype: Flag | None
    gpu_memory_utilization: Flag
    max_model_len: Flag
    max_num_seqs: Flag
    max_num_batched_tokens: Flag | None
    download_dir: Flag | None
    quantization: Flag | None
    quantization_values: Mapping[str, str]
    """Spec quantization -> the engine's name for it; absent: the engine reads it from the checkpoint."""
    kv_cache_dtype: Flag | None
    kv_cache_dtype_values: Mapping[str, str]
    """Spec KV-cache dtype -> the engine's name, where the two differ."""
    cpu_kv_offload_gib: Flag | None
    prefix_caching: Switch | None
    chunked_prefill: Switch | None
    chunked_prefill_size: Flag | None
    """Engines that size prefill chunks instead of switching chunking (SGLang): tokens per chunk, -1 = off."""
    enforce_eager: Switch | None
    trust_remote_code: Switch
    embedding: tuple[str, ...]
    """Arguments that make the engine pool (serve ``/v1/embeddings``) instead of generate."""
    options_file: Flag | None = None
    """The option that points at the engine's options file (TensorRT-LLM), where it takes one."""
    fixed_args: tuple[str, ...] = ()
    """Arguments every launch carries whatever the spec says (the serving backend, a quiet access log)."""
    kv_events: Flag | None = None
    """The option that makes the engine publish its KV-cache events (JSON: publisher, endpoints, topic)."""
    block_hash_algo: Flag | None = None
    """The option that picks the prefix-cache block hash (the router reproduces it for the event view)."""
    nnodes: Flag | None = None
    """Multi-node replicas (one LeaderWorkerSet group): how many nodes the replica spans."""
    node_rank: Flag | None = None
    """This process's node: 0 on the leader, the worker's index on each worker."""
    master_addr: Flag | None = None
    """Where the leader listens for the group's rendezvous: a host (with ``master_port``), or host:port where the
    engine takes one value (``master_port`` None)."""
    master_port: Flag | None = None
    rendezvous_port: int = 0
    """The port of the rendezvous on the leader."""
    revision: Flag | None = None
    """The option that pins a Hugging Face source to a revision (a version's ``revision``), where there is one."""
    worker_args: tuple[str, ...] = ()
    """Arguments only the workers of a group carry (vLLM: no API server on them)."""
    multi_node_note: str = ""
    """How the engine spans nodes (its pinned version), or why it cannot here (then ``nnodes`` is None)."""

    @property
    def multi_node_supported(self) -> bool:
        return self.nnodes is not None

    otlp_traces: Flag | None = None
    """The option that turns the engine's own OpenTelemetry tracing on, exporting OTLP/gRPC to the URL it takes
    (spans join a request's trace through its W3C ``traceparent``); None where not wired here."""
    stream_from_s3: tuple[str, ...] = ()
    """Arguments that make the engine stream safetensors straight from an ``s3://`` model location; empty
    where the engine cannot (it then loads a node cache's copy)."""


@dataclass(frozen=True)
class LoraCli:
    """How an engine serves LoRA adapters loaded at run time: its flags, the environment that allows
    loading, and the endpoints that load and unload one (``{"lora_name", "lora_path"}`` bodies)."""

    enable: tuple[str, ...]
    """Arguments that turn adapter serving on."""
    max_loras: Flag
    """Adapters one batch may mix (GPU slots, sized at start)."""
    max_rank: Flag
    """Largest rank a slot holds."""
    max_cpu_loras: Flag
    """Adapters held loaded in host memory at once."""
    ranks: tuple[int, ...]
    """The values ``max_rank`` accepts."""
    env: Mapping[str, str]
    """Environment that allows loading and unloading while serving."""
    load_path: str
    unload_path: str


@dataclass(frozen=True)
class SleepMode:
    """An engine's sleep mode: how it is switched on and the HTTP endpoints that drive it.

    A sleeping engine keeps its process (and CUDA context) but gives back its GPU memory: level 1 moves the
    weights to host memory and drops the KV cache, so waking is a copy back over PCIe instead of a cold start.
    """

    args: tuple[str, ...]
    """Command-line arguments that enable it."""
    env: Mapping[str, str]
    """Environment the endpoints need."""
    sleep_path: str
    wake_path: str
    state_path: str
    """GET: ``{"is_sleeping": bool}``."""
    level: int
    """The level inferstack sleeps at (1: weights kept in host memory)."""
    devices: frozenset[str]
    """Devices it works on (spec ``engine.device`` values)."""
    since_version: str
    """The earliest release inferstack allows it on."""


@dataclass(frozen=True)
class KvTransfer:
    """How an engine hands a prompt's KV cache to another (prefill/decode disaggregation): the connector, the
    role each side plays and the settings the router's recovery relies on (``runtime.router.disagg``).

    vLLM 0.32's NixlConnector (vllm/distributed/kv_transfer/kv_connector/v1/nixl/, connector.py,
    base_scheduler.py, base_worker.py; vllm/config/kv_transfer.py): the decode engine pulls the blocks the
    prefill engine's answer names, after a handshake on the prefill engine's side channel (ZMQ over TCP, a port
    per engine on a host). The prefill engine keeps the blocks for a lease the decode side renews by heartbeats
    while it waits (``kv_lease_duration``): a decode that vanished frees them within the lease."""

    flag: str
    connector: str
    producer_role: str
    consumer_role: str
    failure_policy: str
    """What a decode engine does with a KV load that failed: ``fail`` answers the request with an error, which
    the router sees and answers by sending the decode again without the KV (and charging the prefill replica);
    ``recompute`` would hide it from the router, which then could not stop pairing with a bad prefill replica."""
    side_channel_host_env: str
    side_channel_port_env: str
    side_channel_port: int
    """The default side-channel port (an engine's data-parallel rank is added to it)."""
    lease_s: int
    """The connector's default lease: how long a prefill engine holds finished blocks for a decode that has not
    pulled them (the decode engine's heartbeats renew it while it waits). inferstack renders its own
    (``runtime.config.PrefillStage.lease_for``)."""
    buffer_device: Mapping[str, str]
    """Spec ``engine.device`` -> ``kv_buffer_device`` (vLLM-CPU: the KV cache is already in host memory)."""
    since_version: str

    def config(
        self, role: str, device: str, backends: tuple[str, ...] = ("UCX",), lease_s: int | None = None
    ) -> dict[str, object]:
        """The ``--kv-transfer-config`` value of a ``prefill`` or ``decode`` engine on ``device``, holding a
        prefill's blocks for ``lease_s`` (None: the connector's default)."""
        if role not in ("prefill", "decode"):
            raise ValueError(f"role {role!r}: prefill or decode")
        return {
            "kv_connector": self.connector,
            "kv_role": self.producer_role if role == "prefill" else self.consumer_role,
            "kv_buffer_device": self.buffer_device[device],
            "kv_load_failure_policy": self.failure_policy,
            "kv_connector_extra_config": {
                "backends": list(backends),
                "kv_lease_duration": self.lease_s if lease_s is None else lease_s,
            },
        }

    def role_of(self, config: Mapping[str, Any]) -> str | None:
        """ "prefill" or "decode": the role a ``--kv-transfer-config`` value gives its engine (None: neither)."""
        role = config.get("kv_role")
        return "prefill" if role == self.producer_role else "decode" if role == self.consumer_role else None

    def config_problems(self, config: Mapping[str, Any], device: str) -> list[str]:
        """What a ``--kv-transfer-config`` value gets wrong for the router's two-phase request (``config`` renders
        none of these; the policy pack reads rendered engines with it): another connector, a role that is neither
        producer nor consumer, a buffer on the wrong device."""
        out = []
        if config.get("kv_connector") != self.connector:
            out.append(
                f"kv_connector {config.get('kv_connector')!r}: inferstack pairs {self.connector} engines only"
            )
        if self.role_of(config) is None:
            out.append(
                f"kv_role {config.get('kv_role')!r}: a prefill engine is {self.producer_role}, a decode engine "
                f"{self.consumer_role}"
            )
        want = self.buffer_device.get(device)
        if want is not None and config.get("kv_buffer_device", want) != want:
            out.append(f"kv_buffer_device {config.get('kv_buffer_device')!r} on {device}: use {want!r}")
        return out

    def lease_of(self, config: Mapping[str, Any]) -> int:
        """The KV lease (seconds) a ``--kv-transfer-config`` value gives its engine (the connector's default when
        it names none)."""
        extra = config.get("kv_connector_extra_config")
        lease = extra.get("kv_lease_duration") if isinstance(extra, Mapping) else None
        return int(lease) if isinstance(lease, int | float) and not isinstance(lease, bool) else self.lease_s

    def env(self, host: str, port: int) -> dict[str, str]:
        """An engine's side channel: the address its peers reach it at (echoed in its ``kv_transfer_params``)."""
        return {self.side_channel_host_env: host, self.side_channel_port_env: str(port)}


# vLLM 0.32: config/kv_transfer.py (kv_role, kv_buffer_device, kv_load_failure_policy "recompute" | "fail",
# default "fail"); envs.py (VLLM_NIXL_SIDE_CHANNEL_HOST default "localhost", VLLM_NIXL_SIDE_CHANNEL_PORT 5600);
# nixl/base_scheduler.py (kv_lease_duration, default 30 s; heartbeats every lease // 6 s extend it by 2/3 of it,
# nixl/base_worker.py _handle_heartbeat). Checked on vLLM-CPU 0.32 with nixl 1.5.1 (UCX over TCP) by
# tests/integration/test_pd_nixl.py. On CPU the worker pins its KV-transfer thread to the last core of each NUMA node
# of the host's topology (nixl/base_worker.py, "reserve different cores for start_load_kv()"; vllm-project/vllm#32365):
# no setting moves it, and a container cpuset without that core fails the engine's start (vllm-project/vllm#58033).
VLLM_KV_TRANSFER = KvTransfer(
    flag="--kv-transfer-config",
    connector="NixlConnector",
    producer_role="kv_producer",
    consumer_role="kv_consumer",
    failure_policy="fail",
    side_channel_host_env="VLLM_NIXL_SIDE_CHANNEL_HOST",
    side_channel_port_env="VLLM_NIXL_SIDE_CHANNEL_PORT",
    side_channel_port=5600,
    lease_s=30,
    buffer_device=_frozen({"gpu": "cuda", "cpu": "cpu"}),
    since_version="0.32.0",
)


class Prepared(StrEnum):
    """What a version's preparation step writes, for an engine to load."""

    COMPRESSED = "compressed-tensors"  # llm-compressor's quantized checkpoints
    TRTLLM_ENGINE = "trtllm-engine"  # trtllm-build's serialized engines


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do here, as the spec's rules ask it: derived from ``EngineFacts``, never kept twice."""

    devices: frozenset[str]
    """Devices it has a pinned image for (spec ``engine.device`` values)."""
    quantizations: frozenset[str]
    """Checkpoint formats it serves (spec ``engine.quantization`` values, ``none`` included)."""
    prepared: frozenset[Prepared]
    """What a preparation step may hand it."""
    weight_streamer: bool
    """Streams safetensors from the model store while loading (no copy on disk)."""
    kv_events: bool
    """Publishes its KV-cache events (for routing by what each engine holds)."""
    kv_offload: bool
    """Keeps evicted KV blocks in host memory."""
    memory_share: bool
    """Sizes its KV cache from a fraction of the device memory, so a time-sliced share bounds it."""
    lora: bool
    sleep: bool
    multi_node: bool
    kv_transfer: bool = False
    """Hands a prompt's KV cache to another engine (prefill/decode disaggregation)."""


@dataclass(frozen=True)
class EngineFacts:
    """One engine: how to start it, its endpoints and its metric names."""

    display_name: str
    """How people write its name (in messages)."""
    cli: EngineCli
    images: Mapping[str, str]
    """Device (spec ``engine.device``) -> the pinned image that runs it there; a device it lacks, it cannot run on."""
    quantizations: frozenset[str]
    """Checkpoint formats it serves (spec ``engine.quantization`` values, ``none`` included)."""
    prepared: frozenset[Prepared]
    """What a preparation step may hand it to load."""
    memory_share: bool
    """True: its KV cache is sized from a fraction of the device memory (``gpu_memory_utilization``), so a
    time-sliced GPU share bounds it; False: it takes what loading left free."""
    health_path: str
    metrics_path: str
    models_path: str
    metrics: dict[Signal, tuple[str, ...]]
    metrics_flag: tuple[str, ...] = ()
    """Arguments the engine needs before it exports metrics at all."""
    version: str = ""
    """The version of the tested image (in messages about what it supports)."""
    lora: LoraCli | None = None
    """How it serves LoRA adapters loaded at run time; None where inferstack does not drive its adapters."""
    sleep: SleepMode | None = None
    """Its sleep mode, where it has one."""
    kv_transfer: KvTransfer | None = None
    """Its KV connector for prefill/decode disaggregation, where inferstack drives one."""

    def names(self, signal: Signal) -> tuple[str, ...]:
        return self.metrics.get(signal, ())

    @property
    def can(self) -> Capabilities:
        return Capabilities(
            devices=frozenset(self.images),
            quantizations=self.quantizations,
            prepared=self.prepared,
            weight_streamer=bool(self.cli.stream_from_s3),
            kv_events=self.cli.kv_events is not None,
            kv_offload=self.cli.cpu_kv_offload_gib is not None,
            memory_share=self.memory_share,
            lora=self.lora is not None,
            sleep=self.sleep is not None,
            multi_node=self.cli.multi_node_supported,
            kv_transfer=self.kv_transfer is not None,
        )

    def kv_events_config(self, events: str, replay: str, topic: str) -> dict[str, object]:
        """The value of its KV-events option for a publisher at these endpoints (``tcp://*:PORT`` binds every
        interface, ``ipc://PATH`` a socket file; vLLM *connects* a PUB socket to any other tcp address)."""
        if self.cli.kv_events is None:
            raise ValueError(f"{self.display_name} publishes no KV-cache events")
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": events,
            "replay_endpoint": replay,
            "topic": topic,
        }


_HOST, _PORT = Flag("--host"), Flag("--port")

VLLM_CLI = EngineCli(
    command=("vllm", "serve"),
    leading_args=(),
    model=Flag("--model"),
    model_positional=True,
    served_name=Flag("--served-model-name"),
    host=_HOST,
    port=_PORT,
    tensor_parallel_size=Flag("--tensor-parallel-size", ("-tp",)),
    pipeline_parallel_size=Flag("--pipeline-parallel-size", ("-pp",)),
    dtype=Flag("--dtype"),
    gpu_memory_utilization=Flag("--gpu-memory-utilization"),
    max_model_len=Flag("--max-model-len"),
    max_num_seqs=Flag("--max-num-seqs"),
    max_num_batched_tokens=Flag("--max-num-batched-tokens"),
    download_dir=Flag("--download-dir"),
    quantization=Flag("--quantization", ("-q",)),
    # int8 (W8A8) checkpoints carry their scheme in config.json (compressed-tensors); vLLM detects it.
    quantization_values=_frozen({"awq": "awq", "gptq": "gptq", "fp8": "fp8"}),
    kv_cache_dtype=Flag("--kv-cache-dtype"),
    kv_cache_dtype_values=_frozen({}),
    # Preempted and evicted prefixes kept in host memory (replaced the removed --swap-space).
    cpu_kv_offload_gib=Flag("--kv-offloading-size"),
    prefix_caching=Switch("--enable-prefix-caching", "--no-enable-prefix-caching"),
    chunked_prefill=Switch("--enable-chunked-prefill", "--no-enable-chunked-prefill"),
    chunked_prefill_size=None,
    enforce_eager=Switch("--enforce-eager", None),
    trust_remote_code=Switch("--trust-remote-code", None),
    embedding=("--runner", "pooling", "--convert", "embed"),
    fixed_args=("--disable-uvicorn-access-log",),
    kv_events=Flag("--kv-events-config"),  # vllm/config/kv_events.py (0.32)
    # vllm/config/observability.py (0.32): otlp_traces_endpoint; the exporter speaks gRPC unless
    # OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says otherwise (vllm/tracing/otel.py get_span_exporter)
    otlp_traces=Flag("--otlp-traces-endpoint"),
    block_hash_algo=Flag("--prefix-caching-hash-algo"),  # vllm/config/cache.py (0.32)
    # vLLM 0.32 spans nodes with its multiprocessing executor (vllm/config/parallel.py: nnodes, node_rank,
    # master_addr, master_port "for multi-node distributed inference when distributed_executor_backend is mp"): the
    # leader (node rank 0) serves the API, each other node runs `vllm serve ... --headless` (entrypoints/cli/serve.py
    # run_headless: "headless multiproc executor ... for multi-node PP/TP"). No Ray cluster to start.
    nnodes=Flag("--nnodes", ("-n",)),
    node_rank=Flag("--node-rank", ("-r",)),
    master_addr=Flag("--master-addr"),
    master_port=Flag("--master-port"),
    rendezvous_port=29501,  # ParallelConfig.master_port's default
    revision=Flag("--revision"),
    worker_args=("--headless",),
    multi_node_note="vLLM 0.32's multiprocessing executor: --nnodes, --node-rank, --master-addr/--master-port, "
    "workers --headless",
    # The Run:ai model streamer (vLLM 0.32 LoadConfig.load_format; PyPI runai-model-streamer[-s3] in the
    # image): config and tokenizer are pulled to a local directory, tensors stream from S3 into memory.
    stream_from_s3=("--load-format", "runai_streamer"),
)

SGLANG_CLI = EngineCli(
    command=("python3",),
    leading_args=("-m", "sglang.launch_server"),
    model=Flag("--model-path", ("--model",)),
    model_positional=False,
    served_name=Flag("--served-model-name"),
    host=_HOST,
    port=_PORT,
    tensor_parallel_size=Flag("--tp-size", ("--tensor-parallel-size", "--tp")),
    pipeline_parallel_size=Flag("--pp-size", ("--pipeline-parallel-size",)),
    dtype=Flag("--dtype"),
    gpu_memory_utilization=Flag("--mem-fraction-static"),
    max_model_len=Flag("--context-length"),
    max_num_seqs=Flag("--max-running-requests"),
    max_num_batched_tokens=Flag("--max-prefill-tokens"),
    download_dir=Flag("--download-dir"),
    quantization=Flag("--quantization"),
    quantization_values=_frozen({"awq": "awq", "gptq": "gptq", "fp8": "fp8", "int8": "w8a8_int8"}),
    kv_cache_dtype=Flag("--kv-cache-dtype"),
    # SGLang names the fp8 KV formats explicitly; plain fp8 means e4m3 on current GPUs.
    kv_cache_dtype_values=_frozen({"fp8": "fp8_e4m3"}),
    cpu_kv_offload_gib=None,
    prefix_caching=Switch(None, "--disable-radix-cache"),
    chunked_prefill=None,
    chunked_prefill_size=Flag("--chunked-prefill-size"),
    enforce_eager=Switch("--disable-cuda-graph", None),
    trust_remote_code=Switch("--trust-remote-code", None),
    embedding=("--is-embedding",),
    # SGLang 0.5.3 (sglang/srt/server_args.py): --nnodes, --node-rank and --dist-init-addr HOST:PORT; every node runs
    # launch_server, node rank 0 serves HTTP.
    nnodes=Flag("--nnodes"),
    node_rank=Flag("--node-rank"),
    master_addr=Flag("--dist-init-addr", ("--nccl-init-addr",)),
    rendezvous_port=5000,
    multi_node_note="SGLang 0.5.3: --nnodes, --node-rank, --dist-init-addr",
)

TRTLLM_CLI = EngineCli(
    command=("trtllm-serve",),
    leading_args=("serve",),
    model=None,
    model_positional=True,
    served_name=None,
    host=_HOST,
    port=_PORT,
    tensor_parallel_size=Flag("--tp_size"),
    pipeline_parallel_size=Flag("--pp_size"),
    dtype=None,
    gpu_memory_utilization=Flag("--kv_cache_free_gpu_memory_fraction"),
    max_model_len=Flag("--max_seq_len"),
    max_num_seqs=Flag("--max_batch_size"),
    max_num_batched_tokens=Flag("--max_num_tokens"),
    download_dir=None,
    # Pre-quantized TensorRT-LLM checkpoints carry their format; KV dtype, chunked prefill, block reuse
    # (prefix caching) and CUDA graphs (eager) are keys of the options file.
    quantization=None,
    quantization_values=_frozen({}),
    kv_cache_dtype=None,
    kv_cache_dtype_values=_frozen({}),
    cpu_kv_offload_gib=None,
    prefix_caching=None,
    chunked_prefill=None,
    chunked_prefill_size=None,
    enforce_eager=None,
    trust_remote_code=Switch("--trust_remote_code", None),
    embedding=(),
    options_file=Flag("--extra_llm_api_options"),
    fixed_args=("--backend", "pytorch"),
    multi_node_note="trtllm-serve 1.0.0 spans nodes only as an MPI job (mpirun or srun around "
    "trtllm-llmapi-launch), which a LeaderWorkerSet group does not start",
)

# vLLM 0.32.0: vllm/config/lora.py (MaxLoRARanks, max_cpu_loras >= max_loras) and
# vllm/entrypoints/openai/api_server.py (the two endpoints exist only with the environment variable). Checked
# against vllm-cpu 0.32.0 here: bench/lora/README.md.
VLLM_LORA = LoraCli(
    enable=("--enable-lora",),
    max_loras=Flag("--max-loras"),
    max_rank=Flag("--max-lora-rank"),
    max_cpu_loras=Flag("--max-cpu-loras"),
    ranks=(1, 8, 16, 32, 64, 128, 256, 320, 512),
    env=_frozen({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}),
    load_path="/v1/load_lora_adapter",
    unload_path="/v1/unload_lora_adapter",
)

# vLLM 0.32.0 (the pinned image and the engine venv's vllm-cpu): vllm/entrypoints/serve/dev/sleep/api_router.py
# serves POST /sleep?level=N, POST /wake_up and GET /is_sleeping, registered only with VLLM_SERVER_DEV_MODE=1
# (vllm/entrypoints/launchers/api_server/routers.py); ModelConfig refuses --enable-sleep-mode where
# Platform.is_sleep_mode_available() is false, which is CUDA, ROCm and XPU only, so never on CPU
# (vllm/config/model.py, vllm/platforms/interface.py; tests/integration/test_sleep_mode.py shows it on the real engine).
# The HTTP endpoints are documented from vllm-project/vllm#22310 (docs/features/sleep_mode.md, merged
# 2025-08-06, in v0.10.1): inferstack allows sleep from that release on.
VLLM_SLEEP = SleepMode(
    args=("--enable-sleep-mode",),
    env=_frozen({"VLLM_SERVER_DEV_MODE": "1"}),
    sleep_path="/sleep",
    wake_path="/wake_up",
    state_path="/is_sleeping",
    level=1,
    devices=frozenset({"gpu"}),
    since_version="0.10.1",
)

ENGINES: dict[EngineKind, EngineFacts] = {
    EngineKind.VLLM: EngineFacts(
        display_name="vLLM",
        cli=VLLM_CLI,
        images=_frozen(
            {
                "gpu": "vllm/vllm-openai:v0.32.0",
                "cpu": "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0",
            }
        ),
        quantizations=frozenset({"none", "awq", "gptq", "fp8", "int8"}),
        prepared=frozenset({Prepared.COMPRESSED}),
        memory_share=True,
        version="0.32.0",
        lora=VLLM_LORA,
        health_path="/health",
        metrics_path="/metrics",
        models_path="/v1/models",
        # vLLM 0.32.0 (the pinned image): every current name is checked against a real engine's /metrics
        # (tests/integration/test_engine_signals.py); the names after the first are what older releases export.
        metrics={
            Signal.QUEUED: ("vllm:num_requests_waiting",),
            Signal.RUNNING: ("vllm:num_requests_running",),
            Signal.KV_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            Signal.PREFIX_HITS: ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            Signal.PREFIX_QUERIES: ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
            Signal.TTFT: ("vllm:time_to_first_token_seconds",),
            Signal.INTER_TOKEN: ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
            Signal.PREEMPTIONS: ("vllm:num_preemptions_total",),
            Signal.PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
            Signal.GENERATION_TOKENS: ("vllm:generation_tokens_total",),
        },
        sleep=VLLM_SLEEP,
        kv_transfer=VLLM_KV_TRANSFER,
    ),
    EngineKind.SGLANG: EngineFacts(
        display_name="SGLang",
        cli=SGLANG_CLI,
        images=_frozen({"gpu": "lmsysorg/sglang:v0.5.3-cu126"}),
        quantizations=frozenset({"none", "awq", "gptq", "fp8", "int8"}),
        prepared=frozenset({Prepared.COMPRESSED}),
        memory_share=True,
        version="0.5.3",
        health_path="/health",
        metrics_path="/metrics",
        models_path="/v1/models",
        # SGLang 0.5.3 (lmsysorg/sglang:v0.5.3-cu126): python/sglang/srt/metrics/collector.py of the sglang 0.5.3
        # wheel. SchedulerMetricsCollector: num_queue_reqs, num_running_reqs, token_usage (KV tokens used / pool,
        # 0-1), cache_hit_rate; TokenizerMetricsCollector: prompt_tokens_total, generation_tokens_total,
        # time_to_first_token_seconds, inter_token_latency_seconds. It has no preemption counter
        # (num_retracted_reqs is a gauge).
        metrics={
            Signal.QUEUED: ("sglang:num_queue_reqs",),
            Signal.RUNNING: ("sglang:num_running_reqs",),
            Signal.KV_USAGE: ("sglang:token_usage",),
            Signal.PREFIX_HIT_RATE: ("sglang:cache_hit_rate",),
            Signal.TTFT: ("sglang:time_to_first_token_seconds",),
            Signal.INTER_TOKEN: ("sglang:inter_token_latency_seconds",),
            Signal.PROMPT_TOKENS: ("sglang:prompt_tokens_total",),
            Signal.GENERATION_TOKENS: ("sglang:generation_tokens_total",),
        },
        metrics_flag=("--enable-metrics",),
    ),
    EngineKind.TRTLLM: EngineFacts(
        display_name="TensorRT-LLM",
        cli=TRTLLM_CLI,
        images=_frozen({"gpu": "nvcr.io/nvidia/tensorrt-llm/release:1.0.0"}),
        # Pre-quantized TensorRT-LLM checkpoints (the format is in the checkpoint); trtllm-serve 1.0 does not
        # load AWQ or GPTQ Hugging Face checkpoints, nor llm-compressor's.
        quantizations=frozenset({"none", "fp8", "int8"}),
        prepared=frozenset({Prepared.TRTLLM_ENGINE}),
        # trtllm-serve sizes its KV cache from the memory left free after loading (kv_cache_free_gpu_memory_fraction)
        memory_share=False,
        version="1.0.0",
        health_path="/health",
        # trtllm-serve 1.0.0 (nvcr.io/nvidia/tensorrt-llm/release:1.0.0) exports no Prometheus serving metric:
        # its /metrics answers JSON iteration stats. /prometheus/metrics came with NVIDIA/TensorRT-LLM#5785
        # (merged to main in August 2025, after the 1.0 branch; 1.1.0rc5 serves five request histograms, without
        # a prefix: time_to_first_token_seconds, time_per_output_token_seconds, e2e_request_latency_seconds,
        # request_queue_time_seconds, request_success_total). Queue, running and KV-cache gauges
        # (trtllm_num_requests_waiting, trtllm_num_requests_running, trtllm_kv_cache_utilization) came with
        # #12545 in 2026. So no signal here: TensorRT-LLM models scale on the router's queue alone (plan says
        # so) and no engine ServiceMonitor scrapes them. A newer pinned image adds its names here.
        metrics_path="/prometheus/metrics",
        models_path="/v1/models",
        metrics={},
    ),
}


def facts(kind: EngineKind) -> EngineFacts:
    return ENGINES[kind]
