"""A replica that spans nodes, as one LeaderWorkerSet group. Pure.

LeaderWorkerSet (kubernetes-sigs/lws, API ``leaderworkerset.x-k8s.io/v1``, the release pinned in
``addons.versions.lws``) runs each replica as a group: one leader pod and ``size - 1`` worker pods, created
together, each on its own node of the pool. What this module decides, with the API field it sets:

- ``leaderWorkerTemplate.size``: the group's nodes (pods);
- ``leaderWorkerTemplate.restartPolicy: RecreateGroupOnPodRestart``: a failed pod or container restarts the whole
  group, because a tensor- or pipeline-parallel engine cannot take a rank back in;
- ``startupPolicy: LeaderCreated``: workers start with the leader, not after it is ready (the leader's engine is
  ready only once every worker has joined; ``LeaderReady`` would deadlock);
- the leader alone serves HTTP, so it alone has probes; the Service selects leaders only, so routing, health,
  metrics and scaling see one endpoint per group (LWS's scale subresource counts groups, and its HPA pod selector
  picks leaders);
- ``rolloutStrategy``: a rolling update replaces whole groups, with the surge the pool has room for;
- ``networkConfig.subdomainPolicy: Shared``: one headless Service names every pod, so ``LWS_LEADER_ADDRESS`` (the
  leader's DNS name, which LWS puts in every container beside ``LWS_WORKER_INDEX``) resolves.

EFA: on a pool whose nodes have EFA, every pod of the group requests the node's interfaces
(``vpc.amazonaws.com/efa``, advertised by the EFA device plugin) and 2 MiB huge pages (libfabric's EFA provider
registers its buffers in them: "instances with the EFA driver installed pre-allocate 5128 2MiB Huge Pages, which you
can request as resources", EKS user guide, node-efa), and NCCL is told to use libfabric's EFA provider.
"""

from __future__ import annotations

from components.core import lifecycle, nodes
from components.core.placement import PoolPlan
from components.core.rollout import Rollout
from components.render import common
from components.render.common import Manifest
from components.spec import ModelSpec, PlatformSpec

API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"
ROLE_LABEL = "inferstack.io/group-role"
LEADER = "leader"
WORKER = "worker"
EFA_RESOURCE = nodes.EFA_RESOURCE
HUGEPAGES_RESOURCE = "hugepages-2Mi"
EFA_HUGEPAGES = "5120Mi"
"""Of the 5128 2 MiB pages (10,256 MiB) the EFA driver pre-allocates on each node."""
EFA_ENV: dict[str, str] = {
    # libfabric's EFA provider for NCCL's aws-ofi-nccl plugin; GPUDirect RDMA where the instance has it.
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "NCCL_PROTO": "simple",
}
"""NCCL over EFA, as AWS's EFA guides set it (aws-ofi-nccl reads FI_PROVIDER; p4d/p5 have device RDMA)."""


def role_labels(leader: bool) -> dict[str, str]:
    return {ROLE_LABEL: LEADER if leader else WORKER}


def node_resources(pool: PoolPlan | None) -> dict[str, str]:
    """What each pod of a group requests besides CPU, memory and GPUs: its node's EFA interfaces and huge pages."""
    if pool is None or not pool.efa_interfaces:
        return {}
    return {EFA_RESOURCE: str(pool.efa_interfaces), HUGEPAGES_RESOURCE: EFA_HUGEPAGES}


def env(pool: PoolPlan | None) -> list[Manifest]:
    """Every group member's extra environment: its own pod address (what the engine tells the group it is reached
    at; without it vLLM finds one by a UDP connect to a public resolver), and NCCL over EFA where there is EFA."""
    out: list[Manifest] = [
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if pool is not None and pool.efa_interfaces:
        out += [{"name": k, "value": v} for k, v in sorted(EFA_ENV.items())]
    return out


def leader_worker_set(
    spec: PlatformSpec,
    model: ModelSpec,
    nodes: int,
    leader: Manifest,
    worker: Manifest,
    rollout: Rollout,
    replicas: int | None,
) -> Manifest:
    """The LeaderWorkerSet of ``model``: ``leader`` and ``worker`` are pod templates (metadata and spec);
    ``replicas`` None when a scaler (KEDA or HPA, through LWS's scale subresource) owns the group count."""
    name = common.engine_name(model.name)
    version = common.image_version(model.engine.resolved_image)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            **common.metadata(spec, name, "engine", version),
            "labels": {k: v for k, v in leader["metadata"]["labels"].items() if k != ROLE_LABEL},
            **({"annotations": notes} if (notes := lifecycle.workload_annotations(model)) else {}),
        },
        "spec": {
            **({} if replicas is None else {"replicas": replicas}),
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {
                    "maxSurge": rollout.max_surge,
                    "maxUnavailable": rollout.max_unavailable,
                },
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }
