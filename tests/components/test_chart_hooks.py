"""Helm hooks never run under helm.v4.Chart (pulumi-kubernetes provider/pkg/provider/helm/v4/chart.go sets
DisableHooks and applies the release manifest only): no chart a stack installs may need what only a hook makes.

Helm cannot run here, so what each pinned chart version makes from hooks is data (``chart_hooks.CHARTS``, read in
the upstream templates it cites); these tests hold every chart every committed stack renders to it, and fail on a
chart or version nobody read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from components.clouds.aws.cloud import EKS
from components.core.stackfile import STACKS_DIR, available_stacks
from components.deploy import synthesis as plan
from components.render import addons, chart_hooks
from components.spec import PlatformSpec
from tests.components.helpers import minimal, write_stack
from tests.stacks import load, synthesized

HELM = "kubernetes:helm.sh/v4:Chart"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stacks"
STACKS = [
    *((s, STACKS_DIR) for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"),
    *((s, EXAMPLES) for s in available_stacks(EXAMPLES)),
]


def _rendered(synthesis: plan.Synthesis) -> set[tuple[str, str, str]]:
    return {
        (m["kind"], m["metadata"].get("namespace", ""), m["metadata"]["name"])
        for m in synthesis.kubernetes_manifests()
    }


def _gaps(synthesis: plan.Synthesis) -> dict[str, list[str]]:
    rendered = _rendered(synthesis)
    out: dict[str, list[str]] = {}
    for chart in (r for r in synthesis.resources if r.type == HELM):
        i = chart.inputs
        if found := chart_hooks.gaps(i["chart"], i["version"], i.get("values", {}), i["namespace"], rendered):
            out[chart.name] = found
    return out


@pytest.mark.parametrize(("name", "directory"), STACKS, ids=[s for s, _ in STACKS])
def test_no_chart_a_stack_installs_needs_what_only_a_helm_hook_makes(name: str, directory: Path) -> None:
    synthesis = synthesized(name, directory)
    assert [r for r in synthesis.resources if r.type == HELM]
    assert _gaps(synthesis) == {}


def test_the_prometheus_operator_runs_without_the_certificate_only_its_hook_made() -> None:
    """kube-prometheus-stack 75.6.1: the operator's Deployment mounts Secret <release>-admission while
    prometheusOperator.tls.enabled (templates/prometheus-operator/deployment.yaml), and only the pre-install Job
    admission-create makes it (admission-webhooks/job-patch/job-createSecret.yaml): the operator never started."""
    values = addons.kube_prometheus_stack(PlatformSpec.model_validate(minimal()), EKS).values
    operator = values["prometheusOperator"]
    assert operator["tls"]["enabled"] is False
    assert operator["admissionWebhooks"]["enabled"] is False
    # The values the chart needs are not lost in the merge.
    assert values["prometheus"]["prometheusSpec"]["ruleSelectorNilUsesHelmValues"] is False


def test_a_chart_or_version_nobody_read_for_hooks_fails_the_check() -> None:
    values: dict[str, Any] = {"prometheusOperator": {"tls": {"enabled": False}}}
    [unread] = chart_hooks.gaps("kube-prometheus-stack", "99.0.0", values, "monitoring", set())
    assert "99.0.0" in unread and "75.6.1" in unread
    [unknown] = chart_hooks.gaps("oci://example.com/charts/something", "1.0.0", {}, "x", set())
    assert "something" in unknown
    # A checked version rendered with the chart's defaults depends on its hooks.
    assert len(chart_hooks.gaps("kube-prometheus-stack", "75.6.1", {}, "monitoring", set())) == 2


def test_every_pinned_chart_version_was_read_for_hooks() -> None:
    """The spec's default versions (which every stack installs unless it pins others) all have an entry."""
    versions = PlatformSpec.model_validate(minimal()).addons.versions.model_dump()
    charts = {
        "nvidia_device_plugin": "nvidia-device-plugin",
        "gpu_operator": "gpu-operator",
        "dcgm_exporter": "dcgm-exporter",
        "keda": "keda",
        "kube_prometheus_stack": "kube-prometheus-stack",
        "prometheus_adapter": "prometheus-adapter",
        "aws_load_balancer_controller": "aws-load-balancer-controller",
        "cluster_autoscaler": "cluster-autoscaler",
        "karpenter": "karpenter",
        "lws": "lws",
        "aws_efa_k8s_device_plugin": "aws-efa-k8s-device-plugin",
        "metrics_server": "metrics-server",
        "envoy_gateway": "gateway-helm",
        "opentelemetry_collector": "opentelemetry-collector",
    }
    assert set(charts) == set(versions)
    for field, chart in charts.items():
        assert versions[field] in chart_hooks.CHARTS[chart].checked, (field, versions[field])


def test_envoy_gateway_gets_its_certificates_from_a_job_that_runs_before_its_chart(tmp_path: Path) -> None:
    """gateway-helm v1.4.2 makes its control-plane Secrets only in its pre-install certgen Job (templates/
    certgen.yaml), and its Deployment mounts Secret envoy-gateway (templates/envoy-gateway-deployment.yaml)."""
    raw = {**minimal(), "gateway": {"ingress": "gateway-api", "hostname": "llm.example.com"}}
    raw["gateway"]["gateway_api"] = "envoy-gateway"
    write_stack(tmp_path, "eg", raw)
    stack = load("eg", tmp_path)
    synthesis = plan.synthesize(stack)
    assert _gaps(synthesis) == {}
    [chart] = [r for r in synthesis.resources if r.type == HELM and r.name == addons.ENVOY_GATEWAY_RELEASE]
    assert chart.inputs["values"]["topologyInjector"] == {"enabled": False}
    [job] = [
        r
        for r in synthesis.resources
        if r.type == "kubernetes:batch/v1:Job"
        and r.inputs["metadata"]["name"] == chart_hooks.ENVOY_GATEWAY_CERTGEN
    ]
    assert job.inputs["metadata"]["namespace"] == addons.ENVOY_GATEWAY_NAMESPACE
    assert job.urn in chart.dependencies
    [container] = job.inputs["spec"]["template"]["spec"]["containers"]
    # The chart's own controller image and command, at the pinned version.
    assert container["image"] == chart.inputs["values"]["global"]["images"]["envoyGateway"]["image"]
    assert container["image"] == f"docker.io/envoyproxy/gateway:{stack.spec.addons.versions.envoy_gateway}"
    assert container["command"][:2] == ["envoy-gateway", "certgen"]
    # It runs with the access the hook had: secrets in its namespace, granted before it starts.
    [role] = [
        r
        for r in synthesis.resources
        if r.type == "kubernetes:rbac.authorization.k8s.io/v1:Role"
        and r.inputs["metadata"]["name"] == chart_hooks.ENVOY_GATEWAY_CERTGEN
    ]
    assert role.inputs["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]}
    ]
    [binding] = [
        r
        for r in synthesis.resources
        if r.type == "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
        and r.inputs["metadata"]["name"] == chart_hooks.ENVOY_GATEWAY_CERTGEN
    ]
    assert binding.urn in job.dependencies
    version = f"{stack.spec.cluster.kubernetes_version}.0"
    for manifest in addons.envoy_gateway_certgen(stack.spec):
        kubernetes_validate.validate(manifest, version, strict=True)
