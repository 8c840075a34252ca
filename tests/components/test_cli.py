"""`inferstack` end to end: plan on every committed stack, size, schema, and bad input without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from components.cli.main import SCHEMA_PATH, app, schema_text
from components.core.stackfile import STACKS_DIR, available_stacks
from tests.components.helpers import minimal, pod_templates, write_stack

runner = CliRunner()


EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "stacks"
COMMITTED = [
    pytest.param(directory, stack, id=f"{directory.parent.name}/{stack}")
    for directory in (STACKS_DIR, EXAMPLES_DIR)
    for stack in available_stacks(directory)
]


@pytest.mark.parametrize(("stacks_dir", "stack"), COMMITTED)
def test_plan_writes_manifests_resources_and_summary_for_every_committed_stack(
    stacks_dir: Path, stack: str, tmp_path: Path
) -> None:
    """Every stack in stacks/ and examples/stacks/ plans, and no mandatory policy fails on it."""
    result = runner.invoke(
        app, ["plan", "-s", stack, "--stacks-dir", str(stacks_dir), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    policy = json.loads((tmp_path / "policy.json").read_text())
    assert not policy["failed"]
    assert [v["rule"] for v in policy["verdicts"] if v["level"] == "mandatory"] == []
    assert "$/month" in result.output or "Monthly cost" in result.output
    summary = (tmp_path / "summary.md").read_text()
    assert f"# inferstack plan: {stack}" in summary
    resources = json.loads((tmp_path / "resources.json").read_text())
    manifests = sorted((tmp_path / "manifests").glob("*.yaml"))
    if stack == "local":
        assert resources == [] and manifests == []
        return
    assert resources and manifests
    assert len(manifests) == len({m.name for m in manifests})
    for path in manifests:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert len(docs) == 1, f"{path.name} holds {len(docs)} objects"
        assert list(docs[0])[:3] == ["apiVersion", "kind", "metadata"]
    workload = next(
        p
        for p in manifests
        if p.name.startswith(("deployment-", "leaderworkerset-")) and p.name.endswith("-engine.yaml")
    )
    pods = pod_templates(yaml.safe_load(workload.read_text()))
    port = next(iter(pods.values()))["spec"]["containers"][0]["ports"][0]
    assert port["containerPort"] == 8000 and isinstance(port["containerPort"], int)


def test_plan_never_writes_secret_values(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "-s", "prod", "--out", str(tmp_path)])
    assert result.exit_code == 0
    committed = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())["config"]
    ciphertexts = [v["secure"] for v in committed.values() if isinstance(v, dict) and "secure" in v]
    assert ciphertexts
    for path in [tmp_path / "resources.json", *tmp_path.glob("manifests/*.yaml")]:
        text = path.read_text()
        assert not any(c in text for c in ciphertexts)


def test_plan_of_a_bad_stack_exits_2_with_the_problem_and_writes_nothing(tmp_path: Path) -> None:
    spec = minimal()
    spec["gpu_pools"][0]["instance_type"] = "g6e.12xlarge"
    spec["models"][0]["engine"]["tensor_parallel_size"] = 6  # fills neither one 4-GPU node nor whole ones
    write_stack(tmp_path, "bad", spec)
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.cli.main",
            "plan",
            "-s",
            "bad",
            "--stacks-dir",
            str(tmp_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "models[0].engine.tensor_parallel_size" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists()


def test_plan_of_a_missing_stack_exits_2_and_lists_the_stacks(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "-s", "nope"])
    assert result.exit_code == 2
    assert "no such stack file" in result.output and "prod" in result.output


def test_plan_of_a_model_that_does_not_fit_prints_the_breakdown(tmp_path: Path) -> None:
    spec = minimal()
    spec["gpu_pools"][0]["instance_type"] = "g6.xlarge"
    spec["models"][0]["source"] = "meta-llama/Llama-3.1-70B-Instruct"
    write_stack(tmp_path, "big", spec)
    result = runner.invoke(app, ["plan", "-s", "big", "--stacks-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "does not fit g6.xlarge" in result.output
    assert "weights" in result.output and "KV budget" in result.output


def test_size_prints_a_breakdown_and_instances_ranked_by_cost() -> None:
    result = runner.invoke(app, ["size", "llama-3.1-70b", "--quant", "awq"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "320 KiB per token" in result.output
    assert "Cheapest fit" in result.output and "weights" in result.output
    assert "p5.48xlarge" in result.output


def test_size_of_an_unknown_model_exits_2_and_lists_known_ones() -> None:
    result = runner.invoke(app, ["size", "gpt-17"])
    assert result.exit_code == 2
    assert "unknown model 'gpt-17'" in result.output and "llama-3.1-70b" in result.output


def test_committed_schema_is_current() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), (
        "run `inferstack schema` and commit stacks/platform.schema.json"
    )


@pytest.mark.parametrize("stack", available_stacks(STACKS_DIR))
def test_stack_files_point_editors_at_the_schema(stack: str) -> None:
    first = (STACKS_DIR / f"Pulumi.{stack}.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=./platform.schema.json"


def test_the_first_deploy_section_lists_what_pulumi_up_waits_for_in_dependency_order(tmp_path: Path) -> None:
    """The plan said how long each engine may take, not what `pulumi up` waits for before it: the order comes
    from the program's own dependencies (cluster, nodes, add-ons, charts and store Jobs, engines, then the
    batcher behind the engines it batches), with the waits the program sets."""
    result = CliRunner().invoke(app, ["plan", "-s", "prod", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    section = (tmp_path / "summary.md").read_text().split("## First deploy", 1)[1].split("\n## ", 1)[0]
    steps = [line for line in section.splitlines() if line[:1].isdigit() and ". " in line]
    assert steps, section

    def step(text: str) -> int:
        return next(i for i, line in enumerate(steps) if text in line)

    assert step("EKS cluster: inferstack-prod") < step("vpc-cni") < step("inferstack-prod-system")
    assert step("inferstack-prod-system") < step("coredns")
    assert step("inferstack-prod-system") < step("kube-prometheus-stack")
    assert step("llama-3-70b-weights-") < step("llama-3-70b-engine (up to 24 min)")
    assert step("kube-prometheus-stack") < step("llama-3-70b-engine")
    assert step("bge-large-engine (up to 18 min)") < step("inferstack-batcher (up to 18 min)")


def test_the_plan_warns_when_a_model_spans_nodes_over_efa_in_an_image_without_the_efa_userspace() -> None:
    """prod-405b reserves EFA interfaces and huge pages for a two-node replica, but vllm/vllm-openai ships no
    libfabric or aws-ofi-nccl (vllm-project/vllm#55635): NCCL would talk TCP. The plan says so and which image to
    use instead; a stack on one node says nothing."""
    from components.cli import report
    from tests.stacks import load

    [warning] = [w for w in report.plan_report(load("prod-405b")).warnings if "EFA" in w]
    assert "llama-3-405b" in warning and "vllm/vllm-openai:v0.32.0" in warning and "TCP" in warning
    assert "engine.image" in warning
    assert not [w for w in report.plan_report(load("prod")).warnings if "EFA" in w]
