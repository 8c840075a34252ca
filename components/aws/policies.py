"""IAM policy documents as plain dicts: pure, so tests parse and audit them without AWS.

Least privilege: each role gets the actions its one job needs, scoped to the resources it touches.
Where AWS allows no resource-level scope for an action, the statement's ``Sid`` says so (``...AnyResource``
statements list their actions one by one; no statement grants ``*`` actions).
"""

from __future__ import annotations

import json
import re
from typing import Any

PolicyDocument = dict[str, Any]
VERSION = "2012-10-17"

EKS_CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"  # an EKS access policy, not an IAM policy


def partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def managed_policy_arn(region: str, name: str) -> str:
    return f"arn:{partition(region)}:iam::aws:policy/{name}"


def access_policy_arn(region: str, name: str) -> str:
    return f"arn:{partition(region)}:eks::aws:cluster-access-policy/{name}"


# AWS managed policies per role, each the narrowest AWS offers for the job.
CLUSTER_MANAGED_POLICIES = ("AmazonEKSClusterPolicy",)
NODE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    # Pull-only (no ListImages/DescribeRepositories) ECR access for the kubelet.
    "AmazonEC2ContainerRegistryPullOnly",
    # vpc-cni (aws-node) takes the node's credentials: it assigns pod IPs before Pod Identity can run.
    "AmazonEKS_CNI_Policy",
)
EBS_CSI_MANAGED_POLICIES = ("service-role/AmazonEBSCSIDriverPolicy",)


def trust(service: str, tag_session: bool = False) -> PolicyDocument:
    """A role that one AWS service principal may assume."""
    actions = ["sts:AssumeRole", "sts:TagSession"] if tag_session else ["sts:AssumeRole"]
    return {
        "Version": VERSION,
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}],
    }


def cluster_trust() -> PolicyDocument:
    return trust("eks.amazonaws.com", tag_session=True)


def node_trust() -> PolicyDocument:
    return trust("ec2.amazonaws.com")


def pod_identity_trust() -> PolicyDocument:
    """EKS Pod Identity: the agent assumes the role and tags the session with the pod's namespace and SA."""
    return trust("pods.eks.amazonaws.com", tag_session=True)


def cluster_encryption(key_arn: str) -> PolicyDocument:
    """What the EKS control plane needs on its envelope-encryption key (Kubernetes Secrets)."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "EnvelopeEncryptSecrets",
                "Effect": "Allow",
                "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"],
                "Resource": key_arn,
            }
        ],
    }


_S3_URI = re.compile(r"^s3://([^/]+)/?(.*)$")


def s3_sources(sources: list[str]) -> dict[str, set[str]]:
    """Bucket -> key prefixes ('' = the whole bucket) for the ``s3://`` model sources."""
    out: dict[str, set[str]] = {}
    for source in sources:
        match = _S3_URI.match(source)
        if match:
            out.setdefault(match.group(1), set()).add(match.group(2))
    return out


def model_read(region: str, model_bucket_arn: str, key_arn: str, sources: list[str]) -> PolicyDocument:
    """Engines read weights: the stack's model bucket, plus the exact prefixes of ``s3://`` sources elsewhere.

    The bucket's objects are SSE-KMS encrypted with ``key_arn``: reading one decrypts its data key, which
    engines may do only through S3 (``kms:ViaService``), never by calling KMS directly.
    """
    p = partition(region)
    statements: list[dict[str, Any]] = [
        {
            "Sid": "DecryptModelWeightsViaS3",
            "Effect": "Allow",
            "Action": ["kms:Decrypt"],
            "Resource": key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": via_service("s3", region)}},
        },
        {
            "Sid": "ListModelBucket",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": model_bucket_arn,
        },
        {
            "Sid": "ReadModelBucket",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": f"{model_bucket_arn}/*",
        },
    ]
    for i, (bucket, prefixes) in enumerate(sorted(s3_sources(sources).items())):
        bucket_arn = f"arn:{p}:s3:::{bucket}"
        whole = "" in prefixes
        listing: dict[str, Any] = {
            "Sid": f"ListSource{i}",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": bucket_arn,
        }
        if not whole:
            listing["Condition"] = {
                "StringLike": {"s3:prefix": sorted(f"{x.rstrip('/')}/*" for x in prefixes)}
            }
        statements.append(listing)
        objects = (
            [f"{bucket_arn}/*"] if whole else sorted(f"{bucket_arn}/{x.rstrip('/')}/*" for x in prefixes)
        )
        statements.append(
            {"Sid": f"ReadSource{i}", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": objects}
        )
    return {"Version": VERSION, "Statement": statements}


_CLUSTER_TAG = "elbv2.k8s.aws/cluster"


def load_balancer_controller(region: str) -> PolicyDocument:
    """The AWS Load Balancer Controller's policy, after its published ``iam_policy.json`` (v2.13).

    Describe/Get calls and create calls have no resource-level scope in IAM, so they name ``*``
    resources (statements ``...AnyResource``); everything that changes or deletes a load balancer,
    target group or security group is limited to resources tagged with ``elbv2.k8s.aws/cluster``.
    """
    p = partition(region)
    elb = f"arn:{p}:elasticloadbalancing:*:*"
    tagged = {"Null": {f"aws:ResourceTag/{_CLUSTER_TAG}": "false"}}
    requested = {"Null": {f"aws:RequestTag/{_CLUSTER_TAG}": "false"}}
    lb_and_tg = [f"{elb}:targetgroup/*/*", f"{elb}:loadbalancer/net/*/*", f"{elb}:loadbalancer/app/*/*"]
    statements: list[dict[str, Any]] = [
        {
            "Sid": "ServiceLinkedRoleAnyResource",
            "Effect": "Allow",
            "Action": ["iam:CreateServiceLinkedRole"],
            "Resource": "*",
            "Condition": {"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}},
        },
        {
            "Sid": "DescribeAnyResource",
            "Effect": "Allow",
            "Action": [
                "ec2:DescribeAccountAttributes",
                "ec2:DescribeAddresses",
                "ec2:DescribeAvailabilityZones",
                "ec2:DescribeInternetGateways",
                "ec2:DescribeVpcs",
                "ec2:DescribeVpcPeeringConnections",
                "ec2:DescribeSubnets",
                "ec2:DescribeSecurityGroups",
                "ec2:DescribeInstances",
                "ec2:DescribeNetworkInterfaces",
                "ec2:DescribeTags",
                "ec2:DescribeRouteTables",
                "ec2:GetCoipPoolUsage",
                "ec2:DescribeCoipPools",
                "ec2:GetSecurityGroupsForVpc",
                "ec2:DescribeIpamPools",
                "elasticloadbalancing:DescribeLoadBalancers",
                "elasticloadbalancing:DescribeLoadBalancerAttributes",
                "elasticloadbalancing:DescribeListeners",
                "elasticloadbalancing:DescribeListenerCertificates",
                "elasticloadbalancing:DescribeListenerAttributes",
                "elasticloadbalancing:DescribeSSLPolicies",
                "elasticloadbalancing:DescribeRules",
                "elasticloadbalancing:DescribeTargetGroups",
                "elasticloadbalancing:DescribeTargetGroupAttributes",
                "elasticloadbalancing:DescribeTargetHealth",
                "elasticloadbalancing:DescribeTags",
                "elasticloadbalancing:DescribeTrustStores",
                "elasticloadbalancing:DescribeCapacityReservation",
            ],
            "Resource": "*",
        },
        {
            "Sid": "CertificatesAndWafAnyResource",
            "Effect": "Allow",
            "Action": [
                "cognito-idp:DescribeUserPoolClient",
                "acm:ListCertificates",
                "acm:DescribeCertificate",
                "iam:ListServerCertificates",
                "iam:GetServerCertificate",
                "waf-regional:GetWebACL",
                "waf-regional:GetWebACLForResource",
                "waf-regional:AssociateWebACL",
                "waf-regional:DisassociateWebACL",
                "wafv2:GetWebACL",
                "wafv2:GetWebACLForResource",
                "wafv2:AssociateWebACL",
                "wafv2:DisassociateWebACL",
                "shield:GetSubscriptionState",
                "shield:DescribeProtection",
                "shield:CreateProtection",
                "shield:DeleteProtection",
            ],
            "Resource": "*",
        },
        {
            "Sid": "CreateSecurityGroupAnyResource",
            "Effect": "Allow",
            "Action": ["ec2:CreateSecurityGroup"],
            "Resource": "*",
        },
        {
            "Sid": "TagNewSecurityGroups",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags"],
            "Resource": f"arn:{p}:ec2:*:*:security-group/*",
            "Condition": {"StringEquals": {"ec2:CreateAction": "CreateSecurityGroup"}, **requested},
        },
        {
            "Sid": "RetagOwnSecurityGroups",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags", "ec2:DeleteTags"],
            "Resource": f"arn:{p}:ec2:*:*:security-group/*",
            "Condition": {
                "Null": {f"aws:RequestTag/{_CLUSTER_TAG}": "true", f"aws:ResourceTag/{_CLUSTER_TAG}": "false"}
            },
        },
        {
            "Sid": "ChangeOwnSecurityGroupsTaggedAnyResource",
            "Effect": "Allow",
            "Action": [
                "ec2:AuthorizeSecurityGroupIngress",
                "ec2:RevokeSecurityGroupIngress",
                "ec2:DeleteSecurityGroup",
            ],
            "Resource": "*",
            "Condition": tagged,
        },
        {
            "Sid": "CreateTaggedLoadBalancersAnyResource",
            "Effect": "Allow",
            "Action": ["elasticloadbalancing:CreateLoadBalancer", "elasticloadbalancing:CreateTargetGroup"],
            "Resource": "*",
            "Condition": requested,
        },
        {
            "Sid": "ListenersAndRulesAnyResource",
            "Effect": "Allow",
            "Action": [
                "elasticloadbalancing:CreateListener",
                "elasticloadbalancing:DeleteListener",
                "elasticloadbalancing:CreateRule",
                "elasticloadbalancing:DeleteRule",
            ],
            "Resource": "*",
        },
        {
            "Sid": "RetagOwnLoadBalancers",
            "Effect": "Allow",
            "Action": ["elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags"],
            "Resource": lb_and_tg,
            "Condition": {
                "Null": {f"aws:RequestTag/{_CLUSTER_TAG}": "true", f"aws:ResourceTag/{_CLUSTER_TAG}": "false"}
            },
        },
        {
            "Sid": "TagListenersAndRules",
            "Effect": "Allow",
            "Action": ["elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags"],
            "Resource": [
                f"{elb}:listener/net/*/*/*",
                f"{elb}:listener/app/*/*/*",
                f"{elb}:listener-rule/net/*/*/*",
                f"{elb}:listener-rule/app/*/*/*",
            ],
        },
        {
            "Sid": "ChangeOwnLoadBalancersTaggedAnyResource",
            "Effect": "Allow",
            "Action": [
                "elasticloadbalancing:ModifyLoadBalancerAttributes",
                "elasticloadbalancing:SetIpAddressType",
                "elasticloadbalancing:SetSecurityGroups",
                "elasticloadbalancing:SetSubnets",
                "elasticloadbalancing:DeleteLoadBalancer",
                "elasticloadbalancing:ModifyTargetGroup",
                "elasticloadbalancing:ModifyTargetGroupAttributes",
                "elasticloadbalancing:DeleteTargetGroup",
                "elasticloadbalancing:ModifyListenerAttributes",
                "elasticloadbalancing:ModifyCapacityReservation",
                "elasticloadbalancing:ModifyIpPools",
            ],
            "Resource": "*",
            "Condition": tagged,
        },
        {
            "Sid": "TagOnCreate",
            "Effect": "Allow",
            "Action": ["elasticloadbalancing:AddTags"],
            "Resource": lb_and_tg,
            "Condition": {
                "StringEquals": {
                    "elasticloadbalancing:CreateAction": ["CreateTargetGroup", "CreateLoadBalancer"]
                },
                **requested,
            },
        },
        {
            "Sid": "RegisterTargets",
            "Effect": "Allow",
            "Action": ["elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"],
            "Resource": f"{elb}:targetgroup/*/*",
        },
        {
            "Sid": "ListenerSettingsAnyResource",
            "Effect": "Allow",
            "Action": [
                "elasticloadbalancing:SetWebAcl",
                "elasticloadbalancing:ModifyListener",
                "elasticloadbalancing:AddListenerCertificates",
                "elasticloadbalancing:RemoveListenerCertificates",
                "elasticloadbalancing:ModifyRule",
                "elasticloadbalancing:SetRulePriorities",
            ],
            "Resource": "*",
        },
    ]
    return {"Version": VERSION, "Statement": statements}


def dumps(document: PolicyDocument) -> str:
    return json.dumps(document, sort_keys=False)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def audit(document: PolicyDocument, key_policy: bool = False) -> list[str]:
    """Least-privilege problems in one document: wildcard actions, and any wildcard action on ``*``.

    Trust policies (with a Principal) are audited for wildcard principals instead. In a KMS key policy
    (``key_policy``) the resource ``*`` means the key the policy is attached to, so it needs no excuse, and a
    wildcard principal passes only when pinned to one account and one service.
    """
    problems: list[str] = []
    for i, statement in enumerate(_as_list(document.get("Statement", []))):
        if statement.get("Effect") != "Allow":
            continue
        actions = [str(a) for a in _as_list(statement.get("Action", []))]
        resources = [str(r) for r in _as_list(statement.get("Resource", []))]
        principal = statement.get("Principal")
        wildcard = principal is not None and (principal == "*" or "*" in json.dumps(principal))
        if wildcard and not (key_policy and _pinned_to_account_and_service(statement)):
            problems.append(f"statement {i}: wildcard principal {principal}")
        if "NotAction" in statement or "NotResource" in statement:
            problems.append(f"statement {i}: NotAction/NotResource grants more than it names")
        wild = [a for a in actions if "*" in a]
        if wild and "*" in resources:
            problems.append(f"statement {i}: wildcard actions {wild} on resource *")
        elif wild:
            problems.append(f"statement {i}: wildcard actions {wild}")
        if "*" in resources and not key_policy and not str(statement.get("Sid", "")).endswith("AnyResource"):
            problems.append(f"statement {i}: resource * without an ...AnyResource Sid saying why")
    return problems


def _pinned_to_account_and_service(statement: dict[str, Any]) -> bool:
    """A key policy statement for "any principal" that only this account's callers can use, and only
    through one AWS service (the pattern of AWS's own ``aws/ebs`` key)."""
    equals = statement.get("Condition", {}).get("StringEquals", {})
    return bool(equals.get("kms:CallerAccount")) and bool(equals.get("kms:ViaService"))


def bucket_tls_only(bucket_arn: str) -> PolicyDocument:
    """A bucket policy that refuses every request not made over TLS."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    }


def dns_suffix(region: str) -> str:
    """The domain of AWS endpoints in ``region`` (China regions have their own)."""
    return "amazonaws.com.cn" if partition(region) == "aws-cn" else "amazonaws.com"


def via_service(service: str, region: str) -> str:
    """The ``kms:ViaService`` value of an AWS service calling KMS on a principal's behalf in ``region``."""
    return f"{service}.{region}.{dns_suffix(region)}"


# Key administration, action by action: what `pulumi up` does to a key (create, tag, rotate, alias, policy)
# and what an operator may need later (disable, schedule deletion). Not one data action among them.
KMS_ADMIN_ACTIONS = (
    "kms:CancelKeyDeletion",
    "kms:CreateAlias",
    "kms:DeleteAlias",
    "kms:DescribeKey",
    "kms:DisableKey",
    "kms:DisableKeyRotation",
    "kms:EnableKey",
    "kms:EnableKeyRotation",
    "kms:GetKeyPolicy",
    "kms:GetKeyRotationStatus",
    "kms:ListGrants",
    "kms:ListKeyPolicies",
    "kms:ListResourceTags",
    "kms:PutKeyPolicy",
    "kms:RevokeGrant",
    "kms:ScheduleKeyDeletion",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:UpdateAlias",
    "kms:UpdateKeyDescription",
)
# Envelope encryption as AWS services do it for their callers (no kms:* and no ReEncrypt* wildcards).
KMS_DATA_ACTIONS = (
    "kms:Decrypt",
    "kms:DescribeKey",
    "kms:Encrypt",
    "kms:GenerateDataKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
)


def account_root(region: str, account_id: str) -> str:
    return f"arn:{partition(region)}:iam::{account_id}:root"


def log_group_arn(region: str, account_id: str, name: str) -> str:
    return f"arn:{partition(region)}:logs:{region}:{account_id}:log-group:{name}"


def _key_administration(region: str, account_id: str) -> dict[str, Any]:
    """The account administers the key through IAM: without it nobody could ever change the policy again."""
    return {
        "Sid": "AccountAdministersThroughIam",
        "Effect": "Allow",
        "Principal": {"AWS": account_root(region, account_id)},
        "Action": list(KMS_ADMIN_ACTIONS),
        "Resource": "*",
    }


def _use_via(region: str, account_id: str, service: str) -> list[dict[str, Any]]:
    """Principals of the account whose IAM policies allow it may use the key, but only through ``service``."""
    via = {"kms:CallerAccount": account_id, "kms:ViaService": via_service(service, region)}
    root = {"AWS": account_root(region, account_id)}
    return [
        {
            "Sid": "AccountUsesThroughService",
            "Effect": "Allow",
            "Principal": root,
            "Action": list(KMS_DATA_ACTIONS),
            "Resource": "*",
            "Condition": {"StringEquals": via},
        },
        {
            # The service keeps a grant for as long as the encrypted resource exists (ECR repositories, volumes).
            "Sid": "AccountGrantsToService",
            "Effect": "Allow",
            "Principal": root,
            "Action": ["kms:CreateGrant"],
            "Resource": "*",
            "Condition": {"StringEquals": via, "Bool": {"kms:GrantIsForAWSResource": "true"}},
        },
    ]


def logs_key(region: str, account_id: str, log_group_names: list[str]) -> PolicyDocument:
    """Key policy of the log groups' key: CloudWatch Logs may use it for exactly these log groups.

    CloudWatch Logs calls KMS as its own service principal (not through a caller's IAM identity), and
    passes the log group's ARN as encryption context, which is what the condition pins.
    """
    arns = sorted(log_group_arn(region, account_id, n) for n in log_group_names)
    return {
        "Version": VERSION,
        "Statement": [
            _key_administration(region, account_id),
            {
                "Sid": "CloudWatchLogsEncryptsTheseLogGroups",
                "Effect": "Allow",
                "Principal": {"Service": via_service("logs", region)},
                "Action": list(KMS_DATA_ACTIONS),
                "Resource": "*",
                "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": arns}},
            },
        ],
    }


def cluster_secrets_key(region: str, account_id: str) -> PolicyDocument:
    """Key policy of the EKS Secrets key: EKS encrypts with the cluster role's own credentials, so use is
    delegated to IAM (only the cluster role's inline policy grants it), without the default policy's ``kms:*``."""
    return {
        "Version": VERSION,
        "Statement": [
            _key_administration(region, account_id),
            {
                "Sid": "AccountUsesThroughIam",
                "Effect": "Allow",
                "Principal": {"AWS": account_root(region, account_id)},
                "Action": list(KMS_DATA_ACTIONS),
                "Resource": "*",
            },
            {
                # Whoever creates the cluster lets EKS hold a grant on the key for the cluster's lifetime.
                "Sid": "AccountGrantsToEks",
                "Effect": "Allow",
                "Principal": {"AWS": account_root(region, account_id)},
                "Action": ["kms:CreateGrant"],
                "Resource": "*",
                "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}},
            },
        ],
    }


def service_key(region: str, account_id: str, service: str) -> PolicyDocument:
    """Key policy of a key one AWS service uses for the account (S3 for models, ECR for images)."""
    return {
        "Version": VERSION,
        "Statement": [_key_administration(region, account_id), *_use_via(region, account_id, service)],
    }


def disks_key(region: str, account_id: str) -> PolicyDocument:
    """Key policy of the node root volumes' key: any principal of this account, through EC2 only.

    The volumes are created by whoever launches the instance: EC2 Auto Scaling's service-linked role for
    managed node groups, EC2's spot role, Karpenter's controller. Service-linked roles carry no KMS
    permissions, and naming one in a key policy fails while it does not exist yet (an account's first
    Auto Scaling group creates it), so ``pulumi up`` in a fresh account could not create this key. AWS's
    own ``aws/ebs`` key solves exactly this with any principal, pinned to the account and to EC2; the
    audit accepts a wildcard principal only under both conditions.
    """
    via = {"kms:CallerAccount": account_id, "kms:ViaService": via_service("ec2", region)}
    return {
        "Version": VERSION,
        "Statement": [
            _key_administration(region, account_id),
            {
                "Sid": "AccountPrincipalsUseThroughEc2",
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": list(KMS_DATA_ACTIONS),
                "Resource": "*",
                "Condition": {"StringEquals": via},
            },
            {
                "Sid": "AccountPrincipalsGrantToEc2",
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": ["kms:CreateGrant"],
                "Resource": "*",
                "Condition": {"StringEquals": via, "Bool": {"kms:GrantIsForAWSResource": "true"}},
            },
        ],
    }


def flow_logs_trust(region: str, account_id: str) -> PolicyDocument:
    """VPC Flow Logs assumes the role only for this account's flow logs (no confused deputy)."""
    p = partition(region)
    document = trust("vpc-flow-logs.amazonaws.com")
    document["Statement"][0]["Condition"] = {
        "StringEquals": {"aws:SourceAccount": account_id},
        "ArnLike": {"aws:SourceArn": f"arn:{p}:ec2:{region}:{account_id}:vpc-flow-log/*"},
    }
    return document


def flow_logs_delivery(log_group: str) -> PolicyDocument:
    """VPC Flow Logs writes streams into the one log group it was given (``log_group`` is its ARN)."""
    group = log_group.removesuffix(":*")
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "WriteFlowLogStreams",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
                "Resource": [group, f"{group}:log-stream:*"],
            },
            {
                # The service checks its destination exists; DescribeLogGroups is scoped by log group ARN.
                "Sid": "FindLogGroups",
                "Effect": "Allow",
                "Action": ["logs:DescribeLogGroups"],
                "Resource": f"{group.rsplit(':log-group:', 1)[0]}:log-group:*",
            },
        ],
    }


def karpenter_controller(
    region: str, cluster_name: str, queue_arn: str, node_role_arn: str, volume_key_arn: str
) -> PolicyDocument:
    """Karpenter's controller policy, after its v1 getting-started CloudFormation template.

    Launch and tag calls are limited to requests that tag what they create with this cluster (and a
    NodePool); terminate and delete only touch resources carrying those tags. Describe, pricing and
    instance-profile listing have no resource-level scope (``...AnyResource``). Karpenter launches as
    itself (no Auto Scaling role in between), so EC2 encrypts the root volumes with ``volume_key_arn`` on its
    behalf: it may use that key, through EC2 only.
    """
    p = partition(region)
    ec2 = f"arn:{p}:ec2:{region}:*"
    profile = f"arn:{p}:iam::*:instance-profile/*"
    owned = f"kubernetes.io/cluster/{cluster_name}"
    launched = [
        f"{ec2}:{kind}/*"
        for kind in (
            "fleet",
            "instance",
            "volume",
            "network-interface",
            "launch-template",
            "spot-instances-request",
        )
    ]
    request_owned = {
        f"aws:RequestTag/{owned}": "owned",
        "aws:RequestTag/eks:eks-cluster-name": cluster_name,
    }
    statements: list[dict[str, Any]] = [
        {
            "Sid": "LaunchFromSharedResources",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
            "Resource": [
                f"{ec2}:{k}/*"
                for k in ("image", "snapshot", "security-group", "subnet", "capacity-reservation")
            ],
        },
        {
            "Sid": "LaunchFromOwnTemplates",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
            "Resource": f"{ec2}:launch-template/*",
            "Condition": {
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "LaunchTagged",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
            "Resource": launched,
            "Condition": {
                "StringEquals": request_owned,
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "TagOnLaunch",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags"],
            "Resource": launched,
            "Condition": {
                "StringEquals": {
                    **request_owned,
                    "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                },
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "TagOwnInstances",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags"],
            "Resource": f"{ec2}:instance/*",
            "Condition": {
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                "ForAllValues:StringEquals": {
                    "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                },
            },
        },
        {
            "Sid": "DeleteOwn",
            "Effect": "Allow",
            "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
            "Resource": [f"{ec2}:instance/*", f"{ec2}:launch-template/*"],
            "Condition": {
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "RegionalReadAnyResource",
            "Effect": "Allow",
            "Action": [
                "ec2:DescribeCapacityReservations",
                "ec2:DescribeImages",
                "ec2:DescribeInstances",
                "ec2:DescribeInstanceTypeOfferings",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeLaunchTemplates",
                "ec2:DescribeSecurityGroups",
                "ec2:DescribeSpotPriceHistory",
                "ec2:DescribeSubnets",
            ],
            "Resource": "*",
            "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
        },
        {
            "Sid": "ReadAmiParameters",
            "Effect": "Allow",
            "Action": ["ssm:GetParameter"],
            "Resource": f"arn:{p}:ssm:{region}::parameter/aws/service/*",
        },
        {"Sid": "PricingAnyResource", "Effect": "Allow", "Action": ["pricing:GetProducts"], "Resource": "*"},
        {
            "Sid": "InterruptionQueue",
            "Effect": "Allow",
            "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
            "Resource": queue_arn,
        },
        {
            "Sid": "PassNodeRole",
            "Effect": "Allow",
            "Action": ["iam:PassRole"],
            "Resource": node_role_arn,
            "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com"]}},
        },
        {
            "Sid": "CreateInstanceProfiles",
            "Effect": "Allow",
            "Action": ["iam:CreateInstanceProfile"],
            "Resource": profile,
            "Condition": {
                "StringEquals": {**request_owned, "aws:RequestTag/topology.kubernetes.io/region": region},
                "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        },
        {
            "Sid": "TagOwnInstanceProfiles",
            "Effect": "Allow",
            "Action": ["iam:TagInstanceProfile"],
            "Resource": profile,
            "Condition": {
                "StringEquals": {
                    f"aws:ResourceTag/{owned}": "owned",
                    "aws:ResourceTag/topology.kubernetes.io/region": region,
                    **request_owned,
                    "aws:RequestTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {
                    "aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                    "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*",
                },
            },
        },
        {
            "Sid": "ManageOwnInstanceProfiles",
            "Effect": "Allow",
            "Action": [
                "iam:AddRoleToInstanceProfile",
                "iam:RemoveRoleFromInstanceProfile",
                "iam:DeleteInstanceProfile",
            ],
            "Resource": profile,
            "Condition": {
                "StringEquals": {
                    f"aws:ResourceTag/{owned}": "owned",
                    "aws:ResourceTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        },
        {
            "Sid": "ReadInstanceProfiles",
            "Effect": "Allow",
            "Action": ["iam:GetInstanceProfile"],
            "Resource": profile,
        },
        {
            "Sid": "ListInstanceProfilesAnyResource",
            "Effect": "Allow",
            "Action": ["iam:ListInstanceProfiles"],
            "Resource": "*",
        },
        {
            "Sid": "DiscoverApiEndpoint",
            "Effect": "Allow",
            "Action": ["eks:DescribeCluster"],
            "Resource": f"arn:{p}:eks:{region}:*:cluster/{cluster_name}",
        },
        {
            "Sid": "EncryptNodeVolumesThroughEc2",
            "Effect": "Allow",
            "Action": [*KMS_DATA_ACTIONS, "kms:CreateGrant"],
            "Resource": volume_key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": via_service("ec2", region)}},
        },
    ]
    return {"Version": VERSION, "Statement": statements}


def interruption_queue(queue_arn: str) -> PolicyDocument:
    """EventBridge (and SQS itself) may deliver interruption events; nothing is accepted without TLS."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "EventsDeliver",
                "Effect": "Allow",
                "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
            },
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": queue_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


def cluster_autoscaler(region: str, cluster_name: str) -> PolicyDocument:
    """Cluster Autoscaler on managed node groups: read everything it sizes, change only this cluster's groups.

    EKS tags each managed node group's Auto Scaling group ``k8s.io/cluster-autoscaler/<cluster>: owned``.
    """
    p = partition(region)
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "DescribeAnyResource",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "autoscaling:DescribeTags",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                ],
                "Resource": "*",
            },
            {
                # Labels and taints of groups at zero nodes come from the node group itself.
                "Sid": "DescribeOwnNodeGroups",
                "Effect": "Allow",
                "Action": ["eks:DescribeNodegroup"],
                "Resource": f"arn:{p}:eks:{region}:*:nodegroup/{cluster_name}/*/*",
            },
            {
                "Sid": "ScaleOwnGroupsTaggedAnyResource",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:SetDesiredCapacity",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                ],
                "Resource": "*",
                "Condition": {
                    "StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}
                },
            },
        ],
    }
