"""KMS: the key policies of the platform's customer-managed keys, and the EKS cluster role's grant on its key.

The account administers every key through IAM; only the AWS service of a key's purpose may use it (no
``kms:*``, no wildcard principal unless pinned to the account and one service).
"""

from __future__ import annotations

from typing import Any

from components.clouds.aws.iam import VERSION, PolicyDocument, account_root, partition, via_service


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
