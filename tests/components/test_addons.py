"""Cluster add-ons: helm.v4.Chart releases with pinned versions, chosen by the spec (opaque under mocks:
assert on chart, version, repository and values)."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest

from components import plan
from components.render import addons, scaling
from components.spec import PlatformSpec
from components.stackfile import STACKS_DIR, available_stacks, load
from tests.components.helpers import minimal

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]
HELM = "kubernetes:helm.sh/v4:Chart"
EXACT = re.compile(r"^v?\d+\.\d+\.\d+$")


@cache
def _charts(name: str) -> dict[str, dict[str, Any]]:
    return {r.name: r.inputs for r in plan.synthesize(load(name)).resources if r.type == HELM}


def _names(spec: PlatformSpec) -> set[str]:
    return {r.name for r in addons.releases(spec, scaling.adapter_rules(spec))}


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_chart_is_pinned_to_an_exact_version_from_its_repository(name: str) -> None:
    charts = _charts(name)
    assert charts
    for chart in charts.values():
        assert EXACT.match(chart["version"]), chart
        assert chart["repositoryOpts"]["repo"].startswith("https://")
        assert chart["namespace"]


def test_prod_gets_gpu_plugin_dcgm_keda_prometheus_and_the_alb_controller() -> None:
    charts = _charts("prod")
    assert set(charts) == {
        "nvidia-device-plugin",
        "dcgm-exporter",
        "keda",
        "kube-prometheus-stack",
        "aws-load-balancer-controller",
    }
    spec = load("prod").spec
    assert charts["keda"]["version"] == spec.addons.versions.keda
    lb = charts["aws-load-balancer-controller"]["values"]
    assert lb["clusterName"] == spec.cluster_name and lb["region"] == spec.cluster.region
    plugin = charts["nvidia-device-plugin"]["values"]
    assert plugin["tolerations"][0]["key"] == "nvidia.com/gpu"
    prom = charts["kube-prometheus-stack"]["values"]["prometheus"]["prometheusSpec"]
    assert prom["serviceMonitorSelectorNilUsesHelmValues"] is False
    assert prom["ruleSelectorNilUsesHelmValues"] is False
    grafana = charts["kube-prometheus-stack"]["values"]["grafana"]["sidecar"]["dashboards"]
    assert grafana["label"] == addons.GRAFANA_DASHBOARD_LABEL and grafana["searchNamespace"] == "ALL"


def test_a_cpu_only_stack_without_dcgm_gets_no_gpu_add_ons() -> None:
    charts = _charts("kind")
    assert "nvidia-device-plugin" not in charts and "dcgm-exporter" not in charts
    assert "aws-load-balancer-controller" not in charts  # target kubernetes


def test_hpa_mode_installs_prometheus_adapter_with_the_rendered_rules_instead_of_keda() -> None:
    raw = minimal()
    raw["addons"] = {"autoscaler": "hpa", "gpu_plugin": "gpu-operator"}
    spec = PlatformSpec.model_validate(raw)
    releases = {r.name: r for r in addons.releases(spec, scaling.adapter_rules(spec))}
    assert "keda" not in releases and "nvidia-device-plugin" not in releases
    assert releases["gpu-operator"].values["driver"] == {"enabled": False}  # EKS AMIs carry the driver
    adapter = releases["prometheus-adapter"].values
    assert adapter["rules"]["custom"] == scaling.adapter_rules(spec)
    assert adapter["prometheus"] == {
        "url": "http://kube-prometheus-stack-prometheus.monitoring.svc",
        "port": 9090,
    }


def test_each_add_on_can_be_left_to_an_existing_installation() -> None:
    raw = minimal()
    raw["addons"] = {"install_keda": False, "install_prometheus_stack": False, "gpu_plugin": "none"}
    raw["observability"] = {
        "dcgm_exporter": False,
        "prometheus_url": "http://prometheus-operated.obs.svc:9090",
    }
    spec = PlatformSpec.model_validate(raw)
    assert _names(spec) == set()
    [scaled] = scaling.render(spec, spec.models[0])
    assert (
        scaled["spec"]["triggers"][0]["metadata"]["serverAddress"]
        == "http://prometheus-operated.obs.svc:9090"
    )


def test_a_chart_version_range_is_refused() -> None:
    raw = minimal()
    raw["addons"] = {"versions": {"keda": "^2.17"}}
    with pytest.raises(ValueError, match="not an exact version"):
        PlatformSpec.model_validate(raw)
