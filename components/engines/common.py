"""What every engine profile builds with: where an engine runs (``Where``), what starts it (``EngineCommand``),
the argument helpers that read a flag's spelling from ``runtime.engines``, and the image facts a profile states.

Pure: spec in, arguments out. The profiles (one module per engine kind beside this one) write their engine's
command line in its own order from these pieces, so a knob spelled the same way is written the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from components.spec import EngineSpec, KvCacheDType, ModelSpec, Transport
from runtime.config import EngineKind, KvEventsSource
from runtime.engines import TELEMETRY_OFF_ENV, EngineCli, Flag, Switch, facts

HF_CACHE_DIR = "/tmp/hf"  # the Hugging Face libraries' cache; nothing is downloaded (HF_HUB_OFFLINE)
ENGINE_CONFIG_DIR = "/etc/inferstack/engine"
"""Where an engine pod sees the files its command carries (``EngineCommand.files``, from a ConfigMap)."""

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
    files: dict[str, str] = field(default_factory=dict)  # file name -> content, mounted at ENGINE_CONFIG_DIR


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


@dataclass(frozen=True)
class Write:
    """A place an engine writes by default (``~`` is HOME), and the variable that moves it, if any."""

    path: str
    moved_by: str | None = None


@dataclass(frozen=True)
class ImageFacts:
    user: str
    """The image's own user (what it would run as without our securityContext)."""
    writes: tuple[Write, ...]
    source: str
    """Where these facts come from, with versions."""


@dataclass(frozen=True)
class EngineProfile:
    """One engine kind as the control plane knows it, beside its runtime facts (``runtime.engines``)."""

    kind: EngineKind
    command: Callable[[ModelSpec, Where], EngineCommand]
    """Its command line for a model, running where ``Where`` says."""
    image: ImageFacts
    """Where its images write (``components.render.engine_images`` checks a rendered pod against it)."""
    image_gib: Mapping[str, float]
    """Device -> its pinned image's compressed size (the cold-start estimate pulls it)."""
    init_s: int
    """Seconds from weights loaded to serving (compile, CUDA graph capture, KV cache profiling)."""


HF_CACHE = Write("~/.cache/huggingface", "HF_HOME")
TORCH_INDUCTOR = Write("/tmp")  # torch._inductor: tempfile.gettempdir()/torchinductor_<user> (also IPC files)
SHM = Write("/dev/shm")  # worker processes and NCCL exchange tensors through shared memory
TRITON = Write("~/.triton")  # Triton's kernel cache (TRITON_CACHE_DIR defaults to ~/.triton/cache)
FLASHINFER_JIT = (HF_CACHE, Write("~/.cache/flashinfer"), TRITON, TORCH_INDUCTOR, SHM)
"""What the CUDA images that JIT-compile FlashInfer kernels write (SGLang, TensorRT-LLM's PyTorch backend)."""

_KV = KvEventsSource.model_fields


def lora_args(model: ModelSpec) -> tuple[list[str], dict[str, str]]:
    """LoRA arguments and environment for a model with adapters (none without): slots and rank sized from the
    spec, loading at run time allowed (the router loads each adapter where a request for it lands)."""
    lora = facts(model.engine.kind).lora
    if not model.adapters or lora is None:  # the spec refuses adapters on engines without ``lora``
        return [], {}
    limits = model.engine.lora
    args = [
        *lora.enable,
        *valued(lora.max_loras, limits.max_per_batch),
        *valued(lora.max_rank, limits.max_rank),
        *valued(lora.max_cpu_loras, limits.loaded),
    ]
    return args, dict(lora.env)


def sleep_args(model: ModelSpec) -> tuple[list[str], dict[str, str]]:
    """Sleep mode's arguments and environment (its endpoints served) for a model that sleeps when idle (none
    otherwise; the spec refuses sleep on engines and devices without it)."""
    sleep = facts(model.engine.kind).sleep
    if model.scaling.sleep_after_idle_s is None or sleep is None:
        return [], {}
    return list(sleep.args), dict(sleep.env)


#: NIXL backend per transport (the plugin names of the nixl 1.5.1 wheels: nixl_cu13.libs/nixl/libplugin_UCX.so,
#: libplugin_LIBFABRIC.so).
_NIXL_BACKENDS = {Transport.UCX: "UCX", Transport.TCP: "UCX", Transport.LIBFABRIC: "LIBFABRIC"}


def kv_transfer_args(model: ModelSpec) -> tuple[list[str], dict[str, str]]:
    """The KV connector of a disaggregated model's serving unit (its role: ``components.core.lifecycle.pd_units``):
    the connector's config for its role and transport, and the environment the transport needs (tcp: UCX over TCP
    only, ``UCX_TLS=tcp``). Where the engine's side channel listens is where it runs (the pod's address, or a
    loopback port of its own on one machine): the caller's (``side_channel_env``)."""
    kv = facts(model.engine.kind).kv_transfer
    role = model.pd_role
    if role is None or kv is None:  # the spec refuses disaggregation on engines without ``kv_transfer``
        return [], {}
    transport = model.transport()
    # the lease outlasts the router's longest wait for a decode carrying the KV (``ModelSpec.prefill_stage``)
    config = kv.config(
        role, model.engine.device.value, (_NIXL_BACKENDS[transport],), model.prefill_stage().kv_lease_s
    )
    env = {"UCX_TLS": "tcp"} if transport is Transport.TCP else {}
    return [kv.flag, json.dumps(config, separators=(",", ":"))], env


def side_channel_env(model: ModelSpec, host: str, port: int | None = None) -> dict[str, str]:
    """Where a disaggregated model's engine takes its peers' handshakes: ``host`` (reachable from the other role's
    engines), on ``port`` (the engine's default where not given); nothing for other models."""
    kv = facts(model.engine.kind).kv_transfer
    if model.pd_role is None or kv is None:
        return {}
    return kv.env(host, kv.side_channel_port if port is None else port)


def kv_events(cli: EngineCli, model: ModelSpec, where: Where) -> list[str]:
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
    return valued(cli.kv_events, config) + valued(cli.block_hash_algo, _KV["hash_algo"].default)


def valued(flag: Flag | None, value: object) -> list[str]:
    """``[flag, value]``, or nothing where the engine has no such flag or there is no value."""
    return [] if flag is None or value is None else [flag.name, str(value)]


def switched(switch: Switch | None, value: bool) -> list[str]:
    return [] if switch is None else switch.args(value)


def start(cli: EngineCli, model: ModelSpec, where: Where) -> list[str]:
    """The arguments every engine begins with: the model, its served name, where it listens."""
    named = [where.model] if cli.model_positional else valued(cli.model, where.model)
    return [
        *cli.leading_args,
        *named,
        *valued(cli.served_name, where.served_name or model.served_name),
        *valued(cli.host, where.host),
        *valued(cli.port, where.port),
    ]


def quantization(cli: EngineCli, model: ModelSpec) -> list[str]:
    """The weight format flag; none for a checkpoint that names its own (a version quantized by its preparation)."""
    if model.format_in_checkpoint:
        return []
    return valued(cli.quantization, cli.quantization_values.get(model.engine.quantization.value))


def kv_cache_dtype(cli: EngineCli, e: EngineSpec) -> list[str]:
    if e.kv_cache_dtype is KvCacheDType.AUTO:
        return []
    value = e.kv_cache_dtype.value
    return valued(cli.kv_cache_dtype, cli.kv_cache_dtype_values.get(value, value))
