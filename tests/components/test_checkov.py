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

pytestmark = pytest.mark.skipif(
    not CHECKOV.exists(), reason="checkov is not installed: run `make tools-venv`"
)


def test_the_skip_file_gives_a_reason_for_every_skipped_check() -> None:
    text = (ROOT / ".checkov.yaml").read_text()
    config = yaml.safe_load(text)
    for check in config.get("skip-check", []):
        before = text[: text.index(f"- {check}")]
        assert f"# {check}" in before, f"{check} is skipped without a reason"


# One checkov run per stack: in one run over every stack's manifests, checkov's graph links a NetworkPolicy to the
# pods of every file, so one stack's policies would pass another's "pods have a NetworkPolicy" check.
@pytest.mark.parametrize("name", [*PULUMI_STACKS, *EXAMPLE_STACKS])
def test_checkov_reports_no_failed_check(name: str, tmp_path: Path) -> None:
    synthesis = synthesized(name, EXAMPLE_STACKS.get(name, STACKS_DIR))
    plan.write(synthesis, tmp_path, "")
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    result = subprocess.run(
        [
            str(CHECKOV),
            "--config-file",
            str(ROOT / ".checkov.yaml"),
            "-d",
            str(tmp_path / "manifests"),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [
        f"{c['check_id']} {c['resource']}: {c['check_name']}"
        for r in reports
        for c in r.get("results", {}).get("failed_checks", [])
    ]
    passed = sum(r.get("summary", {}).get("passed", 0) for r in reports)
    assert not failed, "\n".join(failed)
    assert passed > 100, result.stderr[-2000:]
