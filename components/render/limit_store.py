"""The shared rate-limit store's Kubernetes side (``gateway.shared_limits``). Pure.

The router replicas read the store's address and AUTH token from one Secret (``<name>-limit-store``: keys
``url`` and ``token``) mounted at ``common.LIMIT_STORE_DIR``; its values are Pulumi secrets filled in by the
component, from wherever the store is: ElastiCache on eks (its endpoint is known only once it exists, which
is why the address travels in the Secret and not in the ConfigMap), or, on a cluster you bring, a small
Redis StatefulSet rendered here:

- one replica, nothing persisted (``--save ''``, no AOF): limits are seconds of state, and a store that
  restarts empty hands out full buckets while the routers' fallback covers the gap;
- AUTH from a Secret file (``requirepass`` in an included config file: never an environment variable);
- restricted pod security (non-root high UID, read-only root, no capabilities, RuntimeDefault seccomp);
- reached only by the router's pods (its own NetworkPolicy), on 6379.
"""

from __future__ import annotations

from components.render import common, hardening
from components.render.common import Manifest
from components.spec import PlatformSpec

STORE = "limits"
PORT = 6379
#: Redis for the kubernetes target, pinned by tag (the .checkov.yaml note on digests applies).
REDIS_IMAGE = "redis:7.2.5-alpine"
URL_KEY = "url"
TOKEN_KEY = "token"
AUTH_CONF_KEY = "auth.conf"
AUTH_CONF_DIR = "/etc/redis"
_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}


def secret_name(spec: PlatformSpec) -> str:
    """The router's Secret with the store's ``url`` and ``token``."""
    return f"{spec.name}-limit-store"


def _secret(spec: PlatformSpec, name: str, component: str) -> Manifest:
    """A Secret without its data: the component adds ``stringData`` as Pulumi secrets."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": common.metadata(spec, name, component),
        "type": "Opaque",
    }


def router_secret(spec: PlatformSpec) -> Manifest:
    """The Secret the router mounts (``url``, ``token``)."""
    return _secret(spec, secret_name(spec), common.ROUTER)


def router_mount(spec: PlatformSpec) -> tuple[Manifest, Manifest]:
    """(volume mount, volume) of that Secret in the router's pod."""
    return (
        {"name": "limit-store", "mountPath": common.LIMIT_STORE_DIR, "readOnly": True},
        {"name": "limit-store", "secret": {"secretName": secret_name(spec), "defaultMode": 0o440}},
    )


# --- the in-cluster store (a cluster you bring) --------------------------------------------------------


def name(spec: PlatformSpec) -> str:
    return common.runtime_name(spec, STORE)


def in_cluster_url(spec: PlatformSpec) -> str:
    return f"redis://{name(spec)}.{spec.cluster.namespace}.svc:{PORT}"


def auth_secret_name(spec: PlatformSpec) -> str:
    return f"{name(spec)}-auth"


def auth_secret(spec: PlatformSpec) -> Manifest:
    """The store's own config file with ``requirepass``."""
    return _secret(spec, auth_secret_name(spec), STORE)


def auth_conf(token: str) -> str:
    return f"requirepass {token}\n"


def selector(spec: PlatformSpec) -> dict[str, str]:
    return common.selector(spec, name(spec), STORE)


def service(spec: PlatformSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(spec, name(spec), STORE),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(spec),
            "ports": [{"name": "redis", "port": PORT, "targetPort": "redis", "protocol": "TCP"}],
        },
    }


def stateful_set(spec: PlatformSpec) -> Manifest:
    probe = {"tcpSocket": {"port": "redis"}, "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3}
    container: Manifest = {
        "name": "redis",
        "image": REDIS_IMAGE,
        "imagePullPolicy": "Always",
        "command": ["redis-server", f"{AUTH_CONF_DIR}/{AUTH_CONF_KEY}"],
        "args": ["--port", str(PORT), "--save", "", "--appendonly", "no", "--dir", "/data"],
        "ports": [{"name": "redis", "containerPort": PORT, "protocol": "TCP"}],
        "resources": _RESOURCES,
        "readinessProbe": probe,
        "livenessProbe": {**probe, "periodSeconds": 10},
        "securityContext": hardening.container_security(),
        "volumeMounts": [
            {"name": "auth", "mountPath": AUTH_CONF_DIR, "readOnly": True},
            {"name": "data", "mountPath": "/data"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": common.metadata(spec, name(spec), STORE),
        "spec": {
            "serviceName": name(spec),
            "replicas": 1,
            "selector": {"matchLabels": selector(spec)},
            "template": {
                "metadata": {"labels": common.labels(spec, name(spec), STORE)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": hardening.pod_security(),
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "auth",
                            "secret": {"secretName": auth_secret_name(spec), "defaultMode": 0o440},
                        },
                        {"name": "data", "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                },
            },
        },
    }


def in_cluster(spec: PlatformSpec) -> list[Manifest]:
    """The Service and StatefulSet (the auth Secret is registered first, with its value)."""
    return [service(spec), stateful_set(spec)]
