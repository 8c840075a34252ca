"""checkov (an outside scanner) over `inferstack plan`'s manifests: zero failed checks for every stack.

checkov lives in its own virtualenv (`make tools-venv`; it pins libraries the project cannot share). It runs
with BC_SKIP_MAPPING=TRUE so it never contacts its vendor, and reads the one skip file, .checkov.yaml.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from components.core.stackfile import STACKS_DIR, available_stacks
from components.deploy import synthesis as plan
from tests.stacks import load, synthesized

ROOT = Path(__file__).resolve().parents[2]
CHECKOV = ROOT / ".venv-tools" / "bin" / "checkov"
PULUMI_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target.value != "local"]
#: Committed example stacks outside stacks/ (the inference-extension mode's) are scanned too.
EXAMPLE_STACKS = {"inference-extension": ROOT / "examples" / "stacks"}
STACKS = [*PULUMI_STACKS, *EXAMPLE_STACKS]

pytestmark = [
    pytest.mark.skipif(not CHECKOV.exists(), reason="checkov is not installed: run `make tools-venv`"),
    pytest.mark.xdist_group("checkov"),  # the stacks' tests share one run of checkov: on one worker
]


def test_the_skip_file_gives_a_reason_for_every_skipped_check() -> None:
    text = (ROOT / ".checkov.yaml").read_text()
    config = yaml.safe_load(text)
    for check in config.get("skip-check", []):
        before = text[: text.index(f"- {check}")]
        assert f"# {check}" in before, f"{check} is skipped without a reason"


@pytest.fixture(scope="module")
def checks_by_stack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[str]]]:
    """One checkov run over every stack's manifests, its checks sorted by stack: "failed" and "passed", each
    "check id resource". One start, not one per stack: checkov takes seconds to start, scans in less."""
    root = tmp_path_factory.mktemp("checkov")
    for name in STACKS:
        plan.write(synthesized(name, EXAMPLE_STACKS.get(name, STACKS_DIR)), root / name, "")
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    result = subprocess.run(
        [str(CHECKOV), "--config-file", str(ROOT / ".checkov.yaml"), "-d", str(root), "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
        check=False,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no report (exit {result.returncode}):\n{result.stderr[-2000:]}")
    checks: dict[str, dict[str, list[str]]] = {name: {"failed": [], "passed": []} for name in STACKS}
    for part in report if isinstance(report, list) else [report]:
        for outcome in ("failed", "passed"):
            for check in part.get("results", {}).get(f"{outcome}_checks", []):
                stack = check["file_path"].lstrip("/").split("/", 1)[0]  # relative to the scanned directory
                checks[stack][outcome].append(
                    f"{check['check_id']} {check['resource']}: {check['check_name']}"
                )
    return checks


@pytest.mark.parametrize("name", STACKS)
def test_checkov_reports_no_failed_check(name: str, checks_by_stack: dict[str, dict[str, list[str]]]) -> None:
    checks = checks_by_stack[name]
    assert not checks["failed"], "\n".join(checks["failed"])
    assert len(checks["passed"]) > 100, f"checkov passed only {len(checks['passed'])} checks of {name}"
