"""Register rendered manifest dicts as Pulumi Kubernetes resources.

Renderers produce plain Kubernetes objects; this is the one place that turns them into typed
``pulumi_kubernetes`` resources (or ``CustomResource`` for CRDs), so every component stays a thin
loop over rendered dicts.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.base.names import camel_to
from components.render.common import Manifest

_TYPED: frozenset[tuple[str, str]] = frozenset(
    {
        ("v1", "Namespace"),
        ("v1", "Service"),
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
        ("v1", "ServiceAccount"),
        ("apps/v1", "Deployment"),
        ("apps/v1", "DaemonSet"),
        ("batch/v1", "Job"),
        ("apps/v1", "StatefulSet"),
        ("policy/v1", "PodDisruptionBudget"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("networking.k8s.io/v1", "Ingress"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("scheduling.k8s.io/v1", "PriorityClass"),
        ("storage.k8s.io/v1", "StorageClass"),
    }
)
"""The kinds registered as typed resources (their class is ``pulumi_kubernetes.<group>.<version>.<kind>``); any
other kind is a ``CustomResource``."""


def _typed_class(api_version: str, kind: str) -> Any:
    """Looked up when first used, not at import: the SDK then loads only the service modules a stack needs."""
    group, _, version = api_version.rpartition("/")
    package = getattr(getattr(k8s, group.partition(".")[0] or "core"), version)
    return getattr(package, kind)


def logical_name(manifest: Manifest) -> str:
    """Unique within a stack: kind, namespace and name (duplicates do not fail under mocks, so be exact)."""
    meta = manifest["metadata"]
    scope = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{manifest['kind'].lower()}:{scope}{meta['name']}"


def is_typed(manifest: Manifest) -> bool:
    return (manifest["apiVersion"], manifest["kind"]) in _TYPED


def apply(
    manifest: Manifest, opts: pulumi.ResourceOptions, secret_fields: tuple[str, ...] = ()
) -> pulumi.Resource:
    """Create the resource for one manifest; ``secret_fields`` top-level keys are wrapped as Pulumi secrets."""
    body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
    for key in secret_fields:
        if key in body:
            body[key] = pulumi.Output.secret(body[key])
    name = logical_name(manifest)
    if is_typed(manifest):
        cls = _typed_class(manifest["apiVersion"], manifest["kind"])
        resource: pulumi.Resource = cls(name, opts=opts, **{camel_to("_", k): v for k, v in body.items()})
        return resource
    return k8s.apiextensions.CustomResource(
        name, api_version=manifest["apiVersion"], kind=manifest["kind"], opts=opts, **body
    )
