"""Versions and preparation as rendered: per-version Deployments and Services serving one name, loading from
the model store; the preparation Job (one more Job of the store: it reads the source the store's weights Job
copied, runs on the model's GPU pool before the engines, is named by its input hash and records its
provenance); the router and health monitor config; and a TensorRT-LLM build whose command lines use only the
flags TensorRT-LLM's own parsers define."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.core.stackfile import STACKS_DIR
from components.deploy import synthesis as plan
from components.render import preparation, weights
from runtime.config import RuntimeConfig
from tests.stacks import load, synthesized, validate

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trtllm-build-cli.json"


@pytest.fixture(scope="module")
def staging() -> tuple[Any, list[dict[str, Any]], plan.Synthesis]:
    stack = load("staging")
    synthesis = synthesized("staging")
    return stack, synthesis.kubernetes_manifests(), synthesis


def _named(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name)


def _args(deployment: dict[str, Any]) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


STORE = "s3://inferstack-staging-us-east-1-models/models"
SOURCE = f"{STORE}/meta-llama/Llama-3.1-8B-Instruct/0e9e39f249a16976918f6564b8830bc894c89659/"


def _inits(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return deployment["spec"]["template"]["spec"]["initContainers"]


def test_each_version_has_its_deployment_and_service_serving_the_model_name(staging) -> None:
    _, manifests, _ = staging
    for version in ("bf16", "w4a16"):
        deployment = _named(manifests, "Deployment", f"llama-3-8b-{version}-engine")
        _named(manifests, "Service", f"llama-3-8b-{version}-engine")
        args = _args(deployment)
        assert args[args.index("--served-model-name") + 1] == "llama-3-8b"
        assert "--revision" not in args  # engines load the store's copy of the pinned revision
    assert not [m for m in manifests if m["metadata"]["name"] == "llama-3-8b-engine"]
    stable = _named(manifests, "Deployment", "llama-3-8b-bf16-engine")
    assert _args(stable)[0] == SOURCE and _inits(stable)[0]["args"] == ["verify", "--store", SOURCE]
    canary = _named(manifests, "Deployment", "llama-3-8b-w4a16-engine")
    assert "--quantization" not in _args(canary)  # compressed-tensors names its own format
    prepared = _args(canary)[0]
    assert prepared.startswith(f"{STORE}/prepared/llama-3-8b/w4a16/")
    assert _inits(canary)[0]["args"] == ["verify", "--store", prepared]


def test_the_preparation_job_reads_the_stores_copy_runs_on_the_gpu_pool_and_records_provenance(
    staging,
) -> None:
    stack, manifests, synthesis = staging
    jobs = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Job"}
    (job,) = [m for n, m in jobs.items() if n.startswith("prepare-")]
    # One weights Job copies the source for both versions (the stable serves it, the canary is made from it).
    (copy_job,) = [m for n, m in jobs.items() if n.startswith("llama-3-8b-weights-")]
    copy_args = copy_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert copy_args[copy_args.index("--to") + 1] == SOURCE
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"inferstack.io/pool": "l40s"} and pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == weights.service_account_name(stack.spec)
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == weights.COMPONENT
    steps = [c["name"] for c in pod["initContainers"]] + [c["name"] for c in pod["containers"]]
    assert steps == ["fetch-source", "quantize", "upload"]
    fetch, quantize = pod["initContainers"]
    assert fetch["args"][:3] == ["fetch", "--store", SOURCE]
    assert quantize["command"][:3] == ["python", "-m", "runtime.prepare.quantize"]
    source_dir = quantize["command"][quantize["command"].index("--source") + 1]
    assert source_dir == f"{preparation.SOURCE_ROOT}/{SOURCE.removeprefix('s3://').rstrip('/')}"
    assert quantize["resources"]["limits"]["nvidia.com/gpu"] == "1"
    notes = job["metadata"]["annotations"]
    record = json.loads(notes[preparation.ANNOTATION_PROVENANCE])
    assert record["input_hash"] == notes[preparation.ANNOTATION_HASH]
    assert record["format"] == "gptq" and record["calibration_samples"] == 512
    assert record["revision"] == "0e9e39f249a16976918f6564b8830bc894c89659"
    assert record["source_location"] == SOURCE
    location = notes[preparation.ANNOTATION_LOCATION]
    upload = pod["containers"][0]["args"]
    assert upload[:5] == ["prepare", "--to", location, "--from", preparation.OUTPUT_DIR]
    assert upload[upload.index("--source") + 1].endswith(notes[preparation.ANNOTATION_HASH])
    assert (
        pod["containers"][0]["image"]
        == fetch["image"]
        == copy_job["spec"]["template"]["spec"]["containers"][0]["image"]
    )  # the store's own weights image
    canary = _named(manifests, "Deployment", "llama-3-8b-w4a16-engine")
    assert _args(canary)[0] == location
    deployment = next(
        r for r in synthesis.resources if r.name == "deployment:inference/llama-3-8b-w4a16-engine"
    )
    assert any(d.endswith(f"job:inference/{job['metadata']['name']}") for d in deployment.dependencies)
    prepare = next(r for r in synthesis.resources if r.name == f"job:inference/{job['metadata']['name']}")
    assert any(d.endswith(f"job:inference/{copy_job['metadata']['name']}") for d in prepare.dependencies)


def test_the_job_is_named_by_its_inputs(staging) -> None:
    _, manifests, _ = staging
    raw = yaml.safe_load((STACKS_DIR / "Pulumi.staging.yaml").read_text())["config"]["inferstack:platform"]
    same = validate(copy.deepcopy(raw), "again").preparations
    assert [p.job_name for p in same] == [
        m["metadata"]["name"]
        for m in manifests
        if m["kind"] == "Job" and m["metadata"]["name"].startswith("prepare-")
    ]
    changed = copy.deepcopy(raw)
    changed["models"][1]["versions"][1]["preparation"]["calibration_samples"] = 256
    other = validate(changed, "changed").preparations
    assert other[0].job_name != same[0].job_name and other[0].location != same[0].location


def test_router_and_health_config_group_the_versions_and_carry_the_rollback_rule(staging) -> None:
    _, manifests, _ = staging
    config_map = next(
        m for m in manifests if m["kind"] == "ConfigMap" and "runtime.yaml" in m.get("data", {})
    )
    cfg = RuntimeConfig.model_validate(yaml.safe_load(config_map["data"]["runtime.yaml"]))
    versions = cfg.versions()["llama-3-8b"]
    assert [(t.name, t.version_of.weight, t.version_of.stable) for t in versions if t.version_of] == [
        ("llama-3-8b-bf16", 90, True),
        ("llama-3-8b-w4a16", 10, False),
    ]
    (check,) = cfg.health.canaries
    assert (check.model, check.evaluation_interval_s, check.max_error_rate) == ("llama-3-8b", 60, 0.02)
    assert check.ttft_slo_s == 2.0 and check.max_ttft_ratio == 1.3
    assert cfg.health.synthetic_probe_every == 1  # a canary failing requests behind a healthy /health counts


def test_a_trtllm_engine_build_uses_only_flags_tensorrt_llm_defines() -> None:
    raw = yaml.safe_load((STACKS_DIR / "Pulumi.staging.yaml").read_text())["config"]["inferstack:platform"]
    raw["models"][0]["versions"] = [
        {"name": "vllm", "weight": 90},
        {
            "name": "trt",
            "weight": 10,
            "engine": {
                "kind": "trtllm",
                "image": "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
                "quantization": "none",
            },
            "preparation": {"kind": "trtllm-build", "format": "fp8"},
        },
    ]
    raw["models"][0]["rollout"] = {"canary": {}}
    decided = validate(raw, "trt")
    (prep,) = [p for p in decided.preparations if p.spec.kind.value == "trtllm-build"]
    assert prep.gpu == "H100" and prep.inputs["gpu"] == "H100"  # built for the GPU it will run on
    expanded, placed = decided.served_spec, decided.served_layout
    unit = next(m for m in expanded.models if m.name == prep.unit)
    job = preparation.job(expanded, prep, unit, placed.placements[prep.unit], "weights-image")
    steps = {c["name"]: c.get("command", []) for c in job["spec"]["template"]["spec"]["initContainers"]}
    known = json.loads(FIXTURE.read_text())
    for step, tool in (("convert", "convert_checkpoint.py"), ("build", "trtllm-build")):
        command = steps[step]
        flags = known[tool]
        i = command.index(tool) + 1 if tool in command else 2
        while i < len(command):
            flag = command[i]
            assert flag in flags, f"{tool} has no flag {flag}"
            kind = flags[flag]
            if kind == "switch":
                i += 1
                continue
            value = command[i + 1]
            if kind == "int":
                int(value)
            elif isinstance(kind, list):
                assert value in kind, f"{tool} {flag} {value}"
            i += 2
    assert "--use_fp8" in steps["convert"] and job["spec"]["template"]["spec"]["nodeSelector"] == {
        "inferstack.io/pool": "h100"
    }


def test_on_eks_preparation_jobs_write_the_store_as_the_weights_identity_and_engines_read_it(staging) -> None:
    _, manifests, synthesis = staging
    policies = {
        r.name: json.loads(r.inputs["policy"])
        for r in synthesis.resources
        if r.type == "aws:iam/rolePolicy:RolePolicy" and r.name.endswith(("-prepare-models", "-read-models"))
    }
    (job,) = [m for m in manifests if m["kind"] == "Job" and m["metadata"]["name"].startswith("prepare-")]
    key = job["metadata"]["annotations"][preparation.ANNOTATION_LOCATION].removeprefix("s3://")
    bucket, path = key.split("/", 1)

    def allows(policy: dict[str, Any], action: str) -> bool:
        return any(
            action in s["Action"]
            and any(
                r == f"arn:aws:s3:::{bucket}/*"
                or (r.startswith(f"arn:aws:s3:::{bucket}/") and path.startswith(r.split("/", 1)[1][:-1]))
                for r in _as_list(s["Resource"])
            )
            for s in policy["Statement"]
        )

    write = next(p for n, p in policies.items() if n.endswith("-weights-prepare-models"))
    engine = next(p for n, p in policies.items() if n.endswith("-engine-read-models"))
    assert allows(write, "s3:PutObject") and allows(engine, "s3:GetObject")
    assert not [s for s in engine["Statement"] if "s3:PutObject" in s["Action"]]
    accounts = {
        r.inputs["serviceAccount"]
        for r in synthesis.resources
        if r.type == "aws:eks/podIdentityAssociation:PodIdentityAssociation"
    }
    assert job["spec"]["template"]["spec"]["serviceAccountName"] in accounts
    assert "inferstack-prepare" not in accounts  # one preparation identity: the store's


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
