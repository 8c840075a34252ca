"""ingress: gateway-api has something to attach to: an existing GatewayClass `pulumi up` reads before the Gateway,
or Envoy Gateway (with the Gateway API CRDs) installed by the stack and its GatewayClass; the plan says which."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from components.cli.main import app
from components.deploy import synthesis as plan
from components.render import addons, ingress
from tests.components.helpers import minimal, write_stack
from tests.stacks import load

GATEWAY = {"ingress": "gateway-api", "hostname": "llm.example.com"}


def _synth(tmp_path: Path, gateway: dict[str, Any]) -> plan.Synthesis:
    write_stack(tmp_path, "gw", {**minimal(), "gateway": gateway})
    return plan.synthesize(load("gw", tmp_path))


def _by_type(synthesis: plan.Synthesis, type_: str) -> list[plan.Resource]:
    return [r for r in synthesis.resources if r.type == type_]


def test_an_existing_gateway_class_is_read_before_the_gateway_and_nothing_is_installed(
    tmp_path: Path,
) -> None:
    synthesis = _synth(tmp_path, {**GATEWAY, "gateway_class": "istio"})
    [read] = synthesis.reads
    assert (
        read.type == "kubernetes:gateway.networking.k8s.io/v1:GatewayClass" and read.inputs["id"] == "istio"
    )
    assert _by_type(synthesis, "kubernetes:gateway.networking.k8s.io/v1:GatewayClass") == []
    assert not [
        c
        for c in _by_type(synthesis, "kubernetes:helm.sh/v4:Chart")
        if c.name == addons.ENVOY_GATEWAY_RELEASE
    ]
    [gateway] = _by_type(synthesis, "kubernetes:gateway.networking.k8s.io/v1:Gateway")
    assert gateway.inputs["spec"]["gatewayClassName"] == "istio"
    assert read.urn in gateway.dependencies  # a missing class stops `pulumi up` before the Gateway


def test_envoy_gateway_is_installed_with_its_crds_and_gets_the_gateway_class(tmp_path: Path) -> None:
    synthesis = _synth(tmp_path, {**GATEWAY, "gateway_api": "envoy-gateway"})
    assert synthesis.reads == []
    [chart] = [
        c
        for c in _by_type(synthesis, "kubernetes:helm.sh/v4:Chart")
        if c.name == addons.ENVOY_GATEWAY_RELEASE
    ]
    assert chart.inputs["chart"] == "oci://docker.io/envoyproxy/gateway-helm"
    assert chart.inputs["version"] == load("gw", tmp_path).spec.addons.versions.envoy_gateway
    assert chart.inputs["namespace"] == addons.ENVOY_GATEWAY_NAMESPACE
    assert "repositoryOpts" not in chart.inputs  # an OCI chart names its registry
    namespaces = {m["metadata"]["name"] for m in synthesis.kubernetes_manifests() if m["kind"] == "Namespace"}
    assert addons.ENVOY_GATEWAY_NAMESPACE in namespaces
    [gateway_class] = _by_type(synthesis, "kubernetes:gateway.networking.k8s.io/v1:GatewayClass")
    assert gateway_class.inputs["metadata"]["name"] == "envoy-gateway"
    assert "namespace" not in gateway_class.inputs["metadata"]  # cluster-scoped
    assert gateway_class.inputs["spec"] == {"controllerName": addons.ENVOY_GATEWAY_CONTROLLER}
    [gateway] = _by_type(synthesis, "kubernetes:gateway.networking.k8s.io/v1:Gateway")
    assert gateway.inputs["spec"]["gatewayClassName"] == "envoy-gateway"
    # The Gateway component waits for the chart: its CRDs define GatewayClass, Gateway and HTTPRoute.
    [component] = [r for r in synthesis.resources if r.type == "inferstack:kubernetes:Gateway"]
    assert chart.urn in component.dependencies


def test_the_plan_says_which_implementation_serves_the_gateway(tmp_path: Path) -> None:
    for fields, words in (
        ({"gateway_class": "istio"}, "requires GatewayClass istio and its implementation in the cluster"),
        (
            {"gateway_api": "envoy-gateway"},
            "installs Envoy Gateway v1.4.2 (chart gateway-helm, with the Gateway",
        ),
    ):
        write_stack(tmp_path, "gw", {**minimal(), "environment": "dev", "gateway": {**GATEWAY, **fields}})
        out = tmp_path / "out"
        result = CliRunner().invoke(
            app, ["plan", "-s", "gw", "--stacks-dir", str(tmp_path), "--out", str(out)]
        )
        assert result.exit_code == 0, result.output
        summary = (out / "summary.md").read_text()
        assert words in summary
        if "gateway_class" in fields:
            assert (
                "reads (must exist): `kubernetes:gateway.networking.k8s.io/v1:GatewayClass` istio" in summary
            )


def test_a_gateway_class_named_in_the_spec_is_the_one_envoy_gateway_gets() -> None:
    from components.spec import PlatformSpec

    spec = PlatformSpec.model_validate(
        {**minimal(), "gateway": {**GATEWAY, "gateway_api": "envoy-gateway", "gateway_class": "eg"}}
    )
    assert ingress.gateway_class(spec)["metadata"]["name"] == "eg"
    assert ingress.gateway(spec)["spec"]["gatewayClassName"] == "eg"
