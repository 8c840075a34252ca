"""The seam holds a second target: one made here (its cloud, its cluster layer, an instance type of its own at a
flat price), registered for a test and removed after, validates, plans and bills a tiny stack under the Pulumi
mocks with no edit to the target enum, the spec, placement, the renderers or the program."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.base import catalog
from components.base.catalog import Family, InstanceType
from components.base.problems import Problem, SpecError
from components.cli import report
from components.clouds import targets
from components.core import nodes
from components.core.cloud import Endpoint, IngressClass, Profile
from components.core.cost import LineItem
from components.core.placement import Layout, PoolPlan
from components.deploy import synthesis as plan
from components.kubernetes.cluster import ClusterAccess
from components.spec import CapacityType, KubernetesClusterSpec, PlatformSpec, Target
from runtime.config import S3Files
from tests.components.helpers import LLAMA_8B_COMMIT, OWN_STORE, engine_deployments, write_stack
from tests.stacks import load

TINY = "tiny-cloud"
TINY_NETWORK = "100.64.0.0/10"
TINY_INGRESS = "tiny-lb"
TINY_CONTROL_PLANE = LineItem("tiny control plane", "tiny-control-plane", 50.0, 50.0)

TINY_L4 = dataclasses.replace(
    catalog.INSTANCE_TYPES["g6.xlarge"],
    name="tiny.l4-1",
    family_facts=Family("tiny-l4", spot_fraction=1.0, node_start_s=120, cluster_placement=False),
)
"""The tiny cloud's one GPU type: an L4 node under a name EC2 does not have."""

LAYER_RUNS: list[str] = []
"""The stacks the tiny cluster layer ran for."""


class TinyCloud:
    """A cluster somewhere with its own load balancer class, node network and a control plane it bills."""

    gpu_driver_preinstalled = True
    managed_limit_store = False

    def fixed_costs(self, spec: PlatformSpec, layout: Layout) -> tuple[LineItem, ...]:
        return (TINY_CONTROL_PLANE,)

    def gpu_node_labels(self, pool: PoolPlan) -> dict[str, str]:
        return nodes.gpu_node_labels(pool)

    def gpu_node_taints(self) -> tuple[nodes.Taint, ...]:
        return (nodes.gpu_taint(),)

    def cluster_network(self, spec: PlatformSpec) -> list[str]:
        return [TINY_NETWORK]

    def load_balancer_ingress(self, spec: PlatformSpec) -> IngressClass:
        return IngressClass(TINY_INGRESS, {"tiny.example/scheme": "internet-facing"})

    def credential_endpoints(self, spec: PlatformSpec) -> tuple[Endpoint, ...]:
        return ()

    def model_reader(self, spec: PlatformSpec) -> tuple[str, str] | None:
        return None

    def batch_files(self, spec: PlatformSpec) -> S3Files | None:
        return None

    def volume_storage_class(self, spec: PlatformSpec) -> str | None:
        return None

    def image_build(self, spec: PlatformSpec) -> str | None:
        return None

    def model_store_problems(self, spec: PlatformSpec) -> list[Problem]:
        """Its store must be named: the stack creates none here."""
        return (
            [] if spec.model_store.bucket else [Problem("model_store.bucket", "name the tiny store's bucket")]
        )


@dataclass(frozen=True)
class FlatPrices:
    """One dollar per GPU an hour, whatever the capacity."""

    region: str = "tiny-1"
    read_on: str = "2026-12-01"
    source: str = "the tiny cloud's flat price"

    def hourly(self, instance: InstanceType, capacity: CapacityType) -> float:
        return 1.0 * instance.gpus


def tiny_cluster(spec: PlatformSpec, layout: Layout, stack: str) -> ClusterAccess:
    """The tiny cloud's cluster layer: it creates nothing, and the kubeconfig reaches the cluster."""
    LAYER_RUNS.append(stack)
    return ClusterAccess()


@contextmanager
def second_target() -> Iterator[Profile]:
    """The tiny target, registered while the block runs: a target value and one profile entry, nothing else."""
    target = Target.add(TINY)
    profile = Profile(target, TinyCloud(), f"{__name__}:tiny_cluster", {TINY_L4.name: TINY_L4}, FlatPrices())
    targets.PROFILES[target] = profile
    try:
        yield profile
    finally:
        del targets.PROFILES[target]
        Target.remove(target)


def _tiny_stack(**platform: object) -> dict[str, object]:
    return {
        "name": "tiny",
        "environment": "test",
        "target": TINY,
        "model_store": dict(OWN_STORE),
        "gateway": {"ingress": "alb", "hostname": "llm.tiny.example"},
        "gpu_pools": [{"name": "l4", "instance_type": TINY_L4.name}],
        "models": [
            {
                "name": "llama-8b",
                "source": "meta-llama/Llama-3.1-8B-Instruct",
                "revision": LLAMA_8B_COMMIT,
                "pool": "l4",
                "engine": {"max_model_len": 4096, "max_num_seqs": 16},
                "scaling": {"min_replicas": 1, "max_replicas": 2},
            }
        ],
        **platform,
    }


def test_a_second_target_plans_and_bills_a_tiny_stack_under_the_pulumi_mocks(tmp_path: Path) -> None:
    write_stack(tmp_path, "tiny", _tiny_stack())
    with second_target() as profile:
        stack = load("tiny", tmp_path)
        assert stack.spec.target is profile.target
        assert type(stack.spec.cluster) is KubernetesClusterSpec  # no section of its own: the common fields
        LAYER_RUNS.clear()
        synthesis = plan.synthesize(stack)
        bill = targets.stack_cost(stack.spec, stack.layout)
        summary = report.plan_report(stack)
    assert LAYER_RUNS == ["tiny"]
    assert not [r.type for r in synthesis.resources if r.type.startswith(("aws:", "pulumi:providers:aws"))]
    manifests = synthesis.kubernetes_manifests()
    [ingress] = [m for m in manifests if m["kind"] == "Ingress"]
    assert ingress["spec"]["ingressClassName"] == TINY_INGRESS
    assert ingress["metadata"]["annotations"] == {"tiny.example/scheme": "internet-facing"}
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    assert any(TINY_NETWORK in str(p["spec"]) for p in policies)
    engine = engine_deployments(synthesis)["llama-8b"]["spec"]["template"]["spec"]
    cloud = profile.cloud
    assert nodes.schedulable(engine, cloud.gpu_node_labels(stack.layout.pools["l4"]), cloud.gpu_node_taints())
    # The bill: the pool at the tiny cloud's flat price, and the control plane it priced; no AWS item.
    pool = stack.layout.pools["l4"]
    assert pool.instance is TINY_L4
    month = catalog.HOURS_PER_MONTH
    assert [i.kind for i in bill.items] == ["gpu-pool", TINY_CONTROL_PLANE.kind]
    assert bill.items[0].max_usd_month == pytest.approx(1.0 * pool.instance.gpus * month * pool.max_nodes)
    assert bill.items[1] == TINY_CONTROL_PLANE
    assert bill.prices.source == "the tiny cloud's flat price"
    assert summary.bill == bill
    assert any("runtime images: runs the spec's published images" in note for note in summary.deploy_notes)


def test_a_second_target_plans_on_its_own_instance_types_only(tmp_path: Path) -> None:
    """Placement and the checks read the target's instance table: an EC2 type is unknown on the tiny target,
    and the error names the tiny target's families and types; auto picks the tiny type."""
    write_stack(tmp_path, "tiny", _tiny_stack(gpu_pools=[{"name": "l4", "instance_type": "g6.xlarge"}]))
    with second_target(), pytest.raises(SpecError) as caught:
        load("tiny", tmp_path)
    assert (
        "gpu_pools[0].instance_type: unknown GPU instance type 'g6.xlarge'; use 'auto' or one of the families "
        "tiny-l4 (e.g. 'tiny.l4-1')"
    ) in caught.value.render()
    write_stack(tmp_path, "tiny", _tiny_stack(gpu_pools=[{"name": "l4", "instance_type": "auto"}]))
    with second_target():
        assert load("tiny", tmp_path).layout.pools["l4"].instance is TINY_L4


def test_a_second_target_refuses_an_eks_field_naming_it(tmp_path: Path) -> None:
    write_stack(tmp_path, "tiny", _tiny_stack(cluster={"vpc_cidr": "10.0.0.0/16"}))
    with second_target(), pytest.raises(SpecError) as caught:
        load("tiny", tmp_path)
    assert "cluster.vpc_cidr: vpc_cidr is a field of target eks; target tiny-cloud has no such field" in (
        caught.value.render()
    )


def test_the_second_target_is_gone_after_its_block(tmp_path: Path) -> None:
    with second_target():
        pass
    assert set(targets.PROFILES) == {Target.EKS, Target.KUBERNETES}
    write_stack(tmp_path, "tiny", _tiny_stack())
    with pytest.raises(SpecError, match="target: Input should be 'eks', 'kubernetes' or 'local'"):
        load("tiny", tmp_path)
