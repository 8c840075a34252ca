"""PrometheusRule alerts, from the spec, the serving units' decisions and the engine metric map. Pure.

Thresholds come from the spec: queue backlog is the scaling queue target (the unit's decided thresholds) held while
scaling could not relieve it, TTFT and inter-token alerts are the model's SLO, "pinned at max" is the model's own HPA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from components.core.decisions import ModelDecisions
from components.render import batches, common, scaling, signals
from components.render.common import Manifest
from components.spec import PlatformSpec
from runtime.engines import Signal

KV_CACHE_ALERT_RATIO = 0.9
"""KV cache usage beyond which a replica preempts or rejects work (alert, not a scaling target)."""
ROUTER_5XX_RATIO = 0.05
"""Share of router responses that may be 5xx before paging."""
# Multi-window burn alerts on the p95 objective: (short, long, severity, for).
BURN_WINDOWS = (("5m", "1h", "critical", "2m"), ("30m", "6h", "warning", "15m"))


@dataclass(frozen=True)
class Alert:
    """One alerting rule; ``model`` labels the alerts that concern a single model."""

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    model: str | None = None

    def rule(self) -> Manifest:
        labels = {"severity": self.severity}
        if self.model:
            labels["model"] = self.model
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": labels,
            "annotations": {"summary": self.summary, "description": self.description},
        }


def _up(spec: PlatformSpec, service: str) -> str:
    return f'up{{{signals.namespace_label(spec)},service="{service}"}}'


def model_alerts(spec: PlatformSpec, unit: ModelDecisions) -> list[Alert]:
    """Engine down or too few, queue backlog, KV cache full, SLO burn, and scaling pinned at its max."""
    model, t = unit.model, unit.scaling
    engine = common.engine_name(model.name)
    n = model.name
    out: list[Alert] = []
    if signals.scraped(model):
        out.append(
            Alert(
                "InferenceEngineDown",
                f"{_up(spec, engine)} == 0",
                "5m",
                "critical",
                f"{n}: an engine replica does not answer /metrics",
                "A replica of {{ $labels.service }} ({{ $labels.pod }}) has been unreachable for 5 minutes.",
                n,
            )
        )
    if t.min_replicas > 0:
        # Scraped engines count as up when Prometheus reaches them (a group's leader: the Service selects leaders);
        # the others by their workload's ready replicas.
        up = (
            f"sum({_up(spec, engine)})"
            if signals.scraped(model)
            else signals.workload_replicas(spec, unit)[0]
        )
        out.append(
            Alert(
                "InferenceEngineReplicasBelowMin",
                f"({up} or on() vector(0)) < {t.min_replicas}",
                "10m",
                "critical",
                f"{n}: fewer than {t.min_replicas} replicas up",
                f"{n} should run at least {t.min_replicas} replicas; {{{{ $value }}}} are up.",
                n,
            )
        )
    if signals.has(model, Signal.QUEUED):
        out.append(
            Alert(
                "InferenceQueueBacklog",
                f"{signals.total(spec, model, Signal.QUEUED)} / clamp_min(sum({_up(spec, engine)}), 1)"
                f" > {t.queue_per_replica:g}",
                "10m",
                "warning",
                f"{n}: requests are queueing in the engines",
                f"More than {t.queue_per_replica:g} requests per replica have waited for 10 minutes "
                "(the scale-up target): scaling is not relieving the load.",
                n,
            )
        )
    if signals.has(model, Signal.KV_USAGE):
        out.append(
            Alert(
                "InferenceKVCacheNearlyFull",
                f"{signals.maximum(spec, model, Signal.KV_USAGE)} > {KV_CACHE_ALERT_RATIO:g}",
                "10m",
                "warning",
                f"{n}: KV cache above {KV_CACHE_ALERT_RATIO:.0%}",
                "An engine's KV cache is nearly full: requests are preempted or wait for blocks.",
                n,
            )
        )
    slo_s = model.slo.ttft_p95_ms / 1000
    if signals.has(model, Signal.TTFT):
        for short, long, severity, for_ in BURN_WINDOWS:
            q_short = signals.quantile(spec, model, Signal.TTFT, 0.95, short)
            q_long = signals.quantile(spec, model, Signal.TTFT, 0.95, long)
            out.append(
                Alert(
                    f"InferenceTTFTSLOBurn{short.upper()}",
                    f"({q_short}) > {slo_s:g} and ({q_long}) > {slo_s:g}",
                    for_,
                    severity,
                    f"{n}: TTFT p95 above the {model.slo.ttft_p95_ms} ms objective",
                    f"TTFT p95 has exceeded {model.slo.ttft_p95_ms} ms over both {short} and {long}.",
                    n,
                )
            )
    if signals.has(model, Signal.INTER_TOKEN):
        itl_s = model.slo.inter_token_p95_ms / 1000
        out.append(
            Alert(
                "InferenceInterTokenSLO",
                f"({signals.quantile(spec, model, Signal.INTER_TOKEN, 0.95, '30m')}) > {itl_s:g}",
                "15m",
                "warning",
                f"{n}: inter-token p95 above the {model.slo.inter_token_p95_ms} ms objective",
                f"Streamed tokens are slower than {model.slo.inter_token_p95_ms} ms apart at p95 over 30m.",
                n,
            )
        )
    if scaling.scales(model):
        hpa = f'{signals.namespace_label(spec)},horizontalpodautoscaler="{scaling.hpa_name(spec, model)}"'
        out.append(
            Alert(
                "InferenceScalingPinnedAtMax",
                f"kube_horizontalpodautoscaler_status_current_replicas{{{hpa}}}"
                f" >= kube_horizontalpodautoscaler_spec_max_replicas{{{hpa}}}",
                "30m",
                "warning",
                f"{n}: at max_replicas ({t.max_replicas}) for 30 minutes",
                "Demand exceeds what the stack allows; raise scaling.max_replicas or add capacity.",
                n,
            )
        )
    return out


def gateway_alerts(spec: PlatformSpec) -> list[Alert]:
    """No front up (the router, or behind an inference-extension gateway the picker), too many 5xx through
    it, health-monitor ejections, the rate-limit store out of reach."""
    return [*_front_alerts(spec), *limit_store_alerts(spec)]


def _front_alerts(spec: PlatformSpec) -> list[Alert]:
    part = signals.front(spec)
    name = part.capitalize()
    return [
        Alert(
            f"Inference{name}Down",
            f"(sum({_up(spec, common.runtime_name(spec, part))}) or on() vector(0)) == 0",
            "5m",
            "critical",
            f"No {part} replica is up",
            f"Every request to the platform fails: no {part} answers /metrics.",
        ),
        Alert(
            f"Inference{name}5xxRate",
            f"{signals.router_error_ratio(spec, '5m')} > {ROUTER_5XX_RATIO:g}",
            "5m",
            "critical",
            f"{name} 5xx rate above {{{{ $value | humanizePercentage }}}} for {{{{ $labels.model }}}}",
            f"More than {ROUTER_5XX_RATIO:.0%} of responses for a model are server errors.",
        ),
        Alert(
            "InferenceHealthEjections",
            f"{signals.health_ejections(spec)} > 0",
            "0m",
            "warning",
            "The health monitor ejected replicas of {{ $labels.model }}",
            "{{ $value }} replicas were taken out of rotation in the last 15 minutes.",
        ),
    ]


def batch_alerts(spec: PlatformSpec) -> list[Alert]:
    """A batch without progress for ``batch.stuck_after_minutes``, a batch that ran out of its window, the batch
    service down; none when the stack runs no batch service."""
    if not batches.enabled(spec):
        return []
    ns = signals.namespace_label(spec)
    minutes = spec.batch.stuck_after_minutes
    return [
        Alert(
            "InferenceBatchStuck",
            f"max(inferstack_batches_oldest_progress_age_seconds{{{ns}}}) > {minutes * 60}",
            "5m",
            "warning",
            f"A batch has recorded no result for over {minutes} minutes",
            "An unfinished batch makes no progress: the replicas had no headroom for it all that time (interactive"
            " load, or no replica), or the batch service cannot reach the router or its file store. See"
            ' inferstack_batches_requests_total{outcome="refused"} and the service\'s log.',
        ),
        Alert(
            "InferenceBatchExpired",
            f'increase(inferstack_batches_finished_total{{{ns},status="expired"}}[1h]) > 0',
            "0m",
            "warning",
            "A batch expired before all its requests ran",
            "Its unfinished requests are in its error file as batch_expired: the platform had too little idle"
            " capacity in 24 hours for the batches it was given.",
        ),
        Alert(
            "InferenceBatchServiceDown",
            f"(sum({_up(spec, batches.name(spec))}) or on() vector(0)) == 0",
            "10m",
            "warning",
            "The batch service is down",
            "Batches make no progress and /v1/files and /v1/batches fail; the router serves everything else.",
        ),
    ]


def limit_store_alerts(spec: PlatformSpec) -> list[Alert]:
    """A router replica limiting on its own because the shared rate-limit store does not answer."""
    if not spec.gateway.shared_limits:
        return []
    ns = signals.namespace_label(spec)
    return [
        Alert(
            "InferenceRateLimitStoreUnreachable",
            f"min by (pod) (inferstack_router_limit_store_up{{{ns}}}) == 0",
            "5m",
            "warning",
            "Router {{ $labels.pod }} cannot reach the shared rate-limit store",
            "It limits each key at its share of the limit (the limit divided by the replicas last seen alive)"
            " until the store answers again; see inferstack_router_limit_store_errors_total for the cause.",
        )
    ]


def alerts(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[Alert]:
    """Every alert of the stack: each model's (``units``: their decisions), then the gateway's, then the batch
    service's."""
    models = [a for m in spec.models for a in model_alerts(spec, units[m.name])]
    return models + gateway_alerts(spec) + batch_alerts(spec)


def rule_groups(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[Manifest]:
    """The rule groups: one per model, one for the gateway, one for the batch service. A Prometheus rule file is
    ``{"groups": ...}``; the cluster gets them in a PrometheusRule, ``make local MONITOR=1`` in a file (promtool
    checks that one)."""
    groups = [
        {"name": f"inferstack-{m.name}", "rules": [a.rule() for a in model_alerts(spec, units[m.name])]}
        for m in spec.models
    ]
    groups.append({"name": "inferstack-gateway", "rules": [a.rule() for a in gateway_alerts(spec)]})
    if batch := batch_alerts(spec):
        groups.append({"name": "inferstack-batches", "rules": [a.rule() for a in batch]})
    return groups


def prometheus_rule(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> Manifest:
    """One PrometheusRule with every rule group of the stack."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": common.metadata(spec, f"{spec.name}-alerts", "monitoring"),
        "spec": {"groups": rule_groups(spec, units)},
    }


def promql(spec: PlatformSpec, units: Mapping[str, ModelDecisions]) -> list[str]:
    """Every alert expression, for the parser check."""
    return [a.expr for a in alerts(spec, units)]
