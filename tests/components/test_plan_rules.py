"""The plan-time rules: one registry, each module's rules in it, and the target cloud's rules reaching every shell
that reads a stack file (core cannot import the clouds, so the shells bring them)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pulumi
import pytest
from typer.testing import CliRunner

from components.base.problems import SpecError
from components.cli.main import app
from components.clouds.aws.cloud import EKS
from components.clouds.own_cluster import OWN_CLUSTER
from components.clouds.targets import PROFILES
from components.core import (
    capacity,
    cloud,
    disaggregation,
    endpoint,
    lifecycle,
    placement,
    plan_rules,
    stackfile,
    startup,
)
from components.core.planned import Planned
from components.core.weights import store
from components.deploy import program, synthesis
from components.spec import PlatformSpec
from tests.components.helpers import minimal, on_own_cluster, write_stack

RULE_MODULES = (placement, store, cloud, endpoint, startup, capacity, lifecycle, disaggregation)


def test_every_function_that_reads_a_planned_spec_is_a_registered_rule_once() -> None:
    """A rule written in its module but left out of its ``RULES`` would never run: each is registered, once."""
    written = {
        f
        for module in RULE_MODULES
        for _, f in inspect.getmembers(module, inspect.isfunction)
        if f.__module__ == module.__name__
        and [p.annotation for p in inspect.signature(f).parameters.values()] == ["Planned"]
    }
    assert written == set(plan_rules.RULES)
    assert len(plan_rules.RULES) == len(written)


def _eks_store_fields() -> dict[str, Any]:
    raw = minimal()
    raw["model_store"] = {"bucket": "mine", "reader_secret": "reader"}
    return raw


def test_the_model_store_rules_are_the_targets_clouds() -> None:
    """EKS refuses the fields of a bucket you bring; a cluster you bring needs one for hub models; local has none."""
    eks = PlatformSpec.model_validate(_eks_store_fields())
    assert [p.path for p in EKS.model_store_problems(eks)] == [
        "model_store.bucket",
        "model_store.reader_secret",
    ]
    assert OWN_CLUSTER.model_store_problems(eks) == []  # bucket named: what a cluster you bring asks for
    own = PlatformSpec.model_validate({**on_own_cluster(minimal()), "model_store": {}})
    [problem] = OWN_CLUSTER.model_store_problems(own)
    assert problem.path == "model_store.bucket" and "target kubernetes does not create" in problem.message
    assert OWN_CLUSTER.model_store_problems(PlatformSpec.model_validate(on_own_cluster(minimal()))) == []
    assert list(cloud.model_store(Planned(eks))) == []  # no cloud (target local, or a caller without clouds)
    assert [p.path for p in cloud.model_store(Planned(eks, cloud=EKS))] == [
        "model_store.bucket",
        "model_store.reader_secret",
    ]


def test_a_stack_is_checked_against_its_targets_cloud_the_caller_must_name_the_clouds(
    tmp_path: Path,
) -> None:
    write_stack(tmp_path, "mine", _eks_store_fields())
    with pytest.raises(TypeError, match="profiles"):
        stackfile.load("mine", tmp_path)  # type: ignore[call-arg]  # no default that skips the clouds' rules
    without_clouds = stackfile.load("mine", tmp_path, profiles={})  # only when a caller says so
    assert without_clouds.spec.model_store.bucket == "mine"
    with pytest.raises(
        SpecError, match=r"model_store\.bucket: on eks the model store is the bucket the stack"
    ):
        stackfile.load("mine", tmp_path, profiles=PROFILES)


@pytest.mark.parametrize(
    "argv",
    [["plan", "-s", "mine"], ["cost", "-s", "mine"], ["local", "up", "-s", "mine"]],
    ids=["plan", "cost", "local"],
)
def test_every_command_that_reads_a_stack_judges_it_against_its_cloud(
    tmp_path: Path, argv: list[str]
) -> None:
    write_stack(tmp_path, "mine", _eks_store_fields())
    result = CliRunner().invoke(app, [*argv, "--stacks-dir", str(tmp_path)], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert (
        "model_store.reader_secret: on eks the model store is the bucket the stack creates" in result.output
    )
    assert "Traceback" not in result.output


def test_the_pulumi_program_judges_the_stack_config_against_its_cloud(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`pulumi up` has only the stack config, and validates it itself (program.run) with the clouds: a stack a
    caller read without them is refused there, so nothing the cloud refuses is deployed."""
    write_stack(tmp_path, "mine", _eks_store_fields())
    unjudged = stackfile.load("mine", tmp_path, profiles={})
    monkeypatch.setattr(synthesis, "_run_program", lambda _decided: program.run())
    with pytest.raises(
        pulumi.RunError, match=r"model_store\.reader_secret: on eks the model store is the bucket"
    ):
        synthesis.synthesize(unjudged)
