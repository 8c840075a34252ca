"""The cloud seam: each target's cloud, what it bills, where engines land, and that the pure half stays pure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.base import catalog
from components.clouds import targets
from components.clouds.aws import decisions, prices
from components.clouds.aws import layer as aws_layer
from components.clouds.aws.cloud import EKS
from components.clouds.own_cluster import OWN_CLUSTER, OwnCluster
from components.core import cost, nodes
from components.core.cloud import Cloud, IngressClass
from components.core.placement import place
from components.core.stackfile import STACKS_DIR, available_stacks
from components.deploy import program
from components.kubernetes.cluster import bring_your_own
from components.render import engine, gateway
from components.spec import CapacityType, PlatformSpec, Target
from tests.components.helpers import minimal, on_own_cluster, pod_templates
from tests.stacks import load, synthesized

CLOUDS: list[Cloud] = [EKS, OWN_CLUSTER]
GPU_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).layout.pools]


def _spec(target: str) -> PlatformSpec:
    raw = on_own_cluster(minimal()) if target == "kubernetes" else {**minimal(), "target": target}
    return PlatformSpec.model_validate(raw)


def test_each_cluster_target_has_a_cloud_and_a_cluster_layer_and_local_has_neither() -> None:
    assert targets.cloud_for(_spec("eks")) is EKS
    assert targets.cloud_for(_spec("kubernetes")) is OWN_CLUSTER
    assert set(targets.PROFILES) == {Target.EKS, Target.KUBERNETES}
    for target, profile in targets.PROFILES.items():
        assert profile.target is target
        assert callable(program.cluster_layer(profile))
        assert all(profile.prices.hourly(i, CapacityType.ON_DEMAND) > 0 for i in profile.instances.values())
    assert program.cluster_layer(targets.PROFILES[Target.EKS]) is aws_layer.provision
    assert program.cluster_layer(targets.PROFILES[Target.KUBERNETES]) is bring_your_own
    local = load("local")
    with pytest.raises(ValueError, match="without a cluster"):
        targets.cloud_for(local.spec)
    assert targets.fixed_costs(local.spec, local.layout) == ()


def test_a_cluster_you_bring_bills_nothing_but_its_gpu_pools() -> None:
    spec = _spec("kubernetes")
    layout = place(spec)
    bill = cost.stack_cost(
        spec, layout, OWN_CLUSTER.fixed_costs(spec, layout), catalog.EC2_PRICES, catalog.INSTANCE_TYPES
    )
    assert {i.kind for i in bill.items} == {"gpu-pool"}


def test_eks_bills_what_its_layer_creates_from_the_same_decisions() -> None:
    stack = load("prod")
    items = {i.kind: i for i in EKS.fixed_costs(stack.spec, stack.layout)}
    assert list(items) == ["eks", "system-nodes", "nat", "ebs", "kms"]
    month = catalog.HOURS_PER_MONTH
    groups = decisions.node_groups(stack.spec, stack.layout)
    nats = decisions.network_plan(stack.spec).nat_gateways
    keys = decisions.kms_keys(stack.spec)
    assert items["eks"].max_usd_month == pytest.approx(prices.EKS_CONTROL_PLANE_USD_PER_HOUR * month)
    assert items["nat"].max_usd_month == pytest.approx(nats * prices.NAT_GATEWAY_USD_PER_HOUR * month)
    disks = [(prices.root_disk_usd_month(g.disk), g.min_size, g.max_size) for g in groups]
    assert items["ebs"].min_usd_month == pytest.approx(sum(usd * low for usd, low, _ in disks))
    assert items["ebs"].max_usd_month == pytest.approx(sum(usd * high for usd, _, high in disks))
    assert items["kms"].max_usd_month == pytest.approx(len(keys) * prices.KMS_KEY_USD_PER_MONTH)
    assert ", ".join(keys) in items["kms"].name


def test_gp3_disks_are_priced_above_the_baseline_only() -> None:
    baseline = prices.gp3_disk_usd_month(
        100, prices.EBS_GP3_BASELINE_IOPS, prices.EBS_GP3_BASELINE_THROUGHPUT_MIBPS
    )
    assert baseline == pytest.approx(100 * prices.EBS_GP3_USD_PER_GIB_MONTH)
    faster = prices.gp3_disk_usd_month(100, prices.EBS_GP3_BASELINE_IOPS + 1000, 1000)
    extra = 1000 * prices.EBS_GP3_USD_PER_IOPS_MONTH + 875 * prices.EBS_GP3_USD_PER_MIBPS_MONTH
    assert faster == pytest.approx(baseline + extra)


def test_cost_holds_no_cloud_prices_it_sums_the_clouds_line_items() -> None:
    """A stack's bill is its GPU pools at the price list plus exactly the items its cloud priced."""
    stack = load("prod")
    fixed = EKS.fixed_costs(stack.spec, stack.layout)
    bill = cost.stack_cost(stack.spec, stack.layout, fixed, catalog.EC2_PRICES, catalog.INSTANCE_TYPES)
    assert bill.items[len(stack.layout.pools) :] == fixed
    assert {i.kind for i in bill.items[: len(stack.layout.pools)]} == {"gpu-pool"}
    assert bill.prices is catalog.EC2_PRICES
    source = Path(cost.__file__).read_text()
    assert not [name for name in dir(prices) if name.isupper() and name in source]


@pytest.mark.parametrize("cloud", CLOUDS, ids=type)
@pytest.mark.parametrize("name", GPU_STACKS)
def test_every_engine_lands_on_its_own_pools_gpu_nodes_and_nothing_else_does_on_every_cloud(
    name: str, cloud: Cloud
) -> None:
    stack = load(name)
    gpu_nodes = {
        p.name: (cloud.gpu_node_labels(p), cloud.gpu_node_taints()) for p in stack.layout.pools.values()
    }
    for model in stack.spec.models:
        placement = stack.layout.placements[model.name]
        rendered = engine.render(stack.spec, stack.decisions.models[model.name])
        [workload] = [m for m in rendered if m["kind"] in ("Deployment", "LeaderWorkerSet")]
        for template in pod_templates(workload).values():
            pod = template["spec"]
            fits = [p for p, (labels, taints) in gpu_nodes.items() if nodes.schedulable(pod, labels, taints)]
            assert fits == ([placement.pool] if placement.pool else []), model.name
    plain: dict[str, Any] = {}
    assert not [p for p, (labels, taints) in gpu_nodes.items() if nodes.schedulable(plain, labels, taints)]


@pytest.mark.parametrize("name", [s for s in GPU_STACKS if load(s).spec.target is Target.EKS])
def test_eks_gpu_node_groups_carry_exactly_what_the_cloud_promises(name: str) -> None:
    stack = load(name)
    for pool in stack.layout.pools.values():
        group = decisions.gpu_node_group(stack.spec, pool)
        assert group.labels == EKS.gpu_node_labels(pool)
        assert tuple(group.taints) == EKS.gpu_node_taints()


def test_on_eks_the_engines_service_account_reads_the_weights_and_elsewhere_none_does() -> None:
    stack = load("prod")
    namespace, account = EKS.model_reader(stack.spec)
    synthesis = synthesized("prod")
    associations = [r.inputs for r in synthesis.resources if r.type.endswith("PodIdentityAssociation")]
    reader = next(a for a in associations if a["serviceAccount"] == account)
    assert reader["namespace"] == namespace
    engines = [
        m
        for m in synthesis.kubernetes_manifests()
        if m["kind"] == "Deployment" and "engine" in m["metadata"]["name"]
    ]
    assert engines and all(e["spec"]["template"]["spec"]["serviceAccountName"] == account for e in engines)
    assert OWN_CLUSTER.model_reader(_spec("kubernetes")) is None


def test_a_new_cloud_decides_the_ingress_class_and_network_without_touching_a_renderer() -> None:
    class Nginx(OwnCluster):
        def load_balancer_ingress(self, spec: PlatformSpec) -> IngressClass:
            return IngressClass("nginx", {"nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"})

        def cluster_network(self, spec: PlatformSpec) -> list[str]:
            return ["100.64.0.0/10"]

    raw = {**on_own_cluster(minimal()), "gateway": {"ingress": "alb", "hostname": "llm.example.com"}}
    spec = PlatformSpec.model_validate(raw)
    [ingress] = [m for m in gateway.render(spec, Nginx()) if m["kind"] == "Ingress"]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"}
    [eks_ingress] = [m for m in gateway.render(spec, OWN_CLUSTER) if m["kind"] == "Ingress"]
    assert eks_ingress["spec"]["ingressClassName"] == "alb"  # a cluster you bring: the ALB controller you run


def test_the_seams_pure_half_loads_without_any_pulumi_sdk() -> None:
    """cost, report, placement and the policies use these cheaply: importing them pulls in no Pulumi."""
    modules = [
        "components.clouds.targets",
        "components.core.cost",
        "components.core.nodes",
        "components.render.karpenter",
    ]
    code = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0].startswith('pulumi'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(done.stdout) == []


def test_tolerations_follow_kubernetes_matching_rules() -> None:
    taint = nodes.gpu_taint()
    assert nodes.tolerates([nodes.gpu_toleration()], taint)
    assert nodes.tolerates([{"key": "nvidia.com/gpu", "operator": "Exists"}], taint)
    assert nodes.tolerates([{"operator": "Exists"}], taint)
    assert not nodes.tolerates(
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], taint
    )
    assert not nodes.tolerates([{"key": "other", "operator": "Exists"}], taint)
    assert not nodes.tolerates([{"key": "nvidia.com/gpu", "value": "true"}], taint)
    assert nodes.tolerates(
        [{"key": "nvidia.com/gpu", "value": "true"}], nodes.Taint("nvidia.com/gpu", "NoSchedule", "true")
    )
    assert not nodes.tolerates([], taint)
