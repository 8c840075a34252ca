"""PromQL for serving signals, spelled once from the engine metric map (``runtime.engines``). Pure.

Scaling triggers, prometheus-adapter rules, alerts and dashboards all read engine signals through
these functions, so a renamed metric is fixed in ``runtime.engines`` and nowhere else. Every signal
accepts the old metric names too (``a or b``) and sums across the ``engine`` label. Engine series are
selected by the labels the ServiceMonitor attaches: ``namespace`` and ``service``. The router and
health-monitor expressions that both alerts and dashboards read are spelled here too.
"""

from __future__ import annotations

from components.core.decisions import ModelDecisions
from components.render import common
from components.spec import ModelSpec, PlatformSpec
from runtime.engines import Signal, facts

RATE_WINDOW = "2m"
"""Window of rate() over engine counters and histograms: eight scrapes, so one missed scrape does not matter."""
SCRAPE_INTERVAL = "15s"
"""How often engines and runtime services are scraped (ServiceMonitor interval)."""


def namespace_label(spec: PlatformSpec) -> str:
    """The label matcher of the platform's namespace, which every series it exports carries."""
    return f'namespace="{spec.cluster.namespace}"'


def workload_replicas(spec: PlatformSpec, unit: ModelDecisions) -> tuple[str, str]:
    """kube-state-metrics series of a model's ready and desired replicas, for engines Prometheus does not scrape
    and for dashboards. A Deployment's, or for a multi-node group (LeaderWorkerSet, by the unit's placement) its
    leader StatefulSet's: LWS names that StatefulSet after the set and runs one leader per group, and a leader is
    ready only once its workers have joined (LWS ``constructLeaderStatefulSetApplyConfiguration``: name and
    replicas from the set)."""
    ns, engine = namespace_label(spec), common.engine_name(unit.model.name)
    if unit.placement.multi_node:
        sel = f'{ns},statefulset="{engine}"'
        return (
            f"sum(kube_statefulset_status_replicas_ready{{{sel}}})",
            f"sum(kube_statefulset_replicas{{{sel}}})",
        )
    sel = f'{ns},deployment="{engine}"'
    return (
        f"sum(kube_deployment_status_replicas_available{{{sel}}})",
        f"sum(kube_deployment_spec_replicas{{{sel}}})",
    )


def engine_labels(spec: PlatformSpec, model: ModelSpec) -> str:
    return f'{namespace_label(spec)},service="{common.engine_name(model.name)}"'


def names(model: ModelSpec, signal: Signal) -> tuple[str, ...]:
    return facts(model.engine.kind).names(signal)


def has(model: ModelSpec, signal: Signal) -> bool:
    return bool(names(model, signal))


def scraped(model: ModelSpec) -> bool:
    """True when the model's engine exports Prometheus metrics we read (it gets a ServiceMonitor)."""
    return bool(facts(model.engine.kind).metrics)


def series(spec: PlatformSpec, model: ModelSpec, signal: Signal, suffix: str = "") -> str:
    """Every name of a signal for one model's engines, joined with ``or`` (old names still count)."""
    found = names(model, signal)
    if not found:
        raise ValueError(f"{model.engine.kind.value} exports no {signal.value} metric")
    sel = engine_labels(spec, model)
    return " or ".join(f"{name}{suffix}{{{sel}}}" for name in found)


def _rate(spec: PlatformSpec, model: ModelSpec, signal: Signal, suffix: str, window: str) -> str:
    sel = engine_labels(spec, model)
    return " or ".join(f"rate({name}{suffix}{{{sel}}}[{window}])" for name in names(model, signal))


def total(spec: PlatformSpec, model: ModelSpec, signal: Signal) -> str:
    """Sum of a gauge over every replica of the model (e.g. requests waiting)."""
    return f"sum({series(spec, model, signal)})"


def average(spec: PlatformSpec, model: ModelSpec, signal: Signal) -> str:
    """Mean of a gauge over replicas (e.g. KV cache usage 0-1): the worst engine of a pod, then the mean."""
    return f"avg(max by (pod) ({series(spec, model, signal)}))"


def maximum(spec: PlatformSpec, model: ModelSpec, signal: Signal) -> str:
    return f"max({series(spec, model, signal)})"


def rate(spec: PlatformSpec, model: ModelSpec, signal: Signal, window: str = RATE_WINDOW) -> str:
    """Per-second rate of a counter over every replica."""
    return f"sum({_rate(spec, model, signal, '', window)})"


def quantile(
    spec: PlatformSpec, model: ModelSpec, signal: Signal, q: float, window: str = RATE_WINDOW
) -> str:
    """A latency quantile in seconds from the engines' histogram, across every replica."""
    return f"histogram_quantile({q:g}, sum by (le) ({_rate(spec, model, signal, '_bucket', window)}))"


def prefix_hit_rate(spec: PlatformSpec, model: ModelSpec, window: str = RATE_WINDOW) -> str | None:
    """Share of prompt tokens served from the prefix cache, 0-1; None when the engine exports none."""
    if has(model, Signal.PREFIX_HITS) and has(model, Signal.PREFIX_QUERIES):
        hits = rate(spec, model, Signal.PREFIX_HITS, window)
        queries = rate(spec, model, Signal.PREFIX_QUERIES, window)
        return f"{hits} / clamp_min({queries}, 1e-9)"
    if has(model, Signal.PREFIX_HIT_RATE):
        return average(spec, model, Signal.PREFIX_HIT_RATE)
    return None


def zero_if_absent(expr: str) -> str:
    """NaN (no traffic in a quantile's window) and no series both read as 0: idle, not broken."""
    return f"(({expr}) >= 0) or on() vector(0)"


# Runtime services -----------------------------------------------------------------------------------


def front(spec: PlatformSpec) -> str:
    """The runtime part that routes each request and counts it: the router, or behind an inference-extension
    gateway the endpoint picker (no router runs; its series are ``inferstack_picker_*``, same labels)."""
    return common.PICKER if not spec.gateway.runs_router else common.ROUTER


def front_metric(spec: PlatformSpec, name: str) -> str:
    """``inferstack_<front>_<name>``: e.g. ``requests_total``, ``rejections_total``."""
    return f"inferstack_{front(spec)}_{name}"


def router_error_ratio(spec: PlatformSpec, window: str = RATE_WINDOW) -> str:
    """Share of the routed responses that are 5xx (the router's, or the picker's), per model, 0-1."""
    ns = namespace_label(spec)
    total = front_metric(spec, "requests_total")
    errors = f'{total}{{{ns},status=~"5.."}}'
    requests = f"{total}{{{ns}}}"
    return (
        f"sum by (model) (rate({errors}[{window}]))"
        f" / clamp_min(sum by (model) (rate({requests}[{window}])), 1e-9)"
    )


def health_ejections(spec: PlatformSpec, window: str = "15m") -> str:
    """Replicas the health monitor took out of rotation within ``window``, per model."""
    return (
        f"sum by (model) (increase(inferstack_health_ejections_total{{{namespace_label(spec)}}}[{window}]))"
    )
