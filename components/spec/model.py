"""The models section: a model to serve, with its weights, scaling, objectives, routing, GPU share and adapters
(its engine is in ``engine``, its versions and rollout in ``versions``)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field, PrivateAttr, ValidationError, create_model, field_validator, model_validator

from components.base import catalog
from components.base.enums import Device, DType
from components.base.packing import shared_memory_utilization
from components.spec.base import (
    AUTO,
    MAX_MODEL_NAME,
    DnsLabel,
    HubCommit,
    _checked_source,
    _Spec,
    every_problem,
    is_hub_source,
    is_local_path,
    is_pinned_source,
)
from components.spec.engine import ArchitectureSpec, EngineSpec, engines_that
from components.spec.versions import (
    ModelVersionSpec,
    RolloutSpec,
    _check_preparation,
    _engine_of,
    _version_engine,
)
from runtime.config import (
    BuiltinScorerName,
    EngineKind,
    PrefillStage,
    RouterSettings,
    StrategyName,
    Task,
    knob_field,
    prefill_field,
    reads_engine_events,
    routing_knobs,
    routing_knobs_read,
    routing_scorers,
    strategy_field,
)
from runtime.engines import ENGINES, facts


class WeightsFetch(StrEnum):
    AUTO = "auto"
    STREAMER = "streamer"
    NODE_CACHE = "node-cache"


class WeightsSpec(_Spec):
    """How an engine gets its weights from the platform's model store (never from the hub at start)."""

    fetch: WeightsFetch = WeightsFetch.AUTO
    """auto (placement picks: vLLM streams from the store, other engines read a node-level cache), streamer
    (vLLM's Run:ai streamer reads safetensors straight from S3) or node-cache (copied once per node to its
    local NVMe, or root disk where it has none, and shared by every replica there)."""


class ScalingSpec(_Spec):
    """When to add and remove replicas (the thresholds derive from the SLO and engine limits)."""

    min_replicas: Annotated[int, Field(ge=0)] = 1
    """0 enables scale-to-zero: the first request wakes the model."""
    max_replicas: Annotated[int, Field(ge=1)] = 1
    """Most replicas the autoscaler may run (equal to min_replicas: a fixed count, no autoscaler); the pool's
    node ceiling and the projected monthly cost assume it."""
    queue_per_replica: Annotated[float, Field(gt=0)] | None = None
    """Waiting requests per replica that trigger scale-up; defaults to 10% of max_num_seqs."""
    kv_cache_usage_target: Annotated[float, Field(gt=0, le=1)] = 0.85
    """KV cache usage (0-1) above which to scale up."""
    scale_up_stabilization_s: Annotated[int, Field(ge=0, le=3600)] = 30
    """Seconds load must stay high before replicas are added (the HPA's scale-up stabilization window)."""
    scale_down_stabilization_s: Annotated[int, Field(ge=0, le=3600)] = 600
    """Cooldown: how long load must stay low before replicas are removed."""
    idle_before_zero_s: Annotated[int, Field(ge=60)] = 900
    """With min_replicas 0: idle time before the last replica goes."""
    sleep_after_idle_s: Annotated[int, Field(ge=10, le=86_400)] | None = None
    """Idle time after which a replica goes to sleep instead of staying hot (vLLM sleep mode, level 1: weights
    move to host memory, the KV cache is dropped, the GPU memory is freed) and wakes on the next request, which
    the router holds meanwhile (seconds for a sleeping replica, against minutes for a cold start). None: replicas
    never sleep. Engines and devices that support it only (vLLM on GPUs)."""
    cold_start_hold_ms: Annotated[int, Field(ge=0)] = 90_000
    """With min_replicas 0: how long the router holds a request while the model has no ready replica (one is
    starting from zero; the waiting request is what wakes it); past it the client gets 503 with Retry-After.
    At most the router's first-byte timeout. 0 answers 503 at once (the refusals still wake the model), which is
    what the endpoint picker does in gateway.mode inference-extension (it holds nothing; a hold is refused)."""

    @model_validator(mode="after")
    def _ordered(self) -> ScalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas}); "
                f"raise max_replicas to at least {self.min_replicas}"
            )
        return self

    @model_validator(mode="after")
    def _hold_fits(self) -> ScalingSpec:
        first_byte_ms = RouterSettings().first_byte_timeout_ms
        if self.cold_start_hold_ms > first_byte_ms:
            raise ValueError(
                f"cold_start_hold_ms ({self.cold_start_hold_ms}) is longer than the router's first-byte timeout "
                f"({first_byte_ms} ms), which the load balancer's idle timeout is sized from: a request held "
                f"longer is cut off upstream while the router still holds it; use at most {first_byte_ms}"
            )
        if "cold_start_hold_ms" in self.model_fields_set and self.min_replicas > 0:
            raise ValueError(
                f"cold_start_hold_ms has no effect with min_replicas {self.min_replicas} (a model that never "
                "scales to zero is never started for a waiting request): remove it, or set min_replicas: 0"
            )
        return self


class Transport(StrEnum):
    """How a disaggregated model's KV cache travels from a prefill engine to a decode engine (NIXL's backend)."""

    AUTO = "auto"
    UCX = "ucx"
    LIBFABRIC = "libfabric"
    TCP = "tcp"


#: Engine settings both roles of a disaggregated model share: one engine kind, placed alike (pool size and cost count
#: the prefill role's replicas as the model's).
_ROLE_SHAPE = frozenset(
    {"kind", "device", "tensor_parallel_size", "pipeline_parallel_size", "nodes", "cpu_cores", "memory_gib"}
)

#: The suffix of the serving unit that runs a disaggregated model's prefill role ('<model>-prefill').
PREFILL_SUFFIX = "-prefill"


def kv_transfer_refusal(kind: EngineKind, device: Device, kv_cache_dtype: str) -> str | None:
    """Why an engine of ``kind`` on ``device`` with KV cache ``kv_cache_dtype`` cannot hand its KV cache to another
    (prefill/decode disaggregation); None: it can. One answer for the spec's rule and the policy pack's, which reads
    the rendered engines (policies/inference/rules/disaggregation.py)."""
    if not facts(kind).can.kv_transfer:
        able = engines_that(lambda c: c.kv_transfer)
        return f"{facts(kind).display_name} hands no KV cache to another engine here; use {able}"
    if device is Device.CPU and kv_cache_dtype != "auto":  # vllm/platforms/cpu.py 0.32: NotImplementedError
        return "vLLM-CPU moves no fp8 KV cache between engines; keep engine.kv_cache_dtype auto"
    return None


class PrefillRoleSpec(_Spec):
    """The prefill role of a disaggregated model: engines that compute prompts and hand their KV cache to the
    model's own engines, which decode. It runs in the model's pool unless ``pool`` names another."""

    pool: DnsLabel | None = None
    """The GPU pool its engines run on (a pool of the stack, e.g. one of a cheaper or compute-heavier instance
    type); None: the model's pool. Sizing, cost and node placement follow it. Across pools the KV crosses the
    network between them: in prod the policy asks for a fast path (both pools with EFA, one zone, an RDMA
    transport; ``components.core.disaggregation``)."""
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    """Its replicas, and when the autoscaler adds or removes them."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Engine settings of the prefill engines that differ from the model's (e.g. a larger max_num_batched_tokens
    for long prompts); its kind and device are the model's."""


class DisaggregationSpec(_Spec):
    """Serve the model as two roles (prefill/decode disaggregation): prefill engines compute each prompt's KV cache
    and the model's own engines pull it (vLLM's NixlConnector) and decode. The router sends each request's prefill
    first, then its decode with the KV's whereabouts; when the prefill or the transfer fails or is late, the decode
    computes the prompt itself, so no request is lost or hangs (runtime/router/disagg.py)."""

    prefill: PrefillRoleSpec = Field(default_factory=PrefillRoleSpec)
    """The prefill role: its replicas, scaling and engine overrides."""
    transport: Transport = Transport.AUTO
    """How the KV travels: ucx (RDMA where the nodes have it, TCP where they do not), libfabric (EFA pools), tcp
    (UCX over TCP only: a network without RDMA), or auto (ucx on GPUs, tcp on CPU)."""
    prefill_timeout_ms: int = prefill_field("timeout_ms")
    prefill_attempts: int = prefill_field("attempts")
    transfer_timeout_ms: int = prefill_field("transfer_timeout_ms")


class SloSpec(_Spec):
    """Latency objectives; scaling and alerts are derived from them."""

    ttft_p95_ms: Annotated[int, Field(ge=1)] = 2000
    """95th percentile time to first token."""
    inter_token_p95_ms: Annotated[int, Field(ge=1)] = 100
    """95th percentile time between streamed tokens."""
    allow_cold_starts: bool = True
    """A request may wait while a replica starts from zero (scaling.min_replicas 0). false: the model must
    always have a warm replica, and min_replicas 0 is refused."""


class _RoutingFields(_Spec):
    strategy: StrategyName = Field(default="prefix_aware", description=strategy_field("name").description)
    weights: dict[BuiltinScorerName, Annotated[float, Field(ge=0)]] = strategy_field("weights")


# then a field per knob a stack file may set per model, from the router's records (``Knob.stack``), by name
if TYPE_CHECKING:
    _RoutingKnobs = _RoutingFields
else:
    _RoutingKnobs = create_model(
        "RoutingKnobs",
        __base__=_RoutingFields,
        __module__=__name__,
        **{name: (knob.type, knob_field(knob)) for name, knob in routing_knobs().items()},
    )


class RoutingSpec(_RoutingKnobs):
    """How the gateway spreads this model's requests over its replicas: a named strategy (a preset blend
    of scorers), weights that adjust the blend, and the knobs of the scorers it uses. Names, ranges and
    descriptions come from the router's registry (``runtime.config``), so a typo fails here, at plan."""

    KNOBS: ClassVar[frozenset[str]] = frozenset(routing_knobs())

    priority: int | None = None
    """gateway.mode inference-extension: the request priority of this model's InferenceObjective
    (inference.networking.x-k8s.io/v1alpha2): under load the gateway serves higher first and may shed
    negative ones. Requests name it with the x-gateway-inference-objective header (the objective is named
    after the model)."""

    @model_validator(mode="after")
    def _knobs_take_effect(self) -> RoutingSpec:
        read = routing_knobs_read(self.strategy, self.weights)
        for knob in sorted((self.model_fields_set & self.KNOBS) - read):
            readers = " or ".join(n for n, info in routing_scorers().items() if knob in info.knob_names)
            raise ValueError(
                f"{knob} has no effect with strategy {self.strategy!r} and these weights (only the {readers}"
                " scorer reads it): remove it, or choose a strategy or weights that use that scorer"
            )
        return self


MIG_PROFILE = re.compile(r"^[1-7]g\.\d+gb$")


class GpuShareSpec(_Spec):
    """The part of one GPU a replica takes on a shared pool: a memory fraction (time-slicing) or a MIG profile."""

    fraction: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Pool sharing time-slicing: the share of one GPU's memory the engine may use, e.g. 0.25. Its
    gpu_memory_utilization is derived from it (fraction x the safe total), so engines that share a GPU never
    ask for more than the card has. On a CPU engine (target local): its share of the memory the machine gives
    its engines (`inferstack local up --engine-memory-gib`), which sizes its KV cache (VLLM_CPU_KVCACHE_SPACE)."""
    mig_profile: str | None = None
    """Pool sharing mig: the MIG instance profile each replica runs in, e.g. '1g.10gb' or '3g.40gb' on an H100
    (`inferstack size <model>` shows the smallest that holds it on each GPU); the engine requests
    nvidia.com/mig-<profile>."""

    @field_validator("mig_profile")
    @classmethod
    def _profile_name(cls, value: str | None) -> str | None:
        if value is not None and not MIG_PROFILE.match(value):
            raise ValueError(
                f"{value!r} is not a MIG profile name; write '<compute slices>g.<memory>gb', e.g. '1g.10gb'"
            )
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> GpuShareSpec:
        if (self.fraction is None) == (self.mig_profile is None):
            raise ValueError(
                "give exactly one of fraction (a time-slicing pool, e.g. 0.25) or mig_profile (a mig pool, "
                "e.g. '1g.10gb')"
            )
        return self


class AdapterSpec(_Spec):
    """A LoRA adapter of the model: clients ask for it by name; the router loads it onto a replica of
    the model the first time a request for it lands there."""

    name: DnsLabel
    """What clients put in `model` for this adapter; unique in the stack, and no model's name."""
    source: str
    """Hugging Face repo id ('org/name', pinned by revision), an 's3://bucket/prefix/' holding
    adapter_config.json and adapter_model.safetensors, or (target local) a local directory."""
    revision: HubCommit | None = None
    """Hugging Face sources: the hub commit (40 hex digits, never a branch or tag, which move) to fetch, as for a
    model; required on a cluster, where the adapter is copied into the model store at that commit. Not for S3 or
    local sources."""
    rank: Annotated[int, Field(ge=1, le=512)]
    """The adapter's LoRA rank (adapter_config.json "r"); at most engine.lora.max_rank."""

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _checked_source(value, "adapter")

    @model_validator(mode="after")
    def _revision_for_hub(self) -> AdapterSpec:
        if self.revision is not None and not self.is_hub:
            raise ValueError(
                f"revision applies to Hugging Face sources only, not {self.source!r}: remove it "
                "(an S3 prefix or a directory is pinned by writing a new one per version)"
            )
        return self

    @property
    def is_hub(self) -> bool:
        return is_hub_source(self.source)

    @property
    def pinned(self) -> bool:
        """A source that cannot change under the same spec: a hub commit, an S3 prefix, a local directory (the one
        rule, ``is_pinned_source``, that the plan-time rule and the policy pack's adapter rule ask too)."""
        return is_pinned_source(self.source, self.revision)


class ModelSpec(_Spec):
    """A model to serve, its engine, placement, scale and objectives."""

    name: DnsLabel
    """Served model name: what clients put in `model`; a DNS label, unique in the stack."""
    source: str
    """Hugging Face repo id ('org/name', with revision), an 's3://bucket/prefix/' of prepared weights in the model
    store, or (target local) a local path."""
    revision: HubCommit | None = None
    """The hub commit (40 hex digits) of a Hugging Face source: the weights the preparation Job copies into the
    model store, so every replica serves exactly that model. Required for hub sources on a cluster."""
    weights: WeightsSpec = Field(default_factory=WeightsSpec)
    """How engines get the weights from the model store (streamer or node-level cache)."""
    architecture: ArchitectureSpec | None = None
    """Required when the catalog does not know the source; see `inferstack size --list`."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The serving engine and its launch knobs: kind, parallelism, precision, length and batch limits."""
    pool: str = AUTO
    """GPU pool name, or 'auto' for the cheapest declared pool that fits."""
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    """Replica bounds, and when the autoscaler adds or removes replicas."""
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    """How the router picks one of this model's replicas for each request."""
    slo: SloSpec = Field(default_factory=SloSpec)
    """Latency objectives; scaling triggers and alerts derive from them."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How long its replicas may take to start; how they roll (surge from the pool's spare GPUs)."""
    task: Task | None = None
    """generate or embed; defaults from the architecture (embedding models pool)."""
    gpu_share: GpuShareSpec | None = None
    """Share a GPU instead of taking whole ones: a memory fraction on a time-slicing pool, a MIG profile on a
    mig pool. None: each replica takes engine.tensor_parallel_size x pipeline_parallel_size whole GPUs."""
    team: DnsLabel | None = None
    """The team or tenant that owns the model. In production the policy pack lets models of different teams
    share a GPU only through MIG (isolated memory and faults), never time-slicing."""

    adapters: list[AdapterSpec] = Field(default_factory=list)
    """LoRA adapters of this model, served under their own names from its replicas (vLLM only); each
    replica loads the ones asked of it, up to engine.lora.max_loaded."""

    disaggregation: DisaggregationSpec | None = None
    """Serve the model as separate prefill and decode roles (vLLM; NixlConnector). None: every replica does both."""

    versions: list[ModelVersionSpec] = Field(default_factory=list)
    """Versions served under this one name, with traffic weights adding up to 100; the first is the stable
    version (rollbacks return to it), the others are canaries (rollout.canary). Each version runs its own
    replicas within scaling (pool size and cost count them). Empty: one version, the model."""

    # Set on the serving units derived from versions (components.core.lifecycle), never from a stack file.
    _served_as: str | None = PrivateAttr(default=None)
    _version_of: tuple[str, str, int, bool] | None = PrivateAttr(
        default=None
    )  # model, version, weight, stable
    _format_in_checkpoint: bool = PrivateAttr(default=False)
    _prepared_by: str | None = PrivateAttr(default=None)
    # Set on the serving units of a disaggregated model: "prefill" or "decode", and the decode unit's prefill unit.
    _pd_role: str | None = PrivateAttr(default=None)
    _prefill_unit: str | None = PrivateAttr(default=None)

    @property
    def serving_units(self) -> int:
        """Deployments serving the model: one per version (each scales on its own within scaling), else one."""
        return max(1, len(self.versions))

    @property
    def served_name(self) -> str:
        """What clients send and the engine serves: the model's name, also for each of its versions."""
        return self._served_as or self.name

    @property
    def version_of(self) -> tuple[str, str, int, bool] | None:
        """(model, version, weight, stable) for a serving unit derived from a version; None otherwise."""
        return self._version_of

    @property
    def prepared_by(self) -> str | None:
        """The preparation Job whose output this unit loads (its source), if any."""
        return self._prepared_by

    @property
    def format_in_checkpoint(self) -> bool:
        """The checkpoint says its own quantization (llm-compressor output): no --quantization flag."""
        return self._format_in_checkpoint

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _checked_source(value)

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        """Each of the model's rules below runs, and a model with mistakes in several of its parts hears of each."""
        every_problem(
            type(self).__name__,
            self._weights_rules,
            self._adapters_servable,
            self._cold_starts_allowed,
            self._versions,
            self._sleep_supported,
            self._share_rules,
            self._kv_events_possible,
            self._disaggregation_rules,
        )
        return self

    def _disaggregation_rules(self) -> ModelSpec:
        pd = self.disaggregation
        if pd is None:
            return self
        kind, device = self.engine.kind, self.engine.device
        refusal = kv_transfer_refusal(kind, device, self.engine.kv_cache_dtype.value)
        if refusal is not None:
            raise ValueError(f"disaggregation: {refusal}")
        if self.resolved_task() is not Task.GENERATE:
            raise ValueError("disaggregation: only generation models have a prefill to hand over")
        if self.versions:
            raise ValueError("disaggregation: a model served in versions is not served disaggregated (yet)")
        if self.gpu_share is not None:
            raise ValueError("disaggregation: engines on a GPU share are not served disaggregated (yet)")
        if (self.engine.nodes or 1) > 1:
            raise ValueError("disaggregation: a replica that spans nodes is not served disaggregated (yet)")
        if pd.transport is Transport.LIBFABRIC and device is Device.CPU:
            raise ValueError(
                "disaggregation.transport: libfabric is for EFA on GPU pools; on CPU use tcp or auto"
            )
        fixed = sorted(_ROLE_SHAPE & set(pd.prefill.engine))
        if fixed:
            raise ValueError(
                f"disaggregation.prefill.engine: {', '.join(fixed)} are the model's (both roles run one engine,"
                " placed alike)"
            )
        try:
            self.prefill_engine()
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            raise ValueError(
                f"disaggregation.prefill.engine{'.' + where if where else ''}: {message}"
            ) from None
        unit = f"{self.name}{PREFILL_SUFFIX}"
        if len(unit) > MAX_MODEL_NAME:
            raise ValueError(
                f"disaggregation: its prefill engines are named {unit!r}, {len(unit)} characters; a disaggregated "
                f"model's name may have at most {MAX_MODEL_NAME - len(PREFILL_SUFFIX)}"
            )
        return self

    @property
    def prefill_pool(self) -> str | None:
        """The pool of a disaggregated model's prefill role when it names its own (None: the model's; then the
        model's placement holds both roles)."""
        pd = self.disaggregation
        return pd.prefill.pool if pd is not None else None

    def pd_roles(self) -> tuple[ModelSpec, ModelSpec]:
        """A disaggregated model's serving units: the decode role (the model itself, under its name) and the
        prefill role ('<model>-prefill': its own replicas, scaling, engine and pool where it names one, serving the
        model's name; prefix-affine routing, as it is the prefill that reuses a cached prefix)."""
        pd = self.disaggregation
        assert pd is not None
        name = f"{self.name}{PREFILL_SUFFIX}"
        decode = self.model_copy()
        decode._pd_role, decode._prefill_unit = "decode", name
        prefill = self.model_copy(
            update={
                "name": name,
                "engine": self.prefill_engine(),
                "scaling": pd.prefill.scaling,
                "routing": RoutingSpec(strategy="prefix_aware"),
                "pool": pd.prefill.pool or self.pool,
            }
        )
        prefill._served_as, prefill._pd_role = self.name, "prefill"
        return decode, prefill

    def prefill_stage(self) -> PrefillStage:
        """The router's bounds on a disaggregated model's prefills (``runtime.config.PrefillStage``) and the KV lease
        both roles' engines are rendered with, which outlasts them (``PrefillStage.lease_for``): one value, read
        by the router's config and the engines' connector config alike."""
        pd = self.disaggregation
        assert pd is not None
        stage = PrefillStage(
            target=f"{self.served_name}{PREFILL_SUFFIX}",
            timeout_ms=pd.prefill_timeout_ms,
            attempts=pd.prefill_attempts,
            transfer_timeout_ms=pd.transfer_timeout_ms,
        )
        return stage.model_copy(
            update={"kv_lease_s": stage.lease_for(RouterSettings().first_byte_timeout_ms)}
        )

    def prefill_engine(self) -> EngineSpec:
        """The engine of a disaggregated model's prefill role: the model's, with the role's overrides."""
        pd = self.disaggregation
        overrides = pd.prefill.engine if pd is not None else {}
        return EngineSpec.model_validate({**self.engine.model_dump(exclude_unset=True), **overrides})

    def transport(self) -> Transport:
        """The KV transport of a disaggregated model's engines: as set, or for auto UCX on GPUs (RDMA where the
        nodes have it, TCP where not) and TCP on CPU."""
        pd = self.disaggregation
        chosen = pd.transport if pd is not None else Transport.AUTO
        if chosen is not Transport.AUTO:
            return chosen
        return Transport.TCP if self.engine.device is Device.CPU else Transport.UCX

    @property
    def pd_role(self) -> str | None:
        """ "prefill" or "decode" on a serving unit of a disaggregated model (components.core.lifecycle)."""
        return self._pd_role

    @property
    def prefill_unit(self) -> str | None:
        """On a disaggregated model's decode unit: the name of its prefill unit."""
        return self._prefill_unit

    def unit_replicas(self, bound: str) -> int:
        """``scaling.min_replicas`` or ``max_replicas`` of all the model's serving units together: one per version,
        or the decode and the prefill role where both share the model's pool (what pool sizes and cost count; a
        prefill role in a pool of its own is placed, sized and billed as its own unit: ``placement.members``)."""
        own = int(getattr(self.scaling, bound))
        pd = self.disaggregation
        if pd is not None and self._pd_role is None and pd.prefill.pool is None:  # the model, both roles
            return own + int(getattr(pd.prefill.scaling, bound))
        return own * self.serving_units

    def _weights_rules(self) -> ModelSpec:
        if self.revision is not None and not self.is_hub:
            raise ValueError(
                f"revision pins a Hugging Face source; {self.source!r} is not one: remove revision (an s3:// or "
                "local source is what it is)"
            )
        if self.weights.fetch is WeightsFetch.STREAMER and not facts(self.engine.kind).can.weight_streamer:
            raise ValueError(
                f"weights.fetch: streamer is for engines that stream weights from the store "
                f"({engines_that(lambda c: c.weight_streamer)}); {self.engine.kind.value} reads a node-level "
                "cache: set weights.fetch to node-cache or auto"
            )
        return self

    @property
    def is_local_path(self) -> bool:
        return is_local_path(self.source)

    def _adapters_servable(self) -> ModelSpec:
        if not self.adapters:
            if "lora" in self.engine.model_fields_set:
                raise ValueError(
                    "engine.lora has no effect on a model without adapters: remove it, or add adapters"
                )
            return self
        engine = facts(self.engine.kind)
        if engine.lora is None:
            raise ValueError(
                f"adapters: {engine.display_name} {engine.version} (engine.kind {self.engine.kind.value}) is not "
                "driven with LoRA adapters by inferstack (its adapters cannot be loaded and routed at run time "
                "here); serve this model with kind: vllm, or remove its adapters"
            )
        if self.resolved_task() is Task.EMBED:
            raise ValueError("adapters: an embedding model serves no LoRA adapters here; remove them")
        lora = self.engine.lora
        if lora.max_rank not in engine.lora.ranks:
            raise ValueError(
                f"engine.lora.max_rank: {engine.display_name} {engine.version} accepts "
                f"{', '.join(map(str, engine.lora.ranks))}, not {lora.max_rank}"
            )
        names = [a.name for a in self.adapters]
        for i, adapter in enumerate(self.adapters):
            if names.index(adapter.name) != i:
                raise ValueError(f"adapters[{i}].name: {adapter.name!r} is used twice")
            if adapter.rank > lora.max_rank:
                raise ValueError(
                    f"adapters[{i}].rank: {adapter.name} has rank {adapter.rank}, above engine.lora.max_rank "
                    f"{lora.max_rank}; raise max_rank to at least {adapter.rank} (it sizes every adapter slot)"
                )
        if self.engine.device is Device.CPU and self.engine.dtype is not DType.FLOAT32:
            raise ValueError(
                "adapters on device: cpu need engine.dtype: float32: vLLM-CPU 0.32.0 with LoRA on dies with "
                "SIGILL in its bfloat16 (AMX) attention kernel at the first request (bench/lora/README.md)"
            )
        return self

    @property
    def is_hub(self) -> bool:
        """A Hugging Face repository id (not an S3 URI, not a local path)."""
        return is_hub_source(self.source)

    def arch(self) -> catalog.ModelArch | None:
        """The architecture from the stack file, else from the catalog; None when neither knows it."""
        if self.architecture is not None:
            return self.architecture.to_catalog()
        found = catalog.lookup_model(self.source) or catalog.lookup_model(self.name)
        return found[1] if found else None

    def _cold_starts_allowed(self) -> ModelSpec:
        if self.scaling.min_replicas == 0 and not self.slo.allow_cold_starts:
            raise ValueError(
                f"scaling.min_replicas: 0 lets {self.name} scale to zero, so its first request after idle waits "
                "for a replica to start, but slo.allow_cold_starts is false; set min_replicas to at least 1, "
                "or allow cold starts"
            )
        return self

    def _versions(self) -> ModelSpec:
        if not self.versions:
            if self.rollout.canary is not None:
                raise ValueError("rollout.canary needs versions: list the stable version and the canary")
            return self
        if len(self.versions) < 2:
            raise ValueError(
                "versions: list at least two (the stable version first, then the canary), or none"
            )
        if self.adapters:
            raise ValueError(
                "adapters: a model served in versions carries no LoRA adapters here (the router routes an "
                "adapter to its base model's replicas, not through the version split); serve the adapters on a "
                "model without versions"
            )
        total = sum(v.weight for v in self.versions)
        if total != 100:
            raise ValueError(
                "versions: the weights add up to "
                f"{total}, not 100 ({', '.join(f'{v.name}: {v.weight}' for v in self.versions)})"
            )
        seen: dict[str, int] = {}
        served: dict[tuple[str, ...], int] = {}
        for j, v in enumerate(self.versions):
            if v.name in seen:
                raise ValueError(f"versions[{j}].name: {v.name!r} is also versions[{seen[v.name]}].name")
            unit = f"{self.name}-{v.name}"
            if len(unit) > MAX_MODEL_NAME:
                raise ValueError(
                    f"versions[{j}].name: its engines are named {unit!r}, {len(unit)} characters; model and version "
                    f"names together may have at most {MAX_MODEL_NAME - 1}"
                )
            seen[v.name] = j
            if v.source is not None:
                try:
                    _checked_source(v.source)
                except ValueError as err:
                    raise ValueError(f"versions[{j}].source: {err}") from None
            engine = _version_engine(j, self.engine, v, prepared=False)
            if v.preparation is not None:
                _check_preparation(j, v.preparation, engine)
            engine = _version_engine(j, self.engine, v, prepared=True)
            if v.revision is not None and v.source is not None and not is_hub_source(v.source):
                raise ValueError(
                    f"versions[{j}].revision: revision pins a Hugging Face source; {v.source!r} is not one: "
                    "remove revision"
                )
            key = (
                self.version_source(v),
                self.version_revision(v) or "",
                engine.model_dump_json(),
                v.preparation.model_dump_json() if v.preparation else "",
            )
            if key in served:
                raise ValueError(
                    f"versions[{j}]: same source, revision, engine and preparation as versions[{served[key]}]: "
                    "two versions must differ in what they serve"
                )
            served[key] = j
        if self.rollout.canary is None:
            raise ValueError(
                "rollout.canary: versions need a canary rule (steps and rollback), e.g. "
                "`rollout: {canary: {steps_percent: [10, 25, 50, 100]}}`"
            )
        steps = self.rollout.canary.steps_percent
        for j, v in enumerate(self.versions[1:], start=1):
            if v.weight and v.weight not in steps:
                raise ValueError(
                    f"versions[{j}].weight: {v.weight} is not a step of rollout.canary.steps_percent {steps}; "
                    "move the canary step by step"
                )
        return self

    def version_engine(self, version: ModelVersionSpec) -> EngineSpec:
        """The engine a version runs: the model's, with the version's overrides and its prepared format."""
        return _engine_of(self.engine, version)

    def version_source(self, version: ModelVersionSpec) -> str:
        return version.source or self.source

    def version_revision(self, version: ModelVersionSpec) -> str | None:
        """The hub commit a version's source is pinned at: its own, or the model's when it keeps the model's
        source."""
        if version.revision is not None:
            return version.revision
        return self.revision if version.source is None else None

    def _sleep_supported(self) -> ModelSpec:
        if self.scaling.sleep_after_idle_s is None:
            return self
        engine, device = facts(self.engine.kind), self.engine.device
        sleep = engine.sleep
        if sleep is None or device.value not in sleep.devices:
            supported = ", ".join(
                f"{f.display_name} on {'/'.join(sorted(f.sleep.devices))}"
                for f in ENGINES.values()
                if f.sleep
            )
            raise ValueError(
                f"scaling.sleep_after_idle_s: {engine.display_name} on {device.value} has no sleep mode "
                f"(supported: {supported}); remove it (min_replicas: 0 scales to zero instead)"
            )
        zero = self.scaling.min_replicas == 0
        if zero and self.scaling.sleep_after_idle_s >= self.scaling.idle_before_zero_s:
            raise ValueError(
                f"scaling.sleep_after_idle_s ({self.scaling.sleep_after_idle_s}) must be shorter than "
                f"idle_before_zero_s ({self.scaling.idle_before_zero_s}): a replica sleeps first, then goes"
            )
        return self

    def _share_rules(self) -> ModelSpec:
        share, e = self.gpu_share, self.engine
        if share is None:
            return self
        if e.device is Device.CPU and share.mig_profile is not None:
            raise ValueError(
                "gpu_share.mig_profile: a CPU engine has no GPU to cut into MIG instances; on CPU (target local) "
                "give gpu_share.fraction, its share of the memory the machine gives its engines"
            )
        if e.device is Device.GPU and e.gpus != 1:
            raise ValueError(
                f"gpu_share: a replica that shares a GPU runs on one GPU, but tensor x pipeline parallel size is "
                f"{e.gpus}; set both to 1 or remove gpu_share"
            )
        if share.fraction is not None and not facts(e.kind).can.memory_share:
            raise ValueError(
                f"gpu_share.fraction: {facts(e.kind).display_name} sizes its KV cache from the memory left free "
                "after loading, so a time-sliced share cannot bound it; use kind "
                f"{engines_that(lambda c: c.memory_share)}, or a MIG profile (gpu_share.mig_profile on a mig pool)"
            )
        if share.fraction is not None and "gpu_memory_utilization" in e.model_fields_set:
            raise ValueError(
                "engine.gpu_memory_utilization is derived from gpu_share.fraction on a time-sliced GPU (so the "
                "engines sharing it fit together); remove it and set the fraction"
            )
        return self

    @property
    def memory_utilization(self) -> float:
        """The engine's gpu_memory_utilization: the spec's, or derived from a time-sliced share."""
        if self.gpu_share is not None and self.gpu_share.fraction is not None:
            return shared_memory_utilization(self.gpu_share.fraction)
        return self.engine.gpu_memory_utilization

    def resolved_task(self) -> Task:
        if self.task is not None:
            return self.task
        arch = self.arch()
        return Task.EMBED if arch is not None and arch.pooling else Task.GENERATE

    @property
    def publishes_kv_events(self) -> bool:
        """Its routing weighs the engines' own KV-cache events (``precise_prefix``): the engines publish
        them and every router replica follows them."""
        return reads_engine_events(self.routing.strategy, self.routing.weights)

    def _kv_events_possible(self) -> ModelSpec:
        if self.publishes_kv_events:
            if not facts(self.engine.kind).can.kv_events:
                raise ValueError(
                    "routing: precise_prefix reads the engines' KV-cache events, which only"
                    f" {engines_that(lambda c: c.kv_events)} publishes here, not {self.engine.kind.value}; use"
                    " strategy prefix_aware"
                )
            if not self.engine.enable_prefix_caching:
                raise ValueError(
                    "routing: precise_prefix routes to the engine caching the prompt's prefix, but"
                    " engine.enable_prefix_caching is false; turn it on or use another strategy"
                )
        return self
