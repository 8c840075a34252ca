"""The model bucket (the platform's model store): versioned, SSE-KMS with the platform's models key, private,
TLS only; preparation Jobs write weights into it, engines read them.

S3 Bucket Keys are on: S3 then asks KMS for a data key per bucket and period instead of per object, which
keeps KMS requests (and their cost) flat while engines read multi-GiB weights in many ranged GETs.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.clouds.aws import data_policies, iam
from components.core.weights.store import store_bucket
from components.spec import PlatformSpec

NONCURRENT_VERSION_DAYS = 30
ABORT_UPLOADS_DAYS = 7


class ModelStorage(pulumi.ComponentResource):
    bucket: aws.s3.Bucket

    def __init__(
        self,
        spec: PlatformSpec,
        key_arn: pulumi.Input[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = f"{spec.cluster_name}-models"
        super().__init__("inferstack:aws:ModelStorage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bucket = aws.s3.Bucket(
            name,
            # A known name: engines and preparation Jobs are rendered with their s3:// locations in it.
            bucket=store_bucket(spec),
            force_destroy=False,  # weights are slow to re-upload: deleting the stack keeps a non-empty bucket
            tags=tags,
            opts=child,
        )
        aws.s3.BucketOwnershipControls(
            name,
            bucket=self.bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        block = aws.s3.BucketPublicAccessBlock(
            name,
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketVersioning(
            name,
            bucket=self.bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            name,
            bucket=self.bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="aws:kms", kms_master_key_id=key_arn
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(
            name,
            bucket=self.bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="tidy",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=ABORT_UPLOADS_DAYS
                    ),
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=NONCURRENT_VERSION_DAYS
                    ),
                )
            ],
            opts=child,
        )
        aws.s3.BucketPolicy(
            name,
            bucket=self.bucket.id,
            policy=self.bucket.arn.apply(lambda arn: iam.dumps(data_policies.bucket_tls_only(arn))),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[block]),
        )
        self.register_outputs({"bucket": self.bucket.bucket})
