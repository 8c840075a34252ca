"""Register rendered manifest dicts as Pulumi Kubernetes resources.

Renderers produce plain Kubernetes objects; this is the one place that turns them into typed
``pulumi_kubernetes`` resources (or ``CustomResource`` for CRDs), so every component stays a thin
loop over rendered dicts.
"""

from __future__ import annotations

import re
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.render.common import Manifest

_TYPED: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("batch/v1", "Job"): k8s.batch.v1.Job,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): k8s.autoscaling.v2.HorizontalPodAutoscaler,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("networking.k8s.io/v1", "Ingress"): k8s.networking.v1.Ingress,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("scheduling.k8s.io/v1", "PriorityClass"): k8s.scheduling.v1.PriorityClass,
    ("storage.k8s.io/v1", "StorageClass"): k8s.storage.v1.StorageClass,
}
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def _snake(key: str) -> str:
    return _CAMEL.sub("_", key).lower()


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
    cls = _TYPED.get((manifest["apiVersion"], manifest["kind"]))
    if cls is not None:
        resource: pulumi.Resource = cls(name, opts=opts, **{_snake(k): v for k, v in body.items()})
        return resource
    return k8s.apiextensions.CustomResource(
        name, api_version=manifest["apiVersion"], kind=manifest["kind"], opts=opts, **body
    )
