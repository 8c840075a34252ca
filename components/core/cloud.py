"""The cloud seam: what a deployment target decides, as plain data.

A ``Cloud`` answers the questions on which EKS and a cluster you bring differ: the fixed infrastructure the
target runs (as quantities: ``components.core.cost`` prices them), the labels and taints of its GPU nodes, where
cluster addresses come from, which Ingress class puts a load balancer in front of the router, which service
account reads model weights with cloud credentials, whether GPU nodes come with the NVIDIA driver, and what its
model store refuses in a spec (a plan-time rule, ``model_store``).
``components.clouds.targets.cloud_for`` picks the implementation by ``spec.target``. What a target creates with
Pulumi (the cluster, the Kubernetes provider that reaches it, the runtime images it pushes) is the other half
of the seam: ``components.kubernetes.cluster.ClusterAccess``.

No Pulumi SDK and no cloud or render module here: cost, report, placement and the policies import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from components.core.nodes import Taint
from components.core.placement import Layout, PoolPlan
from components.core.problems import Planned, PlanRule, Problem
from components.spec import PlatformSpec
from runtime.config import S3Files

PRIVATE_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
"""Private address ranges: where the node network is when the target does not know it exactly."""


@dataclass(frozen=True)
class RootDisk:
    """One node's gp3 root volume: size, and provisioned IOPS and throughput."""

    gib: int
    iops: int
    throughput_mibps: int


@dataclass(frozen=True)
class NodeRootDisks:
    """The root disks of one node group: one per node, as many as its nodes at min and at max."""

    disk: RootDisk
    min_count: int
    max_count: int


@dataclass(frozen=True)
class SystemNodes:
    """The CPU nodes (``catalog.SYSTEM_INSTANCE_TYPE``) for the gateway, monitoring and controllers."""

    min_nodes: int
    max_nodes: int


@dataclass(frozen=True)
class FixedInfrastructure:
    """What a target runs besides GPU nodes, in quantities; nothing at all on a cluster you bring."""

    eks_control_planes: int = 0
    system_nodes: SystemNodes | None = None
    nat_gateways: int = 0
    root_disks: tuple[NodeRootDisks, ...] = ()
    """Every node group's, GPU pools' included."""
    kms_keys: tuple[str, ...] = ()
    """The purposes of the customer-managed keys, one key each."""


@dataclass(frozen=True)
class Endpoint:
    """An address pods reach outside the cluster's pod network, on one TCP port."""

    cidr: str
    port: int
    why: str


@dataclass(frozen=True)
class IngressClass:
    """The class and annotations of an Ingress that puts a load balancer in front of the router."""

    name: str
    annotations: dict[str, str] = field(default_factory=dict)


class Cloud(Protocol):
    """One deployment target's decisions (see the module docstring)."""

    @property
    def gpu_driver_preinstalled(self) -> bool:
        """GPU nodes boot with the NVIDIA driver and container toolkit (the GPU operator must not install them)."""
        ...

    @property
    def managed_limit_store(self) -> bool:
        """``gateway.shared_limits`` is a managed Redis the cloud layer creates in the cluster network (its
        address reaches the router through a Secret); False: a Redis StatefulSet in the namespace."""
        ...

    def fixed_infrastructure(self, spec: PlatformSpec, layout: Layout) -> FixedInfrastructure:
        """What the target creates besides GPU instances, for the bill."""
        ...

    def gpu_node_labels(self, pool: PoolPlan) -> dict[str, str]:
        """The labels a GPU pool's nodes carry: engines select their pool by them."""
        ...

    def gpu_node_taints(self) -> tuple[Taint, ...]:
        """The taints every GPU node carries: engines tolerate them, nothing else does."""
        ...

    def cluster_network(self, spec: PlatformSpec) -> list[str]:
        """The address ranges of nodes, load balancers and the API server endpoint (network policies)."""
        ...

    def load_balancer_ingress(self, spec: PlatformSpec) -> IngressClass:
        """The Ingress class and annotations for ``gateway.ingress: alb``."""
        ...

    def credential_endpoints(self, spec: PlatformSpec) -> tuple[Endpoint, ...]:
        """Where the model store's readers (engines) and writers (preparation Jobs) get their cloud credentials
        (on EKS the Pod Identity agent); network policies let them reach exactly these."""
        ...

    def model_reader(self, spec: PlatformSpec) -> tuple[str, str] | None:
        """The service account (namespace, name) that the target lets read model weights from its storage;
        None when engines read the model store with what they are given (model_store.reader_secret)."""
        ...

    def batch_files(self, spec: PlatformSpec) -> S3Files | None:
        """Where the batch service keeps files in the target's object store (a prefix of the platform's
        bucket, named at deploy time); None when they share the service's volume."""
        ...

    def model_store_problems(self, spec: PlatformSpec) -> list[Problem]:
        """What the target's model store refuses in ``spec`` (which buckets, which account, which of
        model_store's fields), at the spec's field paths; the plan-time rule ``model_store`` reports them."""
        ...


def model_store(planned: Planned) -> list[Problem]:
    """The target's own model-store rules, asked of its cloud (none on target local: no cloud, the loopback store).
    Core cannot import the clouds: the caller of ``stackfile.validate`` brings them (``components.clouds.targets``)."""
    return planned.cloud.model_store_problems(planned.spec) if planned.cloud is not None else []


RULES: tuple[PlanRule, ...] = (model_store,)
"""The cloud seam's plan-time rules (``components.core.plan_rules``)."""
