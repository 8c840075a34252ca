"""The model store on the control plane: fetch path per engine, disk and cache sizing per node (not per
replica), cold start per path, the preparation Job (the only holder of the hub token and write access), and
engine pods that never reach the hub."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from components.base import catalog
from components.clouds.aws import data_policies, decisions
from components.core.placement import place
from components.core.weights import coldstart, fetch, store
from components.deploy import synthesis as plan
from components.render import weights
from components.spec import PlatformSpec
from tests.components.helpers import SOME_COMMIT, engine_deployments, minimal, rendered_engine_deployment
from tests.stacks import load, synthesized


def _spec(**model: Any) -> PlatformSpec:
    raw = minimal()
    raw["models"][0] = {**raw["models"][0], **model}
    return PlatformSpec.model_validate(raw)


def _sglang_on_p5(replicas: int) -> dict[str, Any]:
    raw = minimal()
    raw["gpu_pools"] = [{"name": "h100", "instance_type": "p5.48xlarge"}]
    raw["models"][0] = {
        **raw["models"][0],
        "pool": "h100",
        "engine": {"kind": "sglang", "tensor_parallel_size": 2, "max_model_len": 8192},
        "scaling": {"min_replicas": replicas, "max_replicas": replicas},
    }
    return raw


def test_vllm_streams_and_other_engines_read_a_node_cache_on_nvme() -> None:
    vllm = _spec()
    layout = place(vllm)
    way = fetch.decide(vllm.models[0], layout.placements["llama-8b"].instance)
    assert way.path is fetch.FetchPath.STREAMER and way.medium is None
    sglang = _spec(engine={"kind": "sglang"})
    way = fetch.decide(sglang.models[0], place(sglang).placements["llama-8b"].instance)
    assert way.path is fetch.FetchPath.NODE_CACHE and way.medium is fetch.CacheMedium.NVME
    assert "g6e.xlarge has 233 GiB of local NVMe" in way.reason
    forced = _spec(weights={"fetch": "node-cache"})
    assert fetch.decide(forced.models[0], None).medium is fetch.CacheMedium.ROOT_DISK  # CPU nodes: no NVMe


def test_the_node_cache_holds_one_copy_per_node_however_many_replicas_share_it() -> None:
    one = place(PlatformSpec.model_validate(_sglang_on_p5(1))).pools["h100"]
    four = place(PlatformSpec.model_validate(_sglang_on_p5(4))).pools["h100"]  # 4 TP-2 replicas on one p5
    assert one.model_cache_gib == four.model_cache_gib > 0
    assert one.cache_medium is fetch.CacheMedium.NVME
    assert one.root_disk_gib == four.root_disk_gib  # the weights are on NVMe, not the root disk


def test_cold_start_per_path_orders_as_the_bandwidths_say() -> None:
    p5 = catalog.INSTANCE_TYPES["p5.48xlarge"]
    paths = {c.path: c.total_s for c in coldstart.compare(37.8, p5, 2)}
    # On a p5 both the streamer and a cache hit are bound by the load into GPU memory, not the network.
    assert paths["node cache, hit"] <= paths["streamer"] < paths["hub download (per replica)"]
    assert paths["node cache, hit"] < paths["node cache, first on node"] < paths["hub download (per replica)"]
    # The hub's ~0.15 GB/s against a 3,200 Gbps node: the streamer is about 30x faster on a 70B AWQ model.
    assert 20 < paths["hub download (per replica)"] / paths["streamer"] < 40
    prod = load("prod")
    big = prod.layout.placements["llama-3-70b"]
    model = next(m for m in prod.spec.models if m.name == "llama-3-70b")
    streamer = next(c for c in coldstart.compare(big.weights_gib, p5, 2) if c.path == "streamer")
    way = fetch.decide(model, big.instance)
    assert coldstart.expected(way, big.weights_gib, big.instance, big.gpus_per_replica) == streamer


def test_plan_summary_shows_every_models_store_fetch_path_and_cold_start() -> None:
    stack = load("dev")
    summary = synthesized("dev")  # the program runs; the summary is the report over the same stack
    from components.cli.report import plan_report

    text = plan_report(stack).markdown(stack, summary)
    assert "## Model weights" in text
    for model in stack.spec.models:
        assert f"`{store.location(stack.spec, model)}`" in text
    assert "node-cache (instance NVMe)" in text and "| streamer |" not in text.split("## Model weights")[0]


def test_the_preparation_job_alone_reads_the_hub_token_and_engines_reach_only_the_store() -> None:
    stack = load("prod")
    manifests = synthesized("prod").kubernetes_manifests()
    jobs = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Job"}
    assert {j["metadata"]["labels"]["inferstack.io/model"] for j in jobs.values()} == {
        m.name for m in stack.spec.models
    }
    for job in jobs.values():
        pod = job["spec"]["template"]["spec"]
        args = pod["containers"][0]["args"]
        # the models' and their LoRA adapters' (each prepared by its own Job) pinned commits
        assert args[:2] == ["prepare", "--to"] and args[args.index("--revision") + 1] in {
            *(m.revision for m in stack.spec.models),
            *(a.revision for m in stack.spec.models for a in m.adapters),
        }
        assert pod["serviceAccountName"] == weights.service_account_name(stack.spec)
        assert any(
            v.get("secret", {}).get("secretName") == weights.hf_token_secret_name(stack.spec)
            for v in pod["volumes"]
        )
    for deployment in engine_deployments(synthesized(stack.name)).values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["initContainers"][0]["args"][0] == "verify"
        assert pod["containers"][0]["args"][0].startswith("s3://")
        assert not any("secret" in v for v in pod["volumes"])


def test_a_new_revision_is_a_new_job_and_a_new_store_prefix() -> None:
    a = _spec()
    b = _spec(revision=SOME_COMMIT)
    assert weights.job_name(a, a.models[0]) != weights.job_name(b, b.models[0])
    assert store.location(b, b.models[0]).endswith(f"/meta-llama/Llama-3.1-8B-Instruct/{SOME_COMMIT}/")


def test_node_cache_engines_mount_the_nodes_copy_read_only_and_fill_it_first() -> None:
    spec = _spec(engine={"kind": "sglang"})
    deployment = rendered_engine_deployment(spec)
    pod = deployment["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["args"][:2] == ["fetch", "--store"] and "--cache-root" in init["args"]
    assert {
        "name": "model-cache",
        "hostPath": {"path": weights.NVME_CACHE_DIR, "type": "DirectoryOrCreate"},
    } in pod["volumes"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-cache")
    # Only this model's copy, at a directory named after the model (trtllm-serve serves a directory by name).
    assert mount == {
        "name": "model-cache",
        "mountPath": "/models/llama-8b",
        "subPath": store.location(spec, spec.models[0]).removeprefix("s3://").rstrip("/"),
        "readOnly": True,
    }
    model_arg = pod["containers"][0]["args"][pod["containers"][0]["args"].index("--model-path") + 1]
    assert model_arg == "/models/llama-8b"


def test_gpu_nodes_with_a_node_cache_stripe_their_nvme_and_ready_the_cache_directory() -> None:
    spec = PlatformSpec.model_validate(_sglang_on_p5(2))
    group = decisions.gpu_node_group(spec, place(spec).pools["h100"])
    assert group.user_data is not None
    assert (
        "strategy: RAID0" in group.user_data
        and f"install -d -m 0750 -o 10001 -g 10001 {weights.NVME_CACHE_DIR}" in group.user_data
    )
    streamed = PlatformSpec.model_validate(minimal())
    assert decisions.gpu_node_group(streamed, place(streamed).pools["l40s"]).user_data is None


def test_the_preparation_role_writes_only_the_store_prefix() -> None:
    bucket = "arn:aws:s3:::inferstack-prod-us-east-1-models"
    document = data_policies.model_prepare(
        "us-east-1", bucket, "arn:aws:kms:us-east-1:123456789012:key/k", "models"
    )
    actions = {a for s in document["Statement"] for a in s["Action"]}
    assert not {"s3:DeleteObject", "s3:PutBucketPolicy", "s3:*"} & actions
    write = next(s for s in document["Statement"] if s["Sid"] == "WriteStorePrefix")
    assert write["Resource"] == f"{bucket}/models/*"


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "kind"])
def test_committed_cluster_stacks_are_pinned_and_load_from_the_store(stack: str) -> None:
    loaded = load(stack)
    for model in loaded.spec.models:
        assert model.revision is not None or model.source.startswith("s3://")
    for deployment in engine_deployments(plan.synthesize(loaded)).values():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        argv = [*container["command"], *container["args"]]
        model_arg = next(a for a in argv if a.startswith(("s3://", "/models/")))
        assert model_arg  # the store or the node's copy of it, never a hub id
        assert {"name": "HF_HUB_OFFLINE", "value": "1"} in container["env"]


def test_store_bucket_is_known_at_plan_time() -> None:
    spec = PlatformSpec.model_validate(minimal())
    assert store.store_bucket(spec) == "inferstack-test-us-east-1-models"
    raw = copy.deepcopy(minimal())
    raw["cluster"] = {"model_bucket": "acme-weights"}
    assert store.store_bucket(PlatformSpec.model_validate(raw)) == "acme-weights"


def test_on_eks_the_batch_files_have_a_bucket_of_their_own() -> None:
    """Engines read the model bucket: tenants' batch files must never be in it, so the spec refuses one name."""
    doc = {**minimal(), "batch": {"enabled": True}}
    spec = PlatformSpec.model_validate(doc)
    assert spec.cluster.batch_files_bucket(spec) == "inferstack-test-us-east-1-batches"
    assert spec.cluster.batch_files_bucket(spec) != store.store_bucket(spec)
    same = {**doc, "cluster": {"model_bucket": "acme-data", "batch_bucket": "acme-data"}}
    with pytest.raises(ValueError, match=r"cluster.batch_bucket: 'acme-data' is also the model bucket"):
        PlatformSpec.model_validate(same)
    PlatformSpec.model_validate({**same, "batch": {"enabled": False}})
    with pytest.raises(ValueError, match="is not an S3 bucket name"):
        PlatformSpec.model_validate({**doc, "cluster": {"batch_bucket": "Acme_Batches"}})


def _gib(quantity: str) -> float:
    assert quantity.endswith("Gi"), quantity
    return float(quantity[:-2])


@pytest.mark.parametrize("stack", ["prod", "staging", "shared", "dev", "prod-405b"])
def test_store_jobs_request_their_staging_disk_and_the_system_nodes_hold_them_all(stack: str) -> None:
    """The 70B copy staged 37.8 GiB in an emptyDir on a 50 GiB system node without asking for the disk: the
    kubelet evicted it and every retry started empty. Each store Job now requests (and is limited to) its
    volumes' disk, its staging holds the checkpoint the sizing knows, and the system nodes' root disks, past
    their own 50 GiB, leave allocatable room (kubelet: 10% eviction margin, 1 GiB reserved) for all of them."""
    loaded = load(stack)
    synthesis = synthesized(stack)
    jobs = [
        m
        for m in synthesis.kubernetes_manifests()
        if m["kind"] == "Job"
        and m["metadata"]["labels"]["app.kubernetes.io/component"] == weights.COMPONENT
        and not m["metadata"]["name"].startswith("prepare-")  # a version's preparation: the GPU pool's
    ]
    assert jobs
    requested = 0.0
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        [container] = pod["containers"]
        disk = container["resources"]["requests"]["ephemeral-storage"]
        assert container["resources"]["limits"]["ephemeral-storage"] == disk
        volumes = {v["name"]: _gib(v["emptyDir"]["sizeLimit"]) for v in pod["volumes"] if "emptyDir" in v}
        assert _gib(disk) >= sum(volumes.values()), job["metadata"]["name"]
        requested += _gib(disk)
        assert not pod.get("tolerations")  # the general nodes, never a GPU node
    for model in loaded.spec.models:
        if not model.is_hub or model.versions:
            continue
        [job] = [j for j in jobs if j["metadata"]["name"] == weights.job_name(loaded.spec, model)]
        staging = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "staging")
        arch = model.arch()
        assert arch is not None
        assert _gib(staging["emptyDir"]["sizeLimit"]) >= weights.checkpoint_gib(model, arch)
    [group] = [
        r
        for r in synthesis.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup" and r.name.endswith("-system")
    ]
    [template] = [
        r
        for r in synthesis.resources
        if r.type == "aws:ec2/launchTemplate:LaunchTemplate" and r.name == group.name
    ]
    size = template.inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"]
    # Below the eviction margin, the disk holds the node's own use (what its former 50 GiB held below theirs),
    # the kubelet's reservation and every Job's request at once.
    usable = 1 - decisions.NODEFS_EVICTION_FRACTION
    own = decisions.SYSTEM_ROOT_DISK_GIB * usable
    assert size * usable >= own + decisions.KUBE_RESERVED_EPHEMERAL_GIB + requested, (size, requested)


def test_a_stack_whose_store_jobs_no_system_disk_holds_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.clouds.aws import cloud

    spec = load("prod").spec
    assert cloud.staging_problems(spec) == []
    monkeypatch.setattr(decisions, "GP3_MAX_GIB", 100)
    [problem] = cloud.staging_problems(spec)
    assert "llama-3-70b-weights" in problem.message and "more than one gp3 volume holds" in problem.message
