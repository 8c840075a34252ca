"""What `inferstack plan` writes for every committed stack, compared with a committed snapshot.

A change to the program, a renderer or a default shows its effect on real plans here, in review:
the diff of ``tests/snapshots/plans/<stack>/`` is the plan diff. When the change is intended, accept it
with ``make snapshots`` (``INFERSTACK_UPDATE_SNAPSHOTS=1`` on this test) and commit the new files.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.cli.main import app
from components.core.stackfile import STACKS_DIR, available_stacks
from components.kubernetes.images import PICKER_IMAGE, RUNTIME_IMAGES

SNAPSHOTS = Path(__file__).resolve().parents[1] / "snapshots" / "plans"
FILES = ("summary.md", "resources.json", "policy.json")
UPDATE = os.environ.get("INFERSTACK_UPDATE_SNAPSHOTS") == "1"
MAX_DIFF_LINES = 60
# Runtime images built by the program are tagged with a hash of runtime/ (and the mocks derive their
# digests from the tags): any runtime change moves them. That is tested where the tag is made
# (tests/components/test_aws.py); here it would only make every runtime commit a plan change.
_SOURCE_TAG = re.compile(r"\bsrc-[0-9a-f]{16}\b")
_BUILT_DIGEST = re.compile(rf"(/(?:{'|'.join((*RUNTIME_IMAGES, PICKER_IMAGE))}))@sha256:[0-9a-f]{{64}}")


def _normalised(text: str) -> str:
    return _BUILT_DIGEST.sub(r"\1@sha256:<built>", _SOURCE_TAG.sub("src-<runtime>", text))


def _plan(stack: str, out: Path) -> dict[str, str]:
    result = CliRunner().invoke(app, ["plan", "-s", stack, "--out", str(out)])
    assert result.exit_code in (0, 1), result.output  # 1: a mandatory policy verdict, still a plan
    return {name: _normalised((out / name).read_text()) for name in FILES}


@pytest.mark.parametrize("stack", available_stacks(STACKS_DIR))
def test_plan_of_committed_stack_matches_its_snapshot(stack: str, tmp_path: Path) -> None:
    planned = _plan(stack, tmp_path)
    where = SNAPSHOTS / stack
    if UPDATE:
        where.mkdir(parents=True, exist_ok=True)
        for name, text in planned.items():
            (where / name).write_text(text)
        return
    for name, text in planned.items():
        path = where / name
        assert path.is_file(), f"no snapshot {path}: run `make snapshots` and commit it"
        expected = path.read_text()
        if text != expected:
            diff = list(
                difflib.unified_diff(
                    expected.splitlines(), text.splitlines(), f"snapshot/{name}", f"plan/{name}", lineterm=""
                )
            )
            shown = "\n".join(diff[:MAX_DIFF_LINES])
            more = f"\n... {len(diff) - MAX_DIFF_LINES} more diff lines" if len(diff) > MAX_DIFF_LINES else ""
            pytest.fail(
                f"plan of {stack} changed ({name}); if intended, run `make snapshots` and commit "
                f"tests/snapshots/plans/{stack}/:\n{shown}{more}",
                pytrace=False,
            )
