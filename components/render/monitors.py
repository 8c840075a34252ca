"""ServiceMonitors: how the Prometheus operator finds the engines and the runtime services. Pure.

One monitor per model selects its engine Service; one more selects the runtime services (health monitor,
batcher) by component label. Both scrape the ``http`` port every ``SCRAPE_INTERVAL``. The router and the batch
service have one each, on their ``metrics`` ports (their API ports serve no metrics, or only to the router).
"""

from __future__ import annotations

from typing import Any

from components.render import batches, common, signals
from components.render.common import Manifest
from components.render.gateway import METRICS_PORT_NAME, parts
from components.spec import ModelSpec, PlatformSpec
from runtime.engines import facts

RUNTIME_METRICS_PATH = "/metrics"
"""Where the router, the health monitor, the batcher and the batch service serve their metrics."""


def _service_monitor(
    spec: PlatformSpec, name: str, selector: dict[str, Any], path: str, port: str = "http"
) -> Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": common.metadata(spec, name, "monitoring"),
        "spec": {
            "selector": selector,
            "namespaceSelector": {"matchNames": [spec.cluster.namespace]},
            "endpoints": [
                {"port": port, "path": path, "interval": signals.SCRAPE_INTERVAL, "scheme": "http"}
            ],
        },
    }


def engine_service_monitor(spec: PlatformSpec, model: ModelSpec) -> Manifest:
    """Scrapes one model's engine replicas at the engine's own metrics path."""
    return _service_monitor(
        spec,
        common.engine_name(model.name),
        {"matchLabels": common.engine_selector(spec, model.name)},
        facts(model.engine.kind).metrics_path,
    )


def runtime_service_monitor(spec: PlatformSpec) -> Manifest:
    """Scrapes the runtime services this stack runs on their ``http`` ports, selected by their component label: the
    router and the batch service have monitors of their own, on their metrics ports (each Service has one)."""
    name = common.runtime_name(spec, "runtime")
    instance = common.labels(spec, name, "monitoring")["app.kubernetes.io/instance"]
    selector = {
        "matchLabels": {"app.kubernetes.io/instance": instance},
        "matchExpressions": [
            {
                "key": "app.kubernetes.io/component",
                "operator": "In",
                "values": [p for p in parts(spec) if p != common.ROUTER],
            }
        ],
    }
    return _service_monitor(spec, name, selector, RUNTIME_METRICS_PATH)


def router_service_monitor(spec: PlatformSpec) -> Manifest:
    """Scrapes the router on its metrics port (its API port, the one an ingress routes, serves none)."""
    name = common.runtime_name(spec, common.ROUTER)
    selector = {"matchLabels": common.selector(spec, name, common.ROUTER)}
    return _service_monitor(spec, name, selector, RUNTIME_METRICS_PATH, METRICS_PORT_NAME)


def batch_service_monitor(spec: PlatformSpec) -> Manifest:
    """Scrapes the batch service on its metrics port (its API port admits the router only)."""
    selector = {"matchLabels": common.selector(spec, batches.name(spec), batches.PART)}
    return _service_monitor(
        spec, batches.name(spec), selector, RUNTIME_METRICS_PATH, batches.METRICS_PORT_NAME
    )


def render(spec: PlatformSpec) -> list[Manifest]:
    """Every ServiceMonitor of the stack: one per model whose engine exports metrics, then the runtime services'
    (the batch service's apart: it is scraped on its own metrics port)."""
    engines = [engine_service_monitor(spec, m) for m in spec.models if signals.scraped(m)]
    own = [router_service_monitor(spec)] if spec.gateway.runs_router else []
    own += [batch_service_monitor(spec)] if batches.enabled(spec) else []
    return [*engines, runtime_service_monitor(spec), *own]
