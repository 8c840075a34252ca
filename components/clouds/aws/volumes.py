"""The StorageClass an EKS stack's persistent volumes claim (the batch service's state, Prometheus's TSDB). Pure.

A new EKS cluster from Kubernetes 1.30 on marks no StorageClass as its default (issue #35, item 4), so a claim that
names none never binds. The layer creates this one on the EBS CSI driver the stack installs (the aws-ebs-csi-driver
add-on): gp3, encrypted with the stack's disks key (the one its node root volumes use), bound where the pod lands
(``WaitForFirstConsumer``: EBS volumes are zonal, and a volume made before scheduling may sit in a zone the pod
cannot run in), and growable in place. Parameter names: kubernetes-sigs/aws-ebs-csi-driver docs/parameters.md
(``type``, ``encrypted``, ``kmsKeyId``, ``csi.storage.k8s.io/fstype``).
"""

from __future__ import annotations

from typing import Any

from components.clouds.aws.iam import VERSION, PolicyDocument, via_service
from components.render import common
from components.render.common import Manifest
from components.spec import PlatformSpec

STORAGE_CLASS = "inferstack-gp3-encrypted"
"""The class's name: cluster-scoped, one per cluster (one stack per cluster)."""
EBS_CSI_PROVISIONER = "ebs.csi.aws.com"


def storage_class(spec: PlatformSpec, key_arn: Any) -> Manifest:
    """The class; ``key_arn`` (a string or a Pulumi Output) is the disks key's ARN."""
    meta = common.metadata(spec, STORAGE_CLASS, "storage")
    meta.pop("namespace")
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": meta,
        "provisioner": EBS_CSI_PROVISIONER,
        "parameters": {
            "type": "gp3",
            "encrypted": "true",
            "kmsKeyId": key_arn,
            "csi.storage.k8s.io/fstype": "ext4",
        },
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
        "reclaimPolicy": "Delete",
    }


def ebs_csi_kms(region: str, key_arn: str) -> PolicyDocument:
    """What the EBS CSI controller needs on the disks key to create and attach the class's volumes (the driver's
    docs/install.md, "Encrypted EBS Volumes via KMS": Decrypt, GenerateDataKeyWithoutPlaintext, CreateGrant),
    narrowed to that key, through EC2, and grants for AWS resources only."""
    via = {"kms:ViaService": via_service("ec2", region)}
    return {
        "Version": VERSION,
        "Statement": [
            {
                "Sid": "EncryptVolumesWithTheDisksKey",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey"],
                "Resource": key_arn,
                "Condition": {"StringEquals": via},
            },
            {
                "Sid": "GrantEc2TheDisksKeyForVolumes",
                "Effect": "Allow",
                "Action": ["kms:CreateGrant"],
                "Resource": key_arn,
                "Condition": {"StringEquals": via, "Bool": {"kms:GrantIsForAWSResource": "true"}},
            },
        ],
    }
