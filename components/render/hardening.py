"""Security and availability building blocks every workload shares. Pure.

Restricted Pod Security everywhere (non-root fixed UID, read-only root, no capabilities, RuntimeDefault
seccomp, no privilege escalation); no service-account token unless the pod talks to the API, and then a
short-lived projected one; PodDisruptionBudgets; topology spread across nodes and zones; a priority
class that lets engines preempt batch work but never system pods.
"""

from __future__ import annotations

from components.render import common
from components.render.common import Manifest
from components.spec import PlatformSpec

ENGINE_PRIORITY = 100_000
"""Engines' priority: above default workloads (0), far below system-cluster-critical (2 000 000 000)."""
TOKEN_EXPIRY_S = 3600
"""Lifetime of projected service-account tokens (the kubelet refreshes them before expiry)."""
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ZONE_KEY = "topology.kubernetes.io/zone"
HOST_KEY = "kubernetes.io/hostname"


def container_security() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": common.RUNTIME_UID,
        "runAsGroup": common.RUNTIME_UID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": common.RUNTIME_UID,
        "runAsGroup": common.RUNTIME_UID,
        "fsGroup": common.RUNTIME_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def topology_spread(selector: dict[str, str], *, strict_hosts: bool) -> list[Manifest]:
    """Spread replicas over nodes and zones; zones never block scheduling (GPU capacity is zonal)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOST_KEY,
            "whenUnsatisfiable": "DoNotSchedule" if strict_hosts else "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(selector)},
        },
        {
            "maxSkew": 1,
            "topologyKey": ZONE_KEY,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(selector)},
        },
    ]


def service_account_token_volume(name: str = "kube-api-access") -> Manifest:
    """The API credentials a pod needs, mounted explicitly: a bound token that expires, the CA, the namespace.

    Pods that use it still set ``automountServiceAccountToken: false``; only the containers that mount this
    volume get a token.
    """
    return {
        "name": name,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRY_S}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                    }
                },
            ],
        },
    }


def pdb(spec: PlatformSpec, name: str, component: str, selector: dict[str, str]) -> Manifest:
    """At most one replica down through voluntary disruptions (drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": common.metadata(spec, name, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": dict(selector)},
            # Pods that never became ready may be evicted regardless (a crash-looping pod must not block a drain).
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def priority_class(spec: PlatformSpec) -> Manifest:
    meta = common.metadata(spec, common.priority_class_name(spec), "engine")
    meta.pop("namespace")
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": meta,
        "value": ENGINE_PRIORITY,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": f"Inference engines of {spec.name}-{spec.environment}: scheduled before default workloads.",
    }
