"""The stacks the command-line benchmark generates stay valid as the spec grows its rules."""

from __future__ import annotations

from pathlib import Path

from bench.cli.run import generated_stack
from tests.stacks import load


def test_the_cli_benchmarks_generated_stack_passes_the_specs_validation(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    name = generated_stack(root, 10, tmp_path)  # more models than the prod stack has, so copies repeat

    stack = load(name, tmp_path)

    assert len(stack.spec.models) == 10
    adapters = [a.name for m in stack.spec.models for a in m.adapters]
    assert len(adapters) == len(set(adapters)) > 0
