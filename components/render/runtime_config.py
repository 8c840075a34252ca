"""The data-plane configuration (``runtime.config.RuntimeConfig``) rendered from the platform spec. Pure.

The router, health monitor and batcher read this one document from a ConfigMap. Engines are found
through their Services' EndpointSlices; per-replica concurrency caps are the engines' ``max_num_seqs``
(more in flight would only queue inside the engine, where the router cannot see or reroute it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from components.render import common
from components.spec import ModelSpec, PlatformSpec
from runtime.config import (
    BatcherSettings,
    BatchingPolicy,
    HealthSettings,
    KubernetesDiscovery,
    ModelRoute,
    ModelTarget,
    RouterSettings,
    RuntimeConfig,
    StaticBackend,
    StrategyConfig,
    Task,
)

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
    return bool(embedding_models(spec))


def model_target(
    spec: PlatformSpec, model: ModelSpec, static_urls: Sequence[str] | None = None
) -> ModelTarget:
    """Replicas from the engine Service's EndpointSlices, or (``make local``) at fixed ``static_urls``."""
    static = [StaticBackend.model_validate({"url": u}) for u in static_urls or []]
    discovery = None
    if static_urls is None:
        discovery = KubernetesDiscovery(
            namespace=spec.cluster.namespace, service=common.engine_name(model.name), port_name="http"
        )
    return ModelTarget(
        name=model.name,
        engine=model.engine.kind,
        task=model.resolved_task(),
        static_backends=static,
        discovery=discovery,
        max_concurrency_per_backend=model.engine.max_num_seqs,
        max_model_len_tokens=model.engine.max_model_len,
    )


def _route(spec: PlatformSpec, model: ModelSpec) -> ModelRoute:
    batcher = None
    if model.resolved_task() is Task.EMBED:
        batcher = service_url(spec, common.BATCHER, batcher_port())
    routing = model.routing
    knobs = {knob: getattr(routing, knob) for knob in sorted(routing.KNOBS)}  # the spec's knobs, as set
    strategy = StrategyConfig.model_validate(
        {"name": routing.strategy, "weights": dict(routing.weights), **knobs}
    )
    # the activator: a model that scales to zero holds its requests while a replica starts
    hold = model.scaling.cold_start_hold_ms if model.scaling.min_replicas == 0 else 0
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


def runtime_config(
    spec: PlatformSpec, static_backends: Mapping[str, Sequence[str]] | None = None
) -> RuntimeConfig:
    """``static_backends`` (model name -> engine URLs) replaces Kubernetes discovery (``make local``)."""
    keys_file = f"{common.API_KEYS_DIR}/{common.API_KEYS_FILE}" if spec.gateway.api_keys_config_key else None
    router = RouterSettings.model_validate(
        {
            "routes": [_route(spec, m) for m in spec.models],
            "require_api_key": spec.gateway.require_api_key,
            "api_keys_file": keys_file,
            "health_feed_url": f"{service_url(spec, common.HEALTH, health_port())}/v1/backends",
            "client_idle_timeout_s": client_idle_timeout_s(),
        }
    )
    return RuntimeConfig(
        models=[
            model_target(spec, m, None if static_backends is None else static_backends.get(m.name, []))
            for m in spec.models
        ],
        router=router,
        health=HealthSettings(kubernetes_events=True),
        batcher=BatcherSettings(policies=[_batching(m) for m in embedding_models(spec)]),
    )
