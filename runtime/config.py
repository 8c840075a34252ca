"""The contract between the control plane and the data plane.

The control plane (``components``) renders one ``RuntimeConfig`` per platform into a ConfigMap
(Kubernetes) or a file (``make local``); the router, health monitor and batcher each read it and use
their own section. It lives in ``runtime`` so the images never import the control plane, and the
control plane imports only this module of ``runtime`` (and ``runtime.defaults``: shared constants that
the command line reads without loading pydantic).

Everything here is plain data with validation: no I/O, no defaults that depend on the environment.
Durations carry their unit in the name (``_ms``, ``_s``); sizes too (``_bytes``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    WithJsonSchema,
    create_model,
    model_validator,
)

from runtime import scheduling
from runtime.defaults import DEFAULT_MAX_NUM_SEQS

SCHEMA_VERSION: Literal[1] = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineKind(StrEnum):
    """Serving engines whose endpoints and metric names the runtime knows (see ``runtime.engines``)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class Task(StrEnum):
    """What a model's engines serve: token generation or pooling (embeddings, scores)."""

    GENERATE = "generate"
    EMBED = "embed"


def _known_strategy(name: str) -> str:
    problem = scheduling.unknown_strategy(name)
    if problem:
        raise ValueError(problem)
    return name


def _builtin_scorer(name: str) -> str:
    problem = scheduling.unknown_scorer(name, scheduling.builtin_scorers())
    if problem:
        raise ValueError(problem)
    return name


#: A routing strategy: the name of a preset of ``runtime.scheduling`` (an enum in the JSON Schema).
StrategyName = Annotated[
    str,
    AfterValidator(_known_strategy),
    WithJsonSchema({"type": "string", "enum": list(scheduling.PRESETS)}),
]
#: A scorer every router image has (plug-ins are named only in a runtime config, which the router checks).
BuiltinScorerName = Annotated[
    str,
    AfterValidator(_builtin_scorer),
    WithJsonSchema({"type": "string", "enum": list(scheduling.builtin_scorers())}),
]


#: A ZeroMQ endpoint an engine publishes on: tcp (host:port) or ipc (a socket file, one machine).
ZMQ_ENDPOINT = r"^(tcp://[^\s/]+:\d{1,5}|ipc:///[^\s]+)$"


class StaticReplica(_Strict):
    """One engine replica at a fixed address (``make local``, tests, or clusters without discovery)."""

    url: HttpUrl = Field(
        description="Base URL of the engine's OpenAI-compatible server, e.g. http://10.0.0.5:8000."
    )
    weight: float = Field(default=1.0, gt=0, description="Relative share for strategies that use weights.")
    kv_events_endpoint: Annotated[str, Field(pattern=ZMQ_ENDPOINT)] | None = Field(
        default=None,
        description="Where this replica publishes KV-cache events (with the model's kv_events); None: the"
        " replica's host at kv_events.port.",
    )
    kv_replay_endpoint: Annotated[str, Field(pattern=ZMQ_ENDPOINT)] | None = Field(
        default=None, description="Its replay endpoint; None: the replica's host at kv_events.replay_port."
    )


class KvEventsSource(_Strict):
    """How the router follows a model's engines' KV-cache events (vLLM's ZMQ publisher: BlockStored,
    BlockRemoved, AllBlocksCleared), so it knows which prompt blocks each engine holds, and how to compute
    the engines' block hashes for a request's prompt (its tokenizer, the engines' hash and seed)."""

    port: int = Field(default=5557, ge=1, le=65535, description="Publisher port on each discovered replica.")
    replay_port: int = Field(
        default=5558, ge=1, le=65535, description="Replay (ROUTER) port on each discovered replica."
    )
    topic: str = Field(default="kv-events", description="The engines' kv_events topic.")
    hash_algo: Literal["sha256_cbor"] = Field(
        default="sha256_cbor",
        description="The engines' --prefix-caching-hash-algo: sha256 of canonical CBOR, reproducible outside"
        " Python (vLLM's default, sha256 of a pickle, is not rendered with KV events).",
    )
    hash_seed: str = Field(
        default="vllm-none-hash",
        description="What the first block's parent hash derives from: vLLM's fixed seed, or the engines'"
        " PYTHONHASHSEED when that is set.",
    )
    tokenizer_dir: Path = Field(
        description="Directory with the model's tokenizer.json (and chat template), as the engines load it."
    )
    max_blocks: int = Field(
        default=1_000_000,
        ge=1,
        description="Bound of the view (blocks over all replicas of the model); beyond it the oldest go.",
    )
    replay_timeout_ms: int = Field(
        default=2_000, ge=10, description="Longest wait for an engine's replay after a (re)connect."
    )


class KubernetesDiscovery(_Strict):
    """Find replicas through EndpointSlices of a Service (watched, not polled)."""

    namespace: str = Field(description="Namespace of the engine Service.")
    service: str = Field(description="Name of the engine Service whose EndpointSlices list the replicas.")
    port_name: str = Field(default="http", description="Named port of the Service that serves HTTP.")


class FileDiscovery(_Strict):
    """Find replicas in a file in Prometheus' file_sd format that whoever starts them rewrites (``make
    local``): the ``targets`` of the groups labelled ``service``, as EndpointSlices list a Service's
    ready endpoints."""

    path: Path = Field(description="JSON list of {targets: [host:port, ...], labels: {service: ...}}.")
    service: str = Field(description="The `service` label of this model's groups.")
    poll_interval_ms: int = Field(
        default=500, ge=50, description="How often the file is checked for changes."
    )


class AdapterTarget(_Strict):
    """A LoRA adapter of a model: a name clients ask for, and what its replicas load for it."""

    name: str = Field(description="The `model` clients send for the adapter.")
    path: str = Field(
        description="What the engine's load endpoint gets as lora_path: a directory on the replica."
    )


def version_target_name(model: str, version: str) -> str:
    """The target name of one version of a model: what the health feed and per-version routes key on."""
    return f"{model}-{version}"


class VersionOf(_Strict):
    """Marks a target as one version of a model that clients reach under another name."""

    model: str = Field(
        description="The `model` clients send, and the --served-model-name of this version's engines."
    )
    version: str = Field(description="The version's name (metrics label, events).")
    weight: float = Field(ge=0, le=100, description="Percent of the model's requests this version gets.")
    stable: bool = Field(
        default=False,
        description="The version rollbacks return to, and retries of a failed canary request go to.",
    )


class PrefillStage(_Strict):
    """The model is served disaggregated (prefill/decode): its own replicas decode (vLLM ``kv_role:
    kv_consumer``), the replicas of ``target`` compute prompts (``kv_producer``), and the KV cache moves
    between them (NixlConnector). The router sends each request's prefill first (``max_tokens`` 1,
    ``kv_transfer_params: {do_remote_decode: true}``), then its decode with the KV's whereabouts the prefill
    answered; whatever goes wrong on the way (no prefill replica, a failed or slow prefill, a transfer that
    fails or stalls), the decode computes the prompt itself. See ``runtime.router.disagg``."""

    target: str = Field(
        description=(
            "The ModelTarget whose replicas run the prefills. Its engines serve the same model name as this"
            " one (the prefill carries the client's `model`, an adapter's too); clients never reach it by its"
            " own name. Its route's strategy picks the prefill replica (prefix affinity), this model's the"
            " decode replica (load, KV). It lists no adapters: this model's are loaded on its replicas."
        )
    )
    timeout_ms: int = Field(
        default=30_000,
        ge=1,
        description=(
            "Longest one prefill may take, connect to answer; past it the next prefill replica is tried, or"
            " the decode computes the prompt itself."
        ),
    )
    attempts: int = Field(
        default=2,
        ge=1,
        le=8,
        description="Prefill replicas one request tries before its decode computes the prompt itself.",
    )
    transfer_timeout_ms: int = Field(
        default=20_000,
        ge=1,
        description=(
            "A streamed decode that carries a prefill's KV must send its first token within this (the KV's"
            " transfer plus one step), else it is cancelled and the decode computes the prompt itself, and the"
            " prefill replica is charged with a failed transfer. A decode that is not streamed has its first"
            " byte when its answer is whole: router.first_byte_timeout_ms bounds it."
        ),
    )
    kv_lease_s: int | None = Field(
        default=None,
        ge=1,
        description=(
            "How long the prefill engines hold a prefill's KV blocks for its decode (NixlConnector"
            " `kv_lease_duration`; rendered from `lease_for`, which outlasts every wait below). The router never"
            " lets a decode carrying the KV answer after the lease, counted from the prefill's sending: past it the"
            " blocks may have been freed and reused, and the decode would read someone else's KV. None: the"
            " connector's default (vLLM's 30 s)."
        ),
    )

    def lease_for(self, first_byte_timeout_ms: int) -> int:
        """The KV lease (whole seconds) that outlasts the longest the router may wait for a decode carrying the
        KV, counted from the prefill's sending: the prefill (``timeout_ms``), then the decode's answer head
        (``first_byte_timeout_ms`` not streamed, ``transfer_timeout_ms`` streamed), plus ``KV_LEASE_MARGIN_S``
        for what happens between them. The lease is only waited out for a decode that never pulls its KV (a
        decode engine that died): a live one pulls the blocks, or releases them when its request is aborted."""
        longest_ms = self.timeout_ms + max(first_byte_timeout_ms, self.transfer_timeout_ms)
        return -(-longest_ms // 1000) + KV_LEASE_MARGIN_S


KV_LEASE_MARGIN_S = 10
"""Seconds a rendered KV lease outlasts the router's bounds by (``PrefillStage.lease_for``): the router's own
steps between a prefill's answer and its decode's sending, and the engines' clocks."""


class ModelTarget(_Strict):
    """A served model name and where its replicas are; shared by every runtime service."""

    name: str = Field(
        description="The `model` clients send; the engine's --served-model-name. For a version of a model (see"
        " version_of), a name of its own, e.g. 'chat-v2'."
    )
    engine: EngineKind = Field(default=EngineKind.VLLM, description="Which engine serves it.")
    task: Task = Field(default=Task.GENERATE, description="generate (chat/completions) or embed (pooling).")
    static_backends: list[StaticReplica] = Field(
        default_factory=list, description="Fixed replicas; used when `discovery` is not set."
    )
    discovery: KubernetesDiscovery | FileDiscovery | None = Field(
        default=None, description="Discover replicas from Kubernetes (or a file) instead of a fixed list."
    )
    max_concurrency_per_backend: int = Field(
        default=DEFAULT_MAX_NUM_SEQS,
        ge=1,
        description="In-flight requests one replica may hold; derived from the engine's max_num_seqs.",
    )
    max_model_len_tokens: int = Field(default=4096, ge=1, description="Context length of the engine.")
    version_of: VersionOf | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="This target is one version of a model: requests for version_of.model are split by weight.",
    )

    adapters: list[AdapterTarget] = Field(
        default_factory=list,
        exclude_if=lambda adapters: not adapters,  # absent from rendered configs of models without adapters
        description="LoRA adapters the router loads onto this model's replicas when a request asks for one.",
    )
    max_adapters_per_replica: int = Field(
        default=4,
        ge=1,
        exclude_if=lambda n: n == 4,
        description=(
            "Adapters one replica holds loaded at once (the engine's CPU-side adapter cache); loading one"
            " more unloads the replica's least recently used adapter first."
        ),
    )
    kv_events: KvEventsSource | None = Field(
        default=None,
        description="Follow the engines' KV-cache events (the precise_prefix scorer's view); None: off.",
    )
    prefill: PrefillStage | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Serve the model disaggregated: another target's replicas compute the prompts (P/D).",
    )

    @property
    def served_name(self) -> str:
        """What clients send and the engine serves."""
        return self.version_of.model if self.version_of is not None else self.name

    @model_validator(mode="after")
    def _has_replicas(self) -> ModelTarget:
        if not self.static_backends and self.discovery is None:
            raise ValueError(
                f"model {self.name!r}: give static_backends or discovery, or the model has no replicas"
            )
        if self.static_backends and self.discovery is not None:
            raise ValueError(f"model {self.name!r}: give static_backends or discovery, not both")
        return self


_STRATEGY_DESCRIPTION = "Which preset strategy picks a replica. " + " ".join(
    f"{name}: {preset.summary}" for name, preset in scheduling.PRESETS.items()
)
_WEIGHTS_DESCRIPTION = (
    "Scorer name -> weight (>= 0). They override and extend the preset's weights (0 turns a scorer off);"
    " for `weighted` they are the whole blend. Built-in scorers: "
    + " ".join(
        f"{name} ({info.category}): {info.summary}" for name, info in scheduling.builtin_scorers().items()
    )
)


class _StrategyFields(_Strict):
    """The fields of every strategy; its knobs come from the scorer registry (``StrategyConfig``)."""

    name: StrategyName = Field(default="least_load", description=_STRATEGY_DESCRIPTION)
    weights: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description=_WEIGHTS_DESCRIPTION
    )
    session_header: str = Field(default="x-session-id", description="Header that carries the session key.")


def knob_field(knob: scheduling.Knob[Any]) -> Any:
    """The field a knob's record describes (default, range, description), for a model to declare."""
    bounds: dict[str, Any] = {"ge": knob.ge, "gt": knob.gt, "le": knob.le, "lt": knob.lt}
    return Field(
        default=knob.default,
        description=knob.description,
        **{bound: value for bound, value in bounds.items() if value is not None},
    )


def strategy_model(knobs: Iterable[scheduling.Knob[Any]]) -> type[_StrategyFields]:
    """The strategy's fields, then a field per knob, in the order given: what ``StrategyConfig`` is made of
    (from every registered scorer's knobs, ``scheduling.freeze_knobs``)."""
    fields: dict[str, Any] = {knob.name: (knob.type, knob_field(knob)) for knob in knobs}
    return create_model("StrategyKnobs", __base__=_StrategyFields, __module__=__name__, **fields)


# StrategyConfig's knob fields are made from the records of every scorer registered by now (each built-in
# scorer: the registry imports them all), in their places; a plug-in imported later may add none. mypy sees
# the fixed fields only, and a knob as Any: read one typed with its record, ``KNOB.read(strategy)``.
if TYPE_CHECKING:

    class _StrategyKnobs(_StrategyFields):
        def __getattr__(self, name: str) -> Any: ...

else:
    _StrategyKnobs = strategy_model(scheduling.freeze_knobs())


class StrategyConfig(_StrategyKnobs):
    """A routing strategy and its knobs; weights blend affinity scorers against distribution scorers."""


class ModelRoute(_Strict):
    """How the router treats one model."""

    model: str = Field(description="Name of a ModelTarget.")
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    batcher_url: HttpUrl | None = Field(
        default=None, description="Send pooling requests through this batcher, not straight to replicas."
    )
    cold_start_hold_ms: int = Field(
        default=0,
        ge=0,
        exclude_if=lambda hold: not hold,  # absent from rendered configs unless the model scales from zero
        description=(
            "While the model has no ready replica (scaled to zero, or all starting), hold its requests this"
            " long for one to become ready (the activator); past it, 503 with Retry-After. 0: 503 at once."
        ),
    )
    sleep_after_idle_ms: int = Field(
        default=0,
        ge=0,
        exclude_if=lambda idle: not idle,  # absent unless the model sleeps
        description=(
            "Put a replica to sleep (the engine's sleep mode, runtime.engines) after it served nothing for this"
            " long; a request for a model whose replicas all sleep wakes one and waits for it. 0: never."
        ),
    )
    wake_hold_ms: int = Field(
        default=60_000,
        ge=0,
        exclude_if=lambda hold: hold == 60_000,
        description="How long a request waits for a sleeping replica to wake; past it, 503 with Retry-After.",
    )


class Band(StrEnum):
    """A request's priority band, highest first: a waiting request of a higher band always gets a free slot
    before one of a lower band (``runtime.scheduling.fair_queue``)."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"
    BEST_EFFORT = "best-effort"


class QueueOrder(StrEnum):
    """How a model's wait line orders its requests: ``fair`` (bands, then token-weighted fair queuing between
    tenants), or ``fifo`` (arrival order, every request alike)."""

    FAIR = "fair"
    FIFO = "fifo"


class Tenant(_Strict):
    """A tenant's share of a model's replicas when they are full, and its band. Keys name their tenant
    (``ApiKey.tenant``, else their own name); a key of no listed tenant has weight 1 and ``default_band``."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="The tenant: a key's name, or what keys name as their tenant (a metrics label).",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Share of the tokens served while the replicas are full, relative to the other tenants'.",
    )
    band: Band = Field(default=Band.STANDARD, description="Priority band of the tenant's requests.")


class ApiKey(_Strict):
    """A client credential; only its SHA-256 is ever stored."""

    name: str = Field(description="Who holds the key (shows up in metrics and logs, never the key).")
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(description="Hex SHA-256 of the key.")
    models: list[str] = Field(default_factory=list, description="Models the key may use; empty means all.")
    requests_per_minute: int | None = Field(default=None, ge=1, description="Request rate limit.")
    tokens_per_minute: int | None = Field(default=None, ge=1, description="Token rate limit (in + out).")
    tenant: str | None = Field(
        default=None,
        exclude_if=lambda tenant: tenant is None,
        description="The tenant whose fair share and band the key's requests take (router.tenants); None:"
        " the key is a tenant of its own, by its name.",
    )


#: Why a key's ``tokens_per_minute`` cannot stand behind an inference-extension gateway, and what to do: said by the
#: endpoint picker at start-up and by ``pulumi up`` before anything is deployed (components.render.api_keys).
PICKER_HOLDS_NO_TOKEN_LIMIT = (
    "the endpoint picker cannot enforce it (behind an inference-extension gateway no one reads the answers' "
    "token usage); drop tokens_per_minute from the key (requests_per_minute and models are enforced), or use "
    "gateway.mode router, whose router enforces it"
)

REDIS_URL = r"^rediss?://[^\s/]+:\d{1,5}(/\d{1,2})?$"


class LimitStore(_Strict):
    """A Redis that every router replica keeps the per-key rate limits in, so N replicas enforce one limit.

    When it is down or slower than ``timeout_ms``, each replica keeps serving with the key's limits divided
    by the replicas it last saw alive (metric ``inferstack_router_limit_store_up``, one log line per
    cause), and goes back to the shared limits by itself once the store answers again."""

    url: Annotated[str, Field(pattern=REDIS_URL)] | None = Field(
        default=None,
        description="redis://host:port[/db], or rediss:// for TLS (ElastiCache with encryption in transit).",
    )
    url_file: Path | None = Field(
        default=None,
        description="A file holding the URL instead (a mounted Secret: a managed store's address is known only"
        " once it exists).",
    )
    auth_token_file: Path | None = Field(
        default=None, description="File holding the store's AUTH token (a mounted Secret); None: no AUTH."
    )
    timeout_ms: int = Field(
        default=50, ge=1, description="Budget of one limit check; beyond it the request uses the fallback."
    )
    check_interval_ms: int = Field(
        default=1_000,
        ge=100,
        description="How often each replica says it is alive in the store (and, while it is down, tries it).",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        description="Router replicas assumed for the fallback until the store has told how many are alive.",
    )
    key_prefix: str = Field(default="inferstack:", description="Prefix of every key the router writes.")

    @model_validator(mode="after")
    def _one_address(self) -> LimitStore:
        if (self.url is None) == (self.url_file is None):
            raise ValueError("limit_store: give url or url_file (exactly one)")
        return self


# What one client may hold of a service's HTTP listener (runtime/server.py): the same four fields in every
# service that has one, each with its own default.
MaxHeaderBytes = Annotated[
    int,
    Field(
        ge=1024, description="Largest request head (request line and headers); beyond it 431, OpenAI-shaped."
    ),
]
MaxHeaders = Annotated[
    int, Field(ge=8, le=10_000, description="Most header fields one request may carry; beyond them 431.")
]
MaxConnections = Annotated[
    int,
    Field(
        ge=1,
        description=(
            "Client connections held at once; past it a new connection's request is answered 503"
            " (too_many_connections, Retry-After) and the connection closed."
        ),
    ),
]
RequestHeadTimeout = Annotated[
    float,
    Field(
        gt=0,
        le=300,
        description=(
            "Seconds a request head (request line and headers) may take to arrive, from a new connection's"
            " start or a request's first byte; a client still sending it then is cut off (slowloris)."
        ),
    ),
]


class RouterSettings(_Strict):
    """The router's listener, limits and resilience knobs."""

    host: str = "0.0.0.0"  # in-cluster listener; the NetworkPolicy restricts who reaches it
    port: int = Field(default=8080, ge=1, le=65535)
    metrics_port: int = Field(
        default=9091,
        ge=1,
        le=65535,
        description=(
            "A second listener for /metrics (and /healthz) only: the metrics name every replica's address, so"
            " they are not on the API port an ingress routes; the network policy lets Prometheus reach it."
        ),
    )
    routes: list[ModelRoute] = Field(
        default_factory=list, description="Per-model routing; defaults apply to others."
    )
    default_strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    plugins: list[Annotated[str, Field(pattern=r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")]] = Field(
        default_factory=list,
        exclude_if=lambda plugins: not plugins,  # absent from rendered configs unless used
        description=(
            "Python modules the router imports at start (and on reload) before it reads the strategies:"
            " each registers scorers or filters by name (runtime.scheduling.register_scorer), which"
            " `weights` may then use. The module must be importable in the router's image."
        ),
    )
    require_api_key: bool = Field(default=False, description="Reject requests without a known API key.")
    api_keys_file: Path | None = Field(
        default=None, description="YAML list of ApiKey, mounted from a Kubernetes Secret; re-read on change."
    )
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_header_bytes: MaxHeaderBytes = 16 * 1024
    max_headers: MaxHeaders = 100
    max_connections: MaxConnections = 4096
    request_head_timeout_s: RequestHeadTimeout = 10
    trusted_proxy_hops: int = Field(
        default=0,
        ge=0,
        le=8,
        description=(
            "Proxies in front that append the address they saw to X-Forwarded-For (an ALB or a gateway: 1)."
            " A request without a key is then from the entry this many from the right, which no client can"
            " forge; with 0, or fewer entries, from the connection's peer. A judged canary caps each client's"
            " share of its requests by it."
        ),
    )
    max_choices_per_request: int = Field(
        default=16,
        ge=1,
        le=128,
        description="Largest `n` (and `best_of`) a request may ask for; beyond it 400 (OpenAI allows 128).",
    )
    limit_store: LimitStore | None = Field(
        default=None, description="Keep per-key rate limits in a shared Redis; None: per replica."
    )
    recovery_poll_ms: int = Field(
        default=250,
        ge=50,
        description="While a replica is out, read the health feed (or probe) this often, to readmit it fast.",
    )
    queue_max_requests: int = Field(
        default=1024, ge=0, description="Requests that may wait for a free replica."
    )
    queue_deadline_ms: int = Field(default=10_000, ge=1, description="Longest wait before 503 overloaded.")
    queue_order: QueueOrder = Field(
        default=QueueOrder.FAIR,
        exclude_if=lambda order: order is QueueOrder.FAIR,
        description="fair: a higher band first, then the tenant served the fewest weighted tokens; fifo:"
        " arrival order.",
    )
    tenants: list[Tenant] = Field(
        default_factory=list,
        exclude_if=lambda tenants: not tenants,
        description="Weights and bands of the tenants API keys name (each key is a tenant of its own"
        " unless it names one).",
    )
    default_band: Band = Field(
        default=Band.STANDARD,
        exclude_if=lambda band: band is Band.STANDARD,
        description="Band of a request whose key's tenant is not listed, or without a key.",
    )
    connect_timeout_ms: int = Field(default=2_000, ge=1)
    first_byte_timeout_ms: int = Field(default=120_000, ge=1)
    stream_idle_timeout_ms: int = Field(default=60_000, ge=1)
    stream_stall_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        exclude_if=lambda ms: ms == 10_000,  # absent from rendered configs unless changed
        description=(
            "A stream that can move to another replica (max_migrations_per_request > 0) moves after this long"
            " without a token (a hung engine keeps its socket open; only silence tells). Far above a healthy"
            " gap between tokens (tens of ms; a chunked prefill of other requests stalls a decode well under a"
            " second), far below stream_idle_timeout_ms, which bounds it."
        ),
    )
    max_migrations_per_request: int = Field(
        default=2,
        ge=0,
        le=8,
        exclude_if=lambda n: n == 2,  # absent from rendered configs unless changed
        description=(
            "Times a stream whose engine fails mid-generation may be continued on another replica (each"
            " replacement counts, one that fails too included); 0: a broken stream ends with an error event."
        ),
    )
    retries_max: int = Field(
        default=2, ge=0, description="Extra attempts on another replica, before first byte."
    )
    retry_budget_ratio: float = Field(
        default=0.2, ge=0, le=1, description="Retries allowed per request, fleet-wide."
    )
    breaker_failures: int = Field(
        default=5, ge=1, description="Consecutive failures that open a replica's circuit."
    )
    breaker_open_ms: int = Field(
        default=10_000, ge=1, description="How long an open circuit rejects traffic."
    )
    health_feed_url: HttpUrl | None = Field(default=None, description="The health monitor's /v1/backends.")
    batches_url: HttpUrl | None = Field(
        default=None, description="The batch service: /v1/files and /v1/batches are forwarded there."
    )
    probe_interval_ms: int = Field(default=2_000, ge=100, description="Own probing when the feed is absent.")
    adapter_load_backoff_ms: int = Field(
        default=30_000,
        ge=0,
        exclude_if=lambda ms: ms == 30_000,  # absent from rendered configs unless changed
        description=(
            "After an adapter failed to load on a replica, requests for it there are refused (4xx naming the"
            " adapter) for this long instead of each retrying the load."
        ),
    )
    drain_grace_s: int = Field(
        default=30, ge=0, description="Graceful shutdown budget for in-flight streams."
    )
    api_keys: list[ApiKey] = Field(
        default_factory=list, description="Keys given inline (make local, tests); merged with api_keys_file."
    )
    request_id_header: str = Field(
        default="x-request-id", description="Header that carries the request id to the engine and back."
    )
    retry_backoff_ms: int = Field(
        default=20, ge=0, description="Wait before the first retry; doubles per attempt, with jitter."
    )
    config_reload_interval_ms: int = Field(
        default=2_000, ge=100, description="How often the config and keys files are checked for changes."
    )
    access_log: bool = Field(default=False, description="Log one JSON line per request (costs ~10 us each).")
    client_idle_timeout_s: int = Field(
        default=75,
        ge=1,
        description="Close a client connection silent this long with nothing in flight (above the LB's 60 s).",
    )

    @model_validator(mode="after")
    def _tenants_unique(self) -> RouterSettings:
        names = [t.name for t in self.tenants]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"router.tenants: {', '.join(twice)} listed twice; list each tenant once")
        return self


class CanaryCheck(_Strict):
    """How the health monitor judges a versioned model's canaries against its stable version."""

    model: str = Field(description="The model clients send (version_of.model of its versions).")
    evaluation_interval_s: float = Field(default=60, gt=0, description="Length of one comparison window.")
    max_error_rate: float = Field(
        default=0.05, ge=0, le=1, description="Failed probes per probe, above which: rollback."
    )
    max_ttft_ratio: float = Field(
        default=1.5, ge=1, description="Canary TTFT p95 over stable's, above which: rollback."
    )
    max_inter_token_ratio: float = Field(
        default=1.5, ge=1, description="Canary inter-token p95 over stable's, above which: rollback."
    )
    ttft_slo_s: float | None = Field(
        default=None, gt=0, description="TTFT p95 objective; above it: rollback."
    )
    inter_token_slo_s: float | None = Field(default=None, gt=0, description="Inter-token p95 objective.")
    min_samples: int = Field(
        default=3,
        ge=1,
        description=(
            "Probes a window needs before any verdict on the canary's errors (its error rate, or all its"
            " replicas out)."
        ),
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        exclude_if=lambda n: n == 20,  # absent from rendered configs unless changed
        description=(
            "Requests a version's engines must have answered in the window before its TTFT / inter-token p95"
            " is judged (a p95 of a handful of requests is whoever sent them)."
        ),
    )
    restart_grace_s: float = Field(
        default=120,
        ge=0,
        exclude_if=lambda s: s == 120,  # absent from rendered configs unless changed
        description=(
            "A canary replica out of rotation for less than this that comes back (a restart) is not by"
            " itself a failure: its failed probes count only once the outage outlasts it (one restart per"
            " replica per restart_grace_s or evaluation interval, whichever is longer, is let go)."
        ),
    )


class HealthSettings(_Strict):
    """The health monitor's cadence and thresholds."""

    host: str = "0.0.0.0"  # in-cluster listener; the NetworkPolicy restricts who reaches it
    port: int = Field(default=8081, ge=1, le=65535)
    interval_ms: int = Field(default=5_000, ge=100)
    timeout_ms: int = Field(default=2_000, ge=10)
    eject_after_failures: int = Field(default=3, ge=1)
    readmit_after_successes: int = Field(default=2, ge=1)
    recovery_interval_ms: int = Field(
        default=200,
        ge=50,
        description=(
            "Probe interval of an ejected replica, so it is readmitted within ~readmit_after_successes of"
            " these once /health is OK; doubled (up to interval_ms) each time a readmitted replica is"
            " ejected again within flap_window_s, so a flapping one is not let back in quickly."
        ),
    )
    flap_window_s: int = Field(
        default=60, ge=1, description="An ejection this soon after a readmission counts as a flap."
    )
    synthetic_probe_every: int = Field(
        default=0, ge=0, description="Intervals between one-token probes; 0 = off."
    )
    synthetic_timeout_ms: int = Field(
        default=10_000,
        ge=10,
        description="Budget of the one-token probe; beyond it the engine counts as hung.",
    )
    window_s: int = Field(default=60, ge=1, description="Window for TTFT / inter-token percentiles.")
    max_metrics_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    kubernetes_events: bool = Field(default=False, description="Emit Events on ejection and readmission.")
    remediate_after_s: int | None = Field(
        default=None, ge=30, description="Delete a pod wedged this long; None = never (the default)."
    )
    remediate_interval_s: int = Field(
        default=300,
        ge=30,
        exclude_if=lambda s: s == 300,  # absent from rendered configs unless changed
        description=(
            "Remediation deletes one pod at a time, fleet-wide, and at most one per this many seconds, so a"
            " fault that makes many replicas look wedged at once costs one pod, not the fleet."
        ),
    )
    remediate_timeout_s: float = Field(
        default=30,
        gt=0,
        exclude_if=lambda s: s == 30,  # absent from rendered configs unless changed
        description=(
            "Longest a remediation (find the pod, delete it, its Event) may take; past it the attempt counts"
            " as failed and the next one may start (a hung API call must not stop remediation for good)."
        ),
    )
    max_ejected_percent: float = Field(
        default=50,
        ge=0,
        le=100,
        exclude_if=lambda p: p == 50,  # absent from rendered configs unless changed
        description=(
            "Past this percent of a model's (admitted) replicas ejected, the model is in panic: the front"
            " ends ignore the ejections and route to all of them, and no pod of it is remediated, since a"
            " fault between the monitor and the engines looks exactly like every engine failing (Envoy's"
            " panic threshold). 100 = never."
        ),
    )
    canaries: list[CanaryCheck] = Field(
        default_factory=list,
        exclude_if=lambda c: not c,
        description="Versioned models whose canaries are compared with their stable version and rolled back.",
    )


class BatchingPolicy(_Strict):
    """How one pooling model's requests are coalesced."""

    model: str = Field(description="Name of a ModelTarget with task=embed.")
    max_batch_size: int = Field(default=32, ge=1, description="Inputs per engine call.")
    max_batch_tokens: int = Field(default=16_384, ge=1, description="Approximate tokens per engine call.")
    max_wait_ms: float = Field(default=5.0, ge=0, description="Longest a request waits for companions.")
    max_queue: int = Field(default=4_096, ge=1, description="Inputs that may wait; beyond it, 429.")
    max_inflight_batches_per_backend: int = Field(
        default=2,
        ge=1,
        description=(
            "Engine calls one replica may hold at once; more inputs wait and coalesce. 2 by default: "
            "the next batch fills and goes out while one computes (bench/batcher/README.md)."
        ),
    )
    engine_timeout_ms: int = Field(default=60_000, ge=1, description="Budget of one engine call.")


class BatcherSettings(_Strict):
    """The batcher's listener and per-model batching."""

    host: str = "0.0.0.0"  # in-cluster listener; the NetworkPolicy restricts who reaches it
    port: int = Field(default=8082, ge=1, le=65535)
    policies: list[BatchingPolicy] = Field(default_factory=list)
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest request body; beyond it 413."
    )
    max_header_bytes: MaxHeaderBytes = 16 * 1024
    max_headers: MaxHeaders = 100
    max_connections: MaxConnections = 1024
    request_head_timeout_s: RequestHeadTimeout = 10
    connect_timeout_ms: int = Field(default=2_000, ge=1, description="Connect budget towards a replica.")


#: The environment variable that names the files bucket when ``S3Files.bucket`` is None.
BATCH_BUCKET_ENV = "INFERSTACK_FILES_BUCKET"


class S3Files(_Strict):
    """Where the batch service keeps files in the cluster: a prefix of its own bucket (on EKS cluster.batch_bucket,
    apart from the model bucket engines read)."""

    bucket: str | None = Field(
        default=None,
        description=f"Bucket name; None: read from the environment variable {BATCH_BUCKET_ENV} (the control"
        " plane sets it from the bucket it creates).",
    )
    prefix: Annotated[str, Field(pattern=r"^([A-Za-z0-9!_.*'()-]+/)+$")] = Field(
        default="batches/", description="Key prefix of every object the batch service writes ('dir/')."
    )
    region: str = Field(description="The bucket's AWS region.")
    endpoint_url: HttpUrl | None = Field(
        default=None, description="An S3-compatible endpoint instead of AWS's (MinIO, tests)."
    )


class BatchesSettings(_Strict):
    """The batch service (OpenAI Files and Batches API): its stores, the router it feeds, and its pace."""

    host: str = "0.0.0.0"  # in-cluster listener; the NetworkPolicy restricts who reaches it
    port: int = Field(default=8083, ge=1, le=65535)
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "A second listener for /metrics, /healthz and /readyz only, so the network policy can let Prometheus"
            " reach the metrics without reaching the API (which trusts the router's identity headers); None:"
            " the API port serves them too (make local)."
        ),
    )
    state_dir: Path = Field(
        default=Path("/var/lib/inferstack/batches"),
        description="The state store (SQLite, WAL) and, without `s3`, the files; a persistent volume.",
    )
    s3: S3Files | None = Field(default=None, description="Keep files in S3; None: under state_dir/files.")
    router_url: HttpUrl = Field(description="The router the batch's requests go through, at low priority.")
    router_api_key_file: Path | None = Field(
        default=None, description="A file holding the API key the batch service sends to the router."
    )
    router_key_name: str | None = Field(
        default=None,
        description=(
            "The name of that key in the router's key table. The router believes a line's owner (the key"
            " name the batch service sends in x-inferstack-key) from this key only, and then charges the line"
            " to the owner's scopes and rate limits; None: lines are charged to the batch service's own key."
        ),
    )
    health_feed_url: HttpUrl | None = Field(
        default=None, description="The health monitor's /v1/backends: routable replicas and engine queues."
    )
    max_file_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Largest file an upload may carry; beyond it 400."
    )
    max_header_bytes: MaxHeaderBytes = 16 * 1024
    max_headers: MaxHeaders = 100
    max_connections: MaxConnections = Field(
        default=256, description="Connections held at once (only routers call); past it 503 and closed."
    )
    request_head_timeout_s: RequestHeadTimeout = 10
    max_requests_per_batch: int = Field(default=50_000, ge=1, description="Lines of one batch input file.")
    max_files_per_owner: int = Field(
        default=1_000,
        ge=1,
        description=(
            "Files one API key may keep (its uploads and its batches' output and error files); an upload"
            " beyond it is refused (400 quota_exceeded) until files are deleted or expire."
        ),
    )
    max_bytes_per_owner: int = Field(
        default=4 * 1024**3,
        ge=1024,
        description="Bytes of files one API key may keep (as max_files_per_owner counts them); beyond it 400.",
    )
    max_active_batches_per_owner: int = Field(
        default=16,
        ge=1,
        description=(
            "Unfinished batches one API key may have; a new one beyond it is refused (429"
            " batch_limit_exceeded). Each copies its input's lines into the state store, and its input's"
            " bytes count against max_bytes_per_owner while it runs."
        ),
    )
    max_pending_requests_per_owner: int = Field(
        default=200_000,
        ge=1,
        description=(
            "Requests one API key's unfinished batches may still have to run; while they have this many, a"
            " new batch is refused (429 batch_limit_exceeded)."
        ),
    )
    max_inflight_per_replica: int = Field(
        default=2,
        ge=1,
        description=(
            "Batch requests in flight per routable replica of a model, at most (raise it on GPUs, where a few"
            " more sequences in a decode step cost little)."
        ),
    )
    headroom_share: float = Field(
        default=0.03,
        gt=0,
        le=1,
        description=(
            "The router admits a batch (low-priority) request only while a replica's requests in flight stay"
            " below this share of its concurrency cap and nobody waits in line; otherwise 503 at once. 0.03:"
            " on a 32-sequence CPU replica only an idle one takes batch work, on a 256-sequence GPU replica one"
            " with fewer than 8 requests (bench/batches/README.md: 0.5 let a batch add 77 % to interactive"
            " TTFT p95 on CPU engines)."
        ),
    )
    request_timeout_s: int = Field(default=600, ge=1, description="Budget of one request of a batch.")
    max_attempts: int = Field(
        default=5, ge=1, description="Tries of one request on server errors before it goes to the error file."
    )
    file_ttl_s: int = Field(
        default=30 * 24 * 3600, ge=3600, description="Files expire this long after upload (OpenAI: 30 days)."
    )


class BodyMode(StrEnum):
    """How the gateway hands request (and response) bodies to the endpoint picker: Envoy ext_proc's
    ``processing_mode`` body modes (envoy.extensions.filters.http.ext_proc.v3, Envoy 1.40)."""

    FULL_DUPLEX_STREAMED = "full_duplex_streamed"  # what Gateway API Inference Extension gateways configure
    BUFFERED = "buffered"  # the whole body in one message; the headers are answered before it arrives


class PickerSettings(_Strict):
    """The endpoint picker (``runtime.picker``): the router's scheduler behind a gateway, over Envoy's
    external-processing API. It routes with the router's strategies (``router.routes``,
    ``router.default_strategy``, ``router.plugins``) and reads the fleet the router's way
    (``router.health_feed_url``, ``router.probe_interval_ms``, ``router.breaker_*``)."""

    host: str = "0.0.0.0"  # in-cluster listener; the NetworkPolicy restricts who reaches it
    port: int = Field(
        default=9002, ge=1, le=65535, description="gRPC: ext_proc and gRPC health (the extension's EPP port)."
    )
    metrics_port: int = Field(default=9090, ge=1, le=65535, description="HTTP: /metrics, /healthz, /readyz.")
    max_header_bytes: MaxHeaderBytes = 16 * 1024
    max_headers: MaxHeaders = 100
    max_connections: MaxConnections = Field(
        default=64,
        description="Connections the HTTP listener (metrics and probes) holds at once; past it 503.",
    )
    request_head_timeout_s: RequestHeadTimeout = 10
    body_mode: BodyMode = Field(
        default=BodyMode.FULL_DUPLEX_STREAMED,
        description=(
            "The body mode the gateway's ext_proc filter sends in: full_duplex_streamed (the Endpoint Picker"
            " Protocol's streaming mode; the picker answers the headers once the body is in, and returns"
            " every body chunk it was sent) or buffered (the headers are answered at once, the pick rides"
            " on the body's answer)."
        ),
    )
    fallback_endpoints: int = Field(
        default=2,
        ge=0,
        le=8,
        description=(
            "Replicas listed after the pick in x-gateway-destination-endpoint, least loaded first: where the"
            " gateway retries when the pick cannot be reached (an engine that just died)."
        ),
    )
    grace_s: float = Field(default=5.0, ge=0, description="Time given to open streams at SIGTERM.")
    require_api_key: bool = Field(
        default=False,
        description=(
            "Answer inference requests without a known API key with 401 at their headers (behind a gateway"
            " nothing else checks keys): the router's check, keys and scopes, from api_keys_file."
        ),
    )
    api_keys_file: Path | None = Field(
        default=None,
        description=(
            "YAML list of ApiKey (the router's keys Secret, mounted); re-read on change. A key with"
            " tokens_per_minute is refused: the picker never sees the answers' usage."
        ),
    )
    replicas: int = Field(
        default=1,
        ge=1,
        exclude_if=lambda n: n == 1,  # absent from rendered configs unless changed
        description=(
            "Replicas of the picker's Deployment (rendered from it). Each holds its own request buckets, so"
            " each admits requests_per_minute / replicas of a key: together, the key's limit."
        ),
    )

    @model_validator(mode="after")
    def _keys_from_a_file(self) -> PickerSettings:
        if self.require_api_key and self.api_keys_file is None:
            raise ValueError("require_api_key needs api_keys_file (the mounted keys Secret)")
        return self


class TracingSettings(_Strict):
    """OpenTelemetry traces from the router, the picker, the batcher and the batch service (``runtime.tracing``).
    Absent: no tracer, no exporter thread, no export traffic."""

    endpoint: Annotated[str, Field(pattern=r"^https?://[^/\s]+$")] = Field(
        description="OTLP/gRPC endpoint the spans go to (the collector), e.g. http://otel-collector:4317."
    )
    sample_ratio: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Share of new traces kept (parent-based: a request arriving with a sampled traceparent is "
        "kept, one arriving unsampled is not, whatever the ratio).",
    )
    capture_prompts: bool = Field(
        default=False,
        description="Put the request's messages/prompt (first 4 KiB) on the router's span. Off by default: "
        "prompts are the users' data.",
    )
    export_timeout_ms: int = Field(
        default=10_000, ge=1, description="Longest one export to the collector may take."
    )


class RuntimeConfig(_Strict):
    """Everything the data plane needs, rendered by the control plane from the platform spec."""

    schema_version: Literal[1] = SCHEMA_VERSION
    models: list[ModelTarget] = Field(min_length=1)
    router: RouterSettings = Field(default_factory=RouterSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    batcher: BatcherSettings = Field(default_factory=BatcherSettings)
    batches: BatchesSettings | None = Field(default=None, description="The batch service, when it runs.")
    picker: PickerSettings = Field(
        default_factory=PickerSettings,
        exclude_if=lambda picker: picker == PickerSettings(),  # absent from rendered configs unless set
    )
    tracing: TracingSettings | None = Field(default=None, description="OpenTelemetry traces, when on.")

    @model_validator(mode="after")
    def _references_resolve(self) -> RuntimeConfig:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"models: duplicate names {dupes}")
        adapters = [a.name for m in self.models for a in m.adapters]
        clash = sorted({a for a in adapters if adapters.count(a) > 1 or a in names})
        if clash:
            raise ValueError(f"models[].adapters: names used twice or also a model's name: {clash}")
        known = set(names)
        for route in self.router.routes:
            if route.model not in known:
                raise ValueError(f"router.routes: unknown model {route.model!r}; known: {sorted(known)}")
        self._versions_consistent(known)
        self._stages_consistent()
        embed = {m.name for m in self.models if m.task is Task.EMBED}
        for policy in self.batcher.policies:
            if policy.model not in embed:
                raise ValueError(
                    f"batcher.policies: {policy.model!r} is not an embedding model; known: {sorted(embed)}"
                )
        return self

    def _versions_consistent(self, names: set[str]) -> None:
        for model, targets in self.versions().items():
            if model in names:
                raise ValueError(f"models: {model!r} is both a target and the model of versions; rename one")
            stable = [t.name for t in targets if t.version_of and t.version_of.stable]
            if len(stable) != 1:
                raise ValueError(f"versions of {model!r}: exactly one must be stable, not {len(stable)}")
            total = sum(t.version_of.weight for t in targets if t.version_of)
            if abs(total - 100) > 1e-6:
                raise ValueError(f"versions of {model!r}: weights add up to {total:g}, not 100")
            labels = [t.version_of.version for t in targets if t.version_of]
            for t in targets:
                if t.version_of and t.name != version_target_name(model, t.version_of.version):
                    raise ValueError(
                        f"models: a version of {model!r} is named {t.name!r}; name it "
                        f"{version_target_name(model, t.version_of.version)!r}"
                    )
            if len(set(labels)) != len(labels):
                raise ValueError(f"versions of {model!r}: a version name is used twice: {labels}")
        for check in self.health.canaries:
            if check.model not in self.versions():
                raise ValueError(f"health.canaries: {check.model!r} has no versions")

    def _stages_consistent(self) -> None:
        by_name = {m.name: m for m in self.models}
        used: dict[str, str] = {}
        for m in self.models:
            if m.prefill is None:
                continue
            where = f"models[{m.name!r}].prefill"
            stage = by_name.get(m.prefill.target)
            if stage is None or stage is m:
                raise ValueError(f"{where}: {m.prefill.target!r} is not another model target")
            if m.prefill.target in used:
                raise ValueError(
                    f"{where}: {m.prefill.target!r} already computes the prefills of {used[m.prefill.target]!r}"
                )
            used[m.prefill.target] = m.name
            problems = [
                "it is disaggregated itself" if stage.prefill is not None else "",
                f"its engine is {stage.engine}, not {m.engine}" if stage.engine != m.engine else "",
                "it is not a generation model" if stage.task is not Task.GENERATE else "",
                "it lists adapters (the decode's are loaded on it)" if stage.adapters else "",
                "versions are not served disaggregated" if stage.version_of or m.version_of else "",
            ]
            if m.task is not Task.GENERATE:
                problems.append(f"{m.name!r} is not a generation model")
            found = [p for p in problems if p]
            if found:
                raise ValueError(
                    f"{where}: {m.prefill.target!r} cannot compute its prefills: {'; '.join(found)}"
                )

    def prefill_targets(self) -> dict[str, str]:
        """Target computing a disaggregated model's prefills -> that model's name; clients never reach them."""
        return {m.prefill.target: m.name for m in self.models if m.prefill is not None}

    def versions(self) -> dict[str, list[ModelTarget]]:
        """Model name -> its version targets, stable first, for models served in versions."""
        out: dict[str, list[ModelTarget]] = {}
        for m in self.models:
            if m.version_of is not None:
                out.setdefault(m.version_of.model, []).append(m)
        for targets in out.values():
            targets.sort(key=lambda t: not (t.version_of and t.version_of.stable))
        return out

    def model(self, name: str) -> ModelTarget | None:
        return next((m for m in self.models if m.name == name), None)

    def adapter_parents(self) -> dict[str, str]:
        """Adapter name -> the name of the model it adapts."""
        return {a.name: m.name for m in self.models for a in m.adapters}

    def route(self, name: str) -> ModelRoute:
        found = next((r for r in self.router.routes if r.model == name), None)
        return found or ModelRoute(model=name, strategy=self.router.default_strategy)

    def to_yaml(self) -> str:
        # libyaml's safe dumper where present: the same text as PyYAML's, four times faster (a plan renders one
        # config per stack, tens of kilobytes with many models).
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        return yaml.dump(self.model_dump(mode="json", exclude_none=True), Dumper=dumper, sort_keys=False)


# --- What the control plane validates a stack's routing against ------------------------------------
# The registry of ``runtime.scheduling`` (built-in scorers only: plug-ins exist in a router image, not
# at plan time), so ``components`` checks names, weights and knobs without importing router code; with
# ``StrategyName`` and ``BuiltinScorerName`` above.


def routing_scorers() -> Mapping[str, scheduling.ScorerInfo]:
    """Built-in scorers by name, with their category, needs and the knobs they read."""
    return scheduling.builtin_scorers()


def routing_knobs_read(strategy: str, weights: Mapping[str, float]) -> frozenset[str]:
    """The names of the ``StrategyConfig`` knobs that make a difference to this blend."""
    return scheduling.knobs_read(strategy, weights)


def routing_knobs() -> dict[str, scheduling.Knob[Any]]:
    """The knobs a stack file may set per model (``Knob.stack``), built-in scorers' only, by name."""
    return {name: knob for name, knob in sorted(scheduling.builtin_knobs().items()) if knob.stack}


def reads_engine_events(strategy: str, weights: Mapping[str, float]) -> bool:
    """Does this blend weigh a scorer that reads the engines' KV-cache events (``Need.PROMPT_BLOCKS``)?
    Then the model's engines publish them and the router follows them: derived, never a separate switch."""
    known = scheduling.builtin_scorers()
    return any(
        w > 0 and name in known and scheduling.Need.PROMPT_BLOCKS in known[name].needs
        for name, w in scheduling.blend(strategy, weights).items()
    )


def strategy_field(name: str) -> Any:
    """``StrategyConfig``'s field ``name`` (default, range, description) for another model to declare,
    so the spec offers it as it is (a knob's: ``knob_field``)."""
    return copy.copy(StrategyConfig.model_fields[name])


def prefill_field(name: str) -> Any:
    """``PrefillStage``'s field ``name`` (default, range, description), for the spec to offer as it is."""
    return copy.copy(PrefillStage.model_fields[name])


def batches_field(name: str) -> Any:
    """``BatchesSettings``' field ``name`` (default, range, description), for the spec to offer as it is."""
    return copy.copy(BatchesSettings.model_fields[name])
