"""The pack module imports and lists its policies without starting the analyzer server."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml
from pulumi_policy import ResourceValidationPolicy, StackValidationPolicy
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy
from pulumi_policy.secret import Secret

from components.core.redaction import REDACTED
from policies.inference import pack
from policies.inference.rules import RULES, Res

PACK_DIR = Path("policies/inference")


def test_main_imports_without_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    import pulumi_policy

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("importing the pack must not build PolicyPack (it starts a server and blocks)")

    monkeypatch.setattr(pulumi_policy, "PolicyPack", refuse)
    module = importlib.import_module("policies.inference.__main__")
    names = [p.name for p in module.POLICIES]
    assert names == [r.name for r in RULES]
    assert len(names) == len(set(names)) >= 20


def test_policies_carry_metadata() -> None:
    for rule, policy in zip(RULES, pack.policies(), strict=True):
        expected = ResourceValidationPolicy if rule.scope == "resource" else StackValidationPolicy
        assert isinstance(policy, expected)
        assert policy.description == rule.description and len(rule.description) > 30
        assert policy.remediation_steps == rule.remediation and rule.remediation
        assert policy.severity is not None
        assert re.fullmatch(r"[a-z0-9-]+", rule.name)
        if rule.settings:
            assert policy.config_schema is not None
            for setting in rule.settings:
                schema = policy.config_schema.properties[setting.name]
                assert schema["default"] == setting.default and schema["description"]


def test_threshold_rules_have_schemas() -> None:
    with_settings = {r.name for r in RULES if r.settings}
    for name in ("engine-requests-fit-node", "engine-min-replicas", "engine-startup-probe-budget",
                 "monthly-cost-within-budget", "aws-required-tags", "images-pinned"):  # fmt: skip
        assert name in with_settings


def test_pack_files() -> None:
    meta = yaml.safe_load((PACK_DIR / "PulumiPolicy.yaml").read_text())
    assert meta["runtime"]["name"] == "python"
    requirements = (PACK_DIR / "requirements.txt").read_text().split()
    assert "../.." in requirements and any(r.startswith("pulumi-policy") for r in requirements)


def test_plain_unwraps_analyzer_values() -> None:
    props = unknown_checking_proxy(
        {"a": [1.0, 2.5, {"b": UNKNOWN_STRING_VALUE}], "s": Secret("hunter2"), "n": {"x": True}}
    )
    # A secret reads as the plan's redaction, so a rule sees the same value online and offline.
    assert pack.plain(props) == {"a": [1, 2.5, {"b": None}], "s": REDACTED, "n": {"x": True}}


def test_unknown_values_do_not_break_rules() -> None:
    """During preview, outputs of resources not yet created are unknown; rules treat them as absent."""
    from tests.policies.helpers import crossguard

    cluster = Res(
        "aws:eks/cluster:Cluster",
        "c",
        "urn:c",
        {
            "vpcConfig": UNKNOWN_STRING_VALUE,
            "encryptionConfig": {"resources": ["secrets"], "provider": {"keyArn": UNKNOWN_STRING_VALUE}},
        },
    )
    assert crossguard("eks-secrets-encryption", [cluster]) == []


def test_readme_lists_every_rule() -> None:
    text = (PACK_DIR / "README.md").read_text()
    for rule in RULES:
        assert f"| `{rule.name}` |" in text and rule.description in text


def test_policies_never_import_the_cloud_sdks() -> None:
    """The pack and the offline runner read properties; pulumi_aws / pulumi_kubernetes stay out."""
    import subprocess
    import sys

    code = (
        "import sys; import policies.inference.__main__, policies.inference.offline; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi_aws', 'pulumi_kubernetes')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
