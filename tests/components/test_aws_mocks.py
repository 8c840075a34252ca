"""The plan's mocks answer like AWS: ARNs of the right shape, and the invokes the program makes (only those)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components.deploy import synthesis as plan
from tests.components.helpers import cluster, minimal, write_stack
from tests.components.test_aws import EKS_STACKS, _of, _synth
from tests.stacks import load

ACCOUNT = plan.MOCK_ACCOUNT_ID


@pytest.mark.parametrize(
    ("type_", "name", "region", "arn"),
    [
        ("aws:iam/role:Role", "node", "us-east-1", f"arn:aws:iam::{ACCOUNT}:role/node"),
        ("aws:s3/bucket:Bucket", "models", "eu-west-1", "arn:aws:s3:::models"),
        ("aws:eks/cluster:Cluster", "c1", "eu-west-1", f"arn:aws:eks:eu-west-1:{ACCOUNT}:cluster/c1"),
        (
            "aws:ecr/repository:Repository",
            "a/b",
            "us-east-1",
            f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/a/b",
        ),
        (
            "aws:ec2/launchTemplate:LaunchTemplate",
            "lt",
            "us-east-1",
            f"arn:aws:ec2:us-east-1:{ACCOUNT}:launch-template/lt",
        ),
        (
            "aws:cloudwatch/logGroup:LogGroup",
            "/aws/x",
            "us-east-1",
            f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/x",
        ),
        ("aws:sqs/queue:Queue", "q", "us-east-1", f"arn:aws:sqs:us-east-1:{ACCOUNT}:q"),
        ("aws:kms/alias:Alias", "alias/k", "us-east-1", f"arn:aws:kms:us-east-1:{ACCOUNT}:alias/k"),
        (
            "aws:ec2/flowLog:FlowLog",
            "fl-1",
            "us-east-1",
            f"arn:aws:ec2:us-east-1:{ACCOUNT}:vpc-flow-log/fl-1",
        ),
        ("aws:iam/role:Role", "node", "cn-north-1", f"arn:aws-cn:iam::{ACCOUNT}:role/node"),
    ],
)
def test_mock_arns_take_the_shape_aws_gives_each_type(type_: str, name: str, region: str, arn: str) -> None:
    assert plan.mock_arn(type_, name, region) == arn


def _arn_inputs(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, value) of every input that names an ARN: keys ending in Arn/Arns, and KMS key references."""
    out: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}"
            if k.lower().endswith(("arn", "arns")) or k in ("kmsKeyId", "kmsKey", "kmsMasterKeyId"):
                out += [(here, x) for x in (v if isinstance(v, list) else [v])]
            else:
                out += _arn_inputs(v, here)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _arn_inputs(v, f"{path}[{i}]")
    return out


@pytest.mark.parametrize("name", EKS_STACKS)
def test_every_arn_in_the_plan_is_a_real_arn_of_the_stacks_region_and_account(
    name: str, tmp_path: Path
) -> None:
    spec = load(name).spec
    synthesis = _synth(name)
    plan.write(synthesis, tmp_path, "summary\n")
    written = json.loads((tmp_path / "resources.json").read_text())
    aws = [r for r in written if r["type"].startswith("aws:")]
    found = [(f"{r['type']} {r['name']}{p}", v) for r in aws for p, v in _arn_inputs(r["inputs"])]
    assert len(found) > 20
    for where, value in found:
        assert isinstance(value, str) and value.startswith("arn:aws:"), where
        assert "None" not in value, where
    # Roles, the cluster's key and role, the bucket in the engines' policy: all with this account and region.
    roles = [v for w, v in found if w.startswith("aws:eks/nodeGroup") and w.endswith(".nodeRoleArn")]
    assert roles and all(v.startswith(f"arn:aws:iam::{ACCOUNT}:role/") for v in roles)
    [cluster] = [r["inputs"] for r in aws if r["type"] == "aws:eks/cluster:Cluster"]
    assert cluster["roleArn"].startswith(f"arn:aws:iam::{ACCOUNT}:role/{spec.cluster_name}-cluster")
    assert cluster["encryptionConfig"]["provider"]["keyArn"].startswith(
        f"arn:aws:kms:{spec.cluster.region}:{ACCOUNT}:key/"
    )
    read = next(r for r in aws if r["name"] == f"{spec.cluster_name}-engine-read-models")
    bucket = next(
        s for s in json.loads(read["inputs"]["policy"])["Statement"] if s["Sid"] == "ListModelBucket"
    )
    assert re.fullmatch(r"arn:aws:s3:::[a-z0-9][a-z0-9.-]+[a-z0-9]", bucket["Resource"])
    # No input anywhere in the plan lost a value it was built from.
    assert "None" not in json.dumps([r["inputs"] for r in written if r["type"].startswith("aws:")])


@pytest.mark.parametrize("name", EKS_STACKS)
def test_the_ecr_repository_urls_and_launch_template_versions_come_from_the_mocks(name: str) -> None:
    spec = load(name).spec
    synthesis = _synth(name)
    for group in _of(synthesis, "aws:eks/nodeGroup:NodeGroup"):
        assert group.inputs["launchTemplate"]["version"] == "1"
    for build in _of(synthesis, "docker-build:index:Image"):
        url = build.inputs["tags"][0].rsplit(":", 1)[0]
        assert url.startswith(f"{ACCOUNT}.dkr.ecr.{spec.cluster.region}.amazonaws.com/{spec.cluster_name}/")


def test_the_mocks_answer_the_programs_invokes_and_refuse_any_other() -> None:
    mocks = plan._Mocks()
    identity, failures = mocks.call(
        pulumi.runtime.MockCallArgs("aws:index/getCallerIdentity:getCallerIdentity", {}, "")
    )
    assert identity["accountId"] == ACCOUNT and failures == []
    token, _ = mocks.call(
        pulumi.runtime.MockCallArgs(
            "aws:ecr/getAuthorizationToken:getAuthorizationToken", {"registryId": ACCOUNT}, ""
        )
    )
    assert token["userName"] == "AWS" and token["proxyEndpoint"].startswith(f"https://{ACCOUNT}.dkr.ecr.")
    with pytest.raises(NotImplementedError, match="aws:index/getRegion:getRegion"):
        mocks.call(pulumi.runtime.MockCallArgs("aws:index/getRegion:getRegion", {}, ""))


def test_mocks_answer_in_the_region_of_the_stacks_aws_provider(tmp_path: Path) -> None:
    region = "eu-west-1"
    write_stack(tmp_path, "eu", {**minimal(), "environment": "eu", "cluster": cluster(region=region)})
    synthesis = plan.synthesize(load("eu", tmp_path))
    [eks] = _of(synthesis, "aws:eks/cluster:Cluster")
    assert eks.inputs["encryptionConfig"]["provider"]["keyArn"].startswith(
        f"arn:aws:kms:{region}:{ACCOUNT}:key/"
    )
    builds = _of(synthesis, "docker-build:index:Image")
    assert builds
    for build in builds:
        assert build.inputs["registries"][0]["address"] == f"{ACCOUNT}.dkr.ecr.{region}.amazonaws.com"
