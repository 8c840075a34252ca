"""The batch service (``runtime.batch_service``): its settings in the runtime config, a StatefulSet with its
volume, a Service and an identity. Pure. (Its NetworkPolicy is in ``network``, its alerts in ``alerts``.)

Why a StatefulSet of one with a volume: the state store is SQLite on that volume, and SQLite (and the
service's exactly-once bookkeeping) wants exactly one writer. A StatefulSet never runs two pods of the same
identity: an update stops the old pod before it starts the new one, which then mounts the same volume
and resumes every unfinished batch. A Deployment's rolling update would briefly run two. Where the cloud
has an object store (``Cloud.batch_files``: on EKS a bucket and KMS key of their own, apart from the model bucket
engines read) the files go there under a prefix the service alone may touch; elsewhere they share the volume.
"""

from __future__ import annotations

from typing import Any

from components.core.cloud import Cloud
from components.render import common, hardening
from components.render.common import Manifest
from components.spec import PlatformSpec
from runtime.config import BATCH_BUCKET_ENV, BatchesSettings, RuntimeConfig, S3Files

PART = "batches"
KEY_DIR = "/etc/inferstack/batches-key"
KEY_FILE = "api-key"
DATA_VOLUME = "data"
MIB = 1024 * 1024


def enabled(spec: PlatformSpec) -> bool:
    return spec.batch.enabled


def parts(spec: PlatformSpec) -> list[str]:
    """The batch service among the runtime services this stack runs (for scrapes and network policies)."""
    return [PART] if enabled(spec) else []


def name(spec: PlatformSpec) -> str:
    return common.runtime_name(spec, PART)


def port() -> int:
    return int(BatchesSettings.model_fields["port"].default)


METRICS_PORT = 8084
"""In a cluster the metrics listen apart from the API (``BatchesSettings.metrics_port``): Prometheus may reach
them, only the router the API."""
METRICS_PORT_NAME = "metrics"


def state_dir() -> str:
    return str(BatchesSettings.model_fields["state_dir"].default)


def url(spec: PlatformSpec) -> str:
    return f"http://{name(spec)}.{spec.cluster.namespace}.svc:{port()}"


def service_account_name(spec: PlatformSpec) -> str:
    """The identity the service runs as; on EKS, Pod Identity gives it the bucket prefix of its files."""
    return name(spec)


def router_key_secret_name(spec: PlatformSpec) -> str:
    return f"{spec.name}-batches-key"


def uses_router_key(spec: PlatformSpec) -> bool:
    return spec.gateway.require_api_key


def settings(
    spec: PlatformSpec, router_url: str, health_url: str, files: S3Files | None
) -> BatchesSettings | None:
    """The ``batches`` section of the runtime config; None when the stack runs no batch service."""
    if not enabled(spec):
        return None
    b = spec.batch
    return BatchesSettings.model_validate(
        {
            "router_url": router_url,
            "health_feed_url": health_url,
            "s3": files,
            "router_api_key_file": f"{KEY_DIR}/{KEY_FILE}" if uses_router_key(spec) else None,
            "router_key_name": b.router_key_name if uses_router_key(spec) else None,
            "metrics_port": METRICS_PORT,
            "max_file_bytes": b.max_file_mib * MIB,
            "max_requests_per_batch": b.max_requests_per_batch,
            "max_inflight_per_replica": b.max_inflight_per_replica,
            "headroom_share": b.headroom_share,
        }
    )


# --- the workload -----------------------------------------------------------------------------------
def service_account(spec: PlatformSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": common.metadata(spec, service_account_name(spec), PART),
        "automountServiceAccountToken": False,
    }


def router_key_secret(spec: PlatformSpec) -> Manifest:
    """The Secret with the key the service sends to the router; its value is filled in as a Pulumi secret."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": common.metadata(spec, router_key_secret_name(spec), PART),
        "type": "Opaque",
    }


def selector(spec: PlatformSpec) -> dict[str, str]:
    return common.selector(spec, name(spec), PART)


def storage_class(spec: PlatformSpec, cloud: Cloud) -> str | None:
    """The class the service's volume claims: the spec's (batch.storage_class), else the one the target's layer
    creates (on EKS its encrypted gp3 class: EKS 1.30+ has no default class, and a claim naming none never bound),
    else None: the cluster's default."""
    return spec.batch.storage_class or cloud.volume_storage_class(spec)


def stateful_set(
    spec: PlatformSpec,
    config: RuntimeConfig,
    image: Any,
    version: str,
    bucket: Any | None,
    checksum: str,
    storage: str | None,
) -> Manifest:
    """One pod, its volume from a claim template of class ``storage`` (``storage_class``; None: the cluster's
    default); ``image`` and ``bucket`` may be Pulumi Outputs (EKS); ``checksum`` is the runtime config's
    (``gateway.config_checksum``): a changed config rolls the pod."""
    b = spec.batch
    labels = common.labels(spec, name(spec), PART, version)
    quantities = {"cpu": common.quantity_cpu(b.cpu_cores), "memory": common.quantity_gib(b.memory_gib)}
    env: list[Manifest] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if config.batches is not None and config.batches.s3 is not None and config.batches.s3.bucket is None:
        env.append({"name": BATCH_BUCKET_ENV, "value": bucket})
    mounts: list[Manifest] = [
        common.runtime_config_mount(),
        {"name": DATA_VOLUME, "mountPath": state_dir()},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Manifest] = [
        common.runtime_config_volume(spec),
        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    if uses_router_key(spec):
        mounts.append({"name": "router-key", "mountPath": KEY_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "router-key",
                "secret": {"secretName": router_key_secret_name(spec), "defaultMode": 0o440},
            }
        )
    container: Manifest = {
        "name": PART,
        "image": image,
        "imagePullPolicy": "Always",
        "command": [
            "python",
            "-m",
            "runtime.batch_service",
            "--config",
            f"{common.RUNTIME_CONFIG_DIR}/{common.RUNTIME_CONFIG_FILE}",
        ],
        "env": env,
        "ports": [
            {"name": "http", "containerPort": port(), "protocol": "TCP"},
            {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": dict(quantities), "limits": dict(quantities)},
        "readinessProbe": common.http_probe("/readyz", 10, 3, timeout_s=3),
        "livenessProbe": common.http_probe("/healthz", 10, 3, timeout_s=3),
        "securityContext": hardening.container_security(),
        "volumeMounts": mounts,
    }
    claim: Manifest = {
        "metadata": {"name": DATA_VOLUME, "labels": common.labels(spec, name(spec), PART)},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": f"{b.storage_gib}Gi"}},
        },
    }
    if storage:
        claim["spec"]["storageClassName"] = storage
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": common.metadata(spec, name(spec), PART, version),
        "spec": {
            "serviceName": name(spec),
            "replicas": 1,
            "revisionHistoryLimit": 3,
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "selector": {"matchLabels": selector(spec)},
            "template": {
                "metadata": {"labels": labels, "annotations": {"inferstack.io/config-sha256": checksum}},
                "spec": {
                    "serviceAccountName": service_account_name(spec),
                    "automountServiceAccountToken": False,
                    # SIGTERM: API calls drain, requests in flight are abandoned (their lines run again)
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": hardening.pod_security(),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
            "volumeClaimTemplates": [claim],
        },
    }


def service(spec: PlatformSpec) -> Manifest:
    """Headless: the StatefulSet's governing Service, and what the router reaches the one pod through."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(spec, name(spec), PART),
        "spec": {
            "clusterIP": "None",
            "selector": selector(spec),
            "ports": [
                {"name": "http", "port": port(), "targetPort": "http", "protocol": "TCP"},
                {
                    "name": METRICS_PORT_NAME,
                    "port": METRICS_PORT,
                    "targetPort": METRICS_PORT_NAME,
                    "protocol": "TCP",
                },
            ],
        },
    }


def pdb(spec: PlatformSpec) -> Manifest:
    return hardening.pdb(spec, name(spec), PART, selector(spec))


def render(
    spec: PlatformSpec,
    config: RuntimeConfig,
    image: Any,
    version: str,
    bucket: Any | None,
    checksum: str,
    storage: str | None = None,
) -> list[Manifest]:
    """The batch service's objects (the router key Secret aside: its value is a Pulumi secret); ``storage``: the
    volume's class (``storage_class``)."""
    if not enabled(spec):
        return []
    return [
        service_account(spec),
        stateful_set(spec, config, image, version, bucket, checksum, storage),
        service(spec),
        pdb(spec),
    ]
