"""Names, labels and small building blocks every renderer shares, so they are spelled once."""

from __future__ import annotations

from typing import Any

from components.spec import PlatformSpec

Manifest = dict[str, Any]

PART_OF = "inferstack"
MANAGED_BY = "pulumi"
MODEL_LABEL = "inferstack.io/model"
ADAPTERS_ANNOTATION = "inferstack.io/lora-adapters"
"""On an engine's pod template: its model's LoRA adapters as JSON (name, source, revision, rank), which the
policy pack checks (pinned sources, ranks within the engine's limit, an engine that serves adapters)."""
ENGINE_PORT = 8000
RUNTIME_UID = 10001  # the runtime images' user; high, so it never matches a host account


def engine_name(model: str) -> str:
    return f"{model}-engine"


def labels(spec: PlatformSpec, name: str, component: str, version: str | None = None) -> dict[str, str]:
    """The recommended ``app.kubernetes.io/*`` labels plus the environment."""
    out = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": f"{spec.name}-{spec.environment}",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "inferstack.io/environment": spec.environment,
    }
    if version:
        out["app.kubernetes.io/version"] = version[:63]
    return out


def selector(spec: PlatformSpec, name: str, component: str) -> dict[str, str]:
    """The immutable subset of ``labels`` that selectors use (never the version)."""
    full = labels(spec, name, component)
    return {
        k: full[k]
        for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")
    }


def metadata(
    spec: PlatformSpec, name: str, component: str, version: str | None = None, **extra: Any
) -> Manifest:
    return {
        "name": name,
        "namespace": spec.cluster.namespace,
        "labels": labels(spec, name, component, version),
        **extra,
    }


def image_version(image: str) -> str:
    """The tag (or digest) of an image reference, for the version label."""
    if "@" in image:
        return image.rsplit("@", 1)[1].replace(":", "-")[:63]
    return image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "unknown"


def quantity_gib(value: float) -> str:
    """A Kubernetes memory quantity in Mi (integral, so diffs stay stable)."""
    return f"{int(value * 1024)}Mi"


def quantity_cpu(value: float) -> str:
    return f"{int(value * 1000)}m"


# Runtime services (router, health monitor, batcher) and cluster-wide names -------------------------
ROUTER = "router"
HEALTH = "health"
BATCHER = "batcher"
PICKER = "picker"  # the endpoint picker, behind an inference-extension gateway (gateway.mode)
RUNTIME_CONFIG_FILE = "runtime.yaml"  # the images' default --config
RUNTIME_CONFIG_DIR = "/etc/inferstack"
API_KEYS_FILE = "api-keys.yaml"
API_KEYS_DIR = "/etc/inferstack/keys"
TOKENIZERS_DIR = "/var/lib/inferstack/tokenizers"  # the router pod's emptyDir its init container fills
LIMIT_STORE_DIR = "/etc/inferstack/limit-store"  # the router pod's mount of the store's Secret


def router_tokenizer_dir(model: str) -> str:
    """Where the router finds a model's tokenizer (for the KV-event view of precise_prefix)."""
    return f"{TOKENIZERS_DIR}/{model}"


def runtime_name(spec: PlatformSpec, part: str) -> str:
    """Name of a runtime service's objects, e.g. 'inferstack-router'."""
    return f"{spec.name}-{part}"


def engine_service_account_name(spec: PlatformSpec) -> str:
    """The identity engine pods run as; on EKS, Pod Identity gives it read access to the model bucket."""
    return f"{spec.name}-engine"


def runtime_config_name(spec: PlatformSpec) -> str:
    return f"{spec.name}-runtime-config"


def runtime_config_mount() -> Manifest:
    """Where a runtime service reads the rendered ``RuntimeConfig`` (read-only)."""
    return {"name": "config", "mountPath": RUNTIME_CONFIG_DIR, "readOnly": True}


def runtime_config_volume(spec: PlatformSpec) -> Manifest:
    """The ConfigMap holding the rendered ``RuntimeConfig``, as a pod volume."""
    return {
        "name": "config",
        "configMap": {
            "name": runtime_config_name(spec),
            "items": [{"key": RUNTIME_CONFIG_FILE, "path": RUNTIME_CONFIG_FILE}],
        },
    }


def api_keys_secret_name(spec: PlatformSpec) -> str:
    return f"{spec.name}-api-keys"


def priority_class_name(spec: PlatformSpec) -> str:
    """Cluster-scoped, so it carries the environment: two environments may share a cluster."""
    return f"{spec.name}-{spec.environment}-engine"


def engine_selector(spec: PlatformSpec, model: str) -> dict[str, str]:
    return selector(spec, engine_name(model), "engine")


def http_probe(path: str, period_s: int, failures: int, timeout_s: int = 2) -> Manifest:
    """A probe on the container's ``http`` port."""
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }
