"""ingress: gateway-api has something to attach to: an existing GatewayClass `pulumi up` reads before the Gateway,
or Envoy Gateway (with the Gateway API CRDs) installed by the stack and its GatewayClass; the plan says which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from typer.testing import CliRunner

from components.cli.main import app
from components.deploy import synthesis as plan
from components.render import addons, ingress
from runtime.config import RouterSettings
from tests.components.helpers import minimal, write_stack
from tests.envoy_gateway import envoy, free_port, raw_request
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


def _envoy_gateway_listener(name: str, port: int, tls: bool) -> dict[str, Any]:
    """A listener in the shape Envoy Gateway's translator gives one Gateway listener (its testdata
    internal/xds/translator/testdata/out/xds-ir/ext-proc.listeners.yaml and
    http-and-https-listeners-same-container-port.listeners.yaml): named ``<namespace>/<gateway>/<listener>``,
    the HTTP connection manager first in the default chain (HTTP) or the one TLS chain (HTTPS), an
    InferencePool's ext_proc filter disabled there and enabled on its route, routes inline here instead of RDS.
    The ext_proc server and the engine are closed ports: a head past the limits must never reach either."""
    ext_proc = "envoy.filters.http.ext_proc/inferencepool/chat"
    api = "type.googleapis.com/envoy"
    manager = {
        "@type": f"{api}.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": f"http-{port}",
        "common_http_protocol_options": {"headers_with_underscores_action": "REJECT_REQUEST"},
        "http_filters": [
            {
                "name": ext_proc,
                "disabled": True,
                "typed_config": {
                    "@type": f"{api}.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                    "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
                    "processing_mode": {
                        "request_body_mode": "FULL_DUPLEX_STREAMED",
                        "request_trailer_mode": "SEND",
                    },
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": f"{api}.extensions.filters.http.router.v3.Router"},
            },
        ],
        "route_config": {
            "name": name,
            "virtual_hosts": [
                {
                    "name": "chat",
                    "domains": ["*"],
                    "routes": [
                        {"match": {"path": "/healthz"}, "direct_response": {"status": 200}},
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": "engine"},
                            "typed_per_filter_config": {
                                ext_proc: {"@type": f"{api}.config.route.v3.FilterConfig", "config": {}}
                            },
                        },
                    ],
                }
            ],
        },
    }
    chain = {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
    listener: dict[str, Any] = {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
    }
    if tls:
        listener["filter_chains"] = [{**chain, "filter_chain_match": {"server_names": ["llm.example.com"]}}]
    else:
        listener["default_filter_chain"] = chain
    return listener


def _closed(name: str, port: int, http2: bool = False) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _patched(listener: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    """What Envoy Gateway does with an EnvoyPatchPolicy: each JSON patch whose name is the listener's, in turn
    (RFC 6902: an ``add`` under a parent that does not exist fails, as the policy then would)."""
    patches = [p["operation"] for p in policy["spec"]["jsonPatches"] if p["name"] == listener["name"]]
    assert patches, f"no patch names the listener {listener['name']}"
    return jsonpatch.apply_patch(listener, patches)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_envoy_gateways_proxies_answer_a_head_past_the_routers_limits_with_its_json_431(
    tmp_path: Path, tls: bool
) -> None:
    """Envoy's default head limit is 60 KiB, four times the router's 16 KiB, and its 431 is plain text: the
    stack's EnvoyPatchPolicy gives the Gateway's listener the router's limits and its JSON answer. Applied to a
    listener of Envoy Gateway's shape and run in a real Envoy (HTTPS: the patch lands on the TLS chain; run
    over HTTP, without the chain's TLS, which changes nothing for the connection manager)."""
    gateway = {**GATEWAY, "gateway_api": "envoy-gateway", **({"tls_secret_name": "llm-tls"} if tls else {})}
    synthesis = _synth(tmp_path, gateway)
    manifests = synthesis.kubernetes_manifests()
    [chart] = [
        c
        for c in _by_type(synthesis, "kubernetes:helm.sh/v4:Chart")
        if c.name == addons.ENVOY_GATEWAY_RELEASE
    ]
    assert chart.inputs["values"]["config"]["envoyGateway"]["extensionApis"] == {
        "enableEnvoyPatchPolicy": True
    }
    [rendered] = [m for m in manifests if m["kind"] == "Gateway"]
    [policy] = [m for m in manifests if m["kind"] == "EnvoyPatchPolicy"]
    assert policy["spec"]["targetRef"]["name"] == rendered["metadata"]["name"]
    [served] = rendered["spec"]["listeners"]
    name = f"{rendered['metadata']['namespace']}/{rendered['metadata']['name']}/{served['name']}"
    port = free_port()
    listener = _patched(_envoy_gateway_listener(name, port, tls), policy)
    if tls:  # the patched chain, served without its TLS
        listener["default_filter_chain"] = {"filters": listener.pop("filter_chains")[0]["filters"]}
    config = {
        "static_resources": {
            "listeners": [listener],
            "clusters": [_closed("picker", free_port(), http2=True), _closed("engine", free_port())],
        }
    }
    limit = RouterSettings().max_header_bytes
    with envoy(config, tmp_path):
        for size in (
            limit + 1024,
            64 * 1024,
        ):  # past the router's limit (Envoy's default lets it by), and far past
            head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: "
                + b"a" * size
                + b"\r\ncontent-length: 2\r\n\r\n"
            )
            status, headers, body = raw_request(port, head)
            assert status == 431 and headers["content-type"].startswith("application/json"), (size, body)
            assert json.loads(body)["error"]["code"] == "request_header_fields_too_large"
