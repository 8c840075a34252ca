"""Building blocks for spec and program tests: a minimal valid stack, a writer for stack files, and the
engine Deployments of a synthesis."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from components import plan
from components.render import common

#: The hub commit of meta-llama/Llama-3.1-8B-Instruct the committed stacks pin.
LLAMA_8B_COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
#: A well-formed commit for test sources whose real history does not matter.
SOME_COMMIT = "0123456789abcdef0123456789abcdef01234567"

MINIMAL: dict[str, Any] = {
    "name": "inferstack",
    "environment": "test",
    "target": "eks",
    "gpu_pools": [{"name": "l40s", "instance_type": "g6e.xlarge"}],
    "models": [
        {
            "name": "llama-8b",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "revision": LLAMA_8B_COMMIT,
            "pool": "l40s",
            "engine": {"max_model_len": 8192, "max_num_seqs": 64},
            "scaling": {"min_replicas": 1, "max_replicas": 2},
        }
    ],
}


def minimal() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL)


#: The model store of a cluster the stack does not create (target kubernetes): an S3-compatible bucket.
OWN_STORE: dict[str, Any] = {
    "bucket": "models",
    "endpoint_url": "http://minio.minio.svc:9000",
    "reader_secret": "model-store-reader",
    "writer_secret": "model-store-writer",
}


def on_own_cluster(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` as a target kubernetes stack, with its model store."""
    return {**raw, "target": "kubernetes", "model_store": copy.deepcopy(OWN_STORE)}


def write_stack(
    directory: Path, name: str, platform: Any, extra_config: dict[str, Any] | None = None
) -> Path:
    path = directory / f"Pulumi.{name}.yaml"
    config = {"inferstack:platform": platform, **(extra_config or {})}
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return path


def engine_deployments(synthesis: plan.Synthesis) -> dict[str, dict[str, Any]]:
    """Model name -> its engine Deployment manifest; fails on a model with two."""
    out: dict[str, dict[str, Any]] = {}
    for m in synthesis.kubernetes_manifests():
        if (
            m["kind"] == "Deployment"
            and m["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
        ):
            model = m["metadata"]["labels"][common.MODEL_LABEL]
            assert model not in out, f"two engine Deployments for model {model}"
            out[model] = m
    return out
