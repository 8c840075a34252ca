"""Cluster add-ons: helm.v4.Chart releases with pinned versions, chosen by the spec (opaque under mocks:
assert on chart, version, repository and values)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from components.clouds.aws import addons as aws_addons
from components.clouds.aws.cloud import EKS
from components.clouds.own_cluster import OWN_CLUSTER
from components.clouds.targets import cloud_for
from components.core.redaction import REDACTED
from components.core.stackfile import STACKS_DIR, available_stacks
from components.deploy import synthesis as plan
from components.render import addons, scaling
from components.spec import PlatformSpec
from tests.components.helpers import decided, minimal, on_own_cluster, write_stack
from tests.stacks import load, synthesized

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]
HELM = "kubernetes:helm.sh/v4:Chart"
EXACT = re.compile(r"^v?\d+\.\d+\.\d+$")


@cache
def _charts(name: str) -> dict[str, dict[str, Any]]:
    return {r.name: r.inputs for r in synthesized(name).resources if r.type == HELM}


def _names(spec: PlatformSpec) -> set[str]:
    return {r.name for r in addons.releases(spec, scaling.adapter_rules(spec), cloud_for(spec))}


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_chart_is_pinned_to_an_exact_version_from_its_repository(name: str) -> None:
    charts = _charts(name)
    assert charts
    for chart in charts.values():
        assert EXACT.match(chart["version"]), chart
        # A classic chart comes from its HTTPS repository; an OCI chart names its registry itself.
        assert chart.get("repositoryOpts", {}).get("repo", "").startswith("https://") or chart[
            "chart"
        ].startswith("oci://"), chart
        assert chart["namespace"]


def test_prod_gets_gpu_plugin_dcgm_keda_prometheus_and_the_alb_controller() -> None:
    charts = _charts("prod")
    assert set(charts) == {
        "nvidia-device-plugin",
        "dcgm-exporter",
        "keda",
        "kube-prometheus-stack",
        "aws-load-balancer-controller",
        "cluster-autoscaler",
        "metrics-server",
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


def test_the_first_apply_creates_services_and_the_ingress_around_the_load_balancer_controller() -> None:
    """Its service webhook lets a Service through while the controller starts (Fail refused the Services created
    beside it), and the router's Ingress, which its ingress webhook refuses until it serves, waits for it."""
    lb = _charts("prod")["aws-load-balancer-controller"]["values"]
    assert lb["serviceMutatorWebhookConfig"]["failurePolicy"] == "Ignore"
    synthesis = synthesized("prod")
    [chart] = [r for r in synthesis.resources if r.type == HELM and r.name == "aws-load-balancer-controller"]
    [ingress] = [r for r in synthesis.resources if r.type == "kubernetes:networking.k8s.io/v1:Ingress"]
    waits: set[str] = set()
    parent: str | None = ingress.urn
    by_urn = {r.urn: r for r in synthesis.resources}
    while parent is not None:  # a component's dependencies hold for its children
        waits.update(by_urn[parent].dependencies)
        parent = by_urn[parent].parent if by_urn[parent].parent in by_urn else None
    assert chart.urn in waits


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_a_router_that_autoscales_on_cpu_gets_the_resource_metrics_it_reads(name: str) -> None:
    """An HPA on CPU reads metrics.k8s.io, which neither EKS nor most clusters serve without metrics-server: the
    router's never scaled."""
    on_cpu = [
        m
        for m in synthesized(name).kubernetes_manifests()
        if m["kind"] == "HorizontalPodAutoscaler"
        and any(x["type"] == "Resource" for x in m["spec"]["metrics"])
    ]
    assert ("metrics-server" in _charts(name)) == bool(on_cpu), on_cpu
    if on_cpu:
        chart = _charts(name)["metrics-server"]
        assert chart["version"] == load(name).spec.addons.versions.metrics_server


def test_a_cpu_only_stack_without_dcgm_gets_no_gpu_add_ons() -> None:
    charts = _charts("kind")
    assert "nvidia-device-plugin" not in charts and "dcgm-exporter" not in charts
    assert "aws-load-balancer-controller" not in charts  # target kubernetes


def test_hpa_mode_installs_prometheus_adapter_with_the_rendered_rules_instead_of_keda() -> None:
    raw = minimal()
    raw["addons"] = {"autoscaler": "hpa", "gpu_plugin": "gpu-operator"}
    spec = PlatformSpec.model_validate(raw)
    releases = {r.name: r for r in addons.releases(spec, scaling.adapter_rules(spec), EKS)}
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
    raw["addons"] = {
        "install_keda": False,
        "install_prometheus_stack": False,
        "install_cluster_autoscaler": False,
        "install_metrics_server": False,
        "gpu_plugin": "none",
    }
    raw["observability"] = {
        "dcgm_exporter": False,
        "prometheus_url": "http://prometheus-operated.obs.svc:9090",
    }
    spec = PlatformSpec.model_validate(raw)
    assert _names(spec) == set()
    [scaled] = scaling.render(spec, decided(spec).models[spec.models[0].name])
    assert (
        scaled["spec"]["triggers"][0]["metadata"]["serverAddress"]
        == "http://prometheus-operated.obs.svc:9090"
    )


def test_a_chart_version_range_is_refused() -> None:
    raw = minimal()
    raw["addons"] = {"versions": {"keda": "^2.17"}}
    with pytest.raises(ValueError, match="not an exact version"):
        PlatformSpec.model_validate(raw)


def test_grafana_never_keeps_the_charts_default_admin_password() -> None:
    values = addons.kube_prometheus_stack(PlatformSpec.model_validate(minimal()), EKS).values["grafana"]
    assert "adminPassword" not in values
    ini = values["grafana.ini"]
    assert ini["auth"]["disable_login_form"] is True and ini["auth.basic"]["enabled"] is False
    assert ini["auth.anonymous"]["org_role"] == "Viewer"


def test_a_grafana_password_from_a_pulumi_secret_becomes_the_admin_login(tmp_path: Path) -> None:
    raw = on_own_cluster(minimal())
    raw["observability"] = {"grafana_admin_password_config_key": "grafanaPassword"}
    write_stack(tmp_path, "grafana", raw, {"inferstack:grafanaPassword": {"secure": "AAABAJdWm7lKz4p="}})
    synthesis = plan.synthesize(load("grafana", tmp_path))
    chart = next(r for r in synthesis.resources if r.type == HELM and r.name == "kube-prometheus-stack")
    admin = chart.inputs["values"]["grafana"]["admin"]
    assert admin["existingSecret"] == addons.GRAFANA_ADMIN_SECRET
    secret = next(
        m
        for m in synthesis.kubernetes_manifests()
        if m["kind"] == "Secret" and m["metadata"]["name"] == "grafana-admin"
    )
    assert secret["metadata"]["namespace"] == "monitoring"
    assert secret["stringData"] == {"admin-user": REDACTED, "admin-password": REDACTED}


def test_the_gpu_operator_installs_the_driver_only_where_the_nodes_come_without_one() -> None:
    raw = minimal()
    raw["addons"] = {"gpu_plugin": "gpu-operator"}
    spec = PlatformSpec.model_validate(raw)
    for cloud, installs in ((EKS, False), (OWN_CLUSTER, True)):
        values = addons.gpu_operator(spec, cloud).values
        assert values["driver"] == values["toolkit"] == {"enabled": installs}, cloud


def test_the_aws_controllers_come_from_the_eks_layer_and_never_with_the_cloud_neutral_add_ons() -> None:
    spec = load("prod").spec
    aws_controllers = {r.name for r in aws_addons.releases(spec)}
    assert aws_controllers == {"aws-load-balancer-controller", "cluster-autoscaler"}
    assert not aws_controllers & _names(spec)
    assert aws_controllers <= set(_charts("prod"))  # installed all the same, through ClusterAccess.addons
