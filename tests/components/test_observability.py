"""ServiceMonitors, PrometheusRule alerts and Grafana dashboards rendered from the spec."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from components.core.stackfile import STACKS_DIR, available_stacks
from components.render import observability
from runtime.engines import facts
from tests.components.helpers import decided
from tests.stacks import load, synthesized

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]


@cache
def _manifests(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(synthesized(name).kubernetes_manifests())


def _kind(name: str, kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in _manifests(name) if m["kind"] == kind}


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_engine_and_runtime_service_is_scraped(name: str) -> None:
    spec, _ = load(name).served
    monitors = _kind(name, "ServiceMonitor")
    services = _kind(name, "Service")
    for model in spec.models:
        monitor = monitors[f"{model.name}-engine"]["spec"]
        [endpoint] = monitor["endpoints"]
        assert endpoint["port"] == "http" and endpoint["path"] == facts(model.engine.kind).metrics_path
        labels = services[f"{model.name}-engine"]["metadata"]["labels"]
        assert monitor["selector"]["matchLabels"].items() <= labels.items()
        assert monitor["namespaceSelector"] == {"matchNames": [spec.cluster.namespace]}
    runtime = monitors["inferstack-runtime"]["spec"]
    components = set(runtime["selector"]["matchExpressions"][0]["values"])
    assert "health" in components and "router" not in components
    router = monitors["inferstack-router"]["spec"]  # on its metrics port: the API port serves no /metrics
    assert router["endpoints"][0]["port"] == "metrics"
    assert router["selector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert "metrics" in {p["name"] for p in services["inferstack-router"]["spec"]["ports"]}
    for part in components:
        labels = services[f"inferstack-{part}"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == part


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict on a Service's labels (matchLabels, and the In/NotIn expressions we render)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        present = labels.get(expression["key"]) in expression["values"]
        if present != (expression["operator"] == "In"):
            return False
    return True


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_scraped_service_is_scraped_once_on_a_port_it_has(name: str) -> None:
    """Two monitors on one Service scrape it twice: the second on the batch service's API port, which its
    NetworkPolicy closes to Prometheus, was a target down for ever (TargetDown fired in the first hour)."""
    services = _kind(name, "Service")
    scrapes: dict[str, list[str]] = {}
    for monitor_name, monitor in _kind(name, "ServiceMonitor").items():
        [endpoint] = monitor["spec"]["endpoints"]
        for service_name, service in services.items():
            if _selects(monitor["spec"]["selector"], service["metadata"].get("labels", {})):
                ports = {p.get("name") for p in service["spec"]["ports"]}
                assert endpoint["port"] in ports, f"{monitor_name} scrapes {service_name} on a port it lacks"
                scrapes.setdefault(service_name, []).append(monitor_name)
    twice = {service: monitors for service, monitors in scrapes.items() if len(monitors) > 1}
    assert not twice, f"Services scraped by more than one ServiceMonitor: {twice}"


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_alerts_cover_every_failure_the_issue_names_with_spec_thresholds(name: str) -> None:
    spec, _ = load(name).served
    [rule] = _kind(name, "PrometheusRule").values()
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    for alert in alerts:
        assert alert["expr"] and alert["for"] and alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["annotations"]["summary"]
    names = {a["alert"] for a in alerts}
    assert {
        "InferenceEngineDown",
        "InferenceQueueBacklog",
        "InferenceKVCacheNearlyFull",
        "InferenceTTFTSLOBurn5M",
        "InferenceRouter5xxRate",
        "InferenceHealthEjections",
        "InferenceRouterDown",
    } <= names
    if any(m.scaling.min_replicas != m.scaling.max_replicas for m in spec.models):
        assert "InferenceScalingPinnedAtMax" in names
    for model in spec.models:
        burn = next(
            a for a in alerts if a["alert"] == "InferenceTTFTSLOBurn5M" and a["labels"]["model"] == model.name
        )
        assert f"> {model.slo.ttft_p95_ms / 1000:g}" in burn["expr"]
        kv = next(
            a
            for a in alerts
            if a["alert"] == "InferenceKVCacheNearlyFull" and a["labels"]["model"] == model.name
        )
        assert kv["expr"].endswith("> 0.9")


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_dashboards_are_grafana_json_in_sidecar_config_maps(name: str) -> None:
    spec, _ = load(name).served
    maps = [
        m
        for m in _manifests(name)
        if m["kind"] == "ConfigMap" and "grafana_dashboard" in m["metadata"]["labels"]
    ]
    assert len(maps) == len(spec.models) + 1
    titles = set()
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(key, text)] = cm["data"].items()
        assert key.endswith(".json")
        dashboard = json.loads(text)
        assert dashboard["uid"] and len(dashboard["uid"]) <= 40
        panels = {p["title"] for p in dashboard["panels"]}
        titles |= panels
        for panel in dashboard["panels"]:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    assert {
        "Time to first token",
        "Inter-token latency",
        "KV cache usage",
        "Replicas",
        "Queued and running requests",
    } <= titles
    assert "Requests per second by model" in titles  # the gateway dashboard
    if any(m.engine.gpus for m in spec.models):
        assert "GPU utilisation (DCGM)" in titles


def test_observability_toggles_turn_objects_off() -> None:
    spec = load("prod").spec.model_copy(
        update={
            "observability": load("prod").spec.observability.model_copy(
                update={"alerts": False, "grafana_dashboards": False}
            )
        }
    )
    kinds = {m["kind"] for m in observability.render(spec, decided(spec).models)}
    assert kinds == {"ServiceMonitor"}


def test_without_the_prometheus_operator_alerts_are_skipped_and_dashboards_stay() -> None:
    # ServiceMonitor and PrometheusRule are the operator's CRDs; the dashboards only need Grafana's sidecar.
    prod = load("prod").spec
    spec = prod.model_copy(
        update={"observability": prod.observability.model_copy(update={"prometheus": False, "alerts": True})}
    )
    rendered = observability.render(spec, decided(spec).models)
    assert {m["kind"] for m in rendered} == {"ConfigMap"}
    assert len(rendered) == len(spec.models) + 1


# Fields each custom resource's controller refuses to work without (from the CRDs' required lists).
_REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    "ScaledObject": (("spec", "scaleTargetRef", "name"), ("spec", "triggers")),
    "ServiceMonitor": (("spec", "selector"), ("spec", "endpoints")),
    "PrometheusRule": (("spec", "groups"),),
    "Gateway": (("spec", "gatewayClassName"), ("spec", "listeners")),
    "HTTPRoute": (("spec", "parentRefs"),),
}


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_custom_resources_carry_the_fields_their_controllers_require(name: str) -> None:
    seen = set()
    for manifest in _manifests(name):
        required = _REQUIRED.get(manifest["kind"])
        if required is None:
            continue
        seen.add(manifest["kind"])
        for path in required:
            assert _at(manifest, path), f"{manifest['kind']} {manifest['metadata']['name']}: {'.'.join(path)}"
        if manifest["kind"] == "ScaledObject":
            spec = manifest["spec"]
            assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
            for trigger in spec["triggers"]:
                assert {"serverAddress", "query", "threshold"} <= set(trigger["metadata"])
                assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA wants strings
        if manifest["kind"] == "PrometheusRule":
            for group in manifest["spec"]["groups"]:
                assert group["name"] and group["rules"]
                names = [r["alert"] for r in group["rules"]]
                assert len(names) == len(set(names)), f"duplicate alerts in {group['name']}"
        if manifest["kind"] == "ServiceMonitor":
            for endpoint in manifest["spec"]["endpoints"]:
                assert endpoint["port"] and endpoint["path"].startswith("/")
    assert {"ScaledObject", "ServiceMonitor", "PrometheusRule"} <= seen
