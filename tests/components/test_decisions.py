"""A stack's decisions, made once per plan into one value (``components.core.decisions``): the value holds what each
decision module answers, and the plan reads it instead of asking them again."""

from __future__ import annotations

import pytest

from components.clouds import targets
from components.core import cost, lifecycle, rollout, scaling, startup
from components.core.decisions import Decisions, decide
from components.core.stackfile import STACKS_DIR, available_stacks, load
from components.core.weights import coldstart, fetch
from components.spec import PlatformSpec

STACKS = available_stacks(STACKS_DIR)


def _agrees_with_the_decision_modules(spec: PlatformSpec, decided: Decisions, which: str) -> None:
    """Each model's (or unit's) decisions are what its decision module answers when asked on its own."""
    layout = decided.layout if which == "models" else decided.served_layout
    table = decided.models if which == "models" else decided.units
    assert list(table) == [m.name for m in spec.models]
    for model in spec.models:
        d = table[model.name]
        placement = layout.placements[model.name]
        assert d.model is model and d.placement == placement
        assert d.pool == (layout.pools[placement.pool] if placement.pool else None)
        assert d.fetch == fetch.decide(model, placement.instance)
        assert d.weights_gib == startup.weights_gib(model, placement)
        assert list(d.cold_starts) == coldstart.compare(
            d.weights_gib, placement.instance, placement.gpus_per_replica
        )
        assert d.startup == startup.budget(model, placement)
        assert d.weights_phase == startup.weights_fetch(model, placement)
        assert d.rollout == rollout.plan(spec, layout, model)
        assert d.idle == startup.idle_state(model, placement)
        assert d.scaling == scaling.thresholds(model)


@pytest.mark.parametrize("name", STACKS)
def test_the_decisions_are_what_each_decision_module_answers(name: str) -> None:
    stack = load(name)
    spec, layout = stack.spec, stack.layout
    decided = stack.decisions
    assert decided.spec is spec and decided.layout is layout
    _agrees_with_the_decision_modules(spec, decided, "models")
    served, served_layout = lifecycle.expand(spec, layout)
    assert (decided.served_spec, decided.served_layout) == (served, served_layout)
    _agrees_with_the_decision_modules(decided.served_spec, decided, "units")
    assert list(decided.preparations) == lifecycle.preparations(spec, layout)
    assert list(decided.warnings) == rollout.warnings(spec, layout)
    infrastructure = targets.fixed_infrastructure(spec, layout)
    assert decided.bill(infrastructure) == cost.stack_cost(spec, layout, infrastructure)


def test_a_stack_without_versions_serves_its_models_as_decided() -> None:
    """No model has versions: the units are the models, decided once, not twice."""
    decided = load("dev").decisions
    assert not any(m.versions for m in decided.spec.models)
    assert decided.units is decided.models and decided.served_spec is decided.spec


def test_a_stack_is_decided_once_however_often_it_is_read() -> None:
    stack = load("prod")
    assert stack.decisions is stack.decisions
    assert stack.served == (stack.decisions.served_spec, stack.decisions.served_layout)


def test_deciding_the_same_spec_again_gives_the_same_value() -> None:
    stack = load("prod")
    assert decide(stack.spec, stack.layout) == stack.decisions
