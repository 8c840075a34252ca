"""What `make local` runs, decided by pure functions: the process plan, the rendered config, the banner.

``build_plan(stack, options)`` turns a validated ``target: local`` stack into a ``LocalPlan``: which
models to make, which engines to start (one per replica, each on its own port and CPU core), which
runtime services to start after them (health monitor, batcher when there is an embedding model,
router last) and the ``RuntimeConfig`` they all read. That config comes from the same renderer as the
Kubernetes stacks' ConfigMap (``components.render.runtime_config``); only the addresses differ
(static 127.0.0.1 backends instead of EndpointSlice discovery, loopback listeners, no Kubernetes
events). Nothing here touches a process, a socket or the disk, so all of it is unit-tested without
engines; ``components.local.supervisor`` is the thin shell that carries the plan out.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from components import packing, placement, sizing
from components.local.monitor import Monitor
from components.local.tiny_model import GENERATED_MODELS, Kind
from components.render import common, scaling
from components.render import runtime_config as rendered
from components.spec import ModelSpec, PlatformSpec, Target
from components.stackfile import Stack
from runtime.config import EngineKind, FileDiscovery, RuntimeConfig, Task

HOST = "127.0.0.1"
DEFAULT_ROUTER_PORT = 8080
DEFAULT_HEALTH_PORT = 8081
DEFAULT_BATCHER_PORT = 8082
DEFAULT_ENGINE_PORT = 8000
DEFAULT_STATE_DIR = Path(".local")
#: Generated models live here; a missing model directory elsewhere is the user's to provide.
GENERATED_MODELS_DIR = Path(".cache/models")
#: Local routers drain in-flight requests for this long at Ctrl-C (the cluster default is 30 s).
LOCAL_DRAIN_GRACE_S = 5
#: vLLM-CPU KV cache per engine (VLLM_CPU_KVCACHE_SPACE), GiB: enough for a tiny model, small on a laptop.
KV_CACHE_GIB = 1
#: Memory the engines of models with gpu_share.fraction share, GiB, unless `--engine-memory-gib` says otherwise.
DEFAULT_ENGINE_MEMORY_GIB = 8.0
#: Environment variable every process of one local stack carries (its state dir): finds stragglers.
TAG_ENV = "INFERSTACK_LOCAL_STACK"


class PlanError(Exception):
    """A user mistake found while planning: one message that says what to change. Exit code 2."""

    exit_code = 2


@dataclass(frozen=True)
class LocalOptions:
    """What the user can choose on the command line (`inferstack local up --help`)."""

    router_port: int = DEFAULT_ROUTER_PORT
    health_port: int = DEFAULT_HEALTH_PORT
    batcher_port: int = DEFAULT_BATCHER_PORT
    engine_port: int = DEFAULT_ENGINE_PORT
    """The first engine's port; the others take the next ones."""
    state_dir: Path = DEFAULT_STATE_DIR
    cpus: tuple[int, ...] = (0,)
    """CPU cores engines are pinned to, in turn (VLLM_CPU_OMP_THREADS_BIND): one core each."""
    engine_memory_gib: float = DEFAULT_ENGINE_MEMORY_GIB
    """Memory of this machine the engines of models with gpu_share.fraction share (their KV caches are sized
    from their fractions of it)."""
    monitor: Monitor | None = None
    """Also run Prometheus (`--monitor`) with the stack's rendered rules."""


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
    on_demand: bool = False
    """Started by the autoscaler when demand calls for it (replicas above min_replicas), not at start-up."""
    kv_cache_space_gib: int = KV_CACHE_GIB
    """VLLM_CPU_KVCACHE_SPACE: from the model's gpu_share.fraction of the engines' memory, else KV_CACHE_GIB."""

    @property
    def model(self) -> str:
        """The served model name."""
        return self.spec.name

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

    def argv(self, python: str, config: Path) -> list[str]:
        return [python, "-m", self.module, "--config", str(config)]

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
    spec: PlatformSpec | None = None
    monitor: Monitor | None = None
    engine_memory_gib: float = DEFAULT_ENGINE_MEMORY_GIB

    @property
    def router(self) -> ServiceLaunch:
        return self.services[-1]

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
        return (
            [(s.port, s.name, s.option) for s in reversed(self.services)]
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
            need = fit.weights_gib + fit.activations_gib + fit.runtime_gib + 1
            least = need / (packing.SHARED_GPU_SAFE_TOTAL * engine_memory_gib)
            raise _problem(
                stack,
                f"models[{i}].gpu_share.fraction",
                f"{fraction:g} of {engine_memory_gib:g} GiB leaves {model.name} no KV cache (it needs 1 GiB beside "
                f"{need - 1:.1f} GiB of weights, activations and runtime): give it at least {least:.2f}, or more "
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
    if spec.target is not Target.LOCAL:
        raise _problem(
            stack,
            "target",
            f"{spec.target.value}: `inferstack local` runs stacks with target: local "
            f"(stacks/Pulumi.local.yaml); deploy this one with `pulumi up -s {stack.name}`",
        )
    for i, model in enumerate(spec.models):
        if model.engine.kind is not EngineKind.VLLM:
            raise _problem(
                stack,
                f"models[{i}].engine.kind",
                f"{model.engine.kind.value}: the local target runs vLLM on CPU only; set kind: vllm",
            )
    if spec.gateway.require_api_key:
        raise _problem(
            stack,
            "gateway.require_api_key",
            "the local target has no key store and listens on 127.0.0.1 only; set it to false",
        )


def build_plan(stack: Stack, options: LocalOptions, repo_root: Path) -> LocalPlan:
    """The whole process plan for ``stack``; ``PlanError`` on anything the user must change."""
    check_stack(stack)
    spec = stack.spec
    if not options.cpus:
        raise PlanError("no CPU cores to pin engines to")
    preps = model_preps(spec, repo_root, stack.source)
    kv = kv_cache_spaces(stack, options.engine_memory_gib)
    engines: list[EngineLaunch] = []
    port = options.engine_port
    for model, prep in zip(spec.models, preps, strict=True):
        for r in range(replicas(model)):
            core = options.cpus[len(engines) % len(options.cpus)]
            on_demand = scaling.scales(model) and r >= model.scaling.min_replicas
            engines.append(
                EngineLaunch(
                    f"{model.name}-{r}", model, prep.path, port, str(core), on_demand, kv[model.name]
                )
            )
            port += 1
    services = [ServiceLaunch("health", "runtime.health", options.health_port, "--health-port")]
    if rendered.has_batcher(spec):
        services.append(ServiceLaunch("batcher", "runtime.batcher", options.batcher_port, "--batcher-port"))
    services.append(ServiceLaunch("router", "runtime.router", options.router_port, "--port"))
    monitor = [(options.monitor.port, "Prometheus", "--monitor-port")] if options.monitor else []
    check_ports(
        [(s.port, s.name, s.option) for s in services]
        + monitor
        + [(e.port, f"engine {e.name}", "--engine-port") for e in engines]
    )
    return LocalPlan(
        stack=stack.name,
        source=stack.source,
        state_dir=options.state_dir,
        models=tuple(preps),
        engines=tuple(engines),
        services=tuple(services),
        config=local_runtime_config(
            spec, engines, {s.name: s.port for s in services}, endpoints_path(options.state_dir.absolute())
        ),
        generate_models=tuple(m.name for m in spec.models if m.resolved_task() is not Task.EMBED),
        embed_models=tuple(m.name for m in spec.models if m.resolved_task() is Task.EMBED),
        spec=spec,
        monitor=options.monitor,
        engine_memory_gib=options.engine_memory_gib,
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
    spec: PlatformSpec, engines: Sequence[EngineLaunch], ports: dict[str, int], endpoints: Path | None = None
) -> RuntimeConfig:
    """The cluster's RuntimeConfig (same renderer), with this machine's addresses: fixed replicas for models
    of a fixed size, the autoscaler's ``endpoints`` file for models that scale (replicas come and go)."""
    backends: dict[str, list[str]] = {}
    for engine in engines:
        backends.setdefault(engine.model, []).append(engine.url)
    base = rendered.runtime_config(spec, static_backends=backends)
    doc = base.model_dump(mode="json", exclude_none=True)
    for model, target in zip(spec.models, doc["models"], strict=True):
        if scaling.scales(model) and endpoints is not None:
            service = common.engine_name(model.name)
            target["static_backends"] = []
            target["discovery"] = FileDiscovery(path=endpoints, service=service).model_dump(mode="json")
    doc["router"].update(
        host=HOST,
        port=ports["router"],
        health_feed_url=f"http://{HOST}:{ports['health']}/v1/backends",
        drain_grace_s=LOCAL_DRAIN_GRACE_S,
    )
    for route in doc["router"].get("routes", []):
        if route.get("batcher_url"):
            route["batcher_url"] = f"http://{HOST}:{ports['batcher']}"
    doc["health"].update(host=HOST, port=ports["health"], kubernetes_events=False)
    doc["health"].pop("remediate_after_s", None)
    doc["batcher"].update(host=HOST, port=ports.get("batcher", DEFAULT_BATCHER_PORT))
    return RuntimeConfig.model_validate(doc)


def describe(plan: LocalPlan) -> list[str]:
    """The plan in a few lines (printed before starting, and by `status`)."""
    lines = [
        f"stack {plan.stack} ({plan.source}): {len(plan.engines)} engines, then {', '.join(s.name for s in plan.services)}"
    ]
    for e in plan.engines:
        when = "  (started on demand)" if e.on_demand else ""
        lines.append(f"  engine {e.name:<24} {e.url}  core {e.cpu_cores}  {e.path}{when}")
    for s in plan.services:
        lines.append(f"  {s.name:<31} {s.url}")
    if plan.monitor is not None:
        lines.append(f"  {'prometheus':<31} {plan.monitor.url}")
    return lines


#: What the banner's examples ask (the README's too): a question a small chat model gets right.
FIRST_QUESTION = "What is the capital of France?"


def banner(plan: LocalPlan, ready_s: float, detached: bool) -> str:
    """What the user sees once the router is ready: the URL, a curl line and an openai snippet."""
    url = plan.router.url
    chat = plan.generate_models[0] if plan.generate_models else None
    lines = [
        "",
        f"inferstack local is ready in {ready_s:.0f}s: {len(plan.always_on)} vLLM engines behind the router"
        + (
            f", {len(plan.engines) - len(plan.always_on)} more on demand"
            if len(plan.engines) > len(plan.always_on)
            else ""
        ),
        "",
        f"  OpenAI API  {url}/v1   models: {', '.join(plan.generate_models + plan.embed_models)}",
        f"  metrics     {url}/metrics   (health monitor: {plan.services[0].url}/v1/backends)",
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
