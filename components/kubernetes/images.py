"""The runtime images (router, health monitor, batcher, batch service, and the model store's weights image), built
from ``runtime/images/`` and pushed, on every target.

One ``pulumi-docker-build`` Image per runtime service, the same on EKS (pushed to the stack's ECR repositories,
``components.clouds.aws.registry``) and on a cluster you bring (pushed to ``gateway.image_registry``): the gateway runs
each by digest (``<repository>@sha256:...``), and so do the model store's preparation Jobs and the engines' weights
init containers (``weights``), so a pod runs exactly what was built. Tags are immutable content
tags: the digest of what goes into the image (its Dockerfile, ``runtime/`` and ``pyproject.toml``), so unchanged
sources push nothing new.

Pushing authenticates with the registry credentials given (on EKS a short-lived ECR token, as Pulumi secrets), or
else with the Docker login of the machine running `pulumi up` (``docker login ghcr.io``; kind's local registry
needs none). Building needs Docker with buildx there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pulumi

from components.core.cloud import Profile
from components.render import batches, gateway
from components.render.gateway import RuntimeImage
from components.spec import QUANTIZE_IMAGE, PlatformSpec

if TYPE_CHECKING:
    import pulumi_docker_build as docker_build

WEIGHTS_IMAGE = "weights"
"""The model store's tools (preparation Jobs, node-cache fill, store check): every cluster stack runs it."""
RUNTIME_IMAGES = ("router", "health", "batcher", batches.PART, WEIGHTS_IMAGE)
PICKER_IMAGE = "picker"
"""The endpoint picker (runtime/images/picker.Dockerfile): built only when gateway.mode is inference-extension."""
RELEASED_IMAGES = (*RUNTIME_IMAGES, PICKER_IMAGE, QUANTIZE_IMAGE)
"""What the release workflow builds and publishes: the runtime images, the endpoint picker (the default
``gateway.picker_image``), and the quantize step's tool image, which stacks never build (a version's preparation
pins its tool image, as an engine pins its own)."""
DOCKERFILE_DIR = Path("runtime/images")
CONTEXT_INPUTS = ("runtime", "pyproject.toml")
PLATFORM = "linux/amd64"


def runtime_images(spec: PlatformSpec) -> tuple[str, ...]:
    """The images an EKS stack keeps repositories for: every runtime image, the batch service's only when it runs."""
    return tuple(i for i in RUNTIME_IMAGES if i != batches.PART or batches.enabled(spec))


def services(spec: PlatformSpec) -> list[str]:
    """The runtime services this stack runs: the gateway's, and the batch service when it is enabled."""
    return [*gateway.parts(spec), *batches.parts(spec)]


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


def digest_reference(repository: str, digest: str) -> str:
    """``<repository>@sha256:<hex>``: the one image this push produced, whatever tags move later."""
    return f"{repository}@{digest}"


def build(
    resource_name: str,
    image: str,
    repository: pulumi.Input[str],
    root: Path,
    parent: pulumi.Resource,
    registries: Sequence[docker_build.RegistryArgs] = (),
) -> RuntimeImage:
    """Build ``image`` from its Dockerfile and push it as ``repository:<content tag>``; run it by digest."""
    import pulumi_docker_build as docker_build  # noqa: PLC0415 - only stacks that build images need it

    tag = context_tag(root, image)
    built = docker_build.Image(
        resource_name,
        context=docker_build.BuildContextArgs(location=str(root)),
        dockerfile=docker_build.DockerfileArgs(location=str(dockerfile(root, image))),
        platforms=[docker_build.Platform(PLATFORM)],
        push=True,
        tags=[pulumi.Output.from_input(repository).apply(lambda repo: f"{repo}:{tag}")],
        registries=list(registries) or None,
        opts=pulumi.ResourceOptions(parent=parent),
    )
    reference = pulumi.Output.all(repository, built.digest).apply(
        lambda args: digest_reference(str(args[0]), str(args[1]))
    )
    return RuntimeImage(reference, tag)


def images_of(spec: PlatformSpec) -> list[str]:
    """The runtime images a cluster stack runs: its runtime services, and the weights image."""
    return [*services(spec), WEIGHTS_IMAGE]


def note(spec: PlatformSpec, profile: Profile | None) -> str | None:
    """What the plan says about the runtime images: built where (the target's cloud says), or run as published;
    nothing on this machine (target local, no profile, runs no images)."""
    if profile is None:
        return None
    parts = ", ".join(images_of(spec))
    where = profile.cloud.image_build(spec)
    if where is not None:
        return f"runtime images: builds {parts} from runtime/images/ {where}; runs them by digest"
    return f"runtime images: runs the spec's published images for {parts} (gateway.image_registry is not set)"


class RegistryImages(pulumi.ComponentResource):
    """``target: kubernetes`` with ``gateway.image_registry``: the runtime services this stack runs and the weights
    image, built and pushed to ``<image_registry>/<image>`` with the deploying machine's Docker login."""

    images: dict[str, RuntimeImage]

    def __init__(self, spec: PlatformSpec, registry: str, root: Path = Path()) -> None:
        super().__init__("inferstack:index:RegistryImages", f"{spec.name}-{spec.environment}")
        self.images = {
            part: build(f"{spec.name}-{spec.environment}-{part}", part, f"{registry}/{part}", root, self)
            for part in images_of(spec)
        }
        self.register_outputs({"images": {part: i.reference for part, i in self.images.items()}})
