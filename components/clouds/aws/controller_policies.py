"""The IAM policies of the controllers that act on AWS from inside the cluster: the AWS Load Balancer
Controller, Karpenter and the Cluster Autoscaler, each after its project's published policy and narrowed to
this cluster's resources where IAM allows.
"""

from __future__ import annotations

from typing import Any

from components.clouds.aws.iam import VERSION, PolicyDocument, partition, via_service
from components.clouds.aws.key_policies import KMS_DATA_ACTIONS

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
