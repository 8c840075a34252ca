"""Gateway wiring: runtime config round-trip, router/health/batcher workloads, API keys, ingress."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from components.base.problems import SpecError
from components.clouds.targets import cloud_for
from components.core.redaction import REDACTED
from components.core.stackfile import STACKS_DIR, available_stacks
from components.deploy import synthesis as plan
from components.kubernetes import gateway as kubernetes_gateway
from components.render import api_keys, common, gateway
from components.render.runtime_config import embedding_models, runtime_config
from components.spec import PlatformSpec, Target
from runtime.config import RuntimeConfig
from tests.components.helpers import minimal, write_stack
from tests.stacks import load, synthesized

REPO = Path(__file__).resolve().parents[2]
PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]


@cache
def _synthesis(name: str) -> plan.Synthesis:
    return synthesized(name)


@cache
def _manifests(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(_synthesis(name).kubernetes_manifests())


def _get(name: str, kind: str, object_name: str) -> dict[str, Any]:
    return next(m for m in _manifests(name) if m["kind"] == kind and m["metadata"]["name"] == object_name)


def _has(name: str, kind: str, object_name: str) -> bool:
    return any(m["kind"] == kind and m["metadata"]["name"] == object_name for m in _manifests(name))


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_config_map_round_trips_through_the_runtime_contract(name: str) -> None:
    spec, _ = load(name).served
    cm = _get(name, "ConfigMap", common.runtime_config_name(spec))
    parsed = RuntimeConfig.model_validate(yaml.safe_load(cm["data"][common.RUNTIME_CONFIG_FILE]))
    assert parsed == runtime_config(spec, files=cloud_for(spec).batch_files(spec))
    for model in spec.models:
        target = parsed.model(model.name)
        assert target is not None and target.discovery is not None
        assert target.discovery.service == common.engine_name(model.name)
        assert target.discovery.namespace == spec.cluster.namespace
        assert target.max_concurrency_per_backend == model.engine.max_num_seqs
        assert target.max_model_len_tokens == model.engine.max_model_len
        assert parsed.route(model.name).strategy.name == model.routing.strategy
    assert parsed.router.require_api_key == spec.gateway.require_api_key
    assert str(parsed.router.health_feed_url).endswith("/v1/backends")


def test_embedding_models_are_routed_through_a_batcher_sized_from_the_engine() -> None:
    spec = load("prod").spec
    config = runtime_config(spec)
    assert config.route("bge-large").batcher_url is not None
    assert config.route("llama-3-8b").batcher_url is None
    [policy] = config.batcher.policies
    assert policy.model == "bge-large" and policy.max_batch_size <= 256
    assert _has("prod", "Deployment", "inferstack-batcher")
    assert not _has("dev", "Deployment", "inferstack-batcher")  # no embedding model there


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_router_and_health_monitor_run_hardened_with_the_config_mounted(name: str) -> None:
    spec = load(name).spec
    for part, port, metrics in (("router", 8080, 9091), ("health", 8081, None)):
        deployment = _get(name, "Deployment", f"inferstack-{part}")
        pod = deployment["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["command"][:3] == ["python", "-m", f"runtime.{part}"]
        assert container["command"][-1] == f"{common.RUNTIME_CONFIG_DIR}/{common.RUNTIME_CONFIG_FILE}"
        ports = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        if metrics is not None:  # the router's /metrics: a port of its own, which no ingress routes
            ports.append({"name": "metrics", "containerPort": metrics, "protocol": "TCP"})
        assert container["ports"] == ports
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["limits"] and container["resources"]["requests"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["serviceAccountName"] == f"inferstack-{part}"
        token = next(v for v in pod["volumes"] if "projected" in v)
        assert token["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] <= 3600
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert len(annotations[gateway.CONFIG_CHECKSUM_ANNOTATION]) == 64
        service = _get(name, "Service", f"inferstack-{part}")
        assert [p["port"] for p in service["spec"]["ports"]] == [port] + ([metrics] if metrics else [])
    role = _get(name, "Role", "inferstack-router")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    health_verbs = {r["resources"][0]: r["verbs"] for r in _get(name, "Role", "inferstack-health")["rules"]}
    assert health_verbs["pods"] == ["list"]  # no remediation configured: never delete
    assert health_verbs["events"] == ["create"]
    if spec.gateway.max_replicas > spec.gateway.replicas:
        hpa = _get(name, "HorizontalPodAutoscaler", "inferstack-router")["spec"]
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (spec.gateway.replicas, spec.gateway.max_replicas)
        assert "replicas" not in _get(name, "Deployment", "inferstack-router")["spec"]


def test_api_keys_are_stored_only_as_sha256_hashes() -> None:
    raw = yaml.safe_dump(
        [
            {"name": "team-a", "key": "sk-team-a-0123456789abcdef", "models": ["llama-3-8b"]},
            {"name": "team-b", "key": "sk-team-b-0123456789abcdef", "requests_per_minute": 60},
        ]
    )
    stored = api_keys.hash_api_keys(raw, "inferstack:apiKeys")
    assert "sk-team" not in stored
    keys = yaml.safe_load(stored)
    assert keys[0] == {
        "name": "team-a",
        "sha256": hashlib.sha256(b"sk-team-a-0123456789abcdef").hexdigest(),
        "models": ["llama-3-8b"],
    }
    assert keys[1]["requests_per_minute"] == 60


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not yaml", "not valid YAML"),
        ("[]", "non-empty list"),
        ("- just a string", "each entry is a mapping"),
        ("- {name: a, key: short}", "at least 16 characters"),
        ("- {key: sk-0123456789abcdef}", "'name' is required"),
        ("- {name: a, key: sk-0123456789abcdef}\n- {name: a, key: sk-fedcba9876543210}", "used twice"),
        ("- {name: a, key: sk-0123456789abcdef, rpm: 3}", "unknown fields"),
        ("- {name: a, key: sk-0123456789abcdef, requests_per_minute: 0}", "requests_per_minute"),
    ],
)
def test_bad_api_keys_get_a_located_message_that_never_echoes_a_key(raw: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        api_keys.hash_api_keys(raw, "inferstack:apiKeys")
    assert message in str(err.value) and str(err.value).startswith("inferstack:apiKeys")
    assert "0123456789abcdef" not in str(err.value)


def test_a_token_limit_behind_an_inference_extension_gateway_stops_pulumi_up_naming_the_key() -> None:
    """The endpoint picker never sees the answers' usage, so it cannot hold a tokens_per_minute: `pulumi up`
    refuses the key before anything is deployed (the picker would refuse it only at its start), and a router
    gateway takes the same key."""
    raw = yaml.safe_dump([{"name": "heavy", "key": "sk-heavy-0123456789abcdef", "tokens_per_minute": 1000}])
    picker = load("inference-extension", REPO / "examples" / "stacks").spec
    assert picker.gateway.mode.value == "inference-extension"
    with pytest.raises(pulumi.RunError) as refused:
        kubernetes_gateway._hashed(raw, "inferstack:apiKeys", picker)
    message = str(refused.value)
    assert message.startswith("inferstack:apiKeys[0]: key 'heavy' has tokens_per_minute"), message
    assert "gateway.mode router" in message and "0123456789abcdef" not in message
    router = load("prod").spec
    assert (
        yaml.safe_load(kubernetes_gateway._hashed(raw, "inferstack:apiKeys", router))[0]["tokens_per_minute"]
        == 1000
    )


def test_the_api_keys_secret_is_mounted_and_its_value_stays_secret() -> None:
    secret = _get("prod", "Secret", "inferstack-api-keys")
    assert secret["stringData"] == {common.API_KEYS_FILE: REDACTED}
    router = _get("prod", "Deployment", "inferstack-router")["spec"]["template"]["spec"]
    volume = next(v for v in router["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == "inferstack-api-keys"
    config = runtime_config(load("prod").spec)
    assert str(config.router.api_keys_file) == f"{common.API_KEYS_DIR}/{common.API_KEYS_FILE}"
    # What the plan passes for the secret keys passes through hashing as the same placeholder.
    assert api_keys.hash_api_keys(REDACTED, "inferstack:apiKeys") == REDACTED


def test_prod_enters_through_an_alb_ingress_to_the_router() -> None:
    ingress = _get("prod", "Ingress", "inferstack-router")
    ann = ingress["metadata"]["annotations"]
    assert ann["alb.ingress.kubernetes.io/target-type"] == "ip"
    assert ann["alb.ingress.kubernetes.io/scheme"] == "internet-facing"
    assert '"HTTPS": 443' in ann["alb.ingress.kubernetes.io/listen-ports"]
    assert ann["alb.ingress.kubernetes.io/healthcheck-path"] == "/readyz"
    idle = int(
        ann["alb.ingress.kubernetes.io/load-balancer-attributes"]
        .split("idle_timeout.timeout_seconds=")[1]
        .split(",")[0]
    )
    router = runtime_config(load("prod").spec).router
    assert idle * 1000 > max(router.first_byte_timeout_ms, router.stream_idle_timeout_ms)
    assert router.client_idle_timeout_s > idle, "the router must outlive the ALB's idle connections"
    assert ingress["spec"]["ingressClassName"] == "alb"
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "inferstack-router", "port": {"name": "http"}}
    assert not _has("dev", "Ingress", "inferstack-router")  # ingress: none


def test_gateway_api_renders_a_gateway_and_an_http_route_to_the_router() -> None:
    raw = minimal()
    raw["gateway"] = {"ingress": "gateway-api", "hostname": "llm.example.com", "tls_secret_name": "llm-tls"}
    spec = PlatformSpec.model_validate(raw)
    objects = {m["kind"]: m for m in gateway.render(spec, cloud_for(spec))}
    gw = objects["Gateway"]["spec"]
    assert gw["gatewayClassName"] == "istio"
    [listener] = gw["listeners"]
    assert listener["protocol"] == "HTTPS" and listener["tls"]["certificateRefs"] == [
        {"kind": "Secret", "name": "llm-tls"}
    ]
    route = objects["HTTPRoute"]["spec"]
    assert route["parentRefs"] == [{"name": "inferstack-gateway"}]
    assert route["hostnames"] == ["llm.example.com"]
    assert route["rules"][0]["backendRefs"] == [{"name": "inferstack-router", "port": 8080}]
    assert "Ingress" not in objects


def test_an_ingress_without_a_hostname_is_a_located_mistake(tmp_path: Path) -> None:
    raw = minimal()
    raw["gateway"] = {"ingress": "alb"}
    write_stack(tmp_path, "nohost", raw)
    with pytest.raises(SpecError) as err:
        load("nohost", tmp_path)
    assert "gateway" in err.value.render() and "needs a hostname" in err.value.render()


def test_runtime_images_must_be_pinned(tmp_path: Path) -> None:
    raw = minimal()
    raw["gateway"] = {"router_image": "ghcr.io/inferstack/router:latest"}
    write_stack(tmp_path, "latest", raw)
    with pytest.raises(SpecError) as err:
        load("latest", tmp_path)
    assert "gateway.router_image" in err.value.render() and "not pinned" in err.value.render()


@pytest.mark.parametrize("ingress", ["none", "alb", "gateway-api"])
def test_gateway_objects_pass_strict_validation_for_each_ingress(ingress: str) -> None:
    import kubernetes_validate

    raw = minimal()
    raw["gateway"] = {"ingress": ingress, **({"hostname": "llm.example.com"} if ingress != "none" else {})}
    spec = PlatformSpec.model_validate(raw)
    for manifest in gateway.render(spec, cloud_for(spec)):
        if manifest["apiVersion"].startswith("gateway.networking.k8s.io/"):
            continue  # custom resources: checked in test_gateway_api_renders_...
        kubernetes_validate.validate(manifest, f"{spec.cluster.kubernetes_version}.0", strict=True)


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_gateway_runs_the_pushed_ecr_images_by_digest_on_eks_and_the_spec_images_elsewhere(name: str) -> None:
    """On EKS each runtime Deployment runs ``<ECR repository URL>@<digest docker-build reported>``, labelled
    with the content tag it was pushed as; on other targets, the spec's pinned image."""
    spec = load(name).spec
    synthesis = _synthesis(name)
    images = {r.name: r.inputs for r in synthesis.resources if r.type == "docker-build:index:Image"}
    for part in gateway.parts(spec):
        deployment = _get(name, "Deployment", common.runtime_name(spec, part))
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        version = deployment["metadata"]["labels"]["app.kubernetes.io/version"]
        if spec.target is not Target.EKS and spec.gateway.image_registry is None:
            assert container["image"] == getattr(spec.gateway, f"{part}_image")
            assert not images
            continue
        if (
            spec.target is not Target.EKS
        ):  # built and pushed to the spec's registry (tests/components/test_images.py)
            assert container["image"].startswith(f"{spec.gateway.image_registry}/{part}@sha256:")
            continue
        build = f"{spec.cluster_name}-{part}"
        [pushed_tag] = images[build]["tags"]
        repository, tag = pushed_tag.rsplit(":", 1)
        url = f"{plan.MOCK_ACCOUNT_ID}.dkr.ecr.{spec.cluster.region}.amazonaws.com/"
        assert repository == f"{url}{spec.cluster_name}/{part}"
        assert container["image"] == f"{repository}@{plan.mock_image_digest(build, [pushed_tag])}"
        assert version == tag and tag.startswith("src-")
        assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/version"] == tag


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_policy_pack_accepts_the_gateway_images(name: str) -> None:
    """Digest references pass the pack's pinned-image rule (and the spec's tag-pinned images still do)."""
    from policies.inference import offline

    result = offline.prepare(load(name)).run(_synthesis(name))
    assert [v for v in result.verdicts if v.rule == "images-pinned"] == []


def test_the_router_metrics_port_is_rendered_and_may_not_take_another_listeners_port() -> None:
    """``gateway.router_metrics_port`` reaches the runtime config; the API's port (or another service's) is
    refused at plan time, not found by a router that cannot bind."""
    doc = minimal()
    doc["gateway"] = {"router_metrics_port": 9300}
    assert runtime_config(PlatformSpec.model_validate(doc)).router.metrics_port == 9300
    for taken, what in ((8080, "router API"), (8081, "health monitor")):
        doc["gateway"] = {"router_metrics_port": taken}
        with pytest.raises(ValueError, match=f"gateway.router_metrics_port.*{taken} is the {what}'s port"):
            PlatformSpec.model_validate(doc)


def _seconds(timeout: str) -> int:
    assert timeout.endswith("s"), timeout
    return int(timeout[:-1])


@pytest.mark.parametrize("name", [s for s in PULUMI_STACKS if gateway.has_batcher(load(s).served[0])])
def test_the_batcher_waits_behind_the_engines_it_batches_as_long_as_the_slowest_may_take(name: str) -> None:
    """The batcher is ready only once every batched model has a replica: with the provider's 10-minute default
    and no order, `pulumi up` gave up on it while bge-large (an 18-minute budget) was still starting."""
    spec, _ = load(name).served
    decided = load(name).decisions
    synthesis = _synthesis(name)
    deployments = {
        r.inputs["metadata"]["name"]: r
        for r in synthesis.resources
        if r.type == "kubernetes:apps/v1:Deployment"
    }
    batcher = deployments[common.runtime_name(spec, common.BATCHER)]
    waits = synthesis.waits_for(batcher)
    batched = embedding_models(spec)
    assert batched
    for model in batched:
        engine = deployments[common.engine_name(model.name)]
        assert engine.urn in waits, f"the batcher does not wait for {model.name}'s engine"
    assert batcher.timeouts is not None
    longest = max(decided.units[m.name].rollout.startup.budget_s for m in batched)
    assert _seconds(batcher.timeouts["create"]) >= longest
    assert _seconds(batcher.timeouts["update"]) >= longest
