"""A stack's decisions, made once per plan into one value (``components.core.decisions``): the value holds what each
decision module answers, and the plan reads it instead of asking them again."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import components
import policies
from components.cli import report
from components.cli.main import app
from components.core import (
    cost,
    decisions,
    lifecycle,
    placement,
    rollout,
    scaling,
    stackfile,
    startup,
)
from components.core.decisions import Decisions, decide, efa_image_warnings
from components.core.stackfile import STACKS_DIR, available_stacks
from components.core.startup import minutes
from components.core.weights import coldstart, fetch
from components.core.weights.fetch import FetchPath
from components.deploy import synthesis as plan
from components.render import common
from components.render import weights as render_weights
from components.spec import PlatformSpec
from tests.components.helpers import pod_templates
from tests.stacks import load

STACKS = available_stacks(STACKS_DIR)


def _agrees_with_the_decision_modules(spec: PlatformSpec, decided: Decisions, which: str) -> None:
    """Each model's (or unit's) decisions are what its decision module answers when asked on its own."""
    layout = decided.layout if which == "models" else decided.served_layout
    table = decided.models if which == "models" else decided.units
    assert list(table) == [m.name for m in spec.models]
    for model in spec.models:
        d = table[model.name]
        placed = layout.placements[model.name]
        assert d.model is model and d.placement == placed
        assert d.pool == (layout.pools[placed.pool] if placed.pool else None)
        assert d.fetch == fetch.decide(model, placed.instance)
        assert d.weights_gib == startup.weights_gib(model, placed)
        assert list(d.cold_starts) == coldstart.compare(
            d.weights_gib, placed.instance, placed.gpus_per_replica
        )
        budget = startup.budget(model, placed)
        assert d.startup == budget
        assert d.weights_phase == startup.weights_fetch(model, placed)
        assert d.rollout == rollout.plan(spec, layout, model, budget)
        assert d.idle == startup.idle_state(model, placed, budget)
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
    rollouts = {
        m.name: rollout.plan(spec, layout, m, startup.budget(m, layout.placements[m.name]))
        for m in spec.models
    }
    efa = efa_image_warnings(spec, layout)
    assert list(decided.warnings) == [*rollout.warnings(spec, layout, rollouts), *efa]


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


# --- once per plan ------------------------------------------------------------------------------------------------
WATCHED = {
    placement: ("place",),
    fetch: ("decide",),
    coldstart: ("compare", "expected"),
    startup: ("budget", "estimate", "weights_fetch", "idle_state"),
    rollout: ("plan", "warnings", "spare_replicas"),
    scaling: ("thresholds",),
    cost: ("stack_cost",),
    lifecycle: ("expand", "preparations"),
}
"""The decision functions: after validation, only ``decide`` may call them, once per plan."""


@dataclass
class Calls:
    """Calls of the watched functions during one plan, by where they were made."""

    decide: int = 0
    validate: int = 0
    where: list[str] = field(default_factory=list)
    """Stack of what runs now: 'validate', 'decide' or nothing (everything else)."""
    outside: Counter[str] = field(default_factory=Counter)
    """Watched calls made by neither validation nor ``decide``."""
    by_validate: Counter[str] = field(default_factory=Counter)
    """Watched calls made by validation outside ``decide``: placement's, and the plan-time rules'."""
    by_decide: Counter[str] = field(default_factory=Counter)


def _everywhere(
    monkeypatch: pytest.MonkeyPatch, original: Callable[..., Any], wrapper: Callable[..., Any]
) -> None:
    """``wrapper`` for ``original`` in every loaded module that holds it (module attributes and from-imports)."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("components", "policies")):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                monkeypatch.setattr(module, attr, wrapper)


def _counting(monkeypatch: pytest.MonkeyPatch) -> Calls:
    for package in (components, policies):  # every module loaded, so its from-imports are wrapped too
        for found in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not found.name.endswith(".__main__"):  # entry points run when imported
                importlib.import_module(found.name)
    calls = Calls()

    def phase(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            setattr(calls, kind, getattr(calls, kind) + 1)
            calls.where.append(kind)
            try:
                return original(*args, **kwargs)
            finally:
                calls.where.pop()

        return wrapped

    def leaf(key: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if "decide" in calls.where:
                calls.by_decide[key] += 1
            elif "validate" in calls.where:
                calls.by_validate[key] += 1
            else:
                calls.outside[key] += 1
            return original(*args, **kwargs)

        return wrapped

    for module, names in WATCHED.items():
        for name in names:
            original = getattr(module, name)
            _everywhere(monkeypatch, original, leaf(f"{module.__name__.rsplit('.', 1)[-1]}.{name}", original))
    _everywhere(monkeypatch, stackfile.validate, phase("validate", stackfile.validate))
    _everywhere(monkeypatch, decisions.decide, phase("decide", decisions.decide))
    return calls


@pytest.mark.parametrize("name", ["prod", "staging", "kind", "local"])
def test_a_plan_decides_once_and_reads_the_decisions_everywhere_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    """`inferstack plan` validates the stack file once and decides once, while validating: placement decides each
    model's fetch path with its instance, ``decide`` the rest, and the plan-time rules, the report, the Pulumi
    program, its components and the renderers ask no decision module again (staging serves versions as units;
    local has no program)."""
    expected = load(name).decisions  # made before the counting starts
    per_model = len(expected.spec.models)
    per_unit = 0 if expected.units is expected.models else len(expected.served_spec.models)
    calls = _counting(monkeypatch)
    result = CliRunner().invoke(app, ["plan", "-s", name, "--out", str(tmp_path)])
    assert result.exit_code in (0, 1), result.output  # 1: a mandatory policy verdict, still a plan
    assert (calls.validate, calls.decide) == (1, 1)
    # The bill is the one decision made outside: priced once, by the report, with the target profile's prices.
    assert calls.outside == Counter({"cost.stack_cost": 1}), "decided again outside components.core.decisions"
    # One fetch path per model, decided by placement with its instance, and one per unit where it is placed.
    assert (calls.by_validate["fetch.decide"], calls.by_decide["fetch.decide"]) == (per_model, per_unit)
    assert calls.by_decide["startup.budget"] == per_model + per_unit
    assert calls.by_validate["startup.budget"] == 0  # the startup rule reads the decided budgets
    assert calls.by_decide["scaling.thresholds"] == per_model + per_unit
    assert calls.by_decide["placement.place"] == 0  # placement is validation's: the Layout
    assert calls.by_decide["cost.stack_cost"] == 0


def test_the_counting_sees_a_decision_made_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The check above fails where it should: a renderer that asks for a fetch path again is caught."""
    models = len(load("kind").spec.models)  # one Deployment each: one pod template
    calls = _counting(monkeypatch)
    from components.render import engine

    ask_again = engine.pod_template

    def pod_template(spec: Any, unit: Any, *args: Any, **kwargs: Any) -> Any:
        fetch.decide(unit.model, unit.placement.instance)
        return ask_again(spec, unit, *args, **kwargs)

    monkeypatch.setattr(engine, "pod_template", pod_template)
    result = CliRunner().invoke(app, ["plan", "-s", "kind", "--out", str(tmp_path)])
    assert result.exit_code in (0, 1), result.output
    assert calls.outside["fetch.decide"] == models


# --- the report and the renderers show the decisions ----------------------------------------------------------
def _by_name(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


@pytest.mark.parametrize("name", ["prod", "staging", "dev", "prod-405b"])
def test_the_report_and_the_rendered_objects_show_the_decisions(name: str) -> None:
    stack = load(name)
    decided = stack.decisions
    rep = report.plan_report(stack)
    for model, weights, deploy, idle in zip(
        decided.spec.models, rep.weights, rep.deploy, rep.idle, strict=True
    ):
        d = decided.models[model.name]
        assert weights[report.WEIGHTS_COLUMNS.index("fetch")].startswith(d.fetch.path.value)
        assert weights[report.WEIGHTS_COLUMNS.index("cold start (fetch + load)")] == (
            f"**{d.weights_phase.seconds:,} s**"
        )
        assert deploy[report.DEPLOY_COLUMNS.index("startup budget")].startswith(minutes(d.startup.budget_s))
        assert deploy[report.DEPLOY_COLUMNS.index("rollout")] == (
            f"surge {d.rollout.max_surge}, unavailable {d.rollout.max_unavailable}"
        )
        assert idle[report.IDLE_COLUMNS.index("cold start (s, est.)")] == f"{d.startup.estimate_s:,}"
        assert f"{model.name} weights: {d.fetch.reason}" in rep.notes
    assert rep.warnings == list(decided.warnings)
    manifests = plan.synthesize(stack).kubernetes_manifests()
    workloads = {**_by_name(manifests, "Deployment"), **_by_name(manifests, "LeaderWorkerSet")}
    scalers = _by_name(manifests, "ScaledObject")
    for unit in decided.units.values():
        engine_name = common.engine_name(unit.model.name)
        workload = workloads[engine_name]
        for template in pod_templates(workload).values():
            pod = template["spec"]
            [init] = [c for c in pod["initContainers"] if c["name"] in ("check-weights", "fetch-weights")]
            assert init["name"] == (
                "check-weights" if unit.fetch.path is FetchPath.STREAMER else "fetch-weights"
            )
            cache = [v for v in pod["volumes"] if v["name"] == "model-cache"]
            assert [v["hostPath"]["path"] for v in cache] == (
                [render_weights.cache_host_dir(unit.fetch)] if unit.fetch.medium else []
            )
            engine = pod["containers"][0]
            if "startupProbe" in engine:
                probe = engine["startupProbe"]
                assert probe["periodSeconds"] * probe["failureThreshold"] >= unit.startup.budget_s
        if workload["kind"] == "Deployment":
            assert workload["spec"]["progressDeadlineSeconds"] == unit.startup.budget_s
            assert workload["spec"]["strategy"]["rollingUpdate"] == {
                "maxSurge": unit.rollout.max_surge,
                "maxUnavailable": unit.rollout.max_unavailable,
            }
        scaler = scalers.get(engine_name)
        if scaler is not None:
            t = unit.scaling
            assert (scaler["spec"]["minReplicaCount"], scaler["spec"]["maxReplicaCount"]) == (
                t.min_replicas,
                t.max_replicas,
            )
            assert scaler["spec"]["cooldownPeriod"] == t.idle_before_zero_s
            assert scaler["spec"]["scaleTargetRef"]["kind"] == workload["kind"]
