"""Building blocks for spec and program tests: a minimal valid stack, a writer for stack files, and the
engine Deployments of a synthesis."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from components import plan
from components.render import common

MINIMAL: dict[str, Any] = {
    "name": "inferstack",
    "environment": "test",
    "target": "eks",
    "cluster": {"api_endpoint": {"access": "public", "public_cidrs": ["203.0.113.0/28"]}},
    "gpu_pools": [{"name": "l40s", "instance_type": "g6e.xlarge"}],
    "models": [
        {
            "name": "llama-8b",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "pool": "l40s",
            "engine": {"max_model_len": 8192, "max_num_seqs": 64},
            "scaling": {"min_replicas": 1, "max_replicas": 2},
        }
    ],
}


def minimal() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL)


def cluster(**fields: Any) -> dict[str, Any]:
    """MINIMAL's cluster block (its API endpoint) with ``fields`` on top."""
    return {**copy.deepcopy(MINIMAL["cluster"]), **fields}


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
