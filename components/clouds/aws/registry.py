"""ECR repositories for the runtime images, and the images built from ``runtime/images/`` and pushed there.

The build itself is ``components.kubernetes.images`` (the same on every target); here each image gets an immutable, scanned,
KMS-encrypted repository with a lifecycle policy, and the push authenticates with a short-lived ECR token from
``aws.ecr.get_authorization_token`` (the deploying identity's credentials, no ``docker login`` on the host); its
password travels only as a Pulumi secret. The gateway deployments run the pushed images by digest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from components.kubernetes import images as builds
from components.kubernetes.images import dockerfile
from components.render.gateway import RuntimeImage
from components.spec import PlatformSpec

if TYPE_CHECKING:
    import pulumi_docker_build as docker_build

UNTAGGED_EXPIRY_DAYS = 14
KEEP_IMAGES = 30


def images_for(spec: PlatformSpec) -> tuple[str, ...]:
    """The runtime images a stack pushes to ECR: the batch service's only when it runs, the endpoint picker's
    only in inference-extension mode."""
    picker = (builds.PICKER_IMAGE,) if not spec.gateway.runs_router else ()
    return (*builds.runtime_images(spec), *picker)


def repository_name(spec: PlatformSpec, image: str) -> str:
    """'<cluster>/<image>': ECR names are per account and region, and so is the cluster's name, which differs
    between the stacks of an account (two stacks of one environment, such as prod and prod-405b, shared
    '<name>/<environment>/...', and the second `pulumi up` failed). The policy pack's
    ``aws-names-derive-from-cluster`` holds every account-scoped name to this."""
    return f"{spec.cluster_name}/{image}"


def lifecycle_policy() -> str:
    """Expire untagged layers after two weeks; keep the newest tagged images."""
    return json.dumps(
        {
            "rules": [
                {
                    "rulePriority": 1,
                    "description": f"expire untagged images after {UNTAGGED_EXPIRY_DAYS} days",
                    "selection": {
                        "tagStatus": "untagged",
                        "countType": "sinceImagePushed",
                        "countUnit": "days",
                        "countNumber": UNTAGGED_EXPIRY_DAYS,
                    },
                    "action": {"type": "expire"},
                },
                {
                    "rulePriority": 2,
                    "description": f"keep the newest {KEEP_IMAGES} images",
                    "selection": {
                        "tagStatus": "any",
                        "countType": "imageCountMoreThan",
                        "countNumber": KEEP_IMAGES,
                    },
                    "action": {"type": "expire"},
                },
            ]
        }
    )


class Registry(pulumi.ComponentResource):
    """One ECR repository per runtime image; ``images`` maps image -> what the gateway runs: the pushed reference
    by digest, labelled with its content tag."""

    repositories: dict[str, aws.ecr.Repository]
    images: dict[str, RuntimeImage]

    def __init__(
        self,
        spec: PlatformSpec,
        tags: dict[str, str],
        root: Path,
        key_arn: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("inferstack:aws:Registry", spec.cluster_name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.repositories = {}
        self.images = {}
        for image in images_for(spec):
            repo = aws.ecr.Repository(
                f"{spec.cluster_name}-{image}",
                name=repository_name(spec, image),
                image_tag_mutability="IMMUTABLE",
                image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(
                    scan_on_push=True
                ),
                encryption_configurations=[
                    aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="KMS", kms_key=key_arn)
                ],
                force_delete=False,
                tags=tags,
                opts=child,
            )
            aws.ecr.LifecyclePolicy(
                f"{spec.cluster_name}-{image}", repository=repo.name, policy=lifecycle_policy(), opts=child
            )
            self.repositories[image] = repo
            if dockerfile(root, image).is_file():
                self.images[image] = builds.build(
                    f"{spec.cluster_name}-{image}",
                    image,
                    repo.repository_url,
                    root,
                    self,
                    registries=[self._ecr_login(repo)],
                )
            else:
                pulumi.log.warn(
                    f"{dockerfile(root, image)} does not exist: repository {image} is created, no image is "
                    "built, and the gateway runs the spec's image for it",
                    self,
                )
        self.register_outputs({"images": {i: built.reference for i, built in self.images.items()}})

    def runtime_images(self) -> dict[str, RuntimeImage]:
        """What the gateway deployments run: each pushed image by digest, labelled with its content tag."""
        return dict(self.images)

    def _ecr_login(self, repo: aws.ecr.Repository) -> docker_build.RegistryArgs:
        """A fresh ECR token for the repository's registry, as Pulumi secrets."""
        import pulumi_docker_build as docker_build  # noqa: PLC0415 - only stacks that build images need it

        token = aws.ecr.get_authorization_token_output(
            registry_id=repo.registry_id, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        return docker_build.RegistryArgs(
            address=repo.repository_url.apply(lambda url: url.split("/", 1)[0]),
            username=pulumi.Output.secret(token.user_name),
            password=pulumi.Output.secret(token.password),
        )
