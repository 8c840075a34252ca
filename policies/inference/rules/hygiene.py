"""Hygiene: cost-allocation tags on AWS resources, recommended labels on Kubernetes workloads."""

from __future__ import annotations

from collections.abc import Iterator

from policies.inference.rules.base import Category, Config, Res, Rule, Setting, Severity, as_map
from policies.inference.rules.k8s import pod_labels, pod_spec

# AWS resource types the stack creates that accept tags (ones without a `tags` input, such as route table
# associations or S3 sub-configurations, cannot carry them).
TAGGABLE = frozenset(
    {
        "aws:ec2/vpc:Vpc",
        "aws:ec2/subnet:Subnet",
        "aws:ec2/eip:Eip",
        "aws:ec2/internetGateway:InternetGateway",
        "aws:ec2/natGateway:NatGateway",
        "aws:ec2/routeTable:RouteTable",
        "aws:ec2/securityGroup:SecurityGroup",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:eks/cluster:Cluster",
        "aws:eks/nodeGroup:NodeGroup",
        "aws:eks/addon:Addon",
        "aws:eks/podIdentityAssociation:PodIdentityAssociation",
        "aws:iam/role:Role",
        "aws:iam/policy:Policy",
        "aws:kms/key:Key",
        "aws:s3/bucket:Bucket",
        "aws:s3/bucketV2:BucketV2",
        "aws:ecr/repository:Repository",
        "aws:cloudwatch/logGroup:LogGroup",
        "aws:cloudwatch/eventRule:EventRule",
        "aws:sqs/queue:Queue",
        "aws:eks/accessEntry:AccessEntry",
    }
)


def _tags(res: Res, config: Config) -> Iterator[str]:
    if not res.type.startswith("aws:") or (res.type not in TAGGABLE and "tags" not in res.props):
        return
    tags = as_map(res.props.get("tags"))
    missing = [t for t in config["required_tags"] if not tags.get(t)]
    if missing:
        yield (
            f"{res.display}: missing tag(s) {', '.join(missing)}; add them under the stack's `tags:` (the AWS "
            "layer puts inferstack:environment and inferstack:stack on everything itself)"
        )


TAGS = Rule(
    name="aws-required-tags",
    category=Category.HYGIENE,
    severity=Severity.LOW,
    description="Every taggable AWS resource carries the required cost-allocation tags.",
    remediation="Add the missing keys to the stack file's `tags:` map.",
    resource_check=_tags,
    settings=(
        Setting(
            "required_tags",
            {"type": "array", "items": {"type": "string"}},
            ["inferstack:environment", "inferstack:stack", "cost-center"],
            "Tag keys every taggable AWS resource must carry.",
        ),
    ),
)


def _labels(res: Res, config: Config) -> Iterator[str]:
    if pod_spec(res) is None or res.from_chart:
        return  # a chart's workloads carry the chart's labels
    required = list(config["required_labels"])
    for where, labels in (("metadata.labels", res.labels), ("pod template labels", pod_labels(res))):
        missing = [k for k in required if not labels.get(k)]
        if missing:
            yield (
                f"{res.display}: {where} lack {', '.join(missing)}; set the app.kubernetes.io/* labels "
                "(components.render.common.labels renders them)"
            )


LABELS = Rule(
    name="workload-recommended-labels",
    category=Category.HYGIENE,
    severity=Severity.LOW,
    description="Every workload and its pod template carry the recommended app.kubernetes.io/* labels.",
    remediation="Add app.kubernetes.io/name, instance, component, part-of and managed-by labels.",
    resource_check=_labels,
    settings=(
        Setting(
            "required_labels",
            {"type": "array", "items": {"type": "string"}},
            [
                "app.kubernetes.io/name",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/component",
                "app.kubernetes.io/part-of",
                "app.kubernetes.io/managed-by",
            ],
            "Label keys every workload and pod template must carry.",
        ),
    ),
)

RULES = (TAGS, LABELS)
