"""Customer-managed KMS keys for the platform's data at rest: logs, model weights, images, node disks.

One key per purpose (``decisions.KMS_KEYS`` says why), each rotated yearly by KMS, each with a key
policy from ``components.clouds.aws.key_policies``: the account administers the key through IAM, and only the
one AWS service of its purpose may use it (no ``kms:*``, no wildcard principal).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.clouds.aws import decisions, iam, key_policies
from components.spec import PlatformSpec, eks_section


class PlatformKeys(pulumi.ComponentResource):
    """``logs``, ``models``, ``images`` and ``disks`` keys (the EKS Secrets key belongs to the cluster)."""

    logs: aws.kms.Key
    models: aws.kms.Key
    images: aws.kms.Key
    disks: aws.kms.Key

    def __init__(
        self,
        spec: PlatformSpec,
        account_id: pulumi.Output[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = spec.cluster_name
        super().__init__("inferstack:aws:PlatformKeys", name, None, opts)
        region = eks_section(spec).region
        log_groups = [decisions.flow_log_group(spec), decisions.control_plane_log_group(spec)]
        self.logs = self._key(
            spec, "logs", account_id.apply(lambda a: key_policies.logs_key(region, a, log_groups)), tags
        )
        self.models = self._key(
            spec, "models", account_id.apply(lambda a: key_policies.service_key(region, a, "s3")), tags
        )
        self.images = self._key(
            spec, "images", account_id.apply(lambda a: key_policies.service_key(region, a, "ecr")), tags
        )
        self.disks = self._key(
            spec, "disks", account_id.apply(lambda a: key_policies.disks_key(region, a)), tags
        )
        self.register_outputs({k: getattr(self, k).arn for k in ("logs", "models", "images", "disks")})

    def _key(
        self,
        spec: PlatformSpec,
        purpose: str,
        policy: pulumi.Output[iam.PolicyDocument],
        tags: dict[str, str],
    ) -> aws.kms.Key:
        return rotating_key(
            f"{spec.cluster_name}-{purpose}",
            alias=f"alias/{spec.cluster_name}-{purpose}",
            description=f"{spec.cluster_name}: {decisions.KMS_KEYS[purpose]}",
            policy=policy.apply(iam.dumps),
            tags=tags,
            parent=self,
        )


def rotating_key(
    resource_name: str,
    *,
    alias: str,
    description: str,
    policy: pulumi.Input[str],
    tags: dict[str, str],
    parent: pulumi.Resource,
) -> aws.kms.Key:
    """A customer-managed key with yearly rotation and the platform's deletion window, and its alias."""
    child = pulumi.ResourceOptions(parent=parent)
    key = aws.kms.Key(
        resource_name,
        description=description,
        enable_key_rotation=True,
        deletion_window_in_days=decisions.KMS_DELETION_WINDOW_DAYS,
        policy=policy,
        tags=tags,
        opts=child,
    )
    aws.kms.Alias(resource_name, name=alias, target_key_id=key.key_id, opts=child)
    return key
