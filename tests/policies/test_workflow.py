"""The CI example: make test, a plan per stack with the pack's config, preview with the pack."""

from __future__ import annotations

from pathlib import Path

import yaml

from components.core.stackfile import available_stacks

WORKFLOW = Path(".github/workflows/ci.yml")


def _runs(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) for step in job["steps"])


def test_workflow_runs_tests_plans_and_previews() -> None:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert "pull_request" in doc[True] or "pull_request" in doc.get("on", {})  # YAML 1.1 reads `on` as True
    jobs = doc["jobs"]
    assert "make test" in _runs(jobs["test"])
    planned = set(jobs["plan"]["strategy"]["matrix"]["stack"])
    assert planned == set(available_stacks()) - {"local"}
    plan = _runs(jobs["plan"])
    assert "inferstack plan -s ${{ matrix.stack }}" in plan
    assert "--policy-config policies/inference/config/${{ matrix.stack }}.json" in plan
    preview = _runs(jobs["preview"])
    assert "pulumi preview" in preview and "--policy-pack policies/inference" in preview
    assert "--policy-pack-config policies/inference/config/${{ matrix.stack }}.json" in preview
    for stack in jobs["preview"]["strategy"]["matrix"]["stack"]:
        assert Path(f"policies/inference/config/{stack}.json").is_file()
