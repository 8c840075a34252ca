"""Names: every account-scoped physical name the stack gives an AWS resource derives from its cluster's name.

A stack sees only its own resources, so it cannot know what another stack of the account creates. What it can
hold is the convention that makes two stacks apart: the EKS cluster's name is unique per account and region (EKS
refuses a second), so names derived from it cannot collide between stacks. Resources Pulumi names itself (a random
suffix) and names scoped by a parent (a node group's in its cluster, a role's inline policy in its role) are
not account-scoped. S3 bucket names are global and the stack file may choose them (cluster.model_bucket): they are
not held to the convention; AWS refuses a taken one at create.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from policies.inference.rules.base import Category, Config, Finding, Res, Rule, Severity

CLUSTER = "aws:eks/cluster:Cluster"

ACCOUNT_SCOPED_NAMES: dict[str, str] = {
    "aws:ecr/repository:Repository": "name",
    "aws:kms/alias:Alias": "name",
    "aws:cloudwatch/logGroup:LogGroup": "name",
    "aws:ec2/placementGroup:PlacementGroup": "name",
    "aws:ec2/launchTemplate:LaunchTemplate": "name",
    "aws:elasticache/replicationGroup:ReplicationGroup": "replicationGroupId",
    "aws:elasticache/subnetGroup:SubnetGroup": "name",
    "aws:iam/role:Role": "name",
    "aws:iam/policy:Policy": "name",
}
"""Type -> the property that holds its physical name, for the resources whose name is unique per account (IAM)
or per account and region (the rest). Unset, Pulumi names it with a random suffix."""
GLOBAL_NAMES: dict[str, str] = {"aws:s3/bucket:Bucket": "bucket", "aws:s3/bucketV2:BucketV2": "bucket"}
"""Names unique across every account (S3 buckets): the stack file may choose them, so they are not held to the
cluster's name; the committed stacks' are checked apart from one another (tests/policies)."""
ACCOUNT_WIDE = frozenset({"aws:iam/role:Role", "aws:iam/policy:Policy"})
"""Of ``ACCOUNT_SCOPED_NAMES``, those unique per account in every region (IAM is global)."""


def derives_from(name: str, cluster: str) -> bool:
    """Whether one of the name's '/'-separated parts is the cluster's name, or starts with it and a '-':
    'inferstack-prod/router', 'alias/inferstack-prod-disks', '/aws/eks/inferstack-prod/cluster'."""
    return any(part == cluster or part.startswith(f"{cluster}-") for part in name.split("/"))


def physical_name(res: Res) -> str | None:
    """The account-scoped name the resource asks for; None when Pulumi names it (or it is not such a type)."""
    key = ACCOUNT_SCOPED_NAMES.get(res.type)
    value = res.props.get(key) if key else None
    return value if isinstance(value, str) and value else None


def _derived(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    clusters = [str(r.props.get("name")) for r in resources if r.type == CLUSTER and r.props.get("name")]
    if len(clusters) != 1:
        return  # a cluster you bring: the stack creates no account-scoped names to keep apart
    [cluster] = clusters
    for res in resources:
        name = physical_name(res)
        if name is not None and not derives_from(name, cluster):
            kind = res.type.rsplit(":", 1)[-1]
            yield Finding(
                f"{res.display}: {kind} name {name!r} does not derive from the cluster's name {cluster!r}; it is "
                "unique per account, so another stack of the account creating it too fails its `pulumi up` (or "
                f"takes it over): name it '{cluster}/...' or '{cluster}-...'",
                res.urn,
            )


NAMES_FROM_CLUSTER = Rule(
    name="aws-names-derive-from-cluster",
    category=Category.RELIABILITY,
    severity=Severity.HIGH,
    description="Every account-scoped physical name of an AWS resource (ECR repository, KMS alias, log group, "
    "placement group, launch template, ElastiCache group, IAM role or policy) derives from the EKS cluster's name, "
    "which is unique per account and region, so two stacks of one account never ask for the same name.",
    remediation="Name the resource '<cluster>/...' or '<cluster>-...' (spec.cluster_name), or leave its name to "
    "Pulumi (a random suffix).",
    stack_check=_derived,
)

RULES = (NAMES_FROM_CLUSTER,)
