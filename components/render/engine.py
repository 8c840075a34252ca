"""Engine Deployment, Service (and ConfigMap where the engine takes a file) for one model. Pure.

What to render comes from the serving unit's decisions (``components.core.decisions.ModelDecisions``): its placement
and pool, its weights' fetch path, its startup budget and rollout. Nothing is decided again here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from components.core import lifecycle, nodes
from components.core.decisions import ModelDecisions
from components.core.placement import Placement, host_memory_needed_gib, host_share
from components.render import common, groups, hardening, scaling, tracing, weights
from components.render.common import Manifest
from components.render.engine_args import (
    ENGINE_CONFIG_DIR,
    EngineCommand,
    engine_command,
    group_command,
    in_cluster,
    in_group,
    model_dir,
    side_channel_env,
)
from components.spec import ModelSpec, PlatformSpec
from runtime.engines import facts

_CPU_ENGINE_DEFAULTS = (2.0, 8.0)  # cores, GiB
_PROBE_PERIOD_S = 10


def engine_resources(model: ModelSpec, placement: Placement) -> tuple[float, float]:
    """CPU cores and memory GiB per replica: the spec's, else the node's share by GPUs used."""
    e = model.engine
    if placement.instance is None:
        cores, memory = _CPU_ENGINE_DEFAULTS
        return e.cpu_cores or cores, e.memory_gib or memory
    # One pod per node of a multi-node group: each takes its node's share, not the group's.
    cores, memory = host_share(placement.instance, placement.gpu_fraction / placement.nodes)
    memory = max(memory, host_memory_needed_gib(model, placement))
    return e.cpu_cores or cores, e.memory_gib or float(memory)


def _shm_gib(model: ModelSpec) -> float:
    # NCCL and the engines' worker processes exchange tensors through /dev/shm when TP/PP > 1.
    return 16.0 if model.engine.gpus > 1 else 2.0


def _http_probe(path: str, period_s: int, failure_threshold: int, timeout_s: int = 5) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failure_threshold,
    }


def _env(cmd: EngineCommand, store: list[Manifest]) -> list[Manifest]:
    return [*({"name": k, "value": v} for k, v in sorted(cmd.env.items())), *store]


def _pod_metadata(model: ModelSpec, labels: dict[str, str]) -> Manifest:
    """Pod labels, and for a model with adapters the annotation that lists them (for the policy pack)."""
    if not model.adapters:
        return {"labels": labels}
    adapters = [a.model_dump(mode="json") for a in model.adapters]
    return {
        "labels": labels,
        "annotations": {common.ADAPTERS_ANNOTATION: json.dumps(adapters, sort_keys=True)},
    }


def config_map(spec: PlatformSpec, model: ModelSpec) -> Manifest | None:
    """Files the engine reads (TensorRT-LLM's extra options); None when the engine needs none."""
    cmd = engine_command(model)
    if not cmd.files:
        return None
    name = common.engine_name(model.name)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": common.metadata(spec, name, "engine"),
        "data": dict(cmd.files),
    }


@dataclass(frozen=True)
class PodShape:
    """What differs between the pods of one engine: a Deployment's, a group's leader and its workers."""

    cmd: EngineCommand
    probes: bool = True
    """Startup, readiness and liveness probes (a group's workers serve no HTTP: the group's leader answers)."""
    extra_resources: dict[str, str] = field(default_factory=dict)
    """Resources requested and limited beside CPU, memory and GPUs (EFA interfaces, huge pages)."""
    extra_env: list[Manifest] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    """Labels beside the engine's own (a group's role)."""


def _location(spec: PlatformSpec, unit: ModelDecisions) -> str:
    """What the engine loads in the cluster: the model store's copy the weights decision picked."""
    return weights.engine_location(spec, unit.model, unit.fetch)


def pod_template(
    spec: PlatformSpec, unit: ModelDecisions, shape: PodShape, weights_image: Any = None
) -> Manifest:
    """One engine pod's template (labels and spec): the container from ``shape.cmd``, the weights' init container
    and cache (by the unit's fetch path), the hardening, the pool's node selector and the GPU toleration. The
    unit's startup budget is the startup probe's; ``weights_image``: the weights image the init container runs
    (default: the spec's)."""
    model, placement, way = unit.model, unit.placement, unit.fetch
    name = common.engine_name(model.name)
    image = model.engine.resolved_image
    version = common.image_version(image)
    cmd = shape.cmd
    cores, memory_gib = engine_resources(model, placement)
    resources: Manifest = {
        "requests": {"cpu": common.quantity_cpu(cores), "memory": common.quantity_gib(memory_gib)},
        "limits": {"cpu": common.quantity_cpu(cores), "memory": common.quantity_gib(memory_gib)},
    }
    gpus = placement.gpus_per_replica // placement.nodes
    if placement.share is not None:  # one time slice or one MIG instance
        resources["requests"][nodes.share_resource(placement.share)] = "1"
        resources["limits"][nodes.share_resource(placement.share)] = "1"
    elif gpus:
        resources["requests"][nodes.GPU_RESOURCE] = str(gpus)
        resources["limits"][nodes.GPU_RESOURCE] = str(gpus)
    for key, value in shape.extra_resources.items():
        resources["requests"][key] = value
        resources["limits"][key] = value
    mounts: list[Manifest] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Manifest] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{_shm_gib(model):g}Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "10Gi"}},
    ]
    cache = weights.cache_volume(way)
    if cache is not None:  # the node's copy of this model only, read-only (only the init container fills it)
        mounts.append(
            {
                "name": "model-cache",
                "mountPath": model_dir(model),
                "subPath": weights.cache_sub_path(spec, model),
                "readOnly": True,
            }
        )
        volumes.append(cache)
    access = weights.engine_access(spec, way)
    mounts += access.mounts
    volumes += access.volumes
    adapter_inits, adapter_volumes = weights.adapter_inits(
        spec, model, weights_image or spec.model_store.image
    )
    if adapter_volumes:  # every pod of a group loads its shard of an adapter from its own disk
        mounts.append({"name": "adapters", "mountPath": weights.ADAPTER_DIR, "readOnly": True})
        volumes += adapter_volumes
    if cmd.files:
        mounts.append({"name": "engine-config", "mountPath": ENGINE_CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "engine-config", "configMap": {"name": name}})
    startup_failures = math.ceil(unit.startup.budget_s / _PROBE_PERIOD_S)
    health = facts(model.engine.kind).health_path
    container: Manifest = {
        "name": "engine",
        "image": image,
        # Always only re-checks the tag's digest with the registry; cached layers are reused.
        "imagePullPolicy": "Always",
        "command": cmd.command,
        "args": cmd.args,
        "env": [*_env(cmd, access.env), *shape.extra_env],
        "ports": [{"name": "http", "containerPort": common.ENGINE_PORT, "protocol": "TCP"}],
        "resources": resources,
    }
    if shape.probes:
        container["startupProbe"] = _http_probe(health, _PROBE_PERIOD_S, startup_failures)
        container["readinessProbe"] = _http_probe(health, 5, 3)
        container["livenessProbe"] = _http_probe(health, 15, 4)
    container |= {
        # Let the Service stop sending new requests before the engine receives SIGTERM.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}},
        "securityContext": hardening.container_security(),
        "volumeMounts": mounts,
    }
    pod_spec: Manifest = {
        "serviceAccountName": common.engine_service_account_name(spec),
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 120,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": common.RUNTIME_UID,
            "runAsGroup": common.RUNTIME_UID,
            "fsGroup": common.RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
        "priorityClassName": common.priority_class_name(spec),
        # GPU nodes are scarce: spreading is preferred, never a reason to stay Pending.
        "topologySpreadConstraints": hardening.topology_spread(
            common.selector(spec, name, "engine"), strict_hosts=False
        ),
    }
    # Never the hub: check the store's objects (streamer) or fill the node cache before the engine starts, and
    # fetch the LoRA adapters from the store into the pod.
    pod_spec["initContainers"] = [
        weights.engine_init(spec, model, way, weights_image or spec.model_store.image),
        *adapter_inits,
    ]
    if placement.pool is not None and placement.instance is not None:
        pod_spec["nodeSelector"] = {nodes.POOL_LABEL: placement.pool}
        pod_spec["tolerations"] = [nodes.gpu_toleration()]
    pod_labels = {
        **common.labels(spec, name, "engine", version),
        common.MODEL_LABEL: model.name,
        **shape.labels,
    }
    if model.team is not None:
        pod_labels[nodes.TEAM_LABEL] = model.team
    return {"metadata": _pod_metadata(model, pod_labels), "spec": pod_spec}


def _side_channel(model: ModelSpec) -> list[Manifest]:
    """A disaggregated model's engine takes its peers' KV handshakes at its own pod address (the prefill engine
    names it in every answer's kv_transfer_params: vLLM's default, localhost, would send a decode pod to itself)."""
    env = side_channel_env(model, "pod-address")
    kv = facts(model.engine.kind).kv_transfer
    if not env or kv is None:
        return []
    return [
        {"name": kv.side_channel_host_env, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": kv.side_channel_port_env, "value": env[kv.side_channel_port_env]},
    ]


def deployment(spec: PlatformSpec, unit: ModelDecisions, weights_image: Any = None) -> Manifest:
    """The unit's rollout (``components.core.rollout``): the strategy, and the startup budget the probe and the
    progress deadline allow a replica."""
    model, rollout = unit.model, unit.rollout
    name = common.engine_name(model.name)
    version = common.image_version(model.engine.resolved_image)
    cmd = tracing.traced_engine(spec, model, engine_command(model, _location(spec, unit)))
    shape = PodShape(cmd, extra_env=_side_channel(model))
    template = pod_template(spec, unit, shape, weights_image)
    # A scaler (KEDA or HPA) owns the count when min and max differ; a fixed count is set here.
    replicas = {} if scaling.scales(model) else {"replicas": model.scaling.min_replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            **common.metadata(spec, name, "engine", version),
            "labels": template["metadata"]["labels"],
            **({"annotations": notes} if (notes := lifecycle.workload_annotations(model)) else {}),
        },
        "spec": {
            **replicas,
            "revisionHistoryLimit": 3,
            # A round of the rollout may take a whole cold start before it shows progress.
            "progressDeadlineSeconds": rollout.startup.budget_s,
            "selector": {"matchLabels": common.selector(spec, name, "engine")},
            # Surge into the pool's spare GPUs, else replace one replica at a time (components.core.rollout).
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": rollout.max_surge, "maxUnavailable": rollout.max_unavailable},
            },
            "template": template,
        },
    }


def service(spec: PlatformSpec, model: ModelSpec, selector: dict[str, str] | None = None) -> Manifest:
    """The engine's Service; ``selector`` narrows it (a multi-node group: its leaders only)."""
    name = common.engine_name(model.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(spec, name, "engine"),
        "spec": {
            "type": "ClusterIP",
            "selector": {**common.selector(spec, name, "engine"), **(selector or {})},
            "ports": [{"name": "http", "port": common.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def service_account(spec: PlatformSpec) -> Manifest:
    """One identity for every engine pod: it needs no Kubernetes API, only (on EKS) the model bucket."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": common.metadata(spec, common.engine_service_account_name(spec), "engine"),
        "automountServiceAccountToken": False,
    }


def _group(spec: PlatformSpec, unit: ModelDecisions, weights_image: Any = None) -> list[Manifest]:
    """A LeaderWorkerSet whose groups span the placement's nodes, and a Service on the leaders (the pool says
    whether its nodes have EFA)."""
    model, placement, pool = unit.model, unit.placement, unit.pool
    where = in_cluster(model, _location(spec, unit))  # leader and workers load the same copy
    templates = {
        leader: pod_template(
            spec,
            unit,
            PodShape(
                tracing.traced_engine(
                    spec, model, group_command(model, in_group(placement.nodes, leader), where)
                ),
                probes=leader,
                extra_resources=groups.node_resources(pool),
                extra_env=groups.env(pool),
                labels=groups.role_labels(leader),
            ),
            weights_image,
        )
        for leader in (True, False)
    }
    replicas = None if scaling.scales(model) else model.scaling.min_replicas
    lws = groups.leader_worker_set(
        spec, model, placement.nodes, templates[True], templates[False], unit.rollout, replicas
    )
    return [lws, service(spec, model, groups.role_labels(leader=True))]


def render(spec: PlatformSpec, unit: ModelDecisions, weights_image: Any = None) -> list[Manifest]:
    """Every Kubernetes object of one serving unit's engine, in apply order: a Deployment, or for a replica that
    spans nodes a LeaderWorkerSet (``components.render.groups``)."""
    out = [m for m in (config_map(spec, unit.model),) if m is not None]
    if unit.placement.multi_node:
        return [*out, *_group(spec, unit, weights_image)]
    return [*out, deployment(spec, unit, weights_image), service(spec, unit.model)]
