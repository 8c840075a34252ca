"""Preparation Jobs: a version's quantization or TensorRT-LLM engine build, rendered as a Kubernetes Job. Pure.

One more step of the model store (``components.render.weights``), run by its weights image and identity:
the first init container fetches the version's source from the store (where its weights Job copied it at the
pinned revision, checked against its manifest), the tool's steps prepare it, then the Job's container puts the
result into the store at the input-hashed location the version's engines load from
(``components.core.lifecycle``), with a manifest, as any model there. The Job's name carries the input hash, so the
same inputs are the same Job (nothing to do on the next `pulumi up`), and its annotations carry the provenance
(inputs, tool, image, hash). The pod runs on the model's GPU pool when the step needs a GPU, with the engines'
hardening and no service-account token.
"""

from __future__ import annotations

import json
from typing import Any

from components.core import lifecycle, nodes
from components.core.lifecycle import Preparation
from components.core.placement import Placement
from components.render import common, hardening, weights
from components.spec import ModelSpec, PlatformSpec, PreparationKind, Quantization

Manifest = dict[str, Any]

WORK_DIR = "/work"
SOURCE_ROOT = f"{WORK_DIR}/source"
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


def source_dir(p: Preparation) -> str:
    """Where the fetch step leaves the source (``runtime.weights.node_cache.cache_dir``: bucket, then prefix)."""
    return f"{SOURCE_ROOT}/{p.source_location.removeprefix('s3://').rstrip('/')}"


def provenance_label(p: Preparation) -> str:
    """The source the store's manifest records for a prepared checkpoint: the Job and its input hash."""
    return f"prepared:{p.job_name}@{p.input_hash}"


def quantize_command(p: Preparation) -> list[str]:
    s = p.spec
    return [
        "python",
        "-m",
        "runtime.prepare.quantize",
        "--source",
        source_dir(p),
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
    convert = ["python3", TRTLLM_CONVERT, "--model_dir", source_dir(p), "--output_dir", CHECKPOINT_DIR]
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
        "source_location": p.source_location,
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


def job(
    spec: PlatformSpec, p: Preparation, unit: ModelSpec, placement: Placement, weights_image: Any
) -> Manifest:
    """The Job that prepares ``unit``'s checkpoint (``weights_image``: the store's fetch and upload steps)."""
    gpu_step = p.gpu is not None and placement.pool is not None and placement.instance is not None
    gpus = max(1, placement.gpus_per_replica) if gpu_step else 0
    cpu, memory = ("8", "64Gi") if gpu_step else ("4", "16Gi")
    heavy: Manifest = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    if gpus:
        heavy["requests"][nodes.GPU_RESOURCE] = str(gpus)
        heavy["limits"][nodes.GPU_RESOURCE] = str(gpus)
    env: list[Manifest] = [
        {"name": "HF_HOME", "value": f"{WORK_DIR}/hf"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]
    token = bool(spec.huggingface_token_config_key)
    if token:  # calibration datasets may be gated, as models are
        env.append({"name": "HF_TOKEN_PATH", "value": f"{weights.HF_TOKEN_DIR}/{weights.HF_TOKEN_KEY}"})
    work = {"name": "work", "mountPath": WORK_DIR}
    owner = weights.owner_args(spec)
    fetch = weights.store_container(
        spec,
        "fetch-source",
        weights_image,
        ["fetch", "--store", p.source_location, "--cache-root", SOURCE_ROOT, *owner],
        writer=True,
    )
    fetch["volumeMounts"].append(work)
    steps = [fetch]
    if p.spec.kind is PreparationKind.QUANTIZE:
        steps.append(_step("quantize", p.spec.resolved_image, quantize_command(p), heavy, env))
    else:
        convert, build = trtllm_commands(p, unit)
        steps += [
            _step("convert", p.spec.resolved_image, convert, heavy, env),
            _step("build", p.spec.resolved_image, build, heavy, env),
        ]
    upload = weights.store_container(
        spec,
        "upload",
        weights_image,
        ["prepare", "--to", p.location, "--from", OUTPUT_DIR, "--source", provenance_label(p), *owner],
        writer=True,
    )
    upload["volumeMounts"].append(work)
    volumes: list[Manifest] = [
        {
            "name": "work",
            "emptyDir": {"sizeLimit": f"{max(50, 3 * int(placement.arch.params_b * 2) + 20)}Gi"},
        },
        {"name": "tmp", "emptyDir": {"sizeLimit": "10Gi"}},
        *weights.store_access(spec, writer=True).volumes,
    ]
    if token:
        for step in steps[1:]:
            step["volumeMounts"].append(
                {"name": "hf-token", "mountPath": weights.HF_TOKEN_DIR, "readOnly": True}
            )
        volumes.append(
            {
                "name": "hf-token",
                "secret": {"secretName": weights.hf_token_secret_name(spec), "defaultMode": 0o440},
            }
        )
    pod: Manifest = {
        "serviceAccountName": weights.service_account_name(spec),
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
    labels = {**common.labels(spec, p.job_name, weights.COMPONENT), common.MODEL_LABEL: p.unit}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            **common.metadata(spec, p.job_name, weights.COMPONENT),
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
