"""Who may read and write the platform's data on AWS: engines reading model weights, VPC Flow Logs writing
its log group, EventBridge feeding the interruption queue, and TLS-only access to the model bucket.
"""

from __future__ import annotations

import re
from typing import Any

from components.aws.iam import VERSION, PolicyDocument, partition, trust, via_service

_S3_URI = re.compile(r"^s3://([^/]+)/?(.*)$")


def s3_sources(sources: list[str]) -> dict[str, set[str]]:
    """Bucket -> key prefixes ('' = the whole bucket) for the ``s3://`` model sources."""
    out: dict[str, set[str]] = {}
    for source in sources:
        match = _S3_URI.match(source)
        if match:
            out.setdefault(match.group(1), set()).add(match.group(2))
    return out


def model_prepare(
    region: str, model_bucket_arn: str, key_arn: str, sources: list[str], outputs: list[str]
) -> PolicyDocument:
    """Preparation Jobs read their sources (as engines read weights) and write under their outputs' prefixes only.

    Writing an SSE-KMS object into the stack's bucket asks KMS for a data key, through S3 only.
    """
    doc = model_read(region, model_bucket_arn, key_arn, sources)
    statements: list[dict[str, Any]] = list(doc["Statement"])
    statements.append(
        {
            "Sid": "EncryptPreparedWeightsViaS3",
            "Effect": "Allow",
            "Action": ["kms:GenerateDataKey"],
            "Resource": key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": via_service("s3", region)}},
        }
    )
    p = partition(region)
    for i, (bucket, prefixes) in enumerate(sorted(s3_sources(outputs).items())):
        bucket_arn = f"arn:{p}:s3:::{bucket}"
        keys = sorted(f"{bucket_arn}/{x.rstrip('/')}/*" if x else f"{bucket_arn}/*" for x in prefixes)
        listing: dict[str, Any] = {
            "Sid": f"ListPrepared{i}",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": bucket_arn,
        }
        if "" not in prefixes:  # `aws s3 sync` lists where it writes: only under the outputs
            listing["Condition"] = {
                "StringLike": {"s3:prefix": sorted(f"{x.rstrip('/')}/*" for x in prefixes)}
            }
        statements.append(listing)
        statements.append(
            {
                "Sid": f"WritePrepared{i}",
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:GetObject"],
                "Resource": keys,
            }
        )
    return {"Version": VERSION, "Statement": statements}


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
