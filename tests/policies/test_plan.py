"""`inferstack plan` runs the pack offline: verdicts printed, exit 1 on a mandatory violation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.cli.main import app
from tests.policies.helpers import BROKEN, COMMITTED

runner = CliRunner()


def plan(stack: str, *extra: str, stacks_dir: Path = BROKEN) -> tuple[int, str]:
    result = runner.invoke(
        app, ["plan", "-s", stack, "--stacks-dir", str(stacks_dir), *extra], terminal_width=200
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    # Rich wraps at the console width: compare with whitespace collapsed.
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("stack", COMMITTED)
def test_committed_stacks_are_clean(stack: str) -> None:
    code, output = plan(stack, stacks_dir=Path("stacks"))
    assert code == 0, output
    assert "clean, no violations" in output


def test_local_target_has_nothing_to_check() -> None:
    code, output = plan("local", stacks_dir=Path("stacks"))
    assert code == 0 and "nothing to check" in output


def test_70b_fp16_on_one_l4_is_refused_with_the_breakdown() -> None:
    """The spec refuses it before synthesis (engine-model-fits-gpus catches the same in resources)."""
    code, output = plan("l4-70b")
    assert code == 2
    assert "Pulumi.l4-70b.yaml: models[0]: llama-3-70b does not fit g6.2xlarge" in output
    assert "does NOT fit" in output and "weights" in output and "quantize" in output


def test_latest_is_refused() -> None:
    code, output = plan("latest")
    assert code == 2
    assert "models[0].engine.image" in output and "never a moving tag" in output


def test_over_budget_fails_with_contributors(tmp_path: Path) -> None:
    code, output = plan("over-budget", "--out", str(tmp_path))
    assert code == 1, output
    assert "MANDATORY monthly-cost-within-budget" in output
    assert "over the budget of $60,000" in output and "Top contributors" in output
    assert "p5.48xlarge" in output and "raise budget.monthly_usd_cap" in output
    verdicts = json.loads((tmp_path / "policy.json").read_text())
    assert verdicts["failed"] and [v["rule"] for v in verdicts["verdicts"]] == ["monthly-cost-within-budget"]


def test_context_override_the_spec_cannot_see() -> None:
    code, output = plan("context-override")
    assert code == 1, output
    assert "MANDATORY engine-model-fits-gpus" in output
    assert "max_model_len 131,072" in output and "does NOT fit" in output


def test_production_risks() -> None:
    code, output = plan("prod-risks")
    assert code == 1, output
    for rule in (
        "no-spot-in-prod",
        "engine-min-replicas",
        "eks-api-endpoint-restricted",
        "public-ingress-requires-api-key",
    ):
        assert f"MANDATORY {rule}" in output


def test_dev_violations_are_advisory() -> None:
    code, output = plan("dev-over-budget")
    assert code == 0, output
    assert "ADVISORY monthly-cost-within-budget" in output and "advisory only" in output


def test_policy_config_file_overrides(tmp_path: Path) -> None:
    strict = tmp_path / "strict.json"
    strict.write_text(
        json.dumps({"all": "mandatory", "monthly-cost-within-budget": {"monthly_budget_usd": 1000}})
    )
    code, output = plan("dev-over-budget", "--policy-config", str(strict))
    assert code == 1 and "MANDATORY monthly-cost-within-budget" in output and "$1,000" in output
    relaxed = tmp_path / "relaxed.json"
    relaxed.write_text(json.dumps({"monthly-cost-within-budget": "advisory", "no-spot-in-prod": {"allow_spot": True},
                                   "engine-min-replicas": "disabled", "eks-api-endpoint-restricted": "advisory",
                                   "public-ingress-requires-api-key": "advisory"}))  # fmt: skip
    code, output = plan("prod-risks", "--policy-config", str(relaxed))
    assert code == 0, output
    assert "no-spot-in-prod" not in output and "engine-min-replicas" not in output


def test_committed_config_file_is_accepted() -> None:
    code, output = plan(
        "prod", "--policy-config", "policies/inference/config/prod.json", stacks_dir=Path("stacks")
    )
    assert code == 0 and "config: policies/inference/config/prod.json" in output


def test_bad_policy_config_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"engine-min-replicas": {"min": 2}}))
    code, output = plan("over-budget", "--policy-config", str(bad))
    assert code == 2
    assert "engine-min-replicas.min: unknown setting" in output and "Traceback" not in output
    code, output = plan("over-budget", "--policy-config", str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read the policy config" in output


@pytest.mark.parametrize("stack", ["karpenter", "byo-cluster"])
def test_valid_test_stacks_are_clean(stack: str) -> None:
    code, output = plan(stack)
    assert code == 0, output
    assert "clean, no violations" in output


def test_a_crashing_rule_is_a_verdict_not_a_traceback(monkeypatch) -> None:
    """A bug in a rule must neither hide the other verdicts nor pass silently."""
    from policies.inference import offline
    from policies.inference.rules import RULES, Rule
    from policies.inference.rules.base import Category, Severity

    def boom(resources, config):
        raise KeyError("spec")

    broken = Rule("exploding-rule", Category.HYGIENE, Severity.LOW, "explodes", "fix it", stack_check=boom)
    monkeypatch.setattr(offline, "RULES", (*RULES, broken))
    monkeypatch.setattr("policies.inference.config.BY_NAME", {r.name: r for r in (*RULES, broken)})
    verdicts = offline.evaluate([], {"all": "mandatory"})
    assert [(v.rule, v.level) for v in verdicts] == [("exploding-rule", "mandatory")]
    assert "failed to run (KeyError('spec'))" in verdicts[0].message


def test_moving_tag_is_refused_by_the_spec_with_the_list_the_policy_uses() -> None:
    code, output = plan("moving-tag")
    assert code == 2, output
    assert "'vllm/vllm-openai:nightly' is not pinned" in output
    from components.spec import MOVING_TAGS
    from policies.inference.rules.security import MUTABLE_TAGS

    assert set(MUTABLE_TAGS) == set(MOVING_TAGS)
