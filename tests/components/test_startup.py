"""Startup budgets and rollouts: what `pulumi up` waits for, and how replicas are replaced without dropping below
the SLO minimum."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from components.base import catalog
from components.base.problems import SpecError
from components.cli import report as report_columns
from components.cli.main import app
from components.cli.report import plan_report
from components.core import rollout, startup
from components.core.decisions import Decisions, decide, efa_image_warnings
from components.core.placement import place
from components.core.stackfile import STACKS_DIR, available_stacks
from components.core.weights import coldstart, fetch
from components.deploy import synthesis as plan
from components.engines import profile
from components.spec import PlatformSpec
from runtime.config import EngineKind
from tests.components.helpers import (
    SOME_COMMIT,
    engine_deployments,
    engine_workloads,
    minimal,
    pod_templates,
    write_stack,
)
from tests.stacks import load, synthesized

PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]


@cache
def _synth(name: str) -> plan.Synthesis:
    return synthesized(name)


def _seconds(timeout: str) -> int:
    assert timeout.endswith("s"), timeout
    return int(timeout[:-1])


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_each_engine_deployment_waits_its_budget_and_its_probe_and_deadline_allow_the_same(name: str) -> None:
    stack = load(name)
    synthesis = _synth(name)
    workloads = engine_workloads(synthesis)
    resources = {
        r.inputs["metadata"]["name"]: r
        for r in synthesis.resources
        if r.type.endswith((":Deployment", ":LeaderWorkerSet"))
    }
    served, _ = stack.served
    for model in served.models:
        planned = stack.decisions.units[model.name].rollout
        budget = planned.startup.budget_s
        manifest = workloads[model.name]
        resource = resources[manifest["metadata"]["name"]]
        assert resource.timeouts is not None
        assert _seconds(resource.timeouts["create"]) == budget
        assert _seconds(resource.timeouts["update"]) == planned.steps * budget
        # A Deployment's pod, or a group's leader (the one with probes: it is ready when the whole group is).
        template = next(iter(pod_templates(manifest).values()))
        container = template["spec"]["containers"][0]
        probe = container["startupProbe"]
        assert budget <= probe["periodSeconds"] * probe["failureThreshold"] < budget + probe["periodSeconds"]
        if manifest["kind"] == "Deployment":
            assert manifest["spec"]["progressDeadlineSeconds"] == budget
            strategy = manifest["spec"]["strategy"]["rollingUpdate"]
        else:  # LeaderWorkerSet: no progress deadline; its rolling update replaces whole groups
            strategy = manifest["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
        assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (
            planned.max_surge,
            planned.max_unavailable,
        )


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_the_plan_summary_shows_each_models_budget_and_what_pulumi_up_waits(
    name: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(app, ["plan", "-s", name, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = (tmp_path / "summary.md").read_text()
    first_deploy = summary.split("## First deploy", 1)[1]
    stack = load(name)
    for model in stack.spec.models:
        planned = stack.decisions.models[model.name].rollout
        row = next(line for line in first_deploy.splitlines() if line.startswith(f"| {model.name} |"))
        assert f"{planned.startup.estimate_s:,} s" in row
        assert startup.minutes(planned.startup.budget_s) in row
        assert (
            f"{startup.minutes(planned.startup.budget_s)} / {startup.minutes(planned.update_timeout_s)}"
            in row
        )


def test_the_budget_adds_node_start_image_weights_and_engine_start_with_their_catalog_figures() -> None:
    stack = load("prod")
    model = stack.spec.models[0]  # Llama 3.1 70B AWQ, TP 2 on p5.48xlarge, streamed from the model store
    placement = stack.layout.placements[model.name]
    node, image, weights, engine = startup.estimate(model, placement)
    assert node.seconds == catalog.P5.node_start_s
    assert image.seconds == math.ceil(
        profile(EngineKind.VLLM).image_gib["gpu"] * 1024 / catalog.IMAGE_PULL_MIBPS
    )
    gib = placement.weights_gib
    assert 30 < gib < 45  # ~38 GiB of 4-bit weights
    # The weights term is the model store's cold start (fetch + load) by the path placement chose: one owner.
    way = fetch.decide(model, placement.instance)
    cold = coldstart.expected(way, gib, placement.instance, placement.gpus_per_replica).total_s
    assert weights.seconds == math.ceil(cold) and "by streamer" in weights.basis
    assert engine.seconds == profile(EngineKind.VLLM).init_s
    budget = startup.budget(model, placement)
    assert budget.estimate_s == sum(p.seconds for p in (node, image, weights, engine))
    assert budget.budget_s % 60 == 0
    assert budget.estimate_s * 1.25 <= budget.budget_s < budget.estimate_s * 1.25 + 60
    assert budget.budget_s > 600  # Pulumi's default 10-minute await would fail this first deploy


def test_the_weights_term_follows_the_fetch_path_a_node_cache_counting_its_first_fill() -> None:
    raw = minimal()
    raw["models"][0]["engine"]["kind"] = "sglang"  # reads a node cache: a fresh node misses it
    spec = PlatformSpec.model_validate(raw)
    placement = place(spec).placements["llama-8b"]
    model = spec.models[0]
    paths = {c.path: c.total_s for c in coldstart.compare(placement.weights_gib, placement.instance, 1)}
    fetch = startup.weights_fetch(model, placement)
    assert fetch.seconds == math.ceil(paths["node cache, first on node"]) and "by node-cache" in fetch.basis
    streamed = PlatformSpec.model_validate(minimal())
    on_the_same_node = place(streamed).placements["llama-8b"]
    assert on_the_same_node.instance == placement.instance
    assert startup.weights_fetch(streamed.models[0], on_the_same_node).seconds == math.ceil(paths["streamer"])


@pytest.mark.parametrize("name", PULUMI_STACKS)
def test_first_deploy_and_model_weights_tables_agree_on_each_models_weights(name: str) -> None:
    stack = load(name)
    report = plan_report(stack)
    for model, deploy, weights in zip(stack.spec.models, report.deploy, report.weights, strict=True):
        assert deploy[0] == weights[0] == model.name
        chosen = weights[report_columns.WEIGHTS_COLUMNS.index("cold start (fetch + load)")]
        assert chosen == f"**{deploy[report_columns.DEPLOY_COLUMNS.index('weights (fetch + load)')]}**"


def test_a_budget_set_below_the_estimate_is_one_located_error(tmp_path: Path) -> None:
    raw = minimal()
    raw["models"][0]["rollout"] = {"startup_budget_s": 120}
    write_stack(tmp_path, "tight", raw)
    with pytest.raises(SpecError) as caught:
        load("tight", tmp_path)
    text = caught.value.render()
    assert ": models[0].rollout.startup_budget_s: 120 s is less than the ~" in text
    assert "use at least" in text and "\n" not in text
    result = CliRunner().invoke(app, ["plan", "-s", "tight", "--stacks-dir", str(tmp_path)])
    assert result.exit_code == 2 and "models[0].rollout.startup_budget_s" in result.output


def test_a_budget_set_above_the_estimate_is_the_one_used(tmp_path: Path) -> None:
    raw = minimal()
    raw["models"][0]["rollout"] = {"startup_budget_s": 5400}
    write_stack(tmp_path, "patient", raw)
    stack = load("patient", tmp_path)
    planned = stack.decisions.models["llama-8b"].rollout
    assert planned.startup.budget_s == 5400 and planned.startup.set_in_spec
    deployment = engine_deployments(plan.synthesize(stack))["llama-8b"]
    assert deployment["spec"]["progressDeadlineSeconds"] == 5400


def _two_model_pool(max_nodes: int | None, min_replicas: int = 2) -> dict[str, Any]:
    raw = minimal()
    raw["gpu_pools"] = [{"name": "l40s", "instance_type": "g6e.12xlarge"}]  # 4 GPUs a node
    if max_nodes is not None:
        raw["gpu_pools"][0]["max_nodes"] = max_nodes
    raw["models"][0]["scaling"] = {"min_replicas": min_replicas, "max_replicas": 4}
    raw["models"].append(
        {
            "name": "qwen-7b",
            "source": "Qwen/Qwen2.5-7B-Instruct",
            "revision": SOME_COMMIT,
            "pool": "l40s",
            "engine": {"max_model_len": 8192, "max_num_seqs": 64},
            "scaling": {"min_replicas": min_replicas, "max_replicas": 3},
        }
    )
    return raw


def _decided(raw: dict[str, Any]) -> Decisions:
    spec = PlatformSpec.model_validate(raw)
    return decide(spec, place(spec))


def test_without_spare_gpus_a_rollout_replaces_one_at_a_time_and_the_plan_warns_with_the_fix() -> None:
    decided = _decided(_two_model_pool(None))
    llama = decided.models["llama-8b"].rollout
    assert (llama.max_surge, llama.max_unavailable, llama.keeps_minimum) == (0, 1, False)
    assert llama.steps == 4
    # qwen's 3 replicas leave one slot of its second node empty: it surges into that.
    qwen = decided.models["qwen-7b"].rollout
    assert (qwen.max_surge, qwen.max_unavailable, qwen.keeps_minimum) == (1, 0, True)
    [warning] = decided.warnings
    assert warning.startswith("models[0] (llama-8b): a rolling update stops one replica")
    assert "serves with 1, below scaling.min_replicas" in warning
    assert "set gpu_pools[0].max_nodes to 3" in warning


def test_spare_nodes_are_shared_between_the_pools_models_and_surge_never_exceeds_them() -> None:
    decided = _decided(_two_model_pool(4))  # 2 nodes in use at max replicas, 2 spare
    llama, qwen = (d.rollout for d in decided.models.values())
    assert (
        rollout.spare_replicas(decided.spec, decided.layout, decided.spec.models[0]) == 4
    )  # a spare node's 4
    assert (llama.max_surge, llama.max_unavailable, llama.steps, llama.keeps_minimum) == (4, 0, 1, True)
    assert (qwen.max_surge, qwen.max_unavailable) == (3, 0)  # capped at its max replicas
    assert decided.warnings == ()


def test_a_model_that_may_scale_to_zero_has_no_minimum_to_keep() -> None:
    assert _decided(_two_model_pool(None, min_replicas=0)).warnings == ()


def test_the_plan_prints_rollout_warnings_and_writes_them_to_the_summary(tmp_path: Path) -> None:
    write_stack(tmp_path, "tight", _two_model_pool(None))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["plan", "-s", "tight", "--stacks-dir", str(tmp_path), "--out", str(out)], terminal_width=400
    )
    assert result.exit_code == 0, result.output
    assert "warning: models[0] (llama-8b): a rolling update stops one replica" in result.output
    summary = (out / "summary.md").read_text()
    assert "## Warnings" in summary and "set gpu_pools[0].max_nodes to 3" in summary


def test_committed_stacks_plan_without_rollout_warnings() -> None:
    """The one warning a committed stack carries is prod-405b's EFA image (no vLLM image of a tag we could check
    ships the EFA userspace: ``components.core.decisions.efa_image_warnings``); no rollout of any stack warns."""
    for name in PULUMI_STACKS:
        decided = load(name).decisions
        efa = efa_image_warnings(decided.spec, decided.layout)
        assert [w for w in decided.warnings if w not in efa] == [], name


def test_the_readme_states_prods_first_deploy_budget_as_planned() -> None:
    stack = load("prod")
    budget = stack.decisions.models[stack.spec.models[0].name].startup
    text = Path("README.md").read_text()
    assert f"Llama 3.1 70B on p5.48xlarge it is {budget.budget_s // 60} minutes" in text
