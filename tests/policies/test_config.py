"""Policy config: per-environment enforcement, checked files, the committed configs match the stacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.core.stackfile import available_stacks
from policies.inference import config
from tests.stacks import load


def test_levels_per_environment() -> None:
    assert config.level_for("dev") == "advisory"
    assert config.level_for("staging") == "mandatory"
    assert config.level_for("prod") == "mandatory"


@pytest.mark.parametrize("stack", available_stacks())
def test_committed_config_matches_stack(stack: str) -> None:
    """CI passes config/<stack>.json to the pack; it must say what `inferstack plan` derives from the stack."""
    path = config.committed_path(stack)
    assert path.is_file(), f"write {path} with config.dumps(config.for_spec(spec))"
    assert json.loads(path.read_text()) == config.for_spec(load(stack).spec)
    config.load(path)


def test_resolve_and_merge() -> None:
    merged = config.merge(
        {"all": "mandatory", "monthly-cost-within-budget": {"monthly_budget_usd": 10}},
        {"monthly-cost-within-budget": "advisory", "engine-min-replicas": {"min_replicas": 3}},
    )
    resolved = config.resolve(merged)
    assert resolved["monthly-cost-within-budget"].level == "advisory"
    assert resolved["monthly-cost-within-budget"].settings == {"monthly_budget_usd": 10}
    assert resolved["engine-min-replicas"].settings == {"min_replicas": 3}
    assert resolved["images-pinned"].level == "mandatory"
    assert config.resolve({"all": "advisory"})["images-pinned"].level == "advisory"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"all": "block"}, "all: 'block' is not one of advisory, mandatory, disabled"),
        ({"no-such-rule": "advisory"}, "'no-such-rule' is not a rule of this pack"),
        (
            {"engine-min-replicas": {"min": 2}},
            "engine-min-replicas.min: unknown setting; engine-min-replicas takes",
        ),
        (
            {"engine-min-replicas": {"min_replicas": "two"}},
            "engine-min-replicas.min_replicas: 'two' is not a valid integer",
        ),
        ({"monthly-cost-within-budget": {"monthly_budget_usd": -5}}, "-5 is not a valid ['number', 'null']"),
        ({"engine-min-replicas": {"environments": "prod"}}, "'prod' is not a valid array"),
        ({"images-pinned": {"enforcementLevel": "strict"}}, "images-pinned.enforcementLevel: 'strict'"),
        ([1, 2], "a policy config is a JSON object"),
    ],
)
def test_bad_config_is_explained(tmp_path: Path, document: object, message: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(document))
    with pytest.raises(config.PolicyConfigError, match=None) as err:
        config.load(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_unreadable_config(tmp_path: Path) -> None:
    with pytest.raises(config.PolicyConfigError, match="cannot read"):
        config.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(config.PolicyConfigError, match="not valid JSON"):
        config.load(bad)
