"""Who may read and write the platform's data on AWS: engines reading model weights (the store's prefixes only),
the preparation Jobs writing them, the batch service its files (in a bucket of their own), VPC Flow Logs writing
its log group, EventBridge feeding the interruption queue, and TLS-only access to the buckets.
"""

from __future__ import annotations

import re
from typing import Any

from components.clouds.aws.iam import VERSION, PolicyDocument, partition, trust, via_service

_S3_URI = re.compile(r"^s3://([^/]+)/?(.*)$")


def s3_sources(sources: list[str]) -> dict[str, set[str]]:
    """Bucket -> key prefixes ('' = the whole bucket) for the ``s3://`` model sources."""
    out: dict[str, set[str]] = {}
    for source in sources:
        match = _S3_URI.match(source)
        if match:
            out.setdefault(match.group(1), set()).add(match.group(2))
    return out


def model_read(
    region: str, model_bucket_arn: str, key_arn: str, store_prefixes: list[str], sources: list[str]
) -> PolicyDocument:
    """Engines read weights: the given key prefixes of the stack's model bucket (the store's, never the whole
    bucket: ``store.engine_read_prefixes``), plus the exact prefixes of ``s3://`` sources elsewhere.

    The bucket's objects are SSE-KMS encrypted with ``key_arn``: reading one decrypts its data key, which
    engines may do only through S3 (``kms:ViaService``), never by calling KMS directly.
    """
    p = partition(region)
    if not store_prefixes or any(not x.strip("/") for x in store_prefixes):
        raise ValueError(
            f"engines read key prefixes of the model bucket, never all of it: got {store_prefixes!r}"
        )
    scoped = sorted({x.strip("/") for x in store_prefixes})
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
            "Condition": {"StringLike": {"s3:prefix": [f"{x}/*" for x in scoped]}},
        },
        {
            "Sid": "ReadModelBucket",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": [f"{model_bucket_arn}/{x}/*" for x in scoped],
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


def model_prepare(region: str, model_bucket_arn: str, key_arn: str, prefix: str) -> PolicyDocument:
    """The preparation Jobs write weights into the store: objects under ``prefix/`` only (no delete, no other
    prefix, no bucket settings), encrypted with the models key through S3 only."""
    objects = f"{model_bucket_arn}/{prefix.strip('/')}/*"
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "EncryptModelWeightsViaS3",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                "Resource": key_arn,
                "Condition": {"StringEquals": {"kms:ViaService": via_service("s3", region)}},
            },
            {
                "Sid": "ListStorePrefix",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": model_bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix.strip('/')}/*"]}},
            },
            {
                "Sid": "WriteStorePrefix",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
                "Resource": objects,
            },
        ],
    }


def batch_files(region: str, bucket_arn: str, key_arn: str, prefix: str) -> PolicyDocument:
    """The batch service keeps its files under one prefix of its own bucket (not the model bucket, which engines
    read): list that prefix, read, write and delete objects under it, nothing else. Objects are SSE-KMS with the
    batch bucket's own key: writing one makes a data key, reading one decrypts it, both only through S3."""
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "UseBatchKeyViaS3",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                "Resource": key_arn,
                "Condition": {"StringEquals": {"kms:ViaService": via_service("s3", region)}},
            },
            {
                "Sid": "ListBatchFiles",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}},
            },
            {
                "Sid": "ReadWriteBatchFiles",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": f"{bucket_arn}/{prefix}*",
            },
        ],
    }


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
