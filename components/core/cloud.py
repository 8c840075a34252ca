"""The cloud seam: what a deployment target decides, as plain data.

A ``Cloud`` answers the questions on which EKS and a cluster you bring differ: what the target runs besides GPU
nodes, priced (``components.core.cost`` sums the line items and knows no cloud's prices), the labels and taints of
its GPU nodes, where cluster addresses come from, which Ingress class puts a load balancer in front of the router,
which service account reads model weights with cloud credentials, whether GPU nodes come with the NVIDIA driver,
and where the runtime images are built. A ``Profile`` is a whole target: its cloud, its cluster layer (what Pulumi
creates before anything in Kubernetes: ``components.kubernetes.cluster.ClusterAccess`` is what the layer hands
over), its instance catalog and its price list. ``components.clouds.targets.PROFILES`` registers one per cluster
target; ``components.core.stackfile`` hands the target's to placement and the plan-time rules (its instance
types, its cloud) and prices a loaded stack with it (``bill``); the spec's own validators, which cannot be handed
one, ask the spec's cluster section, which is chosen by the target too.
What the target's model store refuses in a spec is asked of its cloud by a plan-time rule (``model_store``).

No Pulumi SDK and no cloud or render module here: cost, report, placement and the policies import it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from components.base.catalog import EC2_PRICES, INSTANCE_TYPES, InstanceType
from components.base.problems import Problem
from components.core.cost import LineItem, PriceList, StackCost, stack_cost
from components.core.nodes import Taint
from components.core.placement import Layout, PoolPlan
from components.core.planned import Planned, PlanRule
from components.spec import PlatformSpec, Target
from runtime.config import S3Files

PRIVATE_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
"""Private address ranges: where the node network is when the target does not know it exactly."""

# How the policy pack tells the platform's data apart in a cloud's resources (policies/inference/rules/security.py):
# each bucket's data tag, each role's workload tag.
DATA_TAG = "inferstack:data"
MODEL_DATA = "models"
BATCH_DATA = "batches"
WORKLOAD_TAG = "inferstack:workload"
ENGINE_WORKLOAD = "engine"


@dataclass(frozen=True)
class RootDisk:
    """One node's root volume: size, and provisioned IOPS and throughput (on AWS a gp3 volume)."""

    gib: int
    iops: int
    throughput_mibps: int


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

    def fixed_costs(self, spec: PlatformSpec, layout: Layout) -> tuple[LineItem, ...]:
        """What the target creates besides GPU instances, priced at the target's prices, for the bill."""
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

    def volume_storage_class(self, spec: PlatformSpec) -> str | None:
        """The StorageClass the platform's persistent volumes claim (the batch service's state, Prometheus's
        TSDB) where the target's layer creates one; None: the cluster's default class (which must exist)."""
        ...

    def image_build(self, spec: PlatformSpec) -> str | None:
        """Where `pulumi up` builds the runtime images from ``runtime/images/`` and pushes them, as the plan
        says it ('into the stack's ECR'); None: the stack runs the spec's published images as pinned."""
        ...

    def model_store_problems(self, spec: PlatformSpec) -> list[Problem]:
        """What the target's model store refuses in ``spec`` (which buckets, which account, which of
        model_store's fields), at the spec's field paths; the plan-time rule ``model_store`` reports them."""
        ...


@dataclass(frozen=True)
class Profile:
    """One deployment target, whole: what its cloud decides, what Pulumi creates for it, and the instance types
    and prices its GPU pools are sized and billed with."""

    target: Target
    cloud: Cloud
    cluster_layer: str
    """``module:function`` of the layer that makes (or finds) the cluster, ``(spec, layout, stack) ->
    ClusterAccess``. Named, not imported: the bill and the report never load Pulumi, and only the Pulumi program
    resolves it (``components.deploy.program``)."""
    instances: Mapping[str, InstanceType]
    """The instance types its GPU pools may name."""
    prices: PriceList
    """What those instance types cost it."""


def bill(spec: PlatformSpec, layout: Layout, profile: Profile | None) -> StackCost:
    """The stack's whole bill: its GPU pools at its target's prices and what its cloud runs besides them. Without a
    profile (target local: nothing runs in a cloud) the pools at the catalog's EC2 prices, as `inferstack size`
    quotes them, and nothing else."""
    if profile is None:
        return stack_cost(spec, layout, (), EC2_PRICES, INSTANCE_TYPES)
    return stack_cost(
        spec, layout, profile.cloud.fixed_costs(spec, layout), profile.prices, profile.instances
    )


def model_store(planned: Planned) -> list[Problem]:
    """The target's own model-store rules, asked of its cloud (none on target local: no cloud, the loopback store).
    Core cannot import the clouds: the caller of ``stackfile.validate`` brings them (``components.clouds.targets``)."""
    return planned.cloud.model_store_problems(planned.spec) if planned.cloud is not None else []


RULES: tuple[PlanRule, ...] = (model_store,)
"""The cloud seam's plan-time rules (``components.core.plan_rules``)."""
