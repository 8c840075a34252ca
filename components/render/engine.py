"""Engine Deployment, Service (and ConfigMap where the engine takes a file) for one model. Pure."""

from __future__ import annotations

import math

from components import nodes
from components.placement import Placement, host_memory_needed_gib, host_share
from components.render import common, hardening, scaling
from components.render.common import Manifest
from components.render.engine_args import (
    MODEL_DIR,
    TRTLLM_CONFIG_DIR,
    EngineCommand,
    engine_command,
    s3_model_dir,
)
from components.rollout import Rollout
from components.spec import ModelSpec, PlatformSpec
from runtime.engines import facts

AWS_CLI_IMAGE = "public.ecr.aws/aws-cli/aws-cli:2.27.50"
HF_TOKEN_KEY = "token"
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
"""The token is a file (huggingface_hub reads HF_TOKEN_PATH), never an environment variable."""
_CPU_ENGINE_DEFAULTS = (2.0, 8.0)  # cores, GiB
_PROBE_PERIOD_S = 10


def hf_token_secret_name(spec: PlatformSpec) -> str:
    return f"{spec.name}-hf-token"


def engine_resources(model: ModelSpec, placement: Placement) -> tuple[float, float]:
    """CPU cores and memory GiB per replica: the spec's, else the node's share by GPUs used."""
    e = model.engine
    if placement.instance is None:
        cores, memory = _CPU_ENGINE_DEFAULTS
        return e.cpu_cores or cores, e.memory_gib or memory
    cores, memory = host_share(placement.instance, placement.gpu_fraction)
    memory = max(memory, host_memory_needed_gib(model, placement))
    return e.cpu_cores or cores, e.memory_gib or float(memory)


def _shm_gib(model: ModelSpec) -> float:
    # NCCL and the engines' worker processes exchange tensors through /dev/shm when TP/PP > 1.
    return 16.0 if model.engine.gpus > 1 else 2.0


def _model_cache_gib(placement: Placement) -> int:
    return max(20, math.ceil(placement.weights_gib * 1.25 + 5))


def _http_probe(path: str, period_s: int, failure_threshold: int, timeout_s: int = 5) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failure_threshold,
    }


def _env(spec: PlatformSpec, cmd: EngineCommand) -> list[Manifest]:
    env: list[Manifest] = [{"name": k, "value": v} for k, v in sorted(cmd.env.items())]
    if spec.huggingface_token_config_key:
        env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_TOKEN_KEY}"})
    return env


def _s3_sync(model: ModelSpec) -> Manifest:
    """An init container that copies the weights from S3 into the model cache before the engine starts."""
    return {
        "name": "fetch-weights",
        "image": AWS_CLI_IMAGE,
        "imagePullPolicy": "Always",
        "command": ["aws", "s3", "sync", "--only-show-errors", model.source, s3_model_dir(model)],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": {
            "requests": {"cpu": "500m", "memory": "1Gi"},
            "limits": {"cpu": "2", "memory": "2Gi"},
        },
        "securityContext": hardening.container_security(),
        "volumeMounts": [
            {"name": "model-cache", "mountPath": MODEL_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
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


def deployment(spec: PlatformSpec, model: ModelSpec, placement: Placement, rollout: Rollout) -> Manifest:
    """``rollout`` (``components.rollout``): the strategy, and the startup budget the probe and the progress
    deadline allow a replica."""
    name = common.engine_name(model.name)
    image = model.engine.resolved_image
    version = common.image_version(image)
    cmd = engine_command(model)
    cores, memory_gib = engine_resources(model, placement)
    resources: Manifest = {
        "requests": {"cpu": common.quantity_cpu(cores), "memory": common.quantity_gib(memory_gib)},
        "limits": {"cpu": common.quantity_cpu(cores), "memory": common.quantity_gib(memory_gib)},
    }
    if placement.share is not None:  # one time slice or one MIG instance
        resources["requests"][nodes.share_resource(placement.share)] = "1"
        resources["limits"][nodes.share_resource(placement.share)] = "1"
    elif placement.gpus_per_replica:
        resources["requests"][nodes.GPU_RESOURCE] = str(placement.gpus_per_replica)
        resources["limits"][nodes.GPU_RESOURCE] = str(placement.gpus_per_replica)
    mounts: list[Manifest] = [
        {"name": "model-cache", "mountPath": MODEL_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Manifest] = [
        {"name": "model-cache", "emptyDir": {"sizeLimit": f"{_model_cache_gib(placement)}Gi"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{_shm_gib(model):g}Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "10Gi"}},
    ]
    if spec.huggingface_token_config_key:
        mounts.append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "hf-token",
                "secret": {"secretName": hf_token_secret_name(spec), "defaultMode": 0o440},
            }
        )
    if cmd.files:
        mounts.append({"name": "engine-config", "mountPath": TRTLLM_CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "engine-config", "configMap": {"name": name}})
    startup_failures = math.ceil(rollout.startup.budget_s / _PROBE_PERIOD_S)
    health = facts(model.engine.kind).health_path
    container: Manifest = {
        "name": "engine",
        "image": image,
        # Always only re-checks the tag's digest with the registry; cached layers are reused.
        "imagePullPolicy": "Always",
        "command": cmd.command,
        "args": cmd.args,
        "env": _env(spec, cmd),
        "ports": [{"name": "http", "containerPort": common.ENGINE_PORT, "protocol": "TCP"}],
        "resources": resources,
        "startupProbe": _http_probe(health, _PROBE_PERIOD_S, startup_failures),
        "readinessProbe": _http_probe(health, 5, 3),
        "livenessProbe": _http_probe(health, 15, 4),
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
    if model.source.startswith("s3://"):
        pod_spec["initContainers"] = [_s3_sync(model)]
    if placement.pool is not None and placement.instance is not None:
        pod_spec["nodeSelector"] = {nodes.POOL_LABEL: placement.pool}
        pod_spec["tolerations"] = [nodes.gpu_toleration()]
    pod_labels = {**common.labels(spec, name, "engine", version), common.MODEL_LABEL: model.name}
    if model.team is not None:
        pod_labels[nodes.TEAM_LABEL] = model.team
    # A scaler (KEDA or HPA) owns the count when min and max differ; a fixed count is set here.
    replicas = {} if scaling.scales(model) else {"replicas": model.scaling.min_replicas}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**common.metadata(spec, name, "engine", version), "labels": pod_labels},
        "spec": {
            **replicas,
            "revisionHistoryLimit": 3,
            # A round of the rollout may take a whole cold start before it shows progress.
            "progressDeadlineSeconds": rollout.startup.budget_s,
            "selector": {"matchLabels": common.selector(spec, name, "engine")},
            # Surge into the pool's spare GPUs, else replace one replica at a time (components.rollout).
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": rollout.max_surge, "maxUnavailable": rollout.max_unavailable},
            },
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }


def service(spec: PlatformSpec, model: ModelSpec) -> Manifest:
    name = common.engine_name(model.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(spec, name, "engine"),
        "spec": {
            "type": "ClusterIP",
            "selector": common.selector(spec, name, "engine"),
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


def render(spec: PlatformSpec, model: ModelSpec, placement: Placement, rollout: Rollout) -> list[Manifest]:
    """Every Kubernetes object of one model's engine, in apply order."""
    out = [m for m in (config_map(spec, model),) if m is not None]
    return [*out, deployment(spec, model, placement, rollout), service(spec, model)]
