"""What a GPU node group's labels say is true of every node it launches, and tells the Cluster Autoscaler it has GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from components.base import catalog
from components.clouds.aws import decisions
from components.core import nodes
from components.core.stackfile import STACKS_DIR, available_stacks
from components.render import karpenter
from components.spec import Target
from tests.stacks import load, synthesized

EKS_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target is Target.EKS]


def _gpu_groups(name: str) -> list[dict[str, Any]]:
    return [
        r.inputs
        for r in synthesized(name).resources
        if r.type == "aws:eks/nodeGroup:NodeGroup" and r.inputs["amiType"] == decisions.GPU_AMI_TYPE
    ]


@pytest.mark.parametrize("name", EKS_STACKS)
def test_every_gpu_node_group_carries_the_cluster_autoscalers_gpu_label(name: str) -> None:
    """Without k8s.amazonaws.com/accelerator a node whose device plugin has not advertised its GPUs yet looks like a
    node without GPUs, and the autoscaler adds another for the same pending engine (cluster-autoscaler 1.32.0,
    cloudprovider/aws/README.md 'Special note on GPU instances'; utils/gpu/gpu.go NodeHasGpu)."""
    groups = _gpu_groups(name)
    assert groups
    for group in groups:
        types = {
            decisions.AUTOSCALER_GPU_TYPES[catalog.INSTANCE_TYPES[t].gpu_spec.name]
            for t in group["instanceTypes"]
        }
        assert group["labels"][decisions.AUTOSCALER_GPU_LABEL] == "_".join(sorted(types))


def test_every_catalog_gpu_has_an_autoscaler_gpu_type() -> None:
    assert set(decisions.AUTOSCALER_GPU_TYPES) == set(catalog.GPUS)
    assert decisions.AUTOSCALER_GPU_TYPES["L4"] == "nvidia-l4"  # the autoscaler's own spelling


def test_a_pool_with_a_fallback_of_another_gpu_names_no_gpu_product_on_its_nodes() -> None:
    """prod's h100 pool falls back to p5en.48xlarge (H200): its node group labelled every node
    NVIDIA-H100-80GB-HBM3, so an H200 node lied. The product is named only where every instance type has it."""
    stack = load("prod")
    pool = stack.layout.pools["h100"]
    assert [i.name for i in pool.instance_types] == ["p5.48xlarge", "p5en.48xlarge"]
    [group] = [
        g for g in _gpu_groups("prod") if g["nodeGroupName"] == decisions.node_group_name(stack.spec, "h100")
    ]
    assert nodes.GPU_PRODUCT_LABEL not in group["labels"]
    assert group["labels"][decisions.AUTOSCALER_GPU_LABEL] == "nvidia-h100_nvidia-h200"
    assert group["labels"][nodes.POOL_LABEL] == "h100"  # what engines select is still there
    for other in _gpu_groups("prod"):
        if other is not group and len(other["instanceTypes"]) == 1:
            gpu = catalog.INSTANCE_TYPES[other["instanceTypes"][0]].gpu_spec
            assert other["labels"][nodes.GPU_PRODUCT_LABEL] == gpu.product_label


def test_karpenter_node_pools_carry_no_autoscaler_label_and_no_false_product() -> None:
    """Karpenter reads GPUs from EC2 and waits on its own NodeClaims: the autoscaler's label is not theirs. A NodePool
    with a fallback of another GPU names no product either."""
    stack = load("prod")
    pool = stack.layout.pools["h100"]
    manifest = karpenter.node_pool(pool, pool.max_nodes, tuple(i.name for i in pool.fallbacks))
    labels = manifest["spec"]["template"]["metadata"]["labels"]
    assert decisions.AUTOSCALER_GPU_LABEL not in labels
    assert nodes.GPU_PRODUCT_LABEL not in labels
