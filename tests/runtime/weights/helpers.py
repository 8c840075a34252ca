"""Small safetensors models written byte by byte, and the weights CLI run the way the Job runs it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.local import s3_server
from components.local.s3_server import LoopbackS3
from tests.conftest import REPO_ROOT


def write_safetensors(path: Path, tensors: dict[str, int], seed: int = 0) -> None:
    """A valid safetensors file of F32 vectors (name -> element count) with deterministic bytes."""
    header: dict[str, Any] = {}
    offset = 0
    for name, count in tensors.items():
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = bytes((seed + i * 7) % 251 for i in range(offset))
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def make_model(root: Path, shards: int = 2, seed: int = 0) -> Path:
    """A sharded model directory: config, tokenizer, index and ``shards`` safetensors files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "seed": seed}))
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "seed": seed}))
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{i}.weight": 4096, f"layers.{i}.bias": 64}
        write_safetensors(root / name, tensors, seed + i)
        weight_map |= dict.fromkeys(tensors, name)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "pytorch_model.bin").write_bytes(b"a pickle never goes to the store")
    return root


@dataclass
class Result:
    code: int
    report: dict[str, Any]
    stderr: str


def weights(s3: LoopbackS3, *args: str, env: dict[str, str] | None = None) -> Result:
    """``python -m runtime.weights ARGS`` against the loopback server."""
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.weights", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **s3.env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}
    return Result(proc.returncode, report, proc.stderr)


def new_bucket(s3: LoopbackS3) -> str:
    name = f"store-{uuid.uuid4().hex[:12]}"
    client(s3).create_bucket(Bucket=name)
    return name


def client(s3: LoopbackS3) -> Any:
    return s3_server.client(s3.endpoint)


def since(s3: LoopbackS3, mark: int, bucket: str) -> list[dict[str, Any]]:
    """Requests the server logged after the first ``mark`` ones, for objects of ``bucket``."""
    return [r for r in s3.logged()[mark:] if r["path"].startswith(f"/{bucket}/")]
