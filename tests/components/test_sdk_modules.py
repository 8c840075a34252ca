"""A thinned SDK package answers every lookup exactly as the package would after a plain import, while loading
only the module that holds the name. Each case runs in a fresh interpreter: in this one, earlier tests may have
loaded the packages whole already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import pulumi_aws as aws, pulumi_kubernetes as k8s
from components.deploy import sdk_modules
sdk_modules.thin("pulumi_aws", "pulumi_kubernetes")
sdk_modules.thin("pulumi_aws")  # again: idempotent
loaded = lambda name: name in sys.modules
facts = {}
facts["vpc"] = aws.ec2.Vpc is sys.modules["pulumi_aws.ec2.vpc"].Vpc
facts["args_in_resource_module"] = aws.ec2.VpcArgs is sys.modules["pulumi_aws.ec2.vpc"].VpcArgs
facts["args_in_inputs"] = aws.ec2.LaunchTemplateNetworkInterfaceArgs.__module__ == "pulumi_aws.ec2._inputs"
facts["output_invoke"] = aws.ecr.get_authorization_token_output.__module__ == "pulumi_aws.ecr.get_authorization_token"
facts["k8s_class"] = isinstance(k8s.core.v1.Namespace, type) and k8s.core.v1.Namespace.__name__ == "Namespace"
facts["k8s_subpackage_thin"] = type(k8s.core.v1).__name__ == "ThinPackage"
facts["k8s_custom_resource"] = k8s.apiextensions.CustomResource.__name__ == "CustomResource"
facts["ec2_rest_unloaded"] = not loaded("pulumi_aws.ec2.transit_gateway")
facts["core_rest_unloaded"] = not loaded("pulumi_kubernetes.core.v1.Binding")
try:
    aws.kms.NoSuchThing
    facts["unknown"] = "found"
except AttributeError as error:
    facts["unknown"] = str(error)
facts["unknown_loaded_whole"] = loaded("pulumi_aws.kms.replica_key")
facts["dir_whole"] = {"Key", "Alias", "ReplicaKey", "KeyArgs"} <= set(dir(aws.kms))
facts["whole_keeps_identity"] = aws.kms.Key is sys.modules["pulumi_aws.kms.key"].Key
print(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


@pytest.mark.parametrize(
    "fact",
    ["vpc", "args_in_resource_module", "args_in_inputs", "output_invoke", "k8s_class", "k8s_custom_resource"],
)
def test_a_name_resolves_to_the_object_a_plain_import_gives(facts: dict[str, Any], fact: str) -> None:
    assert facts[fact] is True


def test_nested_service_packages_are_thin_too(facts: dict[str, Any]) -> None:
    assert facts["k8s_subpackage_thin"] is True


def test_a_lookup_loads_only_the_module_that_holds_the_name(facts: dict[str, Any]) -> None:
    assert facts["ec2_rest_unloaded"] is True
    assert facts["core_rest_unloaded"] is True


def test_a_name_the_layout_does_not_place_loads_the_package_whole_and_fails_as_a_plain_import_would(
    facts: dict[str, Any],
) -> None:
    assert facts["unknown_loaded_whole"] is True
    assert "NoSuchThing" in facts["unknown"]
    assert facts["whole_keeps_identity"] is True


def test_dir_lists_the_whole_package(facts: dict[str, Any]) -> None:
    assert facts["dir_whole"] is True
