"""examples/ci/: the GitHub Actions workflow's and the GitLab job's plan commands, run as written (bash, their own
variables) with the real `inferstack` on two committed versions of a stack in a git repository. The posting steps
need GitHub's or GitLab's API; here they are checked to look for the marker diff.md starts with."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.components.helpers import minimal, write_stack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "ci"
STACK = "ci"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True,
        check=True,
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose main branch has the stack and whose head raises a model's max replicas and moves its pool
    to a bigger instance type (a node group replacement, and more money)."""
    where = tmp_path_factory.mktemp("repo")
    stacks = where / "stacks"
    stacks.mkdir()
    raw = minimal()
    write_stack(stacks, STACK, raw)
    _git(where, "init", "-q", "-b", "main")
    _git(where, "add", ".")
    _git(where, "commit", "-q", "-m", "the stack")
    _git(where, "checkout", "-q", "-b", "change")
    raw["models"][0]["scaling"]["max_replicas"] = 4
    raw["gpu_pools"][0]["instance_type"] = "g6e.2xlarge"
    write_stack(stacks, STACK, raw)
    _git(where, "commit", "-q", "-am", "more and bigger")
    return where


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The script in bash from the project's root, as CI runs it from a checkout (`make venv` made .venv)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop("COLUMNS", None)
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _github() -> dict[str, Any]:
    workflow = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    return dict(workflow["jobs"]["plan-diff"])


def test_the_github_workflow_plans_base_and_head_and_gates(repo: Path, tmp_path: Path) -> None:
    job = _github()
    steps = {s.get("name"): s for s in job["steps"]}
    plan = steps["Plan the base and the head"]["run"]
    assert "inferstack plan" in plan and "--against" in plan
    env = {k: str(v) for k, v in job["env"].items() if "${{" not in str(v)}
    out = tmp_path / "out"
    outputs = tmp_path / "github-output"
    env |= {
        "STACK": STACK,
        "STACKS_DIR": str(repo / "stacks"),
        "BASE": "main",  # what `origin/${{ github.base_ref }}` names on a runner
        "OUT": str(out),
        "GITHUB_OUTPUT": str(outputs),
    }
    done = _run(plan, env)
    assert done.returncode == 0, done.stdout + done.stderr  # the step records the gate; a later step fails
    assert outputs.read_text().strip() == "code=3"  # the node group is replaced and the cost rises
    md = (out / "diff.md").read_text()
    post = steps["Post the diff as one comment, updated on each push"]["run"]
    marker = re.search(r'marker="([^"]+)"', post)
    assert marker is not None
    assert md.startswith(marker.group(1).replace("$STACK", STACK) + "\n")
    assert "**replaced**" in md and "`instanceTypes`" in md
    assert "`scaling.max_replicas` `2` -> `4`" in md
    assert "$OUT/diff.md" in post and "PATCH" in post and "POST" in post
    assert "fail: --fail-on replacement" in done.stderr
    gate = steps["Gate (1 a mandatory policy verdict, 3 a --fail-on condition)"]
    assert gate["if"] == "steps.plan.outputs.code != '0'"


def test_the_gitlab_job_runs_the_same_plan(repo: Path, tmp_path: Path) -> None:
    job = yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())["plan-diff"]
    script = job["script"]
    start = next(i for i, line in enumerate(script) if line.startswith("BASE="))
    plan_lines = list(script[start : start + 3])
    assert any("inferstack plan" in line for line in plan_lines)
    env = {k: str(v) for k, v in job["variables"].items()}
    env |= {"STACK": STACK, "STACKS_DIR": str(repo / "stacks"), "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main"}
    # The job reads origin/<target>: here the repository is its own origin.
    if "origin" not in _remotes(repo):
        _git(repo, "remote", "add", "origin", str(repo))
    _git(repo, "fetch", "-q", "origin", "main")
    out = tmp_path / "out"
    script_text = "\n".join([*plan_lines, 'echo "code=$code"']).replace(
        'OUT="build/plan-diff/$STACK"', f'OUT="{out}"'
    )
    done = _run(script_text, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("code=3")
    md = (out / "diff.md").read_text()
    note = next(line for line in script if "marker=" in line)
    assert 'marker="<!-- inferstack-plan-diff: $STACK -->"' in note
    assert md.startswith(f"<!-- inferstack-plan-diff: {STACK} -->\n")
    assert script[-1] == 'exit "$code"'


def _remotes(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "remote"], capture_output=True, text=True, check=True
    ).stdout
