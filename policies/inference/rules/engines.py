"""Engines and GPU nodes read back from resources: which model, which shape, which node it selects.

An engine is a workload whose app container runs vLLM, SGLang or trtllm-serve. Its model and memory
shape come from the command line it will actually run (later flags win, as with argparse), so a flag
appended by hand or through ``extra_args`` counts; each flag is looked up in the engine table
(``runtime.engines``) the command lines are rendered from. Its node comes from the EKS node group whose
labels its nodeSelector matches (or, for clusters the stack does not create, the rule's
``pool_instance_types``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from components.base import catalog, packing, sizing
from components.core import nodes
from policies.inference.rules.base import Config, Props, Res, as_list, as_map, dig, number
from policies.inference.rules.k8s import Container, containers, gpus_requested, pod_labels, workloads
from runtime.config import EngineKind
from runtime.defaults import DEFAULT_MAX_NUM_SEQS
from runtime.engines import ENGINES, EngineCli, Flag

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
SYSTEM_ROLE = "system"


@dataclass(frozen=True)
class EngineArgs:
    kind: EngineKind
    model: str | None
    served_name: str | None
    tp: int
    pp: int
    dtype: str
    quantization: str
    kv_cache_dtype: str
    max_model_len: int | None
    max_num_seqs: int
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float
    enforce_eager: bool
    nnodes: int = 1
    """Nodes the engine spans (a multi-node group's --nnodes); each node's process uses gpus / nnodes GPUs."""
    streamed: bool = False
    """The engine streams its weights from the model store (the engine table's ``stream_from_s3`` arguments)."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nnodes if self.gpus % self.nnodes == 0 else self.gpus

    def shape(self, arch: catalog.ModelArch) -> sizing.EngineShape:
        return sizing.EngineShape(
            quantization=self.quantization,
            dtype=self.dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            tensor_parallel_size=self.tp,
            pipeline_parallel_size=self.pp,
            # Without --max-model-len the engines use the model's whole context.
            max_model_len=self.max_model_len or arch.max_context_tokens,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=self.enforce_eager,
        )


def _flags(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``--flag value`` / ``--flag=value`` / bare ``--flag`` into a dict (last one wins) and positionals."""
    flags: dict[str, str] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
            if "=" in arg:
                key, value = arg.split("=", 1)
                flags[key] = value
            elif i + 1 < len(argv) and not (argv[i + 1].startswith("-") and not _is_number(argv[i + 1])):
                flags[arg] = argv[i + 1]
                i += 1
            else:
                flags[arg] = ""
        else:
            positional.append(arg)
        i += 1
    return flags, positional


def engine_flags(container: Container) -> dict[str, str]:
    """A container's ``--flag value`` pairs (command and args; the last of a flag wins, as with argparse)."""
    argv = [str(a) for a in as_list(container.props.get("command")) + as_list(container.props.get("args"))]
    return _flags(argv)[0]


def _is_number(text: str) -> bool:
    return number(text) is not None


def _value(flags: Mapping[str, str], flag: Flag | None) -> str | None:
    """What the command line gives ``flag`` under any of its spellings; None when it is absent."""
    for name in flag.spellings if flag is not None else ():
        if flags.get(name):
            return flags[name]
    return None


def _int(flags: Mapping[str, str], flag: Flag | None) -> int | None:
    value = number(_value(flags, flag))
    return int(value) if value is not None else None


def _quantization(value: str | None) -> str:
    value = (value or "none").lower()
    for prefix, name in (
        ("awq", "awq"),
        ("gptq", "gptq"),
        ("fp8", "fp8"),
        ("w8a8", "int8"),
        ("int8", "int8"),
    ):
        if value.startswith(prefix):
            return name
    return "none"


def _hint(model: str | None) -> str | None:
    """Pre-quantized checkpoints name their format (…-AWQ-INT4, …-FP8); engines detect it from config.json."""
    name = (model or "").rsplit("/", 1)[-1].lower()
    return next((q for q in ("awq", "gptq", "fp8", "w8a8", "int8") if q in name), None)


def _runs(cli: EngineCli, flags: Mapping[str, str], words: Sequence[str]) -> bool:
    """Whether a command line runs this engine: the words of its program (``vllm serve``, ``trtllm-serve``),
    or, for one started as a python module (``-m sglang.launch_server``), anything of that package."""
    if cli.leading_args[:1] == ("-m",):
        package = cli.leading_args[1].split(".")[0]
        return flags.get("-m", "").split(".")[0] == package or any(w.startswith(package) for w in words)
    return all(word in words for word in cli.command)


def _model(cli: EngineCli, flags: Mapping[str, str], positional: list[str], words: list[str]) -> str | None:
    """What the engine loads: its model option, else the first argument after the program (and subcommand)."""
    named = _value(flags, cli.model)
    if named or not cli.model_positional:
        return named
    after = positional[words.index(cli.command[-1]) + 1 :]
    lead = list(cli.leading_args)
    after = after[len(lead) :] if after[: len(lead)] == lead else after
    return after[0] if after else None


def parse_engine(container: Container) -> EngineArgs | None:
    """The engine a container runs, read with the engine table's flags; None when it runs none of them."""
    argv = [str(a) for a in as_list(container.props.get("command")) + as_list(container.props.get("args"))]
    flags, positional = _flags(argv)
    words = [p.rsplit("/", 1)[-1] for p in positional]
    kind = next((k for k, engine in ENGINES.items() if _runs(engine.cli, flags, words)), None)
    if kind is None:
        return None
    cli = ENGINES[kind].cli
    model = _model(cli, flags, positional, words)
    memory = number(_value(flags, cli.gpu_memory_utilization))
    return EngineArgs(
        kind=kind,
        model=model,
        served_name=_value(flags, cli.served_name),
        tp=max(_int(flags, cli.tensor_parallel_size) or 1, 1),
        pp=max(_int(flags, cli.pipeline_parallel_size) or 1, 1),
        dtype=(_value(flags, cli.dtype) or "auto").lower(),
        quantization=_quantization(_value(flags, cli.quantization) or _hint(model)),
        kv_cache_dtype=(_value(flags, cli.kv_cache_dtype) or "auto").lower(),
        max_model_len=_int(flags, cli.max_model_len),
        max_num_seqs=_int(flags, cli.max_num_seqs) or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=_int(flags, cli.max_num_batched_tokens),
        gpu_memory_utilization=memory if memory is not None else 0.9,
        enforce_eager=cli.enforce_eager is not None and cli.enforce_eager.on in flags,
        nnodes=max(_int(flags, cli.nnodes) or 1, 1),
        streamed=_carries(argv, cli.stream_from_s3),
    )


def _carries(argv: Sequence[str], args: Sequence[str]) -> bool:
    """``args`` appear in ``argv`` in order, side by side (empty ``args``: never)."""
    n = len(args)
    return n > 0 and any(list(argv[i : i + n]) == list(args) for i in range(len(argv) - n + 1))


@dataclass(frozen=True)
class Engine:
    """An engine workload: the resource, its pod spec, the engine container and what it runs."""

    res: Res
    pod: Props
    container: Container
    args: EngineArgs

    @property
    def gpus(self) -> int:
        """Whole GPUs the pod requests (0 for a time slice or a MIG instance: see ``shared_gpu``)."""
        return gpus_requested(self.pod)

    @property
    def shared_gpu(self) -> str | None:
        """The shared-GPU resource the pod requests (a time slice or a MIG instance), or None."""
        for c in containers(self.pod, init=False):
            for key in (
                *as_map(dig(c.props, "resources", "requests")),
                *as_map(dig(c.props, "resources", "limits")),
            ):
                if key == nodes.SHARED_GPU_RESOURCE or str(key).startswith(nodes.MIG_RESOURCE_PREFIX):
                    return str(key)
        return None

    @property
    def uses_gpu(self) -> bool:
        return self.gpus > 0 or self.shared_gpu is not None

    def device(self, instance: catalog.InstanceType) -> catalog.Gpu | None:
        """What one replica's memory lands on: a GPU of ``instance``, or its MIG instance; None for a MIG profile
        the GPU does not have."""
        share = self.shared_gpu
        if share is None or not share.startswith(nodes.MIG_RESOURCE_PREFIX):
            return instance.gpu_spec
        profile = instance.gpu_spec.mig_profile(share.removeprefix(nodes.MIG_RESOURCE_PREFIX))
        return packing.mig_device(instance.gpu_spec, profile) if profile is not None else None

    @property
    def node_selector(self) -> Mapping[str, str]:
        return as_map(self.pod.get("nodeSelector"))

    @property
    def labels(self) -> Mapping[str, str]:
        return pod_labels(self.res)

    def arch(self) -> tuple[str, catalog.ModelArch] | None:
        """The model's architecture from the catalog, by what the engine loads or serves, or the S3 prefix."""
        candidates = [self.args.model, self.args.served_name]
        for c in containers(self.pod):
            candidates += [a.rstrip("/") for a in as_list(c.props.get("args")) + as_list(c.props.get("command"))
                           if isinstance(a, str) and a.startswith("s3://")]  # fmt: skip
        for name in candidates:
            if not name:
                continue
            # A store location or cache copy ends in the revision: try every segment (org, name, revision).
            for key in (name, *reversed(name.rstrip("/").split("/"))):
                found = catalog.lookup_model(key)
                if found is not None:
                    return found
        return None


def engines(resources: Sequence[Res]) -> list[Engine]:
    out = []
    for res, pod in workloads(resources):
        for c in containers(pod, init=False):
            parsed = parse_engine(c)
            if parsed is not None:
                out.append(Engine(res, pod, c, parsed))
                break
    return out


@dataclass(frozen=True)
class NodePool:
    """A group of nodes pods can select: its labels, instance type, taints (Kubernetes spelling), bounds."""

    res: Res | None
    name: str
    labels: Mapping[str, str]
    instance_type: str | None
    taints: tuple[tuple[str, str, str], ...]  # key, value, effect
    capacity_type: str
    max_size: int | None

    @property
    def instance(self) -> catalog.InstanceType | None:
        return catalog.INSTANCE_TYPES.get(self.instance_type or "")

    @property
    def is_gpu(self) -> bool:
        ami = str(self.res.props.get("amiType", "")) if self.res else ""
        return self.instance is not None or "NVIDIA" in ami or "GPU" in ami

    @property
    def is_system(self) -> bool:
        return self.labels.get(nodes.ROLE_LABEL) == SYSTEM_ROLE


_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


def node_pools(resources: Sequence[Res], config: Config | None = None) -> list[NodePool]:
    """EKS node groups, plus pools the rule config names for clusters the stack does not create."""
    out = []
    for r in resources:
        if r.type != NODE_GROUP:
            continue
        p = r.props
        taints = tuple(
            (
                str(as_map(t).get("key", "")),
                str(as_map(t).get("value") or ""),
                _EFFECTS.get(str(as_map(t).get("effect", "")), str(as_map(t).get("effect", ""))),
            )
            for t in as_list(p.get("taints"))
        )
        types = [str(t) for t in as_list(p.get("instanceTypes"))]
        size = number(dig(p, "scalingConfig", "maxSize"))
        labels = {str(k): str(v) for k, v in as_map(p.get("labels")).items()}
        out.append(
            NodePool(
                r,
                labels.get(nodes.POOL_LABEL) or str(p.get("nodeGroupName") or r.name),
                labels,
                types[0] if types else None,
                taints,
                str(p.get("capacityType") or "ON_DEMAND"),
                int(size) if size is not None else None,
            )
        )
    out += [k for r in resources if (k := karpenter_pool(r)) is not None]
    known = {p.labels.get(nodes.POOL_LABEL) for p in out}
    for pool, instance in as_map((config or {}).get("pool_instance_types")).items():
        if pool not in known:
            out.append(
                NodePool(
                    None,
                    str(pool),
                    {nodes.POOL_LABEL: str(pool)},
                    str(instance),
                    ((nodes.GPU_TAINT_KEY, "", nodes.GPU_TAINT_EFFECT),),
                    "ON_DEMAND",
                    None,
                )
            )
    return out


def is_karpenter_pool(res: Res) -> bool:
    return res.kind == "NodePool" and str(res.props.get("apiVersion", "")).startswith("karpenter.sh/")


def karpenter_pool(res: Res) -> NodePool | None:
    """A Karpenter NodePool read as a pool: template labels and taints, instance and capacity type from its
    requirements (the smallest-memory GPU type when several are allowed: fit is judged against the worst
    node it may launch), and node bound from its nvidia.com/gpu limit."""
    if not is_karpenter_pool(res):
        return None
    template = as_map(dig(res.props, "spec", "template"))
    labels = {str(k): str(v) for k, v in as_map(dig(template, "metadata", "labels")).items()}
    allowed: dict[str, list[str]] = {}
    for item in as_list(dig(template, "spec", "requirements")):
        req = as_map(item)
        if req.get("operator") == "In":
            allowed[str(req.get("key"))] = [str(v) for v in as_list(req.get("values"))]
    types = allowed.get("node.kubernetes.io/instance-type", [])
    known = sorted(
        (catalog.INSTANCE_TYPES[t] for t in types if t in catalog.INSTANCE_TYPES),
        key=lambda i: (i.gpu_spec.memory_gib, i.gpus),
    )
    instance_type = known[0].name if known else (types[0] if types else None)
    taints = tuple(
        (
            str(as_map(t).get("key", "")),
            str(as_map(t).get("value") or ""),
            _EFFECTS.get(str(as_map(t).get("effect", "")), str(as_map(t).get("effect", ""))),
        )
        for t in as_list(dig(template, "spec", "taints"))
    )
    gpu_limit = number(dig(res.props, "spec", "limits", nodes.GPU_RESOURCE))
    max_size = int(gpu_limit // known[0].gpus) if gpu_limit is not None and known else None
    spot = "spot" in allowed.get("karpenter.sh/capacity-type", [])
    return NodePool(
        res,
        labels.get(nodes.POOL_LABEL) or res.k8s_name,
        labels,
        instance_type,
        taints,
        "SPOT" if spot else "ON_DEMAND",
        max_size,
    )


def pools_for(selector: Mapping[str, str], pools: Sequence[NodePool]) -> list[NodePool]:
    """The pools whose node labels a nodeSelector matches (an empty selector matches every pool)."""
    return [p for p in pools if all(p.labels.get(k) == v for k, v in selector.items())]


def gpu_pool_of(engine: Engine, pools: Sequence[NodePool]) -> NodePool | None:
    """The one GPU pool an engine's nodeSelector picks with a known instance type, or None."""
    if not engine.node_selector:
        return None
    found = [p for p in pools_for(engine.node_selector, pools) if p.instance is not None]
    return found[0] if len(found) == 1 else None


POOL_INSTANCE_TYPES_SCHEMA = {"type": "object", "additionalProperties": {"type": "string"}}
