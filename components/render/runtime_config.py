"""The data-plane configuration (``runtime.config.RuntimeConfig``) rendered from the platform spec. Pure.

The router, health monitor and batcher read this one document from a ConfigMap. Engines are found
through their Services' EndpointSlices; per-replica concurrency caps are the engines' ``max_num_seqs``
(more in flight would only queue inside the engine, where the router cannot see or reroute it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from components.render import batches, common, tracing, weights
from components.spec import AdapterSpec, IngressKind, ModelSpec, PlatformSpec
from runtime.config import (
    AdapterTarget,
    BatcherSettings,
    BatchingPolicy,
    CanaryCheck,
    HealthSettings,
    KubernetesDiscovery,
    KvEventsSource,
    LimitStore,
    ModelRoute,
    ModelTarget,
    PickerSettings,
    PrefillStage,
    RouterSettings,
    RuntimeConfig,
    S3Files,
    StaticReplica,
    StrategyConfig,
    Task,
    TracingSettings,
    VersionOf,
)

#: The endpoint picker's replicas (its Deployment's and its config's ``picker.replicas``): one, as its prefix
#: index is per process, like one router's.
PICKER_REPLICAS = 1

BATCH_SIZE_CAP = 32
"""Inputs per embedding batch at most (more rarely helps a pooling engine, and delays the first input)."""


def service_url(spec: PlatformSpec, part: str, port: int) -> str:
    return f"http://{common.runtime_name(spec, part)}.{spec.cluster.namespace}.svc:{port}"


def router_port() -> int:
    return RouterSettings().port


def health_port() -> int:
    return HealthSettings().port


def batcher_port() -> int:
    return BatcherSettings().port


def embedding_models(spec: PlatformSpec) -> list[ModelSpec]:
    return [m for m in spec.models if m.resolved_task() is Task.EMBED]


def has_batcher(spec: PlatformSpec) -> bool:
    """Embedding models get a batcher behind the router (behind an inference-extension gateway the picker
    sends each request to a replica itself)."""
    return bool(embedding_models(spec)) and spec.gateway.runs_router


def _adapter_path(spec: PlatformSpec, adapter: AdapterSpec, *, in_cluster: bool) -> str:
    """What the router's load call names: in a pod, where the init container fetched the adapter from the store;
    on this machine (``make local``), its directory made absolute (the engine runs in a private directory)."""
    if in_cluster:
        return weights.adapter_path(spec, adapter)
    return str(Path(adapter.source).expanduser().absolute())


def model_target(
    spec: PlatformSpec, model: ModelSpec, static_urls: Sequence[str] | None = None
) -> ModelTarget:
    """Replicas from the engine Service's EndpointSlices, or (``make local``) at fixed ``static_urls``."""
    static = [StaticReplica.model_validate({"url": u}) for u in static_urls or []]
    discovery = None
    if static_urls is None:
        discovery = KubernetesDiscovery(
            namespace=spec.cluster.namespace, service=common.engine_name(model.name), port_name="http"
        )
    version_of = None
    if model.version_of is not None:
        of, version, weight, stable = model.version_of
        version_of = VersionOf(model=of, version=version, weight=weight, stable=stable)
    events = None
    if model.publishes_kv_events:  # the router finds the tokenizer where its pod's init container put it
        events = KvEventsSource(tokenizer_dir=Path(common.router_tokenizer_dir(model.name)))
    return ModelTarget(
        name=model.name,
        version_of=version_of,
        engine=model.engine.kind,
        task=model.resolved_task(),
        static_backends=static,
        discovery=discovery,
        max_concurrency_per_backend=model.engine.max_num_seqs,
        max_model_len_tokens=model.engine.max_model_len,
        adapters=[  # a prefill unit loads its decode unit's (the router's: runtime.config.PrefillStage)
            AdapterTarget(name=a.name, path=_adapter_path(spec, a, in_cluster=static_urls is None))
            for a in model.adapters
            if model.pd_role != "prefill"
        ],
        max_adapters_per_replica=model.engine.lora.loaded,
        kv_events=events,
        prefill=_prefill_stage(model),
    )


def _prefill_stage(model: ModelSpec) -> PrefillStage | None:
    """The decode unit of a disaggregated model: where its prefills go, and the router's bounds on them."""
    if model.prefill_unit is None or model.disaggregation is None:
        return None
    return model.prefill_stage()


def _route(spec: PlatformSpec, model: ModelSpec) -> ModelRoute:
    batcher = None
    if model.resolved_task() is Task.EMBED and has_batcher(spec):
        batcher = service_url(spec, common.BATCHER, batcher_port())
    routing = model.routing
    knobs = {knob: getattr(routing, knob) for knob in sorted(routing.KNOBS)}  # the spec's knobs, as set
    strategy = StrategyConfig.model_validate(
        {"name": routing.strategy, "weights": dict(routing.weights), **knobs}
    )
    # the activator: a model that scales to zero holds its requests while a replica starts; the picker
    # holds nothing (the gateway's ext_proc call must answer within its message timeout): 503 at once
    holds = model.scaling.min_replicas == 0 and spec.gateway.runs_router
    hold = model.scaling.cold_start_hold_ms if holds else 0
    # sleep mode: the router puts idle replicas to sleep and wakes one for a waiting request
    idle = model.scaling.sleep_after_idle_s
    return ModelRoute.model_validate(
        {
            "model": model.name,
            "strategy": strategy,
            "batcher_url": batcher,
            "cold_start_hold_ms": hold,
            "sleep_after_idle_ms": idle * 1000 if idle is not None else 0,
        }
    )


def canary_checks(spec: PlatformSpec) -> list[CanaryCheck]:
    """The rollback rule of each versioned model (read from its stable unit), in the health monitor's terms."""
    out = []
    for m in spec.models:
        if m.version_of is None or not m.version_of[3] or m.rollout.canary is None:
            continue
        canary, rule = m.rollout.canary, m.rollout.canary.rollback
        out.append(
            CanaryCheck(
                model=m.served_name,
                evaluation_interval_s=canary.evaluation_interval_s,
                max_error_rate=rule.max_error_rate,
                max_ttft_ratio=rule.max_ttft_ratio,
                max_inter_token_ratio=rule.max_inter_token_ratio,
                ttft_slo_s=m.slo.ttft_p95_ms / 1000 if rule.enforce_slo else None,
                inter_token_slo_s=m.slo.inter_token_p95_ms / 1000 if rule.enforce_slo else None,
                min_samples=rule.min_samples,
            )
        )
    return out


def _batching(model: ModelSpec) -> BatchingPolicy:
    e = model.engine
    size = min(BATCH_SIZE_CAP, e.max_num_seqs)
    tokens = e.max_num_batched_tokens or max(e.max_model_len, size * e.max_model_len // 4)
    return BatchingPolicy(model=model.name, max_batch_size=size, max_batch_tokens=tokens)


LB_IDLE_MARGIN_S = 5
"""Seconds between the router's budgets, the load balancer's idle timeout and the router's client keep-alive."""


def lb_idle_timeout_s() -> int:
    """The load balancer's idle timeout: longer than the router waits for a first byte or a stream chunk."""
    router = RouterSettings()
    return max(router.first_byte_timeout_ms, router.stream_idle_timeout_ms) // 1000 + LB_IDLE_MARGIN_S


def client_idle_timeout_s() -> int:
    """The router keeps idle client connections open longer than the load balancer does, so the load balancer
    never reuses a connection the router already closed (a 502)."""
    return lb_idle_timeout_s() + LB_IDLE_MARGIN_S


def limit_store(spec: PlatformSpec) -> LimitStore | None:
    """The shared rate-limit store, read from the router's mounted Secret (address and AUTH token)."""
    if not spec.gateway.shared_limits:
        return None
    return LimitStore(
        url_file=Path(common.LIMIT_STORE_DIR) / "url",
        auth_token_file=Path(common.LIMIT_STORE_DIR) / "token",
        replicas=spec.gateway.replicas,
    )


def runtime_config(
    spec: PlatformSpec,
    static_replicas: Mapping[str, Sequence[str]] | None = None,
    files: S3Files | None = None,
) -> RuntimeConfig:
    """``static_replicas`` (model name -> engine URLs) replaces Kubernetes discovery (``make local``);
    ``files`` is where the cloud keeps the batch service's files (``Cloud.batch_files``), None: its volume."""
    keys_file = f"{common.API_KEYS_DIR}/{common.API_KEYS_FILE}" if spec.gateway.api_keys_config_key else None
    health_feed = f"{service_url(spec, common.HEALTH, health_port())}/v1/backends"
    router_url = service_url(spec, common.ROUTER, router_port())
    router = RouterSettings.model_validate(
        {
            "routes": [_route(spec, m) for m in spec.models],
            "require_api_key": spec.gateway.require_api_key,
            "api_keys_file": keys_file,
            "health_feed_url": health_feed,
            "batches_url": batches.url(spec) if batches.enabled(spec) else None,
            "client_idle_timeout_s": client_idle_timeout_s(),
            "limit_store": limit_store(spec),
            "metrics_port": spec.gateway.router_metrics_port,
            # the ALB, or the Gateway's Envoy, appends the address it saw to X-Forwarded-For
            "trusted_proxy_hops": 0 if spec.gateway.ingress is IngressKind.NONE else 1,
            "tenants": spec.gateway.tenants,
            "default_band": spec.gateway.default_band,
            "queue_order": spec.gateway.queue_order,
        }
    )
    checks = canary_checks(spec)
    # Behind an inference-extension gateway the picker is the only component that sees a request's key.
    # Its replica count rides along: each replica holds its own request buckets and takes its share of a key.
    picker = PickerSettings(replicas=PICKER_REPLICAS)
    if not spec.gateway.runs_router and keys_file is not None:
        picker = PickerSettings(
            require_api_key=spec.gateway.require_api_key, api_keys_file=keys_file, replicas=PICKER_REPLICAS
        )
    return RuntimeConfig(
        models=[
            model_target(spec, m, None if static_replicas is None else static_replicas.get(m.name, []))
            for m in spec.models
        ],
        router=router,
        # With canaries, every probe round also asks each replica for one token: an engine that still answers
        # /health but fails requests counts against its version's error rate.
        health=HealthSettings(
            kubernetes_events=True, canaries=checks, synthetic_probe_every=1 if checks else 0
        ),
        batcher=BatcherSettings(policies=[_batching(m) for m in embedding_models(spec)]),
        picker=picker,
        batches=batches.settings(spec, router_url, health_feed, files),
        tracing=tracing_settings(spec),
    )


def tracing_settings(spec: PlatformSpec) -> TracingSettings | None:
    """Where the runtime services send spans and how many (observability.tracing); None: tracing off."""
    t = spec.observability.tracing
    if not t.enabled:
        return None
    return TracingSettings(
        endpoint=tracing.collector_endpoint(spec),
        sample_ratio=t.sample_ratio,
        capture_prompts=t.capture_prompts,
    )
