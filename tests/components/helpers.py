"""Building blocks for spec tests: a minimal valid stack and a writer for stack files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

MINIMAL: dict[str, Any] = {
    "name": "inferstack",
    "environment": "test",
    "target": "eks",
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


def write_stack(
    directory: Path, name: str, platform: Any, extra_config: dict[str, Any] | None = None
) -> Path:
    path = directory / f"Pulumi.{name}.yaml"
    config = {"inferstack:platform": platform, **(extra_config or {})}
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return path
