"""How each model's engines scale: KEDA ScaledObjects, or autoscaling/v2 HPAs with prometheus-adapter. Pure.

Every number is a threshold of ``components.core.scaling`` (from the spec), read from the serving unit's decisions
(``components.core.decisions.ModelDecisions.scaling``, made once per plan): this module only renders them.

A model whose min and max replicas are equal gets no scaler: its Deployment keeps a fixed count. A
model with a scaler has no ``replicas`` in its Deployment: the scaler owns the count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.core.decisions import ModelDecisions
from components.core.scaling import Thresholds
from components.render import addons, common, groups, signals
from components.render.common import Manifest
from components.spec import Autoscaler, ModelSpec, PlatformSpec
from runtime.config import EngineKind
from runtime.engines import Signal, facts

POLLING_INTERVAL_S = 15
"""How often KEDA evaluates triggers (matches the scrape interval)."""
SCALE_UP_PERIOD_S = 60
"""Period of the scale-up step policies."""
SCALE_DOWN_PERIOD_S = 120
"""One replica removed per period: the engines' termination grace, so drains never overlap."""
TTFT_QUANTILE = 0.95
PROMETHEUS_TRIGGER = "prometheus"


def scales(model: ModelSpec) -> bool:
    """True when a scaler owns the replica count (min and max differ)."""
    return model.scaling.min_replicas != model.scaling.max_replicas


def scaler_name(model: ModelSpec) -> str:
    return common.engine_name(model.name)


def hpa_name(spec: PlatformSpec, model: ModelSpec) -> str:
    """The HPA that scales the engines (KEDA creates it under this name, from ``horizontalPodAutoscalerConfig``)."""
    return scaler_name(model)


def behavior(t: Thresholds) -> Manifest:
    """HPA behaviour: stabilisation windows from the spec, step policies as cooldown."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": t.scale_up_window_s,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": t.scale_up_step_pods, "periodSeconds": SCALE_UP_PERIOD_S},
                {"type": "Percent", "value": 100, "periodSeconds": SCALE_UP_PERIOD_S},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": t.scale_down_window_s,
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": SCALE_DOWN_PERIOD_S}],
        },
    }


def _number(value: float) -> str:
    return f"{value:g}"


def router_queue(spec: PlatformSpec, model: ModelSpec) -> str:
    """Requests the router holds for this model (a dashboard and alert signal)."""
    return f'sum(inferstack_router_queue_depth{{namespace="{spec.cluster.namespace}",model="{model.name}"}})'


def router_demand(spec: PlatformSpec, model: ModelSpec) -> str:
    """Demand the engines cannot see: requests waiting in the router, plus requests it turned away for want of
    a replica (per second over the rate window). The only signal there is while a model has zero replicas,
    so it is what wakes a model from zero. Behind a gateway (inference-extension) no router runs and the
    endpoint picker holds nothing: its refusals for want of a replica are the whole signal."""
    refused = (
        f'sum(rate({signals.front_metric(spec, "rejections_total")}{{namespace="{spec.cluster.namespace}",'
        f'model="{model.name}",reason="no_backend"}}[{signals.RATE_WINDOW}]))'
    )
    if signals.front(spec) == common.PICKER:
        return f"({refused} or on() vector(0))"
    return f"({router_queue(spec, model)} or on() vector(0)) + ({refused} or on() vector(0))"


@dataclass(frozen=True)
class Trigger:
    """One scaling signal: a query and its target, rendered as a KEDA trigger or an HPA metric."""

    name: str
    query: str
    target: float
    metric_type: str  # AverageValue: per replica; Value: the whole model


def triggers(spec: PlatformSpec, unit: ModelDecisions) -> list[Trigger]:
    """The model's scaling signals, at its thresholds: the router's queue always, the engine's own only where it
    exports them.

    A trigger must never read a metric the engine lacks: with ``ignoreNullValues`` a missing series reads 0
    and the model would never scale on it."""
    model, t = unit.model, unit.scaling
    role = model.pd_role  # a disaggregated model's roles scale on what loads each (``lifecycle.pd_units``)
    out: list[Trigger] = []
    if signals.has(model, Signal.QUEUED):
        out.append(
            Trigger("queued", signals.total(spec, model, Signal.QUEUED), t.queue_per_replica, "AverageValue")
        )
    if (
        role == "prefill"
    ):  # requests never wait for a prefill replica: a missing one is a decode-only fallback
        out.append(
            Trigger("prefill-demand", prefill_demand(spec, model), t.queue_per_replica, "AverageValue")
        )
    else:
        out.append(Trigger("router-queue", router_demand(spec, model), t.queue_per_replica, "AverageValue"))
    if (
        signals.has(model, Signal.KV_USAGE) and role != "prefill"
    ):  # a prefill engine holds its KV only briefly
        out.append(
            Trigger("kv-cache", signals.average(spec, model, Signal.KV_USAGE), t.kv_cache_usage, "Value")
        )
    if signals.has(model, Signal.TTFT) and role != "decode":  # a decode's first token waits on the transfer
        ttft = signals.quantile(spec, model, Signal.TTFT, TTFT_QUANTILE)
        out.append(Trigger("ttft-p95", signals.zero_if_absent(ttft), t.ttft_p95_s, "Value"))
    if signals.has(model, Signal.INTER_TOKEN) and role == "decode":
        itl = signals.quantile(spec, model, Signal.INTER_TOKEN, TTFT_QUANTILE)
        out.append(Trigger("inter-token-p95", signals.zero_if_absent(itl), t.inter_token_p95_s, "Value"))
    return out


def prefill_demand(spec: PlatformSpec, model: ModelSpec) -> str:
    """Prefills the router could not send for want of a prefill replica (per second over the rate window): the
    decode computed those prompts itself (``runtime.router.disagg``). The only signal there is while the prefill
    role has zero replicas, so it is what wakes it from zero."""
    fallbacks = (
        f'sum(rate({signals.front_metric(spec, "pd_fallbacks_total")}{{namespace="{spec.cluster.namespace}",'
        f'model="{model.served_name}",reason="no_prefill_replica"}}[{signals.RATE_WINDOW}]))'
    )
    return f"({fallbacks} or on() vector(0))"


ENGINE_LOAD_SIGNALS = (Signal.QUEUED, Signal.KV_USAGE, Signal.TTFT)
"""The engine signals a scaler reads when the engine exports them."""


def scaling_note(spec: PlatformSpec, unit: ModelDecisions) -> str | None:
    """What a scaled model cannot scale on because its engine does not export it (for the plan); else None."""
    model = unit.model
    missing = [s.value for s in ENGINE_LOAD_SIGNALS if not signals.has(model, s)]
    if not scales(model) or not missing:
        return None
    engine = facts(model.engine.kind).display_name
    used = ", ".join(trig.name for trig in triggers(spec, unit))
    return f"{model.name}: {engine} exports no {', '.join(missing)} metric; it scales on {used} only"


def workload(model: ModelSpec, multi_node: bool = False) -> Manifest:
    """What a scaler scales: the engine's Deployment, or the LeaderWorkerSet of a replica that spans nodes (its
    scale subresource counts groups, and its HPA pod selector picks the leaders, where the engine's metrics are)."""
    name = common.engine_name(model.name)
    if multi_node:
        return {"apiVersion": groups.API_VERSION, "kind": groups.KIND, "name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def scaled_object(spec: PlatformSpec, unit: ModelDecisions) -> Manifest:
    model, t = unit.model, unit.scaling
    name = scaler_name(model)
    server = addons.prometheus_url(spec)
    keda_triggers: list[Manifest] = []
    for trig in triggers(spec, unit):
        keda_triggers.append(
            {
                "type": PROMETHEUS_TRIGGER,
                "name": trig.name,
                "metricType": trig.metric_type,
                "metadata": {
                    "serverAddress": server,
                    "query": trig.query,
                    "threshold": _number(trig.target),
                    # Any waiting request, any KV block in use, any recent request keeps the model awake
                    # (and wakes it from zero); all at zero for idle_before_zero_s lets it go.
                    "activationThreshold": _number(t.activation),
                    "ignoreNullValues": "true",
                },
            }
        )
    body: Manifest = {
        "scaleTargetRef": workload(model, unit.placement.multi_node),
        "pollingInterval": POLLING_INTERVAL_S,
        "cooldownPeriod": t.idle_before_zero_s,
        "minReplicaCount": t.min_replicas,
        "maxReplicaCount": t.max_replicas,
        "advanced": {
            "horizontalPodAutoscalerConfig": {"name": hpa_name(spec, model), "behavior": behavior(t)},
        },
        "triggers": keda_triggers,
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": common.metadata(spec, name, "autoscaling"),
        "spec": body,
    }


# HPA mode: prometheus-adapter exposes the same signals as custom metrics ---------------------------


def adapter_metric(model: ModelSpec, trigger: str) -> str:
    """Custom-metric name prometheus-adapter serves for one engine kind's signal."""
    return f"inferstack_{model.engine.kind.value}_{trigger.replace('-', '_')}"


def _milli(value: float) -> str:
    """A Kubernetes quantity with milli precision (0.85 -> '850m')."""
    return f"{round(value * 1000)}m"


def hpa(spec: PlatformSpec, unit: ModelDecisions) -> Manifest:
    """autoscaling/v2 HPA on queue depth and KV usage per pod and TTFT p95 of the Service."""
    model, t = unit.model, unit.scaling
    name = hpa_name(spec, model)
    metrics: list[Manifest] = []
    for signal, trigger, target in (
        (Signal.QUEUED, "queued", t.queue_per_replica),
        (Signal.KV_USAGE, "kv-cache", t.kv_cache_usage),
    ):
        if signals.has(model, signal):
            metrics.append(
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": adapter_metric(model, trigger)},
                        "target": {"type": "AverageValue", "averageValue": _milli(target)},
                    },
                }
            )
    if signals.has(model, Signal.TTFT):
        metrics.append(
            {
                "type": "Object",
                "object": {
                    "describedObject": {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "name": common.engine_name(model.name),
                    },
                    "metric": {"name": adapter_metric(model, "ttft-p95")},
                    "target": {"type": "Value", "value": _milli(t.ttft_p95_s)},
                },
            }
        )
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": common.metadata(spec, name, "autoscaling"),
        "spec": {
            "scaleTargetRef": workload(model, unit.placement.multi_node),
            "minReplicas": t.min_replicas,
            "maxReplicas": t.max_replicas,
            "metrics": metrics,
            "behavior": behavior(t),
        },
    }


_POD_RESOURCES = {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
_SERVICE_RESOURCES = {"namespace": {"resource": "namespace"}, "service": {"resource": "service"}}


def adapter_rules(spec: PlatformSpec) -> list[dict[str, Any]]:
    """prometheus-adapter ``rules.custom``: one rule per engine kind and signal the stack's models use."""
    rules: list[dict[str, Any]] = []
    seen: set[EngineKind] = set()
    for model in spec.models:
        if model.engine.kind in seen:
            continue
        seen.add(model.engine.kind)
        for signal, trigger, aggregate in (
            (Signal.QUEUED, "queued", "sum"),
            (Signal.KV_USAGE, "kv-cache", "max"),
        ):
            if not signals.has(model, signal):
                continue
            series = signals.names(model, signal)[0]
            rules.append(
                {
                    "seriesQuery": f'{series}{{namespace!="",pod!=""}}',
                    "resources": {"overrides": _POD_RESOURCES},
                    "name": {"matches": f"^{series}$", "as": adapter_metric(model, trigger)},
                    "metricsQuery": f"{aggregate}(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)",
                }
            )
        if signals.has(model, Signal.TTFT):
            ttft = f"{signals.names(model, Signal.TTFT)[0]}_bucket"
            rules.append(
                {
                    "seriesQuery": f'{ttft}{{namespace!="",service!=""}}',
                    "resources": {"overrides": _SERVICE_RESOURCES},
                    "name": {"matches": f"^{ttft}$", "as": adapter_metric(model, "ttft-p95")},
                    "metricsQuery": (
                        f"histogram_quantile({TTFT_QUANTILE:g}, sum(rate(<<.Series>>{{<<.LabelMatchers>>}}"
                        f"[{signals.RATE_WINDOW}])) by (le, <<.GroupBy>>))"
                    ),
                }
            )
    return rules


def render(spec: PlatformSpec, unit: ModelDecisions) -> list[Manifest]:
    """The scaler of one serving unit: a ScaledObject (keda) or an HPA (hpa); nothing when min equals max. A replica
    that spans nodes is scaled as its LeaderWorkerSet (groups), not a Deployment."""
    if not scales(unit.model):
        return []
    if spec.addons.autoscaler is Autoscaler.KEDA:
        return [scaled_object(spec, unit)]
    return [hpa(spec, unit)]


def promql(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[str]:
    """Every PromQL expression this module renders (adapter templates filled in), for the parser check."""
    out = [trig.query for m in spec.models for trig in triggers(spec, units[m.name])]
    for rule in adapter_rules(spec):
        out.append(
            rule["metricsQuery"]
            .replace("<<.Series>>", rule["name"]["matches"].strip("^$"))
            .replace("<<.LabelMatchers>>", f'namespace="{spec.cluster.namespace}"')
            .replace("<<.GroupBy>>", "pod")
        )
    return out
