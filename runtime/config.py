"""The contract between the control plane and the data plane.

The control plane (``components``) renders one ``RuntimeConfig`` per platform into a ConfigMap
(Kubernetes) or a file (``make local``); the router, health monitor and batcher each read it and use
their own section. It lives in ``runtime`` so the images never import the control plane, and the
control plane imports only this module of ``runtime``.

Everything here is plain data with validation: no I/O, no defaults that depend on the environment.
Durations carry their unit in the name (``_ms``, ``_s``); sizes too (``_bytes``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, HttpUrl, WithJsonSchema, model_validator

from runtime import scheduling

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


class StaticBackend(_Strict):
    """One engine replica at a fixed address (``make local``, tests, or clusters without discovery)."""

    url: HttpUrl = Field(
        description="Base URL of the engine's OpenAI-compatible server, e.g. http://10.0.0.5:8000."
    )
    weight: float = Field(default=1.0, gt=0, description="Relative share for strategies that use weights.")


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


#: Sequences an engine decodes together unless the spec says otherwise (EngineSpec.max_num_seqs); it is
#: also what a replica may hold in flight, and what a command line without the flag is read as.
DEFAULT_MAX_NUM_SEQS = 256


class ModelTarget(_Strict):
    """A served model name and where its replicas are; shared by every runtime service."""

    name: str = Field(description="The `model` clients send; the engine's --served-model-name.")
    engine: EngineKind = Field(default=EngineKind.VLLM, description="Which engine serves it.")
    task: Task = Field(default=Task.GENERATE, description="generate (chat/completions) or embed (pooling).")
    static_backends: list[StaticBackend] = Field(
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

    @model_validator(mode="after")
    def _has_backends(self) -> ModelTarget:
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


class StrategyConfig(_Strict):
    """A routing strategy and its knobs; weights blend affinity scorers against distribution scorers."""

    name: StrategyName = Field(default="least_load", description=_STRATEGY_DESCRIPTION)
    weights: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description=_WEIGHTS_DESCRIPTION
    )
    session_header: str = Field(default="x-session-id", description="Header that carries the session key.")
    prefix_block_tokens: int = Field(
        default=64,
        ge=1,
        description=(
            "Tokens per block of the prefix index: prompts are matched block by block, so a smaller block"
            " finds shorter shared prefixes, at more hashing per request."
        ),
    )
    prefix_index_max_entries: int = Field(
        default=100_000, ge=1, description="Bound of the prefix index (LRU)."
    )
    load_guard_ratio: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description=(
            "Affinity scorers (prefix, session) are ignored for a replica whose requests in flight exceed"
            " this share of its concurrency cap: a hot prefix or session moves instead of overloading it."
        ),
    )
    prefix_balance_factor: float = Field(
        default=1.2,
        ge=1,
        description=(
            "prefix_aware: a new conversation on a shared prefix (a system prompt others went through)"
            " goes to a replica holding it only while that replica's count of recently started"
            " conversations, with this one, stays within ceil(this x the average) (bounded loads);"
            " else to the replica that started the fewest, which copies the prefix. 1.2: at most ~60 %"
            " of new conversations on one of two replicas. A conversation's follow-ups are not bounded"
            " by it: they stay home up to load_guard_ratio."
        ),
    )
    prefix_balance_window_s: float = Field(
        default=30.0,
        gt=0,
        description="prefix_aware: time constant of the decaying count of conversations started per replica.",
    )
    prefix_chars_per_token: int = Field(
        default=4,
        ge=1,
        description="The router hashes characters, not tokens: a block is prefix_block_tokens x this many.",
    )
    prefix_max_blocks: int = Field(
        default=128, ge=1, description="Blocks of a prompt that are hashed at most (bounds CPU per request)."
    )
    session_index_max_entries: int = Field(
        default=100_000, ge=1, description="Bound of the session -> replica map (LRU)."
    )
    latency_ewma_alpha: float = Field(
        default=0.3, gt=0, le=1, description="Weight of the newest TTFT sample in a replica's latency mean."
    )


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


class ApiKey(_Strict):
    """A client credential; only its SHA-256 is ever stored."""

    name: str = Field(description="Who holds the key (shows up in metrics and logs, never the key).")
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(description="Hex SHA-256 of the key.")
    models: list[str] = Field(default_factory=list, description="Models the key may use; empty means all.")
    requests_per_minute: int | None = Field(default=None, ge=1, description="Request rate limit.")
    tokens_per_minute: int | None = Field(default=None, ge=1, description="Token rate limit (in + out).")


class RouterSettings(_Strict):
    """The router's listener, limits and resilience knobs."""

    host: str = "0.0.0.0"  # in-cluster listener; the NetworkPolicy restricts who reaches it
    port: int = Field(default=8080, ge=1, le=65535)
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
    queue_max_requests: int = Field(
        default=1024, ge=0, description="Requests that may wait for a free replica."
    )
    queue_deadline_ms: int = Field(default=10_000, ge=1, description="Longest wait before 429.")
    connect_timeout_ms: int = Field(default=2_000, ge=1)
    first_byte_timeout_ms: int = Field(default=120_000, ge=1)
    stream_idle_timeout_ms: int = Field(default=60_000, ge=1)
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
    probe_interval_ms: int = Field(default=2_000, ge=100, description="Own probing when the feed is absent.")
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


class HealthSettings(_Strict):
    """The health monitor's cadence and thresholds."""

    host: str = "0.0.0.0"  # in-cluster listener; the NetworkPolicy restricts who reaches it
    port: int = Field(default=8081, ge=1, le=65535)
    interval_ms: int = Field(default=5_000, ge=100)
    timeout_ms: int = Field(default=2_000, ge=10)
    eject_after_failures: int = Field(default=3, ge=1)
    readmit_after_successes: int = Field(default=2, ge=1)
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
    connect_timeout_ms: int = Field(default=2_000, ge=1, description="Connect budget towards a replica.")


class RuntimeConfig(_Strict):
    """Everything the data plane needs, rendered by the control plane from the platform spec."""

    schema_version: Literal[1] = SCHEMA_VERSION
    models: list[ModelTarget] = Field(min_length=1)
    router: RouterSettings = Field(default_factory=RouterSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    batcher: BatcherSettings = Field(default_factory=BatcherSettings)

    @model_validator(mode="after")
    def _references_resolve(self) -> RuntimeConfig:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"models: duplicate names {dupes}")
        known = set(names)
        for route in self.router.routes:
            if route.model not in known:
                raise ValueError(f"router.routes: unknown model {route.model!r}; known: {sorted(known)}")
        embed = {m.name for m in self.models if m.task is Task.EMBED}
        for policy in self.batcher.policies:
            if policy.model not in embed:
                raise ValueError(
                    f"batcher.policies: {policy.model!r} is not an embedding model; known: {sorted(embed)}"
                )
        return self

    def model(self, name: str) -> ModelTarget | None:
        return next((m for m in self.models if m.name == name), None)

    def route(self, name: str) -> ModelRoute:
        found = next((r for r in self.router.routes if r.model == name), None)
        return found or ModelRoute(model=name, strategy=self.router.default_strategy)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)


# --- What the control plane validates a stack's routing against ------------------------------------
# The registry of ``runtime.scheduling`` (built-in scorers only: plug-ins exist in a router image, not
# at plan time), so ``components`` checks names, weights and knobs without importing router code; with
# ``StrategyName`` and ``BuiltinScorerName`` above.


def routing_scorers() -> Mapping[str, scheduling.ScorerInfo]:
    """Built-in scorers by name, with their category, needs and the knobs they read."""
    return scheduling.builtin_scorers()


def routing_knobs_read(strategy: str, weights: Mapping[str, float]) -> frozenset[str]:
    """The ``StrategyConfig`` knobs that make a difference to this blend."""
    return scheduling.knobs_read(strategy, weights)


def strategy_field(name: str) -> Any:
    """``StrategyConfig``'s field ``name`` (default, range, description) for another model to declare:
    a knob is defined once, here, and the spec offers it as it is."""
    return copy.copy(StrategyConfig.model_fields[name])
