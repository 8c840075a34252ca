"""A stack's routing is checked against the router's registry at plan time: names, weights and knobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from components.render.runtime_config import runtime_config
from components.spec import PlatformSpec, RoutingSpec
from runtime.config import RuntimeConfig, StrategyConfig, routing_scorers
from runtime.scheduling import builtin_knobs
from tests.components.helpers import minimal, write_stack


def _plan(stacks_dir: Path, stack: str) -> tuple[int, str]:
    """Exit status and what the command said (stderr, unwrapped: wide enough that no path is broken)."""
    result = subprocess.run(
        [sys.executable, "-m", "components.cli.main", "plan", "-s", stack, "--stacks-dir", str(stacks_dir)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "1000"},
    )
    assert "Traceback" not in result.stderr + result.stdout
    return result.returncode, " ".join(result.stderr.split())


def test_plan_refuses_a_weight_on_an_unknown_scorer_naming_the_field_and_the_known_scorers(
    tmp_path: Path,
) -> None:
    spec = minimal()
    spec["models"][0]["routing"] = {"strategy": "prefix_aware", "weights": {"prefx": 2.0}}
    write_stack(tmp_path, "typo", spec)
    status, said = _plan(tmp_path, "typo")
    assert status == 2
    known = ", ".join(sorted(routing_scorers()))
    where = tmp_path / "Pulumi.typo.yaml"
    assert f"{where}: models[0].routing.weights.prefx: unknown scorer 'prefx'; known: {known}" in said


def test_plan_refuses_an_unknown_strategy_with_the_known_ones(tmp_path: Path) -> None:
    spec = minimal()
    spec["models"][0]["routing"] = {"strategy": "prefix_awre"}
    write_stack(tmp_path, "typo", spec)
    status, said = _plan(tmp_path, "typo")
    assert status == 2
    assert "models[0].routing.strategy: unknown strategy 'prefix_awre'; known: round_robin" in said


def _routing(**routing: Any) -> RoutingSpec:
    return RoutingSpec.model_validate(routing)


def test_knobs_are_refused_outside_their_range_as_the_runtime_defines_it() -> None:
    with pytest.raises(ValidationError, match="load_guard_ratio"):
        _routing(load_guard_ratio=1.5)
    with pytest.raises(ValidationError, match="prefix_balance_factor"):
        _routing(prefix_balance_factor=0.5)
    with pytest.raises(ValidationError, match="prefix_block_tokens"):
        _routing(prefix_block_tokens=0)
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        _routing(weights={"load": -1.0})


def test_a_knob_no_scorer_of_the_strategy_reads_is_refused_with_the_scorer_that_would() -> None:
    with pytest.raises(
        ValidationError,
        match=r"prefix_balance_factor has no effect .*only the prefix or precise_prefix scorer",
    ):
        _routing(strategy="least_load", prefix_balance_factor=1.5)
    # the same knob counts once a weight brings in the scorer that reads it
    assert _routing(strategy="least_load", weights={"prefix": 1.0}, prefix_balance_factor=1.5)
    # the load guard is every affinity scorer's knob
    assert _routing(strategy="session", load_guard_ratio=0.5)


def test_routing_knobs_from_the_spec_reach_the_rendered_runtime_config() -> None:
    spec = minimal()
    spec["models"][0]["routing"] = {
        "strategy": "prefix_aware",
        "weights": {"prefix": 3.0, "kv": 0.5},
        "load_guard_ratio": 0.6,
        "prefix_balance_factor": 1.5,
        "prefix_block_tokens": 32,
    }
    rendered = runtime_config(PlatformSpec.model_validate(spec))
    reread = RuntimeConfig.model_validate_json(rendered.model_dump_json())
    strategy = reread.route(spec["models"][0]["name"]).strategy
    assert strategy == StrategyConfig(
        name="prefix_aware",
        weights={"prefix": 3.0, "kv": 0.5},
        load_guard_ratio=0.6,
        prefix_balance_factor=1.5,
        prefix_block_tokens=32,
    )


def test_the_spec_offers_the_knobs_their_records_mark_for_stack_files() -> None:
    marked = {name: knob for name, knob in builtin_knobs().items() if knob.stack}
    assert set(marked) == RoutingSpec.KNOBS
    fields = RoutingSpec.model_fields
    assert list(fields) == ["strategy", "weights", *sorted(marked), "priority"]
    for name, knob in marked.items():
        field = fields[name]
        assert (field.annotation, field.default, field.description) == (
            knob.type,
            knob.default,
            knob.description,
        )


def test_routing_defaults_are_the_runtime_defaults() -> None:
    spec, runtime = RoutingSpec(), StrategyConfig()
    for knob in RoutingSpec.KNOBS:
        assert getattr(spec, knob) == getattr(runtime, knob)


def test_schema_offers_editors_the_strategy_and_scorer_names() -> None:
    schema = RoutingSpec.model_json_schema()["properties"]
    assert "prefix_aware" in schema["strategy"]["enum"]
    assert schema["weights"]["propertyNames"]["enum"] == list(routing_scorers())
    for knob in RoutingSpec.KNOBS:
        assert schema[knob]["description"]
