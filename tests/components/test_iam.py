"""IAM: every policy document the stacks create parses, grants no wildcard action, and is scoped."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from components.clouds.aws import audit, controller_policies, data_policies, decisions, iam, key_policies
from components.clouds.aws.cloud import EKS
from components.core.stackfile import STACKS_DIR, available_stacks
from components.deploy import synthesis as plan
from components.spec import Target
from tests.stacks import load, synthesized


@functools.cache
def _synth(name: str) -> plan.Synthesis:
    """One synthesis per committed stack (fresh mocks each; the result is plain data, shared read-only)."""
    return synthesized(name)


EKS_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target is Target.EKS]


KEY_POLICY = "aws:kms/key:Key"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def _documents(synthesis: plan.Synthesis) -> list[tuple[str, dict[str, Any]]]:
    """Every IAM, bucket and KMS key policy document the stack creates, with where it is."""
    out = []
    for r in synthesis.resources:
        for key in ("assumeRolePolicy", "policy"):
            value = r.inputs.get(key)
            audited = r.type.startswith("aws:iam/") or r.type in (
                "aws:s3/bucketPolicy:BucketPolicy",
                KEY_POLICY,
            )
            if audited and isinstance(value, str):
                out.append((f"{r.type} {r.name}", json.loads(value)))
    return out


@pytest.mark.parametrize("name", EKS_STACKS)
def test_every_policy_document_parses_and_passes_the_least_privilege_audit(name: str) -> None:
    documents = _documents(_synth(name))
    assert len(documents) >= 8
    keys = decisions.kms_keys(load(name).spec)
    assert sum(1 for where, _ in documents if where.startswith(KEY_POLICY)) == len(keys)
    for where, document in documents:
        assert document["Version"] == iam.VERSION, where
        assert audit.audit(document, key_policy=where.startswith(KEY_POLICY)) == [], where
        for statement in document["Statement"]:
            if statement["Effect"] == "Allow":
                actions = (
                    statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                )
                assert "*" not in actions, where


@pytest.mark.parametrize("name", EKS_STACKS)
def test_roles_trust_exactly_one_service_and_engines_use_pod_identity(name: str) -> None:
    stack = load(name)
    synthesis = _synth(stack.name)
    roles = {
        r.name: json.loads(r.inputs["assumeRolePolicy"])
        for r in synthesis.resources
        if r.type == "aws:iam/role:Role"
    }
    cluster = stack.spec.cluster_name
    principal = {n: d["Statement"][0]["Principal"]["Service"] for n, d in roles.items()}
    assert principal[f"{cluster}-cluster"] == "eks.amazonaws.com"
    assert principal[f"{cluster}-node"] == "ec2.amazonaws.com"
    for job in ("engine", "lb-controller", "ebs-csi"):
        assert principal[f"{cluster}-{job}"] == "pods.eks.amazonaws.com"
        assert roles[f"{cluster}-{job}"]["Statement"][0]["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    associations = {
        r.inputs["serviceAccount"]: r.inputs
        for r in synthesis.resources
        if r.type == "aws:eks/podIdentityAssociation:PodIdentityAssociation"
    }
    namespace, account = EKS.model_reader(stack.spec)
    assert associations[account]["namespace"] == namespace == stack.spec.cluster.namespace
    assert associations["aws-load-balancer-controller"]["namespace"] == "kube-system"
    inline = {r.name: r.inputs for r in synthesis.resources if r.type == "aws:iam/rolePolicy:RolePolicy"}
    read = json.loads(inline[f"{cluster}-engine-read-models"]["policy"])
    actions = sorted({a for s in read["Statement"] for a in s["Action"]})
    assert actions == ["kms:Decrypt", "s3:GetObject", "s3:ListBucket"]


def test_model_read_scopes_s3_sources_to_their_prefixes() -> None:
    doc = data_policies.model_read(
        "us-east-1",
        "arn:aws:s3:::stack-models",
        "arn:aws:kms:us-east-1:123456789012:key/k",
        ["models", "/ours/"],
        ["s3://weights/llama/70b/", "s3://weights/qwen", "s3://other", "meta-llama/Llama-3.1-8B-Instruct"],
    )
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    assert by_sid["ReadModelBucket"]["Resource"] == [
        "arn:aws:s3:::stack-models/models/*",
        "arn:aws:s3:::stack-models/ours/*",
    ]
    assert by_sid["ListModelBucket"]["Resource"] == "arn:aws:s3:::stack-models"
    assert by_sid["ListModelBucket"]["Condition"] == {"StringLike": {"s3:prefix": ["models/*", "ours/*"]}}
    for whole in ([], ["/"]):  # never the whole model bucket
        with pytest.raises(ValueError, match="never all of it"):
            data_policies.model_read(
                "us-east-1", "arn:aws:s3:::m", "arn:aws:kms:us-east-1:1:key/k", whole, []
            )
    assert by_sid["ReadSource0"]["Resource"] == ["arn:aws:s3:::other/*"]
    assert "Condition" not in by_sid["ListSource0"]
    assert by_sid["ReadSource1"]["Resource"] == [
        "arn:aws:s3:::weights/llama/70b/*",
        "arn:aws:s3:::weights/qwen/*",
    ]
    assert by_sid["ListSource1"]["Condition"] == {"StringLike": {"s3:prefix": ["llama/70b/*", "qwen/*"]}}
    assert audit.audit(doc) == []
    json.loads(iam.dumps(doc))


def _s3_grants(document: dict[str, Any]) -> list[str]:
    """Every resource an Allow statement of ``document`` grants an S3 action on."""
    out: list[str] = []
    for s in document["Statement"]:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        if s["Effect"] == "Allow" and any(a.startswith("s3:") for a in actions):
            out += s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
    return out


@pytest.mark.parametrize("name", ["prod", "dev"])
def test_engines_read_the_store_prefix_and_never_the_batch_bucket(name: str) -> None:
    """Rendered under the mocks: the engines' role reaches only '<model bucket>/<store prefix>/*'; the batch
    service's files are in a bucket of their own, with a key of their own, that only its role reaches."""
    stack = load(name)
    spec = stack.spec
    synthesis = _synth(name)
    cluster = spec.cluster_name
    model_bucket = f"arn:aws:s3:::{spec.cluster.model_store_bucket(spec)}"
    batch_bucket = f"arn:aws:s3:::{spec.cluster.batch_files_bucket(spec)}"
    inline = {r.name: json.loads(r.inputs["policy"]) for r in synthesis.resources if r.type == ROLE_POLICY}
    engine = _s3_grants(inline[f"{cluster}-engine-read-models"])
    assert engine == [model_bucket, f"{model_bucket}/{spec.model_store.prefix}/*"]
    assert not any(g.startswith(batch_bucket) for g in engine)
    buckets = {r.inputs["bucket"]: r.inputs for r in synthesis.resources if r.type == "aws:s3/bucket:Bucket"}
    if not spec.batch.enabled:
        assert (
            batch_bucket.rsplit(":", 1)[-1] not in buckets and f"{cluster}-batches-batch-files" not in inline
        )
        return
    assert batch_bucket != model_bucket
    assert buckets[batch_bucket.rsplit(":", 1)[-1]]["tags"]["inferstack:data"] == "batches"
    files = inline[f"{cluster}-batches-batch-files"]
    assert _s3_grants(files) == [batch_bucket, f"{batch_bucket}/batches/*"]
    [kms] = [s for s in files["Statement"] if s["Sid"] == "UseBatchKeyViaS3"]
    [engine_kms] = [
        s for s in inline[f"{cluster}-engine-read-models"]["Statement"] if s["Action"] == ["kms:Decrypt"]
    ]
    assert kms["Resource"] != engine_kms["Resource"]  # the batch key is not the models key
    keys = [r for r in synthesis.resources if r.type == KEY_POLICY]
    assert sum(1 for k in keys if k.name == f"{cluster}-batches") == 1


def test_partitions_follow_the_region() -> None:
    assert iam.managed_policy_arn("cn-north-1", "AmazonEKSClusterPolicy").startswith("arn:aws-cn:iam::aws:")
    assert iam.managed_policy_arn("us-gov-west-1", "X").startswith("arn:aws-us-gov:")
    lb = iam.dumps(controller_policies.load_balancer_controller("cn-north-1"))
    assert "arn:aws-cn:elasticloadbalancing" in lb and "arn:aws:" not in lb


def test_key_policies_may_name_their_key_as_star_but_never_grant_wildcard_actions() -> None:
    """In a key policy, resource ``*`` is the key itself; ``kms:*`` is still too much."""
    root = {"AWS": "arn:aws:iam::123456789012:root"}
    use = {"Sid": "Use", "Effect": "Allow", "Principal": root, "Action": ["kms:Decrypt"], "Resource": "*"}
    everything = {**use, "Action": ["kms:*"]}
    assert audit.audit({"Version": iam.VERSION, "Statement": [use]}, key_policy=True) == []
    assert audit.audit({"Version": iam.VERSION, "Statement": [use]}) != []
    found = audit.audit({"Version": iam.VERSION, "Statement": [everything]}, key_policy=True)
    assert any("wildcard actions" in p for p in found)
    for document in (
        key_policies.service_key("us-east-1", "123456789012", "s3"),
        key_policies.disks_key("us-east-1", "123456789012"),
        key_policies.logs_key("us-east-1", "123456789012", ["/aws/vpc/x/flow-logs"]),
    ):
        assert audit.audit(document, key_policy=True) == []
        assert all("*" not in a for s in document["Statement"] for a in s["Action"])


def test_key_policy_wildcard_principal_passes_only_when_pinned_to_the_account_and_one_service() -> None:
    """The ``aws/ebs`` pattern (any principal, this account, through EC2) is how the disks key works in an
    account whose Auto Scaling service-linked role does not exist yet; anything looser is refused."""
    pinned = {"kms:CallerAccount": "123456789012", "kms:ViaService": "ec2.us-east-1.amazonaws.com"}
    base = {
        "Sid": "Any",
        "Effect": "Allow",
        "Principal": {"AWS": "*"},
        "Action": ["kms:Decrypt"],
        "Resource": "*",
    }

    def problems(statement: dict[str, object], key_policy: bool = True) -> list[str]:
        return audit.audit({"Version": iam.VERSION, "Statement": [statement]}, key_policy=key_policy)

    assert problems({**base, "Condition": {"StringEquals": pinned}}) == []
    for missing in pinned:
        loose = {k: v for k, v in pinned.items() if k != missing}
        assert any(
            "wildcard principal" in p for p in problems({**base, "Condition": {"StringEquals": loose}})
        )
    assert any("wildcard principal" in p for p in problems(base))
    assert any(
        "wildcard principal" in p
        for p in problems({**base, "Condition": {"StringEquals": pinned}}, key_policy=False)
    )
    disks = key_policies.disks_key("us-east-1", "123456789012")
    use = [s for s in disks["Statement"] if s["Principal"] == {"AWS": "*"}]
    assert use and all(s["Condition"]["StringEquals"] == pinned for s in use)
    assert "AWSServiceRoleForAutoScaling" not in iam.dumps(disks), "no role that may not exist yet"


def test_flow_log_documents_trust_one_account_and_write_one_log_group() -> None:
    group = "arn:aws:logs:eu-west-1:123456789012:log-group:/aws/vpc/c/flow-logs"
    trust = data_policies.flow_logs_trust("eu-west-1", "123456789012")
    assert audit.audit(trust) == []
    assert trust["Statement"][0]["Condition"]["ArnLike"] == {
        "aws:SourceArn": "arn:aws:ec2:eu-west-1:123456789012:vpc-flow-log/*"
    }
    delivery = data_policies.flow_logs_delivery(f"{group}:*")  # either form of the log group ARN
    assert audit.audit(delivery) == []
    assert delivery["Statement"][0]["Resource"] == [group, f"{group}:log-stream:*"]
    assert delivery["Statement"][1]["Resource"] == "arn:aws:logs:eu-west-1:123456789012:log-group:*"


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ({"Effect": "Allow", "Action": "*", "Resource": "*"}, "on resource *"),
        ({"Effect": "Allow", "Action": ["s3:*"], "Resource": "arn:aws:s3:::b"}, "wildcard actions"),
        ({"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "*"}, "without an ...AnyResource Sid"),
        ({"Effect": "Allow", "Principal": "*", "Action": ["sts:AssumeRole"]}, "wildcard principal"),
        ({"Effect": "Allow", "NotAction": ["iam:*"], "Resource": "arn:aws:s3:::b"}, "NotAction"),
    ],
)
def test_audit_catches_over_broad_statements(statement: dict[str, Any], problem: str) -> None:
    found = audit.audit({"Version": iam.VERSION, "Statement": [statement]})
    assert any(problem in p for p in found), found


def test_load_balancer_controller_changes_only_what_it_tagged() -> None:
    doc = controller_policies.load_balancer_controller("us-east-1")
    assert audit.audit(doc) == []
    for statement in doc["Statement"]:
        mutating = [
            a
            for a in statement["Action"]
            if a.startswith(("ec2:", "elasticloadbalancing:"))
            and a.split(":")[1].startswith(("Delete", "Modify", "Set"))
        ]
        # Listeners and rules carry no cluster tag to condition on (as in the controller's published policy).
        untaggable = statement["Sid"] in ("ListenerSettingsAnyResource", "ListenersAndRulesAnyResource")
        if mutating and statement["Resource"] == "*" and not untaggable:
            assert "aws:ResourceTag/elbv2.k8s.aws/cluster" in json.dumps(statement.get("Condition", {}))
