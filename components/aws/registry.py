"""ECR repositories for the runtime images, and the images built from ``runtime/images/`` and pushed there.

Tags are immutable, so an image's tag is the digest of what goes into it (its Dockerfile, ``runtime/`` and
``pyproject.toml``): unchanged sources push nothing, changed ones get a new tag. The gateway deployments
run the pushed images by digest (``<repository URL>@sha256:...``), so a pod runs exactly what was built.

Pushing authenticates with a short-lived ECR token from ``aws.ecr.get_authorization_token`` (the deploying
identity's credentials, no ``docker login`` on the host); its password travels only as a Pulumi secret.
Repositories are encrypted with the platform's images key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from components.render.gateway import RuntimeImage
from components.spec import PlatformSpec

if TYPE_CHECKING:
    import pulumi_docker_build as docker_build

RUNTIME_IMAGES = ("router", "health", "batcher", "batches")
DOCKERFILE_DIR = Path("runtime/images")
CONTEXT_INPUTS = ("runtime", "pyproject.toml")
UNTAGGED_EXPIRY_DAYS = 14
KEEP_IMAGES = 30
PLATFORM = "linux/amd64"


def runtime_images(spec: PlatformSpec) -> tuple[str, ...]:
    """The images this stack runs: the batch service's only when it is enabled."""
    return tuple(i for i in RUNTIME_IMAGES if i != "batches" or spec.batch.enabled)


def dockerfile(root: Path, image: str) -> Path:
    return root / DOCKERFILE_DIR / f"{image}.Dockerfile"


def context_tag(root: Path, image: str) -> str:
    """A content tag: sha256 over the Dockerfile and the build inputs (paths and bytes, in sorted order)."""
    digest = hashlib.sha256()
    files = [dockerfile(root, image)]
    for entry in CONTEXT_INPUTS:
        path = root / entry
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for path in files:
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"src-{digest.hexdigest()[:16]}"


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


def digest_reference(repository_url: str, digest: str) -> str:
    """``<repository URL>@sha256:<hex>``: the one image this push produced, whatever tags move later."""
    return f"{repository_url}@{digest}"


class Registry(pulumi.ComponentResource):
    """One ECR repository per runtime image; ``images`` maps image -> pushed reference by digest.

    ``versions`` maps image -> its content tag (plain text, known before the push: the version label).
    """

    repositories: dict[str, aws.ecr.Repository]
    images: dict[str, pulumi.Output[str]]
    versions: dict[str, str]

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
        self.versions = {}
        for image in runtime_images(spec):
            repo = aws.ecr.Repository(
                f"{spec.cluster_name}-{image}",
                name=f"{spec.name}/{spec.environment}/{image}",
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
                self.versions[image] = tag = context_tag(root, image)
                built = self._build(spec, image, tag, repo, root)
                self.images[image] = pulumi.Output.all(repo.repository_url, built.digest).apply(
                    lambda args: digest_reference(str(args[0]), str(args[1]))
                )
            else:
                pulumi.log.warn(
                    f"{dockerfile(root, image)} does not exist: repository {image} is created, no image is "
                    "built, and the gateway runs the spec's image for it",
                    self,
                )
        self.register_outputs({"images": self.images})

    def runtime_images(self) -> dict[str, RuntimeImage]:
        """What the gateway deployments run: each pushed image by digest, labelled with its content tag."""
        return {image: RuntimeImage(ref, self.versions[image]) for image, ref in self.images.items()}

    def _build(
        self, spec: PlatformSpec, image: str, tag: str, repo: aws.ecr.Repository, root: Path
    ) -> docker_build.Image:
        """Build ``image`` and push it as ``repo:tag``, logged in with a fresh ECR token for that registry."""
        import pulumi_docker_build as docker_build  # noqa: PLC0415 - only stacks that build images need it

        token = aws.ecr.get_authorization_token_output(
            registry_id=repo.registry_id, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        built = docker_build.Image(
            f"{spec.cluster_name}-{image}",
            context=docker_build.BuildContextArgs(location=str(root)),
            dockerfile=docker_build.DockerfileArgs(location=str(dockerfile(root, image))),
            platforms=[docker_build.Platform(PLATFORM)],
            push=True,
            tags=[repo.repository_url.apply(lambda url: f"{url}:{tag}")],
            registries=[
                docker_build.RegistryArgs(
                    address=repo.repository_url.apply(lambda url: url.split("/", 1)[0]),
                    username=pulumi.Output.secret(token.user_name),
                    password=pulumi.Output.secret(token.password),
                )
            ],
            opts=pulumi.ResourceOptions(parent=self),
        )
        return built
