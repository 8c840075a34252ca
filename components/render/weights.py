"""The model store in Kubernetes: a preparation Job per model, and how each engine pod gets its weights. Pure.

- A hub source: a Job copies ``org/name`` at its pinned revision into the store, once (``python -m
  runtime.weights prepare``; it exits at once when the store already holds that revision). Only this Job reads
  the hub token and may write the store (its own service account). An ``s3://`` source: the Job checks the
  prefix holds complete, verified weights. The Job's name carries a hash of the store location, so a new
  revision is a new Job; engines depend on it, so `pulumi up` runs it first. A model's versions that load the
  same source share its Job (named after the served model).
- A version with a preparation (quantize, trtllm-build): one more Job of the store, after its source's, that
  makes the checkpoint the version's engines load from the store (``components.render.preparation``).
- A hub copy stages the whole checkpoint on the node's disk before it uploads (``runtime.weights.prepare`` hashes
  the snapshot into the content id it compares with what the store holds, and ``huggingface_hub`` resumes its
  own partial downloads there). So the Job requests that disk as ``ephemeral-storage`` and caps its staging
  volume at the same size, both from the checkpoint's size (``checkpoint_gib``: the sizing's weight bytes); the
  scheduler then puts it only on a node whose disk holds it, and on EKS the system nodes' root disks are sized
  for the stack's Jobs (``staging_disks``, read by ``components.clouds.aws.decisions.system_node_group``).
- Engine pods never see the hub or its token. Streaming (vLLM): an init container checks the store's objects
  against the manifest, then vLLM streams ``s3://...``. Node cache: an init container fills the node's cache
  (once per node and revision, under a lock; a hit reads nothing) and the engine loads the copy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from components.base import catalog, sizing
from components.core import lifecycle
from components.core.placement import Placement, PoolPlan
from components.core.weights import store
from components.core.weights.fetch import CacheMedium, Fetch, FetchPath
from components.render import common, hardening, mig
from components.render.common import Manifest
from components.render.engine_args import model_dir
from components.spec import AdapterSpec, ModelSpec, PlatformSpec

COMPONENT = "weights"
CACHE_MOUNT = "/models/cache"
"""Where the fill container sees the whole node-level cache (the engine sees only its model's copy)."""
NVME_CACHE_DIR = "/mnt/k8s-disks/0/inferstack-models"
"""The node cache on instance NVMe: EKS AL2023 nodes stripe their NVMe as RAID0 at /mnt/k8s-disks/0."""
ROOT_DISK_CACHE_DIR = "/var/lib/inferstack-models"
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
CREDENTIALS_DIR = "/var/run/secrets/model-store"
CREDENTIALS_KEY = "credentials"
"""The key of model_store.reader_secret / writer_secret: an AWS shared-credentials file."""
HF_TOKEN_KEY = "token"
STAGING_DIR = "/staging"
STAGING_SLACK = 1.2
"""Staging over the sized checkpoint: the sizing counts parameters, the files add metadata, tied or untied heads
and shards that do not split evenly."""
STAGING_OVERHEAD_GIB = 2
"""Tokenizer, configs and ``huggingface_hub``'s partial download of the file in flight."""
STAGING_MIN_GIB = 10
_SCRATCH_GIB = 2
"""A Job's disk besides its staging: its 1 GiB /tmp volume, its container's writable layer and logs."""
_TMP_GIB = 1
_JOB_SECONDS_PER_GIB = 30  # deadline: a slow hub (~35 MB/s) plus the upload
_JOB_MIN_SECONDS = 1800
_WEIGHTS_CONTAINER = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}


def store_port(spec: PlatformSpec) -> int:
    """The TCP port the model store answers on: HTTPS (S3), or the S3-compatible endpoint's own."""
    endpoint = spec.model_store.endpoint_url
    if endpoint is None:
        return 443
    parts = urlsplit(endpoint)
    return parts.port or (443 if parts.scheme == "https" else 80)


def service_account_name(spec: PlatformSpec) -> str:
    """The preparation Jobs' identity: the only one that may write the store and read the hub token."""
    return f"{spec.name}-weights"


def hf_token_secret_name(spec: PlatformSpec) -> str:
    return f"{spec.name}-hf-token"


def location(spec: PlatformSpec, model: ModelSpec) -> str:
    return store.location(spec, model)


def engine_location(spec: PlatformSpec, model: ModelSpec, way: Fetch) -> str:
    """What the engine loads: the store location (streamer) or the node cache's copy of it, mounted at a
    directory named after the model (``engine_args.model_dir``)."""
    return location(spec, model) if way.path is FetchPath.STREAMER else model_dir(model)


def cache_sub_path(spec: PlatformSpec, model: ModelSpec) -> str:
    """The model's copy inside the node cache (``runtime.weights.node_cache.cache_dir``: bucket, then prefix)."""
    return location(spec, model).removeprefix("s3://").rstrip("/")


def job_name(spec: PlatformSpec, model: ModelSpec) -> str:
    """Named after the served model and the store location: the versions of a model that load one source share
    its Job."""
    digest = hashlib.sha256(location(spec, model).encode()).hexdigest()[:8]
    return f"{model.served_name}-weights-{digest}"


def owner_args(spec: PlatformSpec) -> list[str]:
    owner = spec.model_store.account_id or spec.cluster.account_id
    return ["--expected-owner", owner] if owner else []


@dataclass(frozen=True)
class StoreAccess:
    """What a container needs to reach the store: environment, and the credentials file's volume and mount."""

    env: list[Manifest]
    mounts: list[Manifest]
    volumes: list[Manifest]


def store_access(spec: PlatformSpec, writer: bool) -> StoreAccess:
    """The region on AWS (EKS Pod Identity gives the credentials), or an S3-compatible endpoint with the
    reader's or the writer's Secret mounted as an AWS shared-credentials file (never environment variables;
    boto3 and the streamer's AWS SDK both read ``AWS_SHARED_CREDENTIALS_FILE``)."""
    env: list[Manifest] = [{"name": "AWS_EC2_METADATA_DISABLED", "value": "true"}]
    region = spec.cluster.store_region
    if region is not None:
        env.append({"name": "AWS_REGION", "value": region})
    ms = spec.model_store
    if ms.endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL", "value": ms.endpoint_url})
    secret = ms.writer_secret if writer else ms.reader_secret
    if not secret:
        return StoreAccess(env, [], [])
    env.append({"name": "AWS_SHARED_CREDENTIALS_FILE", "value": f"{CREDENTIALS_DIR}/{CREDENTIALS_KEY}"})
    mount = {"name": "store-credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True}
    volume = {"name": "store-credentials", "secret": {"secretName": secret, "defaultMode": 0o440}}
    return StoreAccess(env, [mount], [volume])


def store_container(spec: PlatformSpec, name: str, image: Any, args: list[str], writer: bool) -> Manifest:
    access = store_access(spec, writer)
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "Always",
        "args": args,
        "env": [*access.env, {"name": "HOME", "value": "/tmp"}],
        "resources": _WEIGHTS_CONTAINER,
        "securityContext": hardening.container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *access.mounts],
    }


def checkpoint_gib(model: ModelSpec, arch: catalog.ModelArch, *, dense: bool = False) -> float:
    """The checkpoint ``model``'s source holds, in GiB: its parameters at the precision its engine loads
    (``sizing.weight_bytes``, the figure the GPU fit's weights come from). ``dense``: the source of a preparation
    (a quantize step or an engine build reads the dense checkpoint, at the engine's dtype)."""
    e = model.engine
    quantization = "none" if dense else e.quantization.value
    precision = sizing.weight_precision(quantization, e.dtype.value)
    return sizing.weight_bytes(arch, precision, e.dtype.value) / sizing.GIB


def staging_gib(checkpoint: float) -> int:
    """The staging volume of a hub copy of ``checkpoint`` GiB."""
    return max(STAGING_MIN_GIB, math.ceil(checkpoint * STAGING_SLACK + STAGING_OVERHEAD_GIB))


def job_disk_gib(staging: int) -> int:
    """The ``ephemeral-storage`` a store Job requests (and is limited to): its staging and its scratch."""
    return staging + _SCRATCH_GIB


def job_deadline_s(placement: Placement) -> int:
    """Seconds the preparation Job may run (its ``activeDeadlineSeconds``, and how long `pulumi up` waits for it)."""
    return max(_JOB_MIN_SECONDS, int(placement.weights_gib * _JOB_SECONDS_PER_GIB))


def _copy_staging_gib(model: ModelSpec, arch: catalog.ModelArch, dense: bool) -> int:
    """A store Job's staging: the checkpoint for a hub copy; a check (``s3://`` source) stages nothing."""
    return staging_gib(checkpoint_gib(model, arch, dense=dense)) if model.is_hub else 1


def prepare_job(
    spec: PlatformSpec, model: ModelSpec, placement: Placement, image: Any, *, dense: bool = False
) -> Manifest:
    """The one-time Job that puts ``model``'s weights into the store (hub), or checks them (s3://); ``dense``: the
    source of a version's preparation (``checkpoint_gib``)."""
    hub = (model.source, str(model.revision)) if model.is_hub else None
    return _prepare(
        spec,
        image,
        job_name(spec, model),
        model.served_name,
        location(spec, model),
        hub,
        _copy_staging_gib(model, placement.arch, dense),
        job_deadline_s(placement),
    )


def staging_disks(spec: PlatformSpec) -> dict[str, int]:
    """Every store Job of the stack (hub copy or check, of a model, a version's source or an adapter), by Job
    name, with the ``ephemeral-storage`` it requests: they run on the general (untainted) nodes, together on the
    first `pulumi up`. The same Jobs as ``components.kubernetes.engine.ModelWeights`` registers; a model whose
    architecture is unknown is refused by placement and counts nothing here."""
    out: dict[str, int] = {}
    for model in spec.models:
        arch = model.arch()
        if arch is None:
            continue
        copies = (
            [(lifecycle.source_unit(model, v), v.preparation is not None) for v in model.versions]
            if model.versions
            else [(model, False)]
        )
        for source, dense in copies:
            out[job_name(spec, source)] = job_disk_gib(_copy_staging_gib(source, arch, dense))
        for adapter in model.adapters:
            out[adapter_job_name(spec, model, adapter)] = job_disk_gib(_adapter_staging_gib(adapter))
    return out


ADAPTER_DIR = "/adapters"
"""Where an engine pod sees its LoRA adapters, fetched from the store by init containers (an emptyDir)."""
_ADAPTER_DISK_GIB = 2  # a rank-64 adapter on every projection of a 70B model is ~1.6 GiB in bf16


def adapter_uri(spec: PlatformSpec, adapter: AdapterSpec) -> str:
    return store.adapter_location(spec, adapter)


def adapter_path(spec: PlatformSpec, adapter: AdapterSpec) -> str:
    """Where a replica finds an adapter, which the router's load call names as lora_path: the fetch tool's
    layout under ``ADAPTER_DIR`` (``runtime.weights.node_cache.cache_dir``: bucket, then prefix)."""
    return f"{ADAPTER_DIR}/{adapter_uri(spec, adapter).removeprefix('s3://').rstrip('/')}"


def adapter_job_name(spec: PlatformSpec, model: ModelSpec, adapter: AdapterSpec) -> str:
    digest = hashlib.sha256(adapter_uri(spec, adapter).encode()).hexdigest()[:8]
    return f"{model.served_name}-adapter-{adapter.name}-{digest}"[:54].rstrip(
        "-"
    )  # Job names leave room for the pod's


def _adapter_staging_gib(adapter: AdapterSpec) -> int:
    return 2 * _ADAPTER_DISK_GIB if not adapter.source.startswith("s3://") else 1


def adapter_job(spec: PlatformSpec, model: ModelSpec, adapter: AdapterSpec, image: Any) -> Manifest:
    """The one-time Job that puts a LoRA adapter into the store (hub, at its commit), or checks it (s3://)."""
    hub = (adapter.source, str(adapter.revision)) if not adapter.source.startswith("s3://") else None
    name = adapter_job_name(spec, model, adapter)
    return _prepare(
        spec,
        image,
        name,
        model.served_name,
        adapter_uri(spec, adapter),
        hub,
        _adapter_staging_gib(adapter),
        _JOB_MIN_SECONDS,
    )


def _prepare(
    spec: PlatformSpec,
    image: Any,
    name: str,
    model: str,
    uri: str,
    hub: tuple[str, str] | None,
    staging_gib: int,
    deadline: int,
) -> Manifest:
    """A preparation Job: copy ``hub`` (repository, commit) into ``uri``, or (None) verify what ``uri`` holds.
    ``staging_gib``: its staging volume's cap; it requests that and its scratch as ``ephemeral-storage`` (kubelet
    evicts a pod past its emptyDir's sizeLimit or its containers' limits; the scheduler places it only where
    the node's allocatable ephemeral storage holds the request)."""
    if hub is not None:
        args = ["prepare", "--to", uri, "--hub", hub[0], "--revision", hub[1], "--staging", STAGING_DIR]
    else:
        args = ["verify", "--store", uri]
    token = bool(hub is not None and spec.huggingface_token_config_key)
    if token:
        args += ["--token-file", f"{HF_TOKEN_DIR}/{HF_TOKEN_KEY}"]
    container = store_container(spec, "prepare", image, [*args, *owner_args(spec)], writer=hub is not None)
    disk = f"{job_disk_gib(staging_gib)}Gi"
    container["resources"] = {
        "requests": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": disk},
        "limits": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": disk},
    }
    volumes: list[Manifest] = [
        {"name": "tmp", "emptyDir": {"sizeLimit": f"{_TMP_GIB}Gi"}},
        {"name": "staging", "emptyDir": {"sizeLimit": f"{staging_gib}Gi"}},
        *store_access(spec, writer=hub is not None).volumes,
    ]
    container["volumeMounts"].append({"name": "staging", "mountPath": STAGING_DIR})
    if token:
        container["volumeMounts"].append({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": True})
        volumes.append(
            {"name": "hf-token", "secret": {"secretName": hf_token_secret_name(spec), "defaultMode": 0o440}}
        )
    labels = {**common.labels(spec, name, COMPONENT), common.MODEL_LABEL: model}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**common.metadata(spec, name, COMPONENT), "labels": labels},
        "spec": {
            "backoffLimit": 4,  # a killed or failed run resumes: uploaded objects are kept
            "activeDeadlineSeconds": deadline,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": service_account_name(spec),
                    "automountServiceAccountToken": False,
                    "restartPolicy": "Never",
                    "securityContext": hardening.pod_security(),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def adapter_inits(spec: PlatformSpec, model: ModelSpec, image: Any) -> tuple[list[Manifest], list[Manifest]]:
    """Init containers that fetch each LoRA adapter from the store (checked against its manifest, like a node
    cache fill) into the pod's adapter volume, and that volume; nothing for a model without adapters."""
    if not model.adapters:
        return [], []
    inits = []
    for i, adapter in enumerate(model.adapters):
        args = [
            "fetch",
            "--store",
            adapter_uri(spec, adapter),
            "--cache-root",
            ADAPTER_DIR,
            *owner_args(spec),
        ]
        container = store_container(spec, f"fetch-adapter-{i}", image, args, writer=False)
        container["volumeMounts"].append({"name": "adapters", "mountPath": ADAPTER_DIR})
        inits.append(container)
    size = _ADAPTER_DISK_GIB * len(model.adapters)
    return inits, [{"name": "adapters", "emptyDir": {"sizeLimit": f"{size}Gi"}}]


def cache_host_dir(way: Fetch) -> str:
    return NVME_CACHE_DIR if way.medium is CacheMedium.NVME else ROOT_DISK_CACHE_DIR


_MIME_BOUNDARY = "==INFERSTACK=="


def node_user_data(
    medium: CacheMedium | None, *, node_config: bool = True, boot: tuple[str, ...] = ()
) -> str:
    """EC2 user data (MIME multipart, as EKS AL2023 nodes read it): with a node cache (``medium``), the instance's
    NVMe striped as RAID0 by nodeadm (mounted at /mnt/k8s-disks/0, where kubelet and containerd move too), then
    the cache directory owned by the runtime user, so fill containers run unprivileged; then the ``boot`` shell
    scripts (a MIG partition: ``components.render.mig``). ``node_config=False`` leaves the NodeConfig out
    (Karpenter's ``instanceStorePolicy: RAID0`` sets it)."""
    parts = []
    if medium is CacheMedium.NVME and node_config:
        parts.append(
            "Content-Type: application/node.eks.aws\n\n"
            "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\n"
            "spec:\n  instance:\n    localStorage:\n      strategy: RAID0\n"
        )
    shell = 'Content-Type: text/x-shellscript; charset="us-ascii"\n\n'
    if medium is not None:
        uid = common.RUNTIME_UID
        directory = NVME_CACHE_DIR if medium is CacheMedium.NVME else ROOT_DISK_CACHE_DIR
        parts.append(
            f"{shell}#!/bin/bash\nset -euo pipefail\ninstall -d -m 0750 -o {uid} -g {uid} {directory}\n"
        )
    parts += [f"{shell}{script}" for script in boot]
    body = "".join(f"--{_MIME_BOUNDARY}\n{part}\n" for part in parts)
    return (
        f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{_MIME_BOUNDARY}"\n\n'
        f"{body}--{_MIME_BOUNDARY}--\n"
    )


def pool_user_data(pool: PoolPlan, *, node_config: bool = True) -> str | None:
    """A GPU pool's nodes' user data: its node cache and its MIG partition, each where it has one; None when
    neither."""
    partition = mig.boot_script(pool)
    if pool.cache_medium is None and partition is None:
        return None
    boot = (partition,) if partition is not None else ()
    return node_user_data(pool.cache_medium, node_config=node_config, boot=boot)


def engine_init(spec: PlatformSpec, model: ModelSpec, way: Fetch, image: Any) -> Manifest:
    """The container that runs before the engine: check the store (streamer) or fill the node cache."""
    uri = location(spec, model)
    if way.path is FetchPath.STREAMER:
        return store_container(
            spec, "check-weights", image, ["verify", "--store", uri, *owner_args(spec)], False
        )
    args = ["fetch", "--store", uri, "--cache-root", CACHE_MOUNT, *owner_args(spec)]
    container = store_container(spec, "fetch-weights", image, args, writer=False)
    container["volumeMounts"].append({"name": "model-cache", "mountPath": CACHE_MOUNT})
    return container


def cache_volume(way: Fetch) -> Manifest | None:
    """The node cache as the pod sees it (None: the streamer needs no disk)."""
    if way.path is not FetchPath.NODE_CACHE:
        return None
    return {"name": "model-cache", "hostPath": {"path": cache_host_dir(way), "type": "DirectoryOrCreate"}}


def engine_access(spec: PlatformSpec, way: Fetch) -> StoreAccess:
    """What the engine pod needs: to stream, store access for the engine container; the init container
    (check or fill) reads the store in every case, so the credentials volume is the pod's either way."""
    reader = store_access(spec, writer=False)
    if way.path is FetchPath.STREAMER:
        return reader
    return StoreAccess([], [], reader.volumes)


def service_account(spec: PlatformSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": common.metadata(spec, service_account_name(spec), COMPONENT),
        "automountServiceAccountToken": False,
    }
