"""IAM policy documents' building blocks, as plain dicts: ARNs per partition, trust policies, the AWS managed
policies each role gets.

Pure, so tests parse and audit every document without AWS. Least privilege throughout: each role gets the
actions its one job needs, scoped to the resources it touches; where AWS allows no resource-level scope for
an action, the statement's ``Sid`` says so (``...AnyResource``; ``components.clouds.aws.audit`` checks it).
"""

from __future__ import annotations

import json
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


def dns_suffix(region: str) -> str:
    """The domain of AWS endpoints in ``region`` (China regions have their own)."""
    return "amazonaws.com.cn" if partition(region) == "aws-cn" else "amazonaws.com"


def via_service(service: str, region: str) -> str:
    """The ``kms:ViaService`` value of an AWS service calling KMS on a principal's behalf in ``region``."""
    return f"{service}.{region}.{dns_suffix(region)}"


def account_root(region: str, account_id: str) -> str:
    return f"arn:{partition(region)}:iam::{account_id}:root"


def dumps(document: PolicyDocument) -> str:
    return json.dumps(document, sort_keys=False)
