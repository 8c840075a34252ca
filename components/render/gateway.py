"""The gateway: router, health monitor and batcher Deployments, their configuration and identities. Pure.

- One ConfigMap holds the ``RuntimeConfig`` rendered by ``components.render.runtime_config``; pods carry
  its checksum, so a changed config rolls them.
- Router, health monitor and batcher (embedding models only) run as hardened Deployments with their
  own ServiceAccounts: each mounts a short-lived projected token because each watches EndpointSlices;
  the health monitor may also list pods and create Events (least-privilege Roles below).
- The router mounts the API keys Secret (``components.render.api_keys``); traffic reaches it through
  ``components.render.ingress``. In inference-extension mode the endpoint picker mounts it instead: it is
  what checks keys there.
- Images: the spec's pinned images, unless the caller passes others (on EKS, the images the AWS layer
  pushed to ECR, referenced by digest; see ``RuntimeImage``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.core.cloud import Cloud
from components.render import (
    batches,
    common,
    hardening,
    inference_extension,
    ingress,
    limit_store,
    tokenizers,
)
from components.render.common import Manifest
from components.render.runtime_config import has_batcher, runtime_config
from components.render.tokenizers import RouterTokenizers
from components.spec import PlatformSpec
from runtime.config import RuntimeConfig

CONFIG_CHECKSUM_ANNOTATION = "inferstack.io/config-sha256"
ROUTER_CPU_TARGET_PERCENT = 70
METRICS_PORT_NAME = "metrics"
"""The router's metrics listener, on its pods and its Service: Prometheus scrapes it; no ingress routes it."""
"""Router HPA target: the router is CPU-bound (hashing prompts, proxying streams)."""
# Health monitor and batcher are small, steady services; the router's size is a spec knob.
_HEALTH_RESOURCES = (0.25, 0.25)  # cores, GiB
_BATCHER_RESOURCES = (1.0, 1.0)


@dataclass(frozen=True)
class RuntimeImage:
    """The image a runtime Deployment runs.

    ``reference`` goes into the container as it is: a pinned string, or (on EKS) a Pulumi Output that
    resolves to ``<ECR repository URL>@sha256:<digest>`` once the image is pushed. The renderer stays free of
    Pulumi by never looking inside it; ``version`` is the plain string for the version label.
    """

    reference: Any
    version: str


def spec_images(spec: PlatformSpec) -> dict[str, RuntimeImage]:
    """The spec's pinned images per runtime service, labelled with their tag or digest."""
    g = spec.gateway
    refs = {
        common.ROUTER: g.router_image,
        common.HEALTH: g.health_image,
        common.BATCHER: g.batcher_image,
        inference_extension.PICKER: g.picker_image,
        batches.PART: spec.batch.image,
    }
    return {part: RuntimeImage(ref, common.image_version(ref)) for part, ref in refs.items()}


def config_text(config: RuntimeConfig) -> str:
    return config.to_yaml()


def config_map(spec: PlatformSpec, text: str) -> Manifest:
    """The runtime config ``text`` (``config_text``: rendered once per plan, it is most of a plan's YAML work)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": common.metadata(spec, common.runtime_config_name(spec), "gateway"),
        "data": {common.RUNTIME_CONFIG_FILE: text},
    }


def config_checksum(text: str) -> str:
    """Of the config text: a changed config rolls the services that read it."""
    return hashlib.sha256(text.encode()).hexdigest()


# Identity and access --------------------------------------------------------------------------------


def service_account(spec: PlatformSpec, part: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": common.metadata(spec, common.runtime_name(spec, part), part),
        "automountServiceAccountToken": False,
    }


def _rules(spec: PlatformSpec, part: str) -> list[Manifest]:
    rules: list[Manifest] = [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    if part == common.HEALTH:
        health = runtime_config(spec).health
        pod_verbs = ["list"] + (["delete"] if health.remediate_after_s is not None else [])
        rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": pod_verbs})
        if health.kubernetes_events:
            rules.append({"apiGroups": [""], "resources": ["events"], "verbs": ["create"]})
    return rules


def role(spec: PlatformSpec, part: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": common.metadata(spec, common.runtime_name(spec, part), part),
        "rules": _rules(spec, part),
    }


def role_binding(spec: PlatformSpec, part: str) -> Manifest:
    name = common.runtime_name(spec, part)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": common.metadata(spec, name, part),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": spec.cluster.namespace}],
    }


# Workloads ------------------------------------------------------------------------------------------


def _resources(cores: float, memory_gib: float) -> Manifest:
    quantities = {"cpu": common.quantity_cpu(cores), "memory": common.quantity_gib(memory_gib)}
    return {"requests": dict(quantities), "limits": dict(quantities)}


def runtime_selector(spec: PlatformSpec, part: str) -> dict[str, str]:
    return common.selector(spec, common.runtime_name(spec, part), part)


def deployment(
    spec: PlatformSpec,
    part: str,
    image: RuntimeImage,
    port: int,
    replicas: int | None,
    resources: tuple[float, float],
    checksum: str,
    extra_mounts: tuple[tuple[Manifest, Manifest], ...] = (),
    pod: RouterTokenizers | None = None,
    metrics_port: int | None = None,
) -> Manifest:
    """A runtime service: ``python -m runtime.<part> --config ...`` with the config, a token, and /tmp;
    ``metrics_port``: a second container port, ``metrics`` (the router's /metrics, apart from its API)."""
    name = common.runtime_name(spec, part)
    version = image.version
    pod_labels = common.labels(spec, name, part, version)
    token = hardening.service_account_token_volume()
    mounts: list[Manifest] = [
        common.runtime_config_mount(),
        {"name": token["name"], "mountPath": hardening.SERVICE_ACCOUNT_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Manifest] = [
        common.runtime_config_volume(spec),
        token,
        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    for mount, volume in extra_mounts:
        mounts.append(mount)
        volumes.append(volume)
    if pod is not None:
        mounts += pod.router_mounts
        volumes += pod.volumes
    config_path = f"{common.RUNTIME_CONFIG_DIR}/{common.RUNTIME_CONFIG_FILE}"
    container: Manifest = {
        "name": part,
        "image": image.reference,
        "imagePullPolicy": "Always",
        "command": ["python", "-m", f"runtime.{part}", "--config", config_path],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [
            {"name": "http", "containerPort": port, "protocol": "TCP"},
            *(
                [{"name": METRICS_PORT_NAME, "containerPort": metrics_port, "protocol": "TCP"}]
                if metrics_port is not None
                else []
            ),
        ],
        "resources": _resources(*resources),
        "readinessProbe": common.http_probe("/readyz", 5, 2),
        "livenessProbe": common.http_probe("/healthz", 10, 3),
        # Let endpoints drop this pod before it stops accepting connections.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "securityContext": hardening.container_security(),
        "volumeMounts": mounts,
    }
    selector = runtime_selector(spec, part)
    body: Manifest = {
        "revisionHistoryLimit": 3,
        "selector": {"matchLabels": selector},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {"labels": pod_labels, "annotations": {CONFIG_CHECKSUM_ANNOTATION: checksum}},
            "spec": {
                "serviceAccountName": name,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": runtime_config(spec).router.drain_grace_s + 15,
                "securityContext": hardening.pod_security(),
                "topologySpreadConstraints": hardening.topology_spread(selector, strict_hosts=False),
                **({"initContainers": pod.init_containers} if pod and pod.init_containers else {}),
                "containers": [container],
                "volumes": volumes,
            },
        },
    }
    if replicas is not None:
        body = {"replicas": replicas, **body}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(spec, name, part, version),
        "spec": body,
    }


def service(spec: PlatformSpec, part: str, port: int, metrics_port: int | None = None) -> Manifest:
    """A runtime service's Service; with ``metrics_port`` a second port, ``metrics``, that no ingress names
    (the router's: Prometheus scrapes it, the network policy admits only Prometheus to it)."""
    ports: list[Manifest] = [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]
    if metrics_port is not None:
        ports.append(
            {
                "name": METRICS_PORT_NAME,
                "port": metrics_port,
                "targetPort": METRICS_PORT_NAME,
                "protocol": "TCP",
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(spec, common.runtime_name(spec, part), part),
        "spec": {"type": "ClusterIP", "selector": runtime_selector(spec, part), "ports": ports},
    }


def router_scales(spec: PlatformSpec) -> bool:
    """The stack runs the router with a CPU autoscaler (its HPA): gateway.max_replicas above gateway.replicas."""
    return spec.gateway.runs_router and spec.gateway.max_replicas > spec.gateway.replicas


def router_hpa(spec: PlatformSpec) -> Manifest:
    name = common.runtime_name(spec, common.ROUTER)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": common.metadata(spec, name, common.ROUTER),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": spec.gateway.replicas,
            "maxReplicas": spec.gateway.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": ROUTER_CPU_TARGET_PERCENT},
                    },
                }
            ],
            "behavior": {
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                }
            },
        },
    }


# Everything -----------------------------------------------------------------------------------------


def parts(spec: PlatformSpec) -> list[str]:
    """The runtime services this stack runs: the router (and the batcher for embedding models), or, behind
    an inference-extension gateway, the endpoint picker; the health monitor either way."""
    if not spec.gateway.runs_router:
        return [common.HEALTH, inference_extension.PICKER]
    return [common.ROUTER, common.HEALTH, *([common.BATCHER] if has_batcher(spec) else [])]


def render(
    spec: PlatformSpec, cloud: Cloud, images: Mapping[str, RuntimeImage] | None = None
) -> list[Manifest]:
    """Every gateway object except the API keys Secret, in apply order, the ingress ``cloud`` gives last.

    ``images`` (runtime service -> image) replaces the spec's images for the services it names.
    """
    config = runtime_config(spec, files=cloud.batch_files(spec))
    text = config_text(config)
    checksum = config_checksum(text)
    g = spec.gateway
    image = {**spec_images(spec), **(images or {})}
    out: list[Manifest] = [config_map(spec, text)]
    for part in parts(spec):
        out += [service_account(spec, part), role(spec, part), role_binding(spec, part)]
    keys_mount: tuple[tuple[Manifest, Manifest], ...] = ()
    if g.api_keys_config_key:
        keys_mount = (
            (
                {"name": "api-keys", "mountPath": common.API_KEYS_DIR, "readOnly": True},
                {"name": "api-keys", "secret": {"secretName": common.api_keys_secret_name(spec)}},
            ),
        )
    if not spec.gateway.runs_router:
        picker = inference_extension.PICKER
        s = config.picker
        out += [
            inference_extension.with_grpc_port(
                deployment(
                    spec,
                    picker,
                    image[picker],
                    s.metrics_port,
                    s.replicas,  # what the picker divides each key's request rate by
                    inference_extension.PICKER_RESOURCES,
                    checksum,
                    keys_mount,  # the picker checks the keys: nothing else in this mode sees a request
                )
            ),
            inference_extension.picker_service(spec),
            deployment(
                spec, common.HEALTH, image[common.HEALTH], config.health.port, 1, _HEALTH_RESOURCES, checksum
            ),
            service(spec, common.HEALTH, config.health.port),
        ]
        return out + inference_extension.routing(spec)
    router_mounts = keys_mount
    if g.shared_limits:
        router_mounts += (limit_store.router_mount(spec),)
    router_replicas = None if router_scales(spec) else g.replicas
    out += [
        deployment(
            spec,
            common.ROUTER,
            image[common.ROUTER],
            config.router.port,
            router_replicas,
            (g.router_cpu_cores, g.router_memory_gib),
            checksum,
            router_mounts,
            tokenizers.router_parts(spec, image[common.ROUTER].reference),
            config.router.metrics_port,
        ),
        service(spec, common.ROUTER, config.router.port, config.router.metrics_port),
        hardening.pdb(
            spec,
            common.runtime_name(spec, common.ROUTER),
            common.ROUTER,
            runtime_selector(spec, common.ROUTER),
        ),
    ]
    if router_scales(spec):
        out.append(router_hpa(spec))
    # One health monitor: its state (ejections) is per process, and the router tolerates its absence.
    out += [
        deployment(
            spec, common.HEALTH, image[common.HEALTH], config.health.port, 1, _HEALTH_RESOURCES, checksum
        ),
        service(spec, common.HEALTH, config.health.port),
    ]
    if has_batcher(spec):
        out += [
            deployment(
                spec,
                common.BATCHER,
                image[common.BATCHER],
                config.batcher.port,
                2,
                _BATCHER_RESOURCES,
                checksum,
            ),
            service(spec, common.BATCHER, config.batcher.port),
            hardening.pdb(
                spec,
                common.runtime_name(spec, common.BATCHER),
                common.BATCHER,
                runtime_selector(spec, common.BATCHER),
            ),
        ]
    return out + ingress.render(spec, cloud)
