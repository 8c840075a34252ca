"""How the Kubernetes side of a stack reaches its cluster: the Pulumi half of the cloud seam.

The layer that makes the cluster fills in a ``ClusterAccess`` (on EKS, ``components.clouds.aws.layer.provision``);
``InferencePlatform`` registers every Kubernetes resource with it. A cluster you bring needs nothing made
first, and the defaults say so (``bring_your_own``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi

from components.core.placement import Layout
from components.kubernetes.images import RegistryImages
from components.render.addons import Release
from components.render.gateway import RuntimeImage
from components.spec import PlatformSpec


@dataclass(frozen=True)
class ClusterAccess:
    """What the cloud layer hands the Kubernetes side."""

    options: pulumi.ResourceOptions | None = None
    """Options for every Kubernetes resource: the cluster's provider, and what must exist first. None: the
    default provider, from the ambient kubeconfig."""
    images: Mapping[str, RuntimeImage] = field(default_factory=dict)
    """Runtime service -> the image to run instead of the spec's pinned one (on EKS, its ECR pushes)."""
    addons: tuple[Release, ...] = ()
    """The cloud's own controllers, installed after the cloud-neutral add-ons."""
    files_bucket: Any | None = None
    """The bucket holding the batch service's files where the cloud keeps them in S3 (``Cloud.batch_files``):
    on EKS the batch bucket's name (cluster.batch_bucket, never the model bucket), an Output known once it exists."""
    limit_store_url: pulumi.Output[str] | None = None
    """The managed rate-limit store's URL (``gateway.shared_limits`` on a cloud that manages it)."""


def bring_your_own(spec: PlatformSpec, layout: Layout, stack: str) -> ClusterAccess:
    """``target: kubernetes``: the kubeconfig's cluster, no cloud controllers, and the runtime images built into
    ``gateway.image_registry`` (else the spec's pinned images, which must be published)."""
    registry = spec.gateway.image_registry
    if registry is None:
        return ClusterAccess()
    return ClusterAccess(images=RegistryImages(spec, registry).images)
