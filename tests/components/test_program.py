"""The real Pulumi program under the SDK's mock runtime: the resources each committed stack creates."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from components.core import nodes, startup
from components.core.redaction import REDACTED
from components.core.stackfile import STACKS_DIR, Stack, available_stacks
from components.core.weights import store
from components.deploy import program
from components.deploy import synthesis as plan
from components.render import common
from tests.components.helpers import engine_deployments, engine_workloads, pod_templates
from tests.stacks import load, synthesized

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]


def _synth(stack: Stack) -> plan.Synthesis:
    """A committed stack's resources (run once per test process: tests/stacks.py)."""
    return synthesized(stack.name)


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_every_kubernetes_manifest_passes_strict_validation_for_the_stack_version(name: str) -> None:
    stack = load(name)
    version = f"{stack.spec.cluster.kubernetes_version}.0"
    manifests = _synth(stack).kubernetes_manifests()
    assert manifests
    checked = 0
    for manifest in manifests:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
            checked += 1
        except kubernetes_validate.SchemaNotFoundError:
            continue  # custom resources: tests/components/test_crd_schemas.py checks them against their CRDs
        except kubernetes_validate.ValidationError as err:
            pytest.fail(
                f"{manifest['kind']} {manifest['metadata']['name']}: {err.message} at {list(err.path)}"
            )
    assert checked >= 2 * len(stack.spec.models)


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_each_model_gets_an_engine_deployment_and_service_with_deterministic_names(name: str) -> None:
    stack = load(name)
    synthesis = _synth(stack)
    manifests = synthesis.kubernetes_manifests()
    workloads = engine_workloads(synthesis)
    served, layout = stack.served
    assert set(workloads) == {m.name for m in served.models}
    services = {m["metadata"]["name"] for m in manifests if m["kind"] == "Service"}
    for model in served.models:
        kind = "LeaderWorkerSet" if layout.placements[model.name].multi_node else "Deployment"
        assert workloads[model.name]["kind"] == kind
        assert workloads[model.name]["metadata"]["name"] == common.engine_name(model.name)
        assert common.engine_name(model.name) in services
    keys = [(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in manifests]
    assert len(keys) == len(set(keys)), "two objects share a kind, namespace and name"
    urns = [r.urn for r in synthesis.resources]
    assert len(urns) == len(set(urns))


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_engine_pods_get_gpus_probes_placement_shm_and_labels_from_the_spec(name: str) -> None:
    stack = load(name)
    workloads = engine_workloads(_synth(stack))
    served, layout = stack.served
    for model in served.models:
        placement = layout.placements[model.name]
        for role, template in pod_templates(workloads[model.name]).items():
            _check_engine_pod(stack, model, placement, role, template, workloads[model.name])


def _check_engine_pod(
    stack: Any, model: Any, placement: Any, role: str, template: dict[str, Any], workload: dict[str, Any]
) -> None:
    """One engine pod: a Deployment's, or a group's leader or worker (each on its own node of the pool)."""
    pod = template["spec"]
    container = pod["containers"][0]
    resources = container["resources"]
    gpus = model.engine.tensor_parallel_size * model.engine.pipeline_parallel_size // placement.nodes
    # a shared GPU: one time slice or one MIG instance (tests/components/test_gpu_sharing.py)
    resource = nodes.share_resource(placement.share) if placement.share else nodes.GPU_RESOURCE
    if placement.share is not None:
        gpus = 1
        assert nodes.GPU_RESOURCE not in resources["limits"]
    if placement.instance is not None:
        assert resources["requests"][resource] == resources["limits"][resource] == str(gpus)
        assert pod["nodeSelector"] == {nodes.POOL_LABEL: placement.pool}
        assert {"key": nodes.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
    else:
        assert nodes.GPU_RESOURCE not in resources["requests"]
        assert "tolerations" not in pod
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if role == "worker":  # a group's workers serve no HTTP; the leader answers for the group
            assert probe not in container
        else:
            assert container[probe]["httpGet"]["path"] == "/health"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert pod["terminationGracePeriodSeconds"] >= 60
    labels = workload["metadata"]["labels"]
    for key in ("name", "instance", "component", "part-of", "managed-by", "version"):
        assert f"app.kubernetes.io/{key}" in labels
    assert container["image"] == model.engine.resolved_image
    assert pod["serviceAccountName"] == common.engine_service_account_name(stack.spec)
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_engine_service_account_exists_in_the_engines_namespace(name: str) -> None:
    stack = load(name)
    accounts = {
        (m["metadata"]["namespace"], m["metadata"]["name"])
        for m in _synth(stack).kubernetes_manifests()
        if m["kind"] == "ServiceAccount"
    }
    assert (stack.spec.cluster.namespace, common.engine_service_account_name(stack.spec)) in accounts


def test_vllm_command_line_carries_every_engine_knob_of_the_spec() -> None:
    stack = load("prod")
    model = next(m for m in stack.spec.models if m.name == "llama-3-70b")
    container = engine_deployments(_synth(stack))[model.name]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert container["command"] == ["vllm", "serve"]
    assert args[0] == store.location(stack.spec, model)  # streamed from the model store, never the hub

    def value(flag: str) -> str:
        return str(args[args.index(flag) + 1])

    assert value("--served-model-name") == "llama-3-70b"
    assert value("--tensor-parallel-size") == "2"
    assert value("--quantization") == "awq"
    assert value("--dtype") == "float16"
    assert value("--max-model-len") == "8192"
    assert value("--max-num-seqs") == "256"
    assert value("--gpu-memory-utilization") == "0.9"
    assert value("--kv-offloading-size") == "64"
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_NO_USAGE_STATS"]["value"] == "1"
    assert env["HF_HUB_OFFLINE"]["value"] == "1"  # engines never reach the hub ...
    assert not {"HF_TOKEN", "HF_TOKEN_PATH"} & set(env)  # ... nor hold its token
    pod = engine_deployments(_synth(stack))[model.name]["spec"]["template"]["spec"]
    assert all(v.get("secret") is None for v in pod["volumes"])


def test_startup_budget_grows_with_model_size() -> None:
    stack = load("prod")
    deployments = engine_deployments(_synth(stack))
    models = {m.name: m for m in stack.spec.models}

    def probe_window(model: str) -> int:
        probe = deployments[model]["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        return int(probe["periodSeconds"]) * int(probe["failureThreshold"])

    def weights_s(model: str) -> int:
        return startup.weights_fetch(models[model], stack.layout.placements[model]).seconds

    for name in models:  # the probe allows exactly the startup budget
        assert probe_window(name) == stack.decisions.models[name].startup.budget_s
    # Streamed weights take seconds, so budgets in whole minutes may tie; the weights term itself still grows.
    assert probe_window("llama-3-70b") > probe_window("llama-3-8b") >= probe_window("bge-large")
    assert weights_s("llama-3-70b") > weights_s("llama-3-8b") > weights_s("bge-large")


def test_hf_token_reaches_kubernetes_only_as_a_pulumi_secret() -> None:
    synthesis = _synth(load("prod"))
    secret = next(
        r for r in synthesis.resources if r.type == "kubernetes:core/v1:Secret" and "hf-token" in r.name
    )
    assert secret.inputs["stringData"] == {"token": REDACTED}


def test_sglang_and_embedding_engines_render_their_own_flags() -> None:
    dev = load("dev")
    container = engine_deployments(_synth(dev))["qwen-7b-sglang"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["-m", "sglang.launch_server"]
    assert "--enable-metrics" in container["args"]
    assert container["args"][container["args"].index("--tp-size") + 1] == "1"
    prod = load("prod")
    embed = engine_deployments(_synth(prod))["bge-large"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert embed[embed.index("--runner") + 1] == "pooling"
    assert embed[embed.index("--convert") + 1] == "embed"


def test_components_parent_their_resources() -> None:
    synthesis = _synth(load("kind"))
    platform = next(r for r in synthesis.resources if r.type == "inferstack:index:InferencePlatform")
    engine = next(r for r in synthesis.resources if r.type == "inferstack:kubernetes:ModelEngine")
    assert engine.parent == platform.urn
    deployment = next(
        r for r in synthesis.resources if r.type == "kubernetes:apps/v1:Deployment" and "qwen" in r.name
    )
    assert deployment.parent == engine.urn


@pytest.mark.parametrize(("name", "url"), [("prod", "https://llm.example.com"), ("kind", None)])
def test_the_stack_exports_where_clients_reach_the_gateway(monkeypatch, name: str, url: str | None) -> None:
    import pulumi

    exported: dict[str, Any] = {}
    monkeypatch.setattr(pulumi, "export", exported.__setitem__)
    stack = load(name)
    plan.synthesize(stack)
    if url is not None:
        assert exported["gateway_url"] == url
    else:  # no ingress: the router Service, inside the cluster
        router = next(
            m
            for m in plan.synthesize(stack).kubernetes_manifests()
            if m["kind"] == "Service" and "router" in m["metadata"]["name"]
        )
        port = router["spec"]["ports"][0]["port"]
        namespace = stack.spec.cluster.namespace
        assert exported["gateway_url"] == f"http://{router['metadata']['name']}.{namespace}.svc:{port}"


def test_every_resource_belongs_to_its_own_stack_when_several_are_planned_in_one_process() -> None:
    """The snapshot test plans every stack in one process: none may inherit the previous one's root Stack."""
    for name in ("kind", "prod", "kind"):
        resources = plan.synthesize(load(name)).resources
        parents = {r.parent for r in resources if r.parent is not None}
        assert parents and all(p.startswith(f"urn:pulumi:{name}::") for p in parents), name


@pytest.mark.parametrize("name", ["prod", "staging", "kind"])
def test_pulumi_up_decides_from_stack_config_what_the_plan_passes_in(monkeypatch, name: str) -> None:
    """`inferstack plan` hands the program the decisions it made from the stack file; `pulumi up` has only the stack
    config and decides there: both register the same resources (stacks on eks and kubernetes, one with versions)."""
    stack = load(name)
    planned = plan.synthesize(stack).resources
    monkeypatch.setattr(plan, "_run_program", lambda _decided: program.run())
    from_config = plan.synthesize(stack).resources
    assert sorted((r.as_json() for r in from_config), key=lambda r: r["urn"]) == sorted(
        (r.as_json() for r in planned), key=lambda r: r["urn"]
    )
