"""Preparation Jobs: a version's quantization or TensorRT-LLM engine build, rendered as a Kubernetes Job. Pure.

Steps run in order as init containers (fetch the source, prepare), then the one container uploads the result
to the model store, at the input-hashed location the version's engines load from (``components.lifecycle``).
The Job's name carries the input hash, so the same inputs are the same Job (nothing to do on the next
`pulumi up`), and its annotations carry the provenance (inputs, tool, image, hash). The pod runs on the
model's GPU pool when the step needs a GPU, with the engines' hardening and no service-account token.
"""

from __future__ import annotations

import json
from typing import Any

from components import lifecycle, nodes
from components.lifecycle import Preparation
from components.placement import Placement
from components.render import common, flows, hardening
from components.render.engine import AWS_CLI_IMAGE, HF_TOKEN_DIR, HF_TOKEN_KEY, hf_token_secret_name
from components.spec import ModelSpec, PlatformSpec, PreparationKind, Quantization

Manifest = dict[str, Any]

WORK_DIR = "/work"
SOURCE_DIR = f"{WORK_DIR}/source"
CHECKPOINT_DIR = f"{WORK_DIR}/checkpoint"
OUTPUT_DIR = f"{WORK_DIR}/out"
ANNOTATION_HASH = "inferstack.io/input-hash"
ANNOTATION_PROVENANCE = "inferstack.io/provenance"
ANNOTATION_LOCATION = lifecycle.ANNOTATION_PREPARED_FROM
#: TensorRT-LLM 1.0's checkpoint converter for Llama-family models, inside its release image.
TRTLLM_CONVERT = "/app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py"
JOB_DEADLINE_S = (
    6 * 3600
)  # a 70B calibration on one GPU takes hours; a stuck one must not hold a GPU for ever


def service_account(spec: PlatformSpec) -> Manifest:
    """The Jobs' identity: on EKS the role that may write the model store's prepared prefix binds to it."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": common.metadata(spec, common.prepare_service_account_name(spec), flows.PREPARE),
        "automountServiceAccountToken": False,
    }


def fetch_command(source: str, revision: str | None) -> list[str]:
    """Copy the source checkpoint into the work directory: from S3, or from the Hugging Face Hub."""
    if source.startswith("s3://"):
        return ["aws", "s3", "sync", "--only-show-errors", source, SOURCE_DIR]
    return [
        "hf",
        "download",
        source,
        *(["--revision", revision] if revision else []),
        "--local-dir",
        SOURCE_DIR,
    ]


def quantize_command(p: Preparation) -> list[str]:
    s = p.spec
    return [
        "python",
        "-m",
        "runtime.prepare.quantize",
        "--source",
        SOURCE_DIR,
        "--out",
        OUTPUT_DIR,
        "--format",
        s.format.value,
        "--calibration-dataset",
        s.calibration_dataset,
        "--calibration-samples",
        str(s.calibration_samples),
        "--max-sequence-length",
        str(s.max_sequence_length),
    ]


def trtllm_commands(p: Preparation, unit: ModelSpec) -> list[list[str]]:
    """Convert the Hugging Face checkpoint, then build the engine for this GPU (TensorRT-LLM 1.0 flags)."""
    e = unit.engine
    dtype = "bfloat16" if e.dtype.value in ("auto", "bfloat16") else e.dtype.value
    convert = ["python3", TRTLLM_CONVERT, "--model_dir", SOURCE_DIR, "--output_dir", CHECKPOINT_DIR]
    convert += [
        "--dtype",
        dtype,
        "--tp_size",
        str(e.tensor_parallel_size),
        "--pp_size",
        str(e.pipeline_parallel_size),
    ]
    if p.spec.format is Quantization.FP8:
        convert.append("--use_fp8")
    build = ["trtllm-build", "--checkpoint_dir", CHECKPOINT_DIR, "--output_dir", OUTPUT_DIR]
    build += ["--max_seq_len", str(p.spec.max_sequence_length), "--max_batch_size", str(e.max_num_seqs)]
    build += ["--max_num_tokens", str(e.max_num_batched_tokens or 8192), "--gemm_plugin", "auto"]
    build += ["--workers", str(e.tensor_parallel_size * e.pipeline_parallel_size)]
    return [convert, build]


def provenance(p: Preparation) -> dict[str, Any]:
    """What the Job records about its output (the output's own provenance.json adds content hashes)."""
    return {
        "model": p.model,
        "version": p.version,
        "input_hash": p.input_hash,
        "location": p.location,
        **p.inputs,
    }


def _step(name: str, image: str, command: list[str], resources: Manifest, env: list[Manifest]) -> Manifest:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "Always",
        "command": command,
        "env": [{"name": "HOME", "value": "/tmp"}, *env],
        "resources": resources,
        "securityContext": hardening.container_security(),
        "volumeMounts": [{"name": "work", "mountPath": WORK_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
    }


def job(spec: PlatformSpec, p: Preparation, unit: ModelSpec, placement: Placement) -> Manifest:
    """The Job that prepares ``unit``'s checkpoint."""
    gpu_step = p.gpu is not None and placement.pool is not None and placement.instance is not None
    gpus = max(1, placement.gpus_per_replica) if gpu_step else 0
    cpu, memory = ("8", "64Gi") if gpu_step else ("4", "16Gi")
    heavy: Manifest = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    if gpus:
        heavy["requests"][nodes.GPU_RESOURCE] = str(gpus)
        heavy["limits"][nodes.GPU_RESOURCE] = str(gpus)
    light: Manifest = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    env: list[Manifest] = [
        {"name": "HF_HOME", "value": f"{WORK_DIR}/hf"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]
    if spec.huggingface_token_config_key:
        env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_TOKEN_KEY}"})
    image = p.spec.resolved_image
    fetch_image = AWS_CLI_IMAGE if p.inputs["source"].startswith("s3://") else image
    steps = [
        _step(
            "fetch-source", fetch_image, fetch_command(p.inputs["source"], p.inputs["revision"]), light, env
        )
    ]
    if p.spec.kind is PreparationKind.QUANTIZE:
        steps.append(_step("quantize", image, quantize_command(p), heavy, env))
    else:
        convert, build = trtllm_commands(p, unit)
        steps += [_step("convert", image, convert, heavy, env), _step("build", image, build, heavy, env)]
    upload = _step(
        "upload",
        AWS_CLI_IMAGE,
        ["aws", "s3", "sync", "--only-show-errors", OUTPUT_DIR, p.location],
        light,
        [],
    )
    volumes: list[Manifest] = [
        {
            "name": "work",
            "emptyDir": {"sizeLimit": f"{max(50, 3 * int(placement.arch.params_b * 2) + 20)}Gi"},
        },
        {"name": "tmp", "emptyDir": {"sizeLimit": "10Gi"}},
    ]
    if spec.huggingface_token_config_key:
        for step in steps:
            step["volumeMounts"].append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
        volumes.append(
            {"name": "hf-token", "secret": {"secretName": hf_token_secret_name(spec), "defaultMode": 0o440}}
        )
    pod: Manifest = {
        "serviceAccountName": common.prepare_service_account_name(spec),
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        "securityContext": hardening.pod_security() | {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": steps,
        "containers": [upload],
        "volumes": volumes,
    }
    if gpu_step:
        pod["nodeSelector"] = {nodes.POOL_LABEL: str(placement.pool)}
        pod["tolerations"] = [nodes.gpu_toleration()]
    labels = {**common.labels(spec, p.job_name, flows.PREPARE), common.MODEL_LABEL: p.unit}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            **common.metadata(spec, p.job_name, flows.PREPARE),
            "labels": labels,
            "annotations": {
                ANNOTATION_HASH: p.input_hash,
                ANNOTATION_LOCATION: p.location,
                ANNOTATION_PROVENANCE: json.dumps(provenance(p), sort_keys=True),
            },
        },
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": JOB_DEADLINE_S,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
