"""No two committed stacks ask AWS for the same name, and the pack's rule keeps every stack's names its own.

The pack judges one stack at a time (``aws-names-derive-from-cluster``); this test judges them together: every
account-scoped physical name the rendered plans ask for (ECR repositories, KMS aliases, log groups, placement
groups, IAM roles, EKS clusters, S3 buckets), in its scope (the region, or the account for IAM, or every account
for S3), belongs to one stack. prod and prod-405b both asked for 'inferstack/prod/*' repositories, so the second
`pulumi up` in an account failed.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from components.core.stackfile import STACKS_DIR, available_stacks
from components.spec import Target, eks_section
from policies.inference.rules import names
from tests.stacks import load, synthesized

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "stacks"

EKS_STACKS = tuple(
    (name, directory)
    for directory in (STACKS_DIR, EXAMPLES_DIR)
    for name in available_stacks(directory)
    if load(name, directory).spec.target is Target.EKS
)
PARENT_SCOPED = {
    "aws:eks/nodeGroup:NodeGroup": "nodeGroupName",  # in its cluster
    "aws:eks/addon:Addon": "addonName",  # in its cluster
    "aws:iam/rolePolicy:RolePolicy": "name",  # in its role
}
"""Named resources whose name is unique only inside their parent (which is account-scoped and checked)."""
NAME_KEYS = ("name", "bucket", "replicationGroupId", "nodeGroupName", "addonName", "roleName", "namePrefix")
"""Input properties that hold a physical name in the AWS resources the program registers."""


@cache
def _named(stack: str, directory: str) -> tuple[tuple[str, str, str, str], ...]:
    """(type, scope, name, stack) for every physical name the stack's AWS resources ask for, the EKS cluster's
    among them."""
    spec = load(stack, Path(directory)).spec
    region = eks_section(spec).region
    out: list[tuple[str, str, str, str]] = []
    for r in synthesized(stack, Path(directory)).resources:
        if r.type in names.GLOBAL_NAMES:
            out.append((r.type, "global", r.inputs[names.GLOBAL_NAMES[r.type]], stack))
        elif r.type in names.ACCOUNT_SCOPED_NAMES or r.type == names.CLUSTER:
            value = r.inputs.get(names.ACCOUNT_SCOPED_NAMES.get(r.type, "name"))
            if value:
                scope = "account" if r.type in names.ACCOUNT_WIDE else region
                out.append((r.type, scope, value, stack))
    return tuple(out)


def test_the_eks_stacks_are_found() -> None:
    assert {"prod", "prod-405b"} <= {name for name, _ in EKS_STACKS}


@pytest.mark.parametrize(("stack", "directory"), EKS_STACKS)
def test_every_named_aws_resource_is_in_the_rules_tables(stack: str, directory: Path) -> None:
    """A new resource type with a physical name must be placed in a scope (or the collision check misses it)."""
    known = {*names.ACCOUNT_SCOPED_NAMES, *names.GLOBAL_NAMES, names.CLUSTER, *PARENT_SCOPED}
    for r in synthesized(stack, directory).resources:
        if r.type.startswith("aws:") and r.custom:
            named = [k for k in NAME_KEYS if isinstance(r.inputs.get(k), str)]
            if named and r.type not in known and not r.type.startswith("aws:s3/bucket"):
                pytest.fail(f"{r.type} {r.name} sets {named}: add it to policies/inference/rules/names.py")


def test_no_two_committed_stacks_ask_for_one_account_scoped_name() -> None:
    owners: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for stack, directory in EKS_STACKS:
        for kind, scope, value, who in _named(stack, str(directory)):
            owners[(kind, scope, value)].add(who)
    shared = {key: sorted(who) for key, who in owners.items() if len(who) > 1}
    assert not shared, f"names two stacks would both create in one account: {shared}"
    ecr = [key for key in owners if key[0] == "aws:ecr/repository:Repository"]
    assert ecr  # the check sees the repositories


@pytest.mark.parametrize(("stack", "directory"), EKS_STACKS)
def test_every_account_scoped_name_derives_from_the_cluster(stack: str, directory: Path) -> None:
    cluster = load(stack, directory).spec.cluster_name
    for kind, scope, value, _ in _named(stack, str(directory)):
        if scope != "global":
            assert names.derives_from(value, cluster), (kind, value)
