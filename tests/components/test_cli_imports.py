"""`inferstack --help` and `inferstack size` answer at once: they never load a Pulumi SDK or the spec's
pydantic models (those take seconds; only `plan` needs them). Checked on the modules a fresh process has
loaded when the command returns, not on a timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs the command in a fresh interpreter as the `inferstack` script would, then lists what it imported.
PROBE = """
import json, sys
from components.cli import main as cli
out, sys.argv = sys.argv[1], ["inferstack", *sys.argv[2:]]
try:
    cli.main()
    code = 0
except SystemExit as exit:
    code = exit.code or 0
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

HEAVY = ("pulumi", "pulumi_aws", "pulumi_kubernetes", "pulumi_docker_build", "pulumi_policy", "grpc")
SPEC_MODELS = ("components.spec", "runtime.config", "components.core.stackfile")


def loaded_by(args: list[str], tmp_path: Path) -> set[str]:
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["code"] == 0, proc.stdout + proc.stderr
    return set(result["modules"])


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["size", "llama-3.1-8b"],
        ["size", "--list"],
        ["local", "--help"],
        ["plan", "--help"],
        ["cost", "--help"],
    ],
    ids=" ".join,
)
def test_help_and_size_load_no_pulumi_sdk_and_no_spec_models(args: list[str], tmp_path: Path) -> None:
    modules = loaded_by(args, tmp_path)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"`inferstack {' '.join(args)}` imported {heavy[:10]}"
    spec = sorted(m for m in modules if m in SPEC_MODELS)
    assert not spec, f"`inferstack {' '.join(args)}` imported {spec}"


def test_the_probe_sees_what_plan_loads(tmp_path: Path) -> None:
    """The control: `plan` does load the program, its SDKs and the spec, and the probe reports them. The AWS SDK
    comes with the EKS cluster layer only, which the program imports for a stack of target eks (its profile names
    the layer): a plan of target local never loads it."""
    modules = loaded_by(["plan", "-s", "local"], tmp_path)
    assert {"pulumi", "pulumi_kubernetes", "components.spec", "components.deploy.program"} <= modules
    assert "pulumi_aws" not in modules


def test_plan_loads_only_the_sdk_modules_its_resources_need(tmp_path: Path) -> None:
    """A generated SDK's service package imports all of its resource modules; the program looks each name up in
    the module that holds it instead (components.deploy.sdk_modules): the prod plan builds VPCs and namespaces
    without the ~200 other EC2 resources or core/v1's other kinds."""
    modules = loaded_by(["plan", "-s", "prod"], tmp_path)
    assert {
        "pulumi_aws.ec2.vpc",
        "pulumi_aws.eks.node_group",
        "pulumi_kubernetes.core.v1.Namespace",
    } <= modules
    unused = {
        "pulumi_aws.ec2.transit_gateway",
        "pulumi_aws.s3.bucket_object",
        "pulumi_kubernetes.core.v1.Binding",
    }
    assert not unused & modules
