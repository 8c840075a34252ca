"""gateway.mode inference-extension: the committed example stack's plan renders an InferencePool per model,
an InferenceObjective where routing gives a priority, the picker (least-privilege RBAC, gRPC port), an
HTTPRoute from the Gateway of the named class to the pools, and the network flows between them; the spec
refuses the mode without a gateway class. Router mode is untouched (tests/snapshots/plans)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from components.clouds.targets import cloud_for
from components.core.placement import place
from components.render import flows, gateway, scaling
from components.render import runtime_config as runtime_config_module
from components.render.envoy import FAIL_OPEN_NEEDS_BUFFERED, EnvoyPool, envoy_config
from components.render.runtime_config import runtime_config
from components.spec import PlatformSpec
from runtime.config import BodyMode, RuntimeConfig, Task
from tests.components.helpers import decided
from tests.components.test_network import _mismatches
from tests.stacks import load, synthesized

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stacks"
STACK = "inference-extension"


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return synthesized(STACK, EXAMPLES).kubernetes_manifests()


def _by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def _named(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(m for m in _by_kind(manifests, kind) if m["metadata"]["name"] == name)


def test_an_inference_pool_per_model_selects_its_engines_and_names_the_picker(manifests) -> None:
    pools = {p["metadata"]["name"]: p for p in _by_kind(manifests, "InferencePool")}
    assert set(pools) == {"qwen-0-5b-pool", "qwen-coder-0-5b-pool"}
    picker_service = _named(manifests, "Service", "inferstack-picker")
    grpc = next(p for p in picker_service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    for model in ("qwen-0-5b", "qwen-coder-0-5b"):
        pool = pools[f"{model}-pool"]
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
        engine = _named(manifests, "Deployment", f"{model}-engine")
        pod_labels = engine["spec"]["template"]["metadata"]["labels"]
        selector = pool["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
        assert pool["spec"]["targetPorts"] == [
            {"number": engine["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]}
        ]
        assert pool["spec"]["endpointPickerRef"] == {
            "kind": "Service",
            "name": "inferstack-picker",
            "port": {"number": grpc["port"]},
            "failureMode": "FailClose",
        }


def test_an_objective_only_where_routing_gives_a_priority(manifests) -> None:
    objectives = _by_kind(manifests, "InferenceObjective")
    assert [(o["metadata"]["name"], o["apiVersion"]) for o in objectives] == [
        ("qwen-0-5b", "inference.networking.x-k8s.io/v1alpha2")
    ]
    assert objectives[0]["spec"] == {
        "priority": 10,
        "poolRef": {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": "qwen-0-5b-pool",
        },
    }


def test_the_route_sends_each_model_to_its_pool_from_the_named_gateway_class(manifests) -> None:
    (gateway,) = _by_kind(manifests, "Gateway")
    assert gateway["spec"]["gatewayClassName"] == "kgateway"
    (route,) = _by_kind(manifests, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": gateway["metadata"]["name"]}]
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    targets = {
        rule["matches"][0]["headers"][0]["value"]: rule["backendRefs"] for rule in route["spec"]["rules"]
    }
    assert targets == {
        m: [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": f"{m}-pool"}]
        for m in ("qwen-0-5b", "qwen-coder-0-5b")
    }


def test_the_picker_replaces_the_router_with_least_privilege(manifests) -> None:
    deployments = {d["metadata"]["name"] for d in _by_kind(manifests, "Deployment")}
    assert "inferstack-router" not in deployments and "inferstack-batcher" not in deployments
    picker = _named(manifests, "Deployment", "inferstack-picker")
    container = picker["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "runtime.picker"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 9090, "grpc": 9002}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    role = _named(manifests, "Role", "inferstack-picker")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_the_picker_checks_the_api_keys_from_the_mounted_secret(manifests) -> None:
    """Nothing else in this mode sees a request: the keys Secret is mounted into the picker, and its config
    requires keys from the mounted file (the router's file, which the policy pack then accepts)."""
    picker = _named(manifests, "Deployment", "inferstack-picker")["spec"]["template"]["spec"]
    (secret,) = [v["secret"]["secretName"] for v in picker["volumes"] if "secret" in v]
    assert secret == _named(manifests, "Secret", "inferstack-api-keys")["metadata"]["name"]
    (mount,) = [m for m in picker["containers"][0]["volumeMounts"] if m["name"] == "api-keys"]
    config = yaml.safe_load(
        _named(manifests, "ConfigMap", "inferstack-runtime-config")["data"]["runtime.yaml"]
    )
    assert config["picker"]["require_api_key"] is True
    assert Path(config["picker"]["api_keys_file"]).parent == Path(mount["mountPath"])
    assert mount["readOnly"] is True
    # each replica holds its own request buckets: the picker divides a key's rate by the rendered count
    replicas = _named(manifests, "Deployment", "inferstack-picker")["spec"]["replicas"]
    assert RuntimeConfig.model_validate(config).picker.replicas == replicas


def test_the_pickers_config_carries_its_deployments_replica_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each picker replica takes requests_per_minute / picker.replicas of a key: the count it divides by is the
    one its Deployment runs, whatever that becomes."""
    monkeypatch.setattr(runtime_config_module, "PICKER_REPLICAS", 3)
    spec = load(STACK, EXAMPLES).spec
    out = gateway.render(spec, cloud_for(spec))
    text = _named(out, "ConfigMap", "inferstack-runtime-config")["data"]["runtime.yaml"]
    config = RuntimeConfig.model_validate(yaml.safe_load(text))
    assert _named(out, "Deployment", "inferstack-picker")["spec"]["replicas"] == config.picker.replicas == 3


def test_network_policies_let_the_gateway_reach_engines_and_picker_only(manifests) -> None:
    """The flow table has the gateway's two calls (ext_proc to the picker, the request to the replica) and no
    router; the rendered policies allow exactly the table, pair by pair and port by port."""
    spec = load(STACK, EXAMPLES).spec
    cloud = cloud_for(spec)
    table = {(f.source.name, f.dest.name, f.ports) for f in flows.flows(spec, cloud, place(spec))}
    assert ("gateway-proxy", "picker", (("TCP", 9002),)) in table
    assert ("gateway-proxy", "engine", (("TCP", 8000),)) in table
    assert ("picker", "health", (("TCP", 8081),)) in table
    assert not any("router" in (src, dst) for src, dst, _ in table)
    assert _mismatches(spec, cloud, tuple(manifests)) == []


def test_built_in_objects_pass_kubernetes_validate(manifests) -> None:
    for m in manifests:
        try:
            kubernetes_validate.validate(m, "1.33.0", strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert m["kind"] in {
                "InferencePool",
                "InferenceObjective",
                "Gateway",
                "HTTPRoute",
                "ServiceMonitor",
                "PrometheusRule",
                "ScaledObject",
            }, m["kind"]


def _platform() -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / f"Pulumi.{STACK}.yaml").read_text())
    return copy.deepcopy(doc["config"]["inferstack:platform"])


def test_inference_extension_without_a_gateway_class_is_an_error() -> None:
    doc = _platform()
    del doc["gateway"]["gateway_class"]
    with pytest.raises(ValidationError, match="mode inference-extension needs gateway_class"):
        PlatformSpec.model_validate(doc)


def test_fail_open_with_api_keys_is_an_error() -> None:
    """The picker checks the keys: a gateway failing open past an unreachable picker would serve keyless clients."""
    doc = _platform()
    doc["gateway"]["picker_failure_mode"] = "FailOpen"
    assert doc["gateway"]["require_api_key"] is True
    with pytest.raises(ValidationError) as err:
        PlatformSpec.model_validate(doc)
    message = str(err.value)
    assert "gateway.picker_failure_mode FailOpen with gateway.require_api_key" in message
    assert "set picker_failure_mode FailClose" in message and "require_api_key false" in message
    doc["gateway"]["require_api_key"] = False  # a deliberately open API may fail open
    assert PlatformSpec.model_validate(doc).gateway.picker_failure_mode.value == "FailOpen"


def test_a_priority_in_router_mode_is_an_error() -> None:
    doc = _platform()
    doc["gateway"] = {"require_api_key": False}
    with pytest.raises(
        ValidationError, match=r"models\[0\].routing.priority: priorities are InferenceObjectives"
    ):
        PlatformSpec.model_validate(doc)


def test_a_model_at_zero_behind_the_gateway_wakes_on_the_pickers_refusals() -> None:
    """The picker holds nothing (the gateway's ext_proc call has a deadline): a model with no ready replica
    gets 503 at once, and the scaler reads those refusals, the picker's, since no router runs."""
    doc = _platform()
    doc["models"][0]["scaling"] = {"min_replicas": 0, "max_replicas": 2}
    spec = PlatformSpec.model_validate(doc)
    model = spec.models[0]
    assert runtime_config(spec).route(model.name).cold_start_hold_ms == 0
    (trigger,) = [
        t for t in scaling.triggers(spec, decided(spec).models[model.name]) if t.name == "router-queue"
    ]
    assert "inferstack_picker_rejections_total" in trigger.query
    assert 'reason="no_backend"' in trigger.query and f'model="{model.name}"' in trigger.query
    assert "inferstack_router_" not in trigger.query
    doc["gateway"] = {"require_api_key": False}  # the router's own mode still holds, on its own series
    doc["models"][0]["routing"].pop("priority")
    router_spec = PlatformSpec.model_validate(doc)
    assert (
        runtime_config(router_spec).route(model.name).cold_start_hold_ms == model.scaling.cold_start_hold_ms
    )
    assert "inferstack_router_queue_depth" in scaling.router_demand(router_spec, router_spec.models[0])


def test_a_cold_start_hold_behind_the_gateway_is_an_error() -> None:
    doc = _platform()
    doc["models"][0]["scaling"] = {"min_replicas": 0, "max_replicas": 2, "cold_start_hold_ms": 30_000}
    with pytest.raises(
        ValidationError, match=r"models\[0\].scaling.cold_start_hold_ms: in gateway.mode inference-extension"
    ):
        PlatformSpec.model_validate(doc)
    doc["models"][0]["scaling"]["cold_start_hold_ms"] = 0
    PlatformSpec.model_validate(doc)


def test_the_batch_api_behind_the_gateway_is_an_error() -> None:
    """The router serves /v1/files and /v1/batches and carries the batch service's requests: this mode has none."""
    doc = {**_platform(), "batch": {"enabled": True}}
    with pytest.raises(
        ValidationError, match=r"batch.enabled: .* gateway.mode inference-extension runs no router"
    ):
        PlatformSpec.model_validate(doc)


def test_sleep_behind_the_gateway_is_an_error() -> None:
    """The router puts idle replicas to sleep and holds a request while one wakes: this mode runs none."""
    shared = EXAMPLES.parents[1] / "stacks" / "Pulumi.shared.yaml"
    doc = yaml.safe_load(shared.read_text())["config"]["inferstack:platform"]
    assert (
        PlatformSpec.model_validate(doc).models[2].scaling.sleep_after_idle_s == 300
    )  # the router sleeps it
    gateway = {"mode": "inference-extension", "gateway_class": "kgateway", "ingress": "gateway-api"}
    doc["gateway"] = {**gateway, "hostname": "llm.example.com", "require_api_key": False}
    with pytest.raises(
        ValidationError,
        match=r"models\[2\].scaling.sleep_after_idle_s: .* inference-extension runs no router",
    ):
        PlatformSpec.model_validate(doc)


def test_envoy_cannot_fail_open_in_full_duplex_mode() -> None:
    pools = [EnvoyPool("m", Task.GENERATE, ("127.0.0.1:8000",))]
    with pytest.raises(ValueError, match="fails open only with buffered bodies") as err:
        envoy_config(host="127.0.0.1", port=8080, pools=pools, picker="127.0.0.1:9002", fail_open=True)
    assert str(err.value) == FAIL_OPEN_NEEDS_BUFFERED
    config = envoy_config(
        host="127.0.0.1",
        port=8080,
        pools=pools,
        picker="127.0.0.1:9002",
        fail_open=True,
        body_mode=BodyMode.BUFFERED,
    )
    ext_proc = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "http_filters"
    ][0]["typed_config"][
        "extension_config"
    ]  # wrapped: skipped for Envoy's own 431 (envoy.skipped_on_header_errors)
    assert ext_proc["typed_config"]["failure_mode_allow"] is True


def test_the_cli_plans_the_example_and_the_policy_pack_passes_it(tmp_path: Path) -> None:
    """``inferstack plan`` on the committed example writes the objects, and the policy pack finds nothing:
    the public route's pools have a picker that requires API keys."""
    out = tmp_path / "plan"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.cli.main",
            "plan",
            "-s",
            STACK,
            "--stacks-dir",
            str(EXAMPLES),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in (out / "manifests").glob("*.yaml")}
    assert {"InferencePool", "InferenceObjective", "HTTPRoute", "Gateway"} <= kinds, (
        result.stdout + result.stderr
    )
    verdicts = json.loads((out / "policy.json").read_text())["verdicts"]
    assert verdicts == []  # the public route's pools have a picker that checks API keys
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (out / "summary.md").read_text()
    assert (
        "body-based router" in summary and "x-gateway-model-name" in summary
    )  # the multi-model route's need


def test_eks_pushes_the_picker_image_only_in_inference_extension_mode() -> None:
    from components.clouds.aws import registry
    from components.kubernetes import images

    inference = PlatformSpec.model_validate({**_platform(), "target": "eks"})
    router = PlatformSpec.model_validate(
        {
            **_platform(),
            "target": "eks",
            "gateway": {"require_api_key": False},
            "models": [{**m, "routing": {"strategy": "prefix_aware"}} for m in _platform()["models"]],
        }
    )
    assert registry.images_for(inference) == (*images.runtime_images(inference), "picker")
    assert registry.images_for(router) == images.runtime_images(router)
    assert registry.dockerfile(Path(__file__).resolve().parents[2], "picker").is_file()


def test_alerts_dashboards_and_scalers_read_the_picker_behind_the_gateway() -> None:
    """No router runs in this mode: every inferstack series the stack's alerts, panels and scaling queries
    read is one the picker (or the health monitor) exports, by its own metrics code."""
    import re

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from components.render import alerts, dashboards
    from runtime.picker.metrics import PickerMetrics, scheduling_families

    stack = load(STACK, EXAMPLES)
    spec, units = stack.spec, stack.decisions.models
    metrics = PickerMetrics()
    metrics.picked("m", "http://e", 0.001)
    metrics.rejected("no_backend", "m")
    metrics.finished("m", "http://e", 200, 0.1)
    text = generate_latest(metrics.registry).decode()
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    exported |= {f.name for f in scheduling_families({})}
    queries = [*dashboards.promql(spec, units), *(a.expr for a in alerts.alerts(spec, units))]
    queries += [t.query for u in units.values() for t in scaling.triggers(spec, u)]
    read = {name for q in queries for name in re.findall(r"inferstack_[a-z_]+", q)}
    assert not {n for n in read if n.startswith("inferstack_router_")}
    picker = {n for n in read if n.startswith("inferstack_picker_")}
    assert picker and picker <= exported, picker - exported
    assert {"InferencePickerDown", "InferencePicker5xxRate"} <= {a.name for a in alerts.alerts(spec, units)}


def test_lora_adapters_need_the_router() -> None:
    """The gateway routes by model name to a pool and the picker loads no adapter: adapters are refused there."""
    doc = _platform()
    model = next(m for m in doc["models"] if m.get("engine", {}).get("kind", "vllm") == "vllm")
    model["adapters"] = [{"name": "sql-helper", "source": "s3://bucket/adapters/sql/", "rank": 8}]
    model.setdefault("engine", {})["dtype"] = "float32"  # a CPU engine with LoRA needs it (its own check)
    with pytest.raises(
        ValidationError, match=r"adapters: in gateway.mode inference-extension .* use gateway.mode router"
    ):
        PlatformSpec.model_validate(doc)


def test_what_only_the_router_does_is_an_error_behind_the_gateway() -> None:
    """No router runs in inference-extension mode: its shared limits and KV-event view have no home."""
    doc = _platform()
    doc["gateway"]["shared_limits"] = True
    doc["gateway"]["limit_store_auth_config_key"] = "limitStoreToken"
    with pytest.raises(ValidationError, match="shared_limits shares the router's rate limits"):
        PlatformSpec.model_validate(doc)
    doc = _platform()
    doc["models"][0]["routing"]["strategy"] = "precise_prefix"
    with pytest.raises(
        ValidationError,
        match=r"models\[0\].routing: precise_prefix follows the engines' KV events in the router",
    ):
        PlatformSpec.model_validate(doc)
