"""The platform's two buckets, each versioned, SSE-KMS with a key of its own, private and TLS only: the model
bucket (the model store: preparation Jobs write weights into it, engines read them) and, with batch.enabled, the
batch bucket (the batch service's files: tenants' batch inputs and outputs, which engines must never read).

S3 Bucket Keys are on: S3 then asks KMS for a data key per bucket and period instead of per object, which
keeps KMS requests (and their cost) flat while engines read multi-GiB weights in many ranged GETs.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.clouds.aws import data_policies, decisions, iam, key_policies
from components.clouds.aws.keys import rotating_key
from components.core.cloud import BATCH_DATA, DATA_TAG, MODEL_DATA
from components.core.weights.store import store_bucket
from components.spec import PlatformSpec, eks_section

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
        # A known name: engines and preparation Jobs are rendered with their s3:// locations in it.
        self.bucket = private_bucket(
            name, str(store_bucket(spec)), key_arn, {**tags, DATA_TAG: MODEL_DATA}, self
        )
        self.register_outputs({"bucket": self.bucket.bucket})


class BatchStorage(pulumi.ComponentResource):
    """The batch service's bucket, apart from the model bucket: a policy that lets engines read weights can then
    never reach a tenant's batch file, and the batch key decrypts nothing of the models' (nor the reverse)."""

    bucket: aws.s3.Bucket
    key: aws.kms.Key

    def __init__(
        self,
        spec: PlatformSpec,
        account_id: pulumi.Output[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        name = f"{spec.cluster_name}-batches"
        super().__init__("inferstack:aws:BatchStorage", name, None, opts)
        region = eks_section(spec).region
        self.key = rotating_key(
            f"{spec.cluster_name}-{decisions.BATCHES_KEY}",
            alias=f"alias/{spec.cluster_name}-{decisions.BATCHES_KEY}",
            description=f"{spec.cluster_name}: {decisions.BATCHES_KEY_PURPOSE}",
            policy=account_id.apply(lambda a: iam.dumps(key_policies.service_key(region, a, "s3"))),
            tags=tags,
            parent=self,
        )
        self.bucket = private_bucket(
            name,
            eks_section(spec).batch_files_bucket(spec),
            self.key.arn,
            {**tags, DATA_TAG: BATCH_DATA},
            self,
        )
        self.register_outputs({"bucket": self.bucket.bucket, "key": self.key.arn})


def private_bucket(
    name: str, bucket_name: str, key_arn: pulumi.Input[str], tags: dict[str, str], parent: pulumi.Resource
) -> aws.s3.Bucket:
    """A versioned bucket, SSE-KMS with ``key_arn`` (Bucket Keys on), owner-enforced, no public access, TLS only."""
    child = pulumi.ResourceOptions(parent=parent)
    bucket = aws.s3.Bucket(
        name,
        bucket=bucket_name,
        force_destroy=False,  # weights are slow to re-upload, batch results are tenants': never deleted with the stack
        tags=tags,
        opts=child,
    )
    aws.s3.BucketOwnershipControls(
        name,
        bucket=bucket.id,
        rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
        opts=child,
    )
    block = aws.s3.BucketPublicAccessBlock(
        name,
        bucket=bucket.id,
        block_public_acls=True,
        block_public_policy=True,
        ignore_public_acls=True,
        restrict_public_buckets=True,
        opts=child,
    )
    aws.s3.BucketVersioning(
        name,
        bucket=bucket.id,
        versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
        opts=child,
    )
    aws.s3.BucketServerSideEncryptionConfiguration(
        name,
        bucket=bucket.id,
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
        bucket=bucket.id,
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
        bucket=bucket.id,
        policy=bucket.arn.apply(lambda arn: iam.dumps(data_policies.bucket_tls_only(arn))),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[block]),
    )
    return bucket
