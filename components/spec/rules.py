"""Rules that span sections of the spec: one function per rule, each yielding every problem it finds.

A field's own rule lives on its model; a rule that reads two sections (the gateway's mode and a model's routing,
the target and the cluster's name) lives here, registered with ``@rule``, so a stack file with several such
mistakes hears of all of them in one run (``PlatformSpec`` runs every rule and reports what they found together).
Rules that also need the hardware catalog, the layout or the target's cloud are the plan-time rules
(``components.core.plan_rules``), reported with the same paths; a stack file gets both kinds in one run
(``components.core.stackfile`` runs these with them, ``RULES_LATER``).; a target's own rules are its cluster section's
(``components.spec.cluster``), run by one rule here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from components.base.problems import Problem
from components.spec.base import HF_REPO
from components.spec.model import ModelSpec
from components.spec.platform import CROSS_SECTION_RULES, Autoscaler, PlatformSpec
from runtime.config import BatcherSettings, BatchesSettings, HealthSettings, RouterSettings
from runtime.engines import Signal, facts

Rule = Callable[[PlatformSpec], Iterator[Problem]]
#: The runtime services' fixed ports (their defaults in runtime.config; the spec does not change them).
RUNTIME_PORTS = {
    "router API": RouterSettings().port,
    "health monitor": HealthSettings().port,
    "batcher": BatcherSettings().port,
    "batch service": BatchesSettings.model_fields["port"].default,
}


def rule(check: Rule) -> Rule:
    """Registers a cross-section rule (in definition order, which is the order its problems are reported)."""
    CROSS_SECTION_RULES.append(check)
    return check


def _models_where(
    spec: PlatformSpec, applies: Callable[[ModelSpec], bool], field: str, message: str
) -> Iterator[Problem]:
    """One problem at ``models[i].<field>`` for each model the rule applies to."""
    for i, m in enumerate(spec.models):
        if applies(m):
            yield Problem(f"models[{i}].{field}", message)


@rule
def hpa_cannot_reach_zero(spec: PlatformSpec) -> Iterator[Problem]:
    zero = [m.name for m in spec.models if m.scaling.min_replicas == 0]
    if spec.addons.autoscaler is Autoscaler.HPA and zero:
        yield Problem(
            "addons.autoscaler",
            f"hpa cannot scale to zero, but min_replicas is 0 for {', '.join(zero)}; use autoscaler: keda or set "
            "min_replicas to at least 1",
        )


@rule
def router_metrics_apart(spec: PlatformSpec) -> Iterator[Problem]:
    """The router's metrics listener cannot share a port with its API (or the health monitor, batcher and batch
    service, which run in the same network policy's reach)."""
    taken = {port: what for what, port in RUNTIME_PORTS.items()}
    what = taken.get(spec.gateway.router_metrics_port)
    if what is not None:
        yield Problem(
            "gateway.router_metrics_port",
            f"{spec.gateway.router_metrics_port} is the {what}'s port; choose another (the default is 9091)",
        )


@rule
def limit_store_auth(spec: PlatformSpec) -> Iterator[Problem]:
    if (
        spec.gateway.shared_limits
        and not spec.cluster.on_this_machine  # make local's Redis listens on loopback only
        and not spec.gateway.limit_store_auth_config_key
    ):
        yield Problem(
            "gateway.shared_limits",
            "the store needs an AUTH token: set gateway.limit_store_auth_config_key to a Pulumi secret config key "
            "(`pulumi config set --secret <key> <16-128 characters>`)",
        )


@rule
def tokenizers_reachable(spec: PlatformSpec) -> Iterator[Problem]:
    """The router needs each precise_prefix model's tokenizer; its pod fetches it from the hub at start."""
    for i, m in enumerate(spec.models):
        if m.publishes_kv_events and not spec.cluster.on_this_machine and not HF_REPO.match(m.source):
            yield Problem(
                f"models[{i}].routing",
                "precise_prefix needs the model's tokenizer in the router, which fetches it from the Hugging Face "
                f"hub; {m.source!r} is not a hub repo id: use strategy prefix_aware for it",
            )


@rule
def hpa_needs_an_engine_load_metric(spec: PlatformSpec) -> Iterator[Problem]:
    """prometheus-adapter serves the engines' own queue and KV-cache gauges per pod; an engine without either
    leaves an HPA with nothing to scale on (KEDA also reads the router's queue)."""
    if spec.addons.autoscaler is not Autoscaler.HPA:
        return
    for i, m in enumerate(spec.models):
        engine = facts(m.engine.kind)
        if m.scaling.min_replicas != m.scaling.max_replicas and not (
            engine.names(Signal.QUEUED) or engine.names(Signal.KV_USAGE)
        ):
            yield Problem(
                f"models[{i}].engine.kind",
                f"{engine.display_name} exports no queue or KV-cache metric for addons.autoscaler hpa to scale on; "
                "use autoscaler: keda (it scales on the router's queue) or set min_replicas equal to max_replicas",
            )


@rule
def versions_need_the_router(spec: PlatformSpec) -> Iterator[Problem]:
    if not spec.gateway.runs_router:
        yield from _models_where(
            spec,
            lambda m: bool(m.versions),
            "versions",
            "the router splits a model's requests between its versions and rolls a canary back; gateway.mode "
            "inference-extension runs no router (the gateway routes by model name to one pool): use "
            "gateway.mode router, or serve one version",
        )


@rule
def versions_in_a_cluster(spec: PlatformSpec) -> Iterator[Problem]:
    """make local runs one engine per model from a local path: no preparation Jobs, no per-version engines."""
    if spec.cluster.on_this_machine:
        yield from _models_where(
            spec,
            lambda m: bool(m.versions),
            "versions",
            "target local serves one version per model; list the versions in a cluster stack (target eks or "
            "kubernetes), or point source at the version to try",
        )


@rule
def disaggregation_needs_the_router(spec: PlatformSpec) -> Iterator[Problem]:
    if not spec.gateway.runs_router:
        yield from _models_where(
            spec,
            lambda m: m.disaggregation is not None,
            "disaggregation",
            "the router runs a disaggregated model's two phases and recovers when a prefill or its transfer fails; "
            "gateway.mode inference-extension runs no router: use gateway.mode router",
        )


@rule
def disaggregation_scales_with_keda(spec: PlatformSpec) -> Iterator[Problem]:
    """Each role of a disaggregated model scales on its own signals (the prefill also on the prefills the router
    could not send, the decode on inter-token latency): KEDA's queries; prometheus-adapter serves neither."""
    if spec.addons.autoscaler is not Autoscaler.HPA:
        return

    def scales(m: ModelSpec) -> bool:
        pd = m.disaggregation
        if pd is None:
            return False
        roles = (m.scaling, pd.prefill.scaling)
        return any(s.min_replicas != s.max_replicas for s in roles)

    yield from _models_where(
        spec,
        scales,
        "disaggregation",
        "the prefill and decode roles scale on signals only KEDA reads (prefill demand, inter-token latency): use "
        "addons.autoscaler keda, or fix each role's replica count (min_replicas equal to max_replicas)",
    )


@rule
def the_picker_holds_nothing(spec: PlatformSpec) -> Iterator[Problem]:
    if not spec.gateway.runs_router:
        yield from _models_where(
            spec,
            lambda m: "cold_start_hold_ms" in m.scaling.model_fields_set and m.scaling.cold_start_hold_ms > 0,
            "scaling.cold_start_hold_ms",
            "in gateway.mode inference-extension the endpoint picker holds no request (the gateway's ext_proc "
            "call must answer within its message timeout): a request for a model with no ready replica gets "
            "503 at once, and those refusals wake the model; set it to 0 or remove it",
        )


@rule
def sleep_needs_the_router(spec: PlatformSpec) -> Iterator[Problem]:
    if not spec.gateway.runs_router:
        yield from _models_where(
            spec,
            lambda m: m.scaling.sleep_after_idle_s is not None,
            "scaling.sleep_after_idle_s",
            "the router puts idle replicas to sleep and wakes one for a waiting request, and gateway.mode "
            "inference-extension runs no router (the endpoint picker holds no request, so none would wake a "
            "replica): use gateway.mode router, or remove it",
        )


@rule
def adapters_need_the_router(spec: PlatformSpec) -> Iterator[Problem]:
    if not spec.gateway.runs_router:
        yield from _models_where(
            spec,
            lambda m: bool(m.adapters),
            "adapters",
            "in gateway.mode inference-extension the gateway routes by model name to the model's pool and the "
            "endpoint picker loads no adapter; LoRA adapters are loaded on demand by the router: use "
            "gateway.mode router, or serve the adapters as models",
        )


@rule
def the_picker_follows_no_kv_events(spec: PlatformSpec) -> Iterator[Problem]:
    if not spec.gateway.runs_router:
        yield from _models_where(
            spec,
            lambda m: m.publishes_kv_events,
            "routing",
            "precise_prefix follows the engines' KV events in the router, and gateway.mode inference-extension "
            "runs no router (the endpoint picker does not follow them): use strategy prefix_aware, or "
            "gateway.mode router",
        )


@rule
def priorities_need_the_inference_extension(spec: PlatformSpec) -> Iterator[Problem]:
    if spec.gateway.runs_router:
        yield from _models_where(
            spec,
            lambda m: m.routing.priority is not None,
            "routing.priority",
            "priorities are InferenceObjectives of gateway.mode inference-extension; set that mode or remove "
            "the priority",
        )


@rule
def batches_need_the_router(spec: PlatformSpec) -> Iterator[Problem]:
    if spec.batch.enabled and not spec.gateway.runs_router:
        yield Problem(
            "batch.enabled",
            "the Batch API is served by inferstack's router, and the batch service sends its requests through it; "
            "gateway.mode inference-extension runs no router: set gateway.mode router or batch.enabled false",
        )


@rule
def the_targets_own_rules(spec: PlatformSpec) -> Iterator[Problem]:
    """What the target's cluster section checks across sections (on eks: the batch service's bucket apart from
    the model bucket, the cluster's name short enough for AWS names)."""
    yield from spec.cluster.platform_problems(spec)
