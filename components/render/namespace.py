"""The namespace everything of one platform lives in. Pure."""

from __future__ import annotations

from components.render import common
from components.render.common import Manifest
from components.spec import PlatformSpec


def namespace(spec: PlatformSpec) -> Manifest:
    name = spec.cluster.namespace
    meta = common.metadata(spec, name, "namespace")
    meta.pop("namespace")
    # Engines need nothing beyond the restricted Pod Security Standard; enforce it.
    meta["labels"].update(
        {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
    )
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
