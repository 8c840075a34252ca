"""AWS security under the mocks: flow logs per VPC, customer-managed keys for the bucket, ECR and node disks
(rotating, with key policies that let only their service use them), and ECR pushes authenticated by a token
that stays secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components.clouds.aws import audit, decisions, iam, key_policies
from components.core.redaction import REDACTED
from components.deploy import synthesis as plan
from components.kubernetes import images
from tests.components.test_aws import EKS_STACKS, _key_arn, _named, _of, _synth
from tests.stacks import load


def _policy(resource: plan.Resource, key: str = "policy") -> dict[str, Any]:
    document: dict[str, Any] = json.loads(resource.inputs[key])
    return document


@pytest.mark.parametrize("name", EKS_STACKS)
def test_every_vpc_sends_its_flow_logs_to_a_kms_encrypted_log_group_kept_a_year(name: str) -> None:
    spec = load(name).spec
    synthesis = _synth(name)
    region = spec.cluster.region
    vpcs = _of(synthesis, "aws:ec2/vpc:Vpc")
    flow_logs = [r.inputs for r in _of(synthesis, "aws:ec2/flowLog:FlowLog")]
    assert sorted(f["vpcId"] for f in flow_logs) == sorted(f"{v.name}-id" for v in vpcs)
    [flow_log] = flow_logs
    group_name = decisions.flow_log_group(spec)
    group = next(
        r.inputs for r in _of(synthesis, "aws:cloudwatch/logGroup:LogGroup") if r.inputs["name"] == group_name
    )
    assert group["retentionInDays"] == decisions.FLOW_LOG_RETENTION_DAYS >= 365
    assert group["kmsKeyId"] == _key_arn(synthesis, spec, "logs")
    group_arn = plan.mock_arn("aws:cloudwatch/logGroup:LogGroup", group_name, region)
    assert flow_log["trafficType"] == "ALL"
    assert flow_log["logDestinationType"] == "cloud-watch-logs"
    assert flow_log["logDestination"] == group_arn
    # The delivery role: trusted by VPC Flow Logs for this account only, writing into that one group.
    role = _named(synthesis, "aws:iam/role:Role", f"{spec.cluster_name}-flow-logs")
    assert flow_log["iamRoleArn"].startswith(f"arn:aws:iam::{plan.MOCK_ACCOUNT_ID}:role/{role.name}")
    [trust] = _policy(role, "assumeRolePolicy")["Statement"]
    assert trust["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": plan.MOCK_ACCOUNT_ID}
    delivery = _policy(
        _named(synthesis, "aws:iam/rolePolicy:RolePolicy", f"{spec.cluster_name}-flow-logs-deliver")
    )
    write = next(s for s in delivery["Statement"] if "logs:PutLogEvents" in s["Action"])
    assert write["Resource"] == [group_arn, f"{group_arn}:log-stream:*"]
    assert audit.audit(delivery) == []


@pytest.mark.parametrize("name", EKS_STACKS)
def test_bucket_ecr_and_node_disks_use_their_own_rotating_customer_managed_keys(name: str) -> None:
    spec = load(name).spec
    synthesis = _synth(name)
    keys = {r.name: r.inputs for r in _of(synthesis, "aws:kms/key:Key")}
    assert set(keys) == {f"{spec.cluster_name}-{purpose}" for purpose in decisions.kms_keys(spec)}
    assert all(k["enableKeyRotation"] is True for k in keys.values())
    arns = {purpose: _key_arn(synthesis, spec, purpose) for purpose in decisions.kms_keys(spec)}
    assert len(set(arns.values())) == len(arns)  # one key per purpose
    sse = {
        r.name: r.inputs
        for r in _of(
            synthesis,
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        )
    }
    # The model bucket with the models key; the batch files' bucket (batch.enabled) with a key of its own.
    buckets = {f"{spec.cluster_name}-models": "models"}
    if spec.batch.enabled:
        buckets[f"{spec.cluster_name}-batches"] = "batches"
    assert set(sse) == set(buckets)
    for bucket, purpose in buckets.items():
        assert (
            sse[bucket]["rules"][0]["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"] == arns[purpose]
        )
        assert sse[bucket]["rules"][0]["bucketKeyEnabled"] is True
    repositories = _of(synthesis, "aws:ecr/repository:Repository")
    assert len(repositories) == len(images.runtime_images(spec))
    for repo in repositories:
        assert repo.inputs["encryptionConfigurations"] == [
            {"encryptionType": "KMS", "kmsKey": arns["images"]}
        ]
    templates = _of(synthesis, "aws:ec2/launchTemplate:LaunchTemplate")
    assert templates
    for template in templates:
        ebs = template.inputs["blockDeviceMappings"][0]["ebs"]
        assert (ebs["encrypted"], ebs["kmsKeyId"]) == ("true", arns["disks"])


def _allowed(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in document["Statement"] if s["Effect"] == "Allow"]


@pytest.mark.parametrize("name", EKS_STACKS)
def test_key_policies_let_only_the_service_of_each_purpose_use_the_key(name: str) -> None:
    spec = load(name).spec
    synthesis = _synth(name)
    region = spec.cluster.region
    root = iam.account_root(region, plan.MOCK_ACCOUNT_ID)
    data = set(key_policies.KMS_DATA_ACTIONS) | {"kms:CreateGrant"}
    # The EKS Secrets key: no kms:*, use delegated to IAM (where only the cluster role's policy grants it).
    secrets = _policy(_named(synthesis, "aws:kms/key:Key", f"{spec.cluster_name}-secrets"))
    assert audit.audit(secrets, key_policy=True) == []
    assert {json.dumps(s["Principal"]) for s in _allowed(secrets)} == {json.dumps({"AWS": root})}
    for purpose, service in (("models", "s3"), ("images", "ecr"), ("disks", "ec2"), ("logs", None)):
        document = _policy(_named(synthesis, "aws:kms/key:Key", f"{spec.cluster_name}-{purpose}"))
        assert audit.audit(document, key_policy=True) == [], purpose
        statements = _allowed(document)
        admin = next(s for s in statements if s["Sid"] == "AccountAdministersThroughIam")
        assert admin["Principal"] == {"AWS": root}
        assert not data & set(admin["Action"]) - {"kms:DescribeKey"}, "administration grants no data use"
        using = [s for s in statements if data & set(s["Action"]) - {"kms:DescribeKey"}]
        for statement in using:
            if statement["Principal"] == {"AWS": root}:
                via = statement["Condition"]["StringEquals"]["kms:ViaService"]
                assert via == iam.via_service(service or "", region), purpose
        if purpose in ("models", "images"):  # the account's principals only, and only through the service
            assert {json.dumps(s["Principal"]) for s in using} == {json.dumps({"AWS": root})}, purpose
        if purpose == "disks":  # whoever launches the node (Auto Scaling, spot, Karpenter), via EC2 only
            assert {json.dumps(s["Principal"]) for s in using} == {json.dumps({"AWS": "*"})}
            for statement in using:
                assert statement["Condition"]["StringEquals"] == {
                    "kms:CallerAccount": plan.MOCK_ACCOUNT_ID,
                    "kms:ViaService": iam.via_service("ec2", region),
                }
        if purpose == "logs":
            [logs] = using
            assert logs["Principal"] == {"Service": f"logs.{region}.amazonaws.com"}
            groups = [decisions.flow_log_group(spec), decisions.control_plane_log_group(spec)]
            assert sorted(logs["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]) == sorted(
                plan.mock_arn("aws:cloudwatch/logGroup:LogGroup", g, region) for g in groups
            )
    # Engines decrypt weights through S3 only, with the models key only.
    read = _policy(
        _named(synthesis, "aws:iam/rolePolicy:RolePolicy", f"{spec.cluster_name}-engine-read-models")
    )
    [decrypt] = [s for s in read["Statement"] if any(a.startswith("kms:") for a in s["Action"])]
    assert decrypt["Action"] == ["kms:Decrypt"]
    assert decrypt["Resource"] == _key_arn(synthesis, spec, "models")
    assert decrypt["Condition"] == {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}


@pytest.mark.parametrize("name", EKS_STACKS)
def test_images_are_pushed_with_an_ecr_token_whose_credentials_stay_secret(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = load(name)
    spec = stack.spec
    # Record the tokens the mocks hand out while this stack is synthesized (in its own region and registry).
    tokens: list[dict[str, Any]] = []
    answer = plan._Mocks.call

    def recording(self: plan._Mocks, args: pulumi.runtime.MockCallArgs) -> Any:
        result = answer(self, args)
        if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            tokens.append(result[0])
        return result

    monkeypatch.setattr(plan._Mocks, "call", recording)
    synthesis = plan.synthesize(stack)
    builds = _of(synthesis, "docker-build:index:Image")
    assert len(builds) == len(images.runtime_images(spec))
    assert len(tokens) == len(builds)  # one token per push
    address = f"{plan.MOCK_ACCOUNT_ID}.dkr.ecr.{spec.cluster.region}.amazonaws.com"
    for build in builds:
        assert build.inputs["registries"] == [
            {"address": address, "username": REDACTED, "password": REDACTED}
        ]
        assert build.inputs["tags"][0].startswith(f"{address}/")
    # The tokens appear nowhere in what the plan writes.
    plan.write(synthesis, tmp_path, "summary\n")
    written = "\n".join(p.read_text() for p in sorted(tmp_path.rglob("*")) if p.is_file())
    for token in tokens:
        assert token["password"] not in written and token["authorizationToken"] not in written
