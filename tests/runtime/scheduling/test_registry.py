"""The registry of scorers and filters, and named strategies as presets of it."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest

import runtime.scheduling.scorers
from runtime.config import StrategyConfig
from runtime.router.replicas import Breaker, Replica
from runtime.scheduling import (
    LOAD_GUARD_RATIO,
    PRESETS,
    Category,
    Context,
    Need,
    Scorer,
    blend,
    build,
    builtin_scorers,
    load_plugins,
    register_scorer,
    registered_filters,
    registered_knobs,
    registered_scorers,
)


def test_every_module_of_the_scorers_package_registers_a_builtin_scorer() -> None:
    modules = {m.name for m in pkgutil.iter_modules(runtime.scheduling.scorers.__path__)}
    assert {info.module.rsplit(".", 1)[1] for info in builtin_scorers().values()} == modules


def test_strategy_config_has_a_field_per_registered_knob_as_its_record_says() -> None:
    fields = StrategyConfig.model_fields
    assert list(fields) == ["name", "weights", "session_header", *registered_knobs()]
    for name, knob in registered_knobs().items():
        field = fields[name]
        assert (field.annotation, field.default, field.description) == (
            knob.type,
            knob.default,
            knob.description,
        )
    for name, info in builtin_scorers().items():
        assert info.knob_names <= set(fields), name


def test_affinity_scorers_are_subject_to_the_load_guard_knob() -> None:
    for info in builtin_scorers().values():
        assert (LOAD_GUARD_RATIO in info.knobs) == (info.category is Category.AFFINITY)


def test_every_preset_names_registered_scorers_and_filters() -> None:
    for name, preset in PRESETS.items():
        assert set(preset.weights) <= set(registered_scorers()), name
        assert set(preset.filters) <= set(registered_filters()), name


def test_scorers_report_what_they_declare() -> None:
    knobs = StrategyConfig()
    for name, info in builtin_scorers().items():
        assert set(info.make.from_knobs(knobs).report()) == set(info.reports), name


def test_configured_weights_override_and_extend_a_preset() -> None:
    assert blend("prefix_aware", {}) == {"prefix": 2.0, "adapter_affinity": 2.0, "load": 1.0}
    assert blend("prefix_aware", {"load": 3.0, "kv": 1.0}) == {
        "prefix": 2.0,
        "adapter_affinity": 2.0,
        "load": 3.0,
        "kv": 1.0,
    }
    assert blend("session", {"session": 2.0}) == {"session": 2.0, "load": 1.0}


def test_weighted_configured_weights_are_the_whole_blend() -> None:
    assert blend("weighted", {}) == {"load": 1.0, "latency": 1.0}
    assert blend("weighted", {"kv": 1.0}) == {"kv": 1.0}


def test_session_strategy_takes_its_configured_weights() -> None:
    """It used to ignore them: a weight of 0 now turns the session scorer off."""
    off = build(StrategyConfig(name="session", weights={"session": 0.0}))
    assert [s.name for s, _ in off.scorers] == ["load"]
    assert Need.SESSION not in off.needs


@pytest.mark.parametrize("name", ["kv_aware", "prefix_aware", "session", "weighted", "least_load"])
def test_unknown_weight_names_are_refused_by_every_strategy(name: str) -> None:
    """kv_aware and prefix_aware used to drop them silently."""
    with pytest.raises(
        ValueError, match=r"weights\.prefx: unknown scorer 'prefx'; known: .*kv, latency, load"
    ):
        build(StrategyConfig(name=name, weights={"prefx": 1.0}))


def test_what_a_strategy_needs_from_requests_comes_from_its_scorers() -> None:
    assert build(StrategyConfig(name="least_load")).needs == {Need.ENGINE_STATS}
    assert Need.PROMPT in build(StrategyConfig(name="prefix_aware")).needs
    assert Need.PROMPT in build(StrategyConfig(name="least_load", weights={"prefix": 1.0})).needs
    assert Need.SESSION in build(StrategyConfig(name="session")).needs


def test_a_scorer_name_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="scorer 'load' is registered twice"):

        @register_scorer("load", Category.DISTRIBUTION)
        class Impostor(Scorer):
            def score(self, endpoints, ctx):  # type: ignore[no-untyped-def]
                return [0.0] * len(endpoints)

    assert registered_scorers()["load"].module == "runtime.scheduling.scorers.load"


def test_a_plugin_that_cannot_be_imported_is_a_problem_naming_it() -> None:
    (problem,) = load_plugins(["tests.runtime.scheduling.no_such_plugin"])
    assert problem.field == "plugins[0]"
    assert "cannot import 'tests.runtime.scheduling.no_such_plugin'" in problem.message


def test_the_router_replica_is_a_replica_of_the_library() -> None:
    replicas = [Replica(f"http://10.0.0.{i}:8000", 4, Breaker(1, 1.0)) for i in range(2)]
    replicas[0].inflight = 3
    assert build(StrategyConfig(name="least_load")).pick(replicas, Context(model="m", now=1.0)) is replicas[1]


def test_the_package_docstring_names_every_module() -> None:
    """runtime/scheduling/__init__.py's layout is what a newcomer reads first: it cannot go stale. It names
    no scorer or filter: the registry finds them, so a new one is its module alone."""
    root = Path(runtime.scheduling.__file__).parent
    doc = runtime.scheduling.__doc__ or ""
    modules = {
        p.name if p.is_dir() else p.stem
        for p in root.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    for module in modules - {"__init__"}:
        assert (f"{module}.py" if (root / f"{module}.py").is_file() else f"{module}/") in doc, module
