"""GPU capacity: a pool's reservation (Capacity Block or On-Demand Capacity Reservation) first, then its own
instance type, then fallback types, rendered into launch templates, node groups, the autoscaler's priorities and
Karpenter's NodePools; bad input is one located line."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from components.base import catalog
from components.base.problems import SpecError
from components.cli.main import app
from components.clouds import targets
from components.clouds.aws import decisions
from components.core import capacity, cost
from components.deploy import synthesis as plan
from tests.components.helpers import SOME_COMMIT, cluster, write_stack
from tests.stacks import load

RESERVATION = "cr-0123456789abcdef0"
ZONES = ["us-east-1a", "us-east-1b"]


def _h100(reservation: dict[str, Any] | None = None, **pool: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "inferstack",
        "environment": "dev",
        "target": "eks",
        "cluster": cluster(availability_zones=ZONES),
        "gpu_pools": [
            {
                "name": "h100",
                "instance_type": "p5.48xlarge",
                "fallback_instance_types": ["p5en.48xlarge"],
                **pool,
            }
        ],
        "models": [
            {
                "name": "llama-70b",
                "source": "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
                "revision": SOME_COMMIT,
                "pool": "h100",
                "engine": {
                    "tensor_parallel_size": 2,
                    "dtype": "float16",
                    "quantization": "awq",
                    "max_model_len": 8192,
                },
                "scaling": {"min_replicas": 1, "max_replicas": 4},
            }
        ],
    }
    if reservation is not None:
        raw["gpu_pools"][0]["capacity_reservation"] = reservation
    return raw


def _synth(tmp_path: Path, raw: dict[str, Any]) -> plan.Synthesis:
    write_stack(tmp_path, "gpu", raw)
    return plan.synthesize(load("gpu", tmp_path))


def _of(synthesis: plan.Synthesis, type_: str) -> list[plan.Resource]:
    return [r for r in synthesis.resources if r.type == type_]


def _groups_and_templates(synthesis: plan.Synthesis) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    templates = {r.name: r.inputs for r in _of(synthesis, "aws:ec2/launchTemplate:LaunchTemplate")}
    return {
        r.inputs["nodeGroupName"]: (r.inputs, templates[r.inputs["nodeGroupName"]])
        for r in _of(synthesis, "aws:eks/nodeGroup:NodeGroup")
    }


def test_a_capacity_block_is_its_own_node_group_in_its_zone_tried_first(tmp_path: Path) -> None:
    reservation = {"id": RESERVATION, "kind": "capacity-block", "availability_zone": "us-east-1b"}
    synthesis = _synth(tmp_path, _h100(reservation, min_nodes=1))
    groups = _groups_and_templates(synthesis)
    reserved, reserved_template = groups["inferstack-dev-h100-reserved"]
    own, own_template = groups["inferstack-dev-h100"]
    assert reserved["capacityType"] == "CAPACITY_BLOCK" and reserved["instanceTypes"] == ["p5.48xlarge"]
    assert reserved["scalingConfig"]["minSize"] == reserved["scalingConfig"]["desiredSize"] == 0
    assert reserved["scalingConfig"]["maxSize"] == own["scalingConfig"]["maxSize"]
    assert reserved_template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": RESERVATION}
    }
    assert reserved_template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    # Only the subnet of the reservation's zone (the second of the stack's zones).
    subnets = {r.name: r.inputs for r in _of(synthesis, "aws:ec2/subnet:Subnet")}
    [zone_subnet] = [
        n
        for n, s in subnets.items()
        if s["availabilityZone"] == "us-east-1b" and "internal-elb" in str(s["tags"])
    ]
    assert reserved["subnetIds"] == [f"{zone_subnet}-id"]
    assert len(own["subnetIds"]) == len(ZONES)
    # The pool's own group keeps its floor and falls back to H200 nodes in order.
    assert own["capacityType"] == "ON_DEMAND" and own["instanceTypes"] == ["p5.48xlarge", "p5en.48xlarge"]
    assert own["scalingConfig"]["minSize"] == 1
    assert (
        "capacityReservationSpecification" not in own_template and "instanceMarketOptions" not in own_template
    )
    assert reserved["labels"] == own["labels"] and reserved["taints"] == own["taints"]
    # The Cluster Autoscaler tries the reservation's group first.
    [chart] = [r for r in _of(synthesis, "kubernetes:helm.sh/v4:Chart") if r.name == "cluster-autoscaler"]
    values = chart.inputs["values"]
    assert values["extraArgs"]["expander"] == "priority,least-waste"
    priorities = yaml.safe_load(values["expanderPriorities"])
    assert list(priorities) == [decisions.RESERVED_PRIORITY, decisions.POOL_PRIORITY, 0]
    assert priorities[decisions.RESERVED_PRIORITY] == [
        r"^eks-inferstack-dev-h100-reserved-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$"
    ]


def test_an_on_demand_capacity_reservation_is_targeted_without_the_capacity_block_market(
    tmp_path: Path,
) -> None:
    reservation = {"id": RESERVATION, "kind": "on-demand", "availability_zone": "us-east-1a"}
    groups = _groups_and_templates(_synth(tmp_path, _h100(reservation)))
    reserved, template = groups["inferstack-dev-h100-reserved"]
    assert reserved["capacityType"] == "ON_DEMAND"
    assert (
        template["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"]
        == RESERVATION
    )
    assert "instanceMarketOptions" not in template


def test_without_a_reservation_the_autoscaler_keeps_least_waste(tmp_path: Path) -> None:
    synthesis = _synth(tmp_path, _h100())
    [chart] = [r for r in _of(synthesis, "kubernetes:helm.sh/v4:Chart") if r.name == "cluster-autoscaler"]
    assert chart.inputs["values"]["extraArgs"]["expander"] == "least-waste"
    assert "expanderPriorities" not in chart.inputs["values"]


def test_karpenter_selects_the_reservation_and_allows_the_fallback_types(tmp_path: Path) -> None:
    raw = _h100({"id": RESERVATION, "availability_zone": "us-east-1a"})
    raw["cluster"]["node_provisioner"] = "karpenter"
    synthesis = _synth(tmp_path, raw)
    [node_class] = [r.inputs for r in _of(synthesis, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")]
    assert node_class["spec"]["capacityReservationSelectorTerms"] == [{"id": RESERVATION}]
    [node_pool] = [r.inputs for r in _of(synthesis, "kubernetes:karpenter.sh/v1:NodePool")]
    requirements = {r["key"]: r["values"] for r in node_pool["spec"]["template"]["spec"]["requirements"]}
    assert requirements["karpenter.sh/capacity-type"] == ["reserved", "on-demand"]
    assert requirements["node.kubernetes.io/instance-type"] == ["p5.48xlarge", "p5en.48xlarge"]
    [chart] = [r for r in _of(synthesis, "kubernetes:helm.sh/v4:Chart") if r.name.endswith("-karpenter")]
    assert chart.inputs["values"]["settings"]["featureGates"] == {"reservedCapacity": True}


def test_the_plan_says_where_the_pools_nodes_come_from_and_prices_the_dearest_fallback(
    tmp_path: Path,
) -> None:
    raw = _h100({"id": RESERVATION, "availability_zone": "us-east-1a"})
    write_stack(tmp_path, "gpu", raw)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["plan", "-s", "gpu", "--stacks-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = (out / "summary.md").read_text()
    assert (
        f"pool h100 capacity, in order: Capacity Block {RESERVATION} (p5.48xlarge, us-east-1a) -> p5.48xlarge "
        "on-demand -> p5en.48xlarge on-demand"
    ) in summary
    stack = load("gpu", tmp_path)
    [pool] = [i for i in targets.stack_cost(stack.spec, stack.layout).items if i.kind == "gpu-pool"]
    p5en = catalog.INSTANCE_TYPES["p5en.48xlarge"].on_demand_usd_per_hour * catalog.HOURS_PER_MONTH
    assert pool.max_usd_month == pytest.approx(p5en * stack.layout.pools["h100"].max_nodes)


def test_a_fallback_is_priced_from_the_targets_own_instance_table(tmp_path: Path) -> None:
    """The bill reads a pool's fallback types in the target's instance table (``Profile.instances``), not in the
    AWS catalog behind every target's back: a target whose p5en costs more bills the pool's maximum with it."""
    write_stack(tmp_path, "gpu", _h100())
    stack = load("gpu", tmp_path)
    p5en = catalog.INSTANCE_TYPES["p5en.48xlarge"]
    dearer = dataclasses.replace(p5en, on_demand_usd_per_hour=p5en.on_demand_usd_per_hour * 10)
    instances = {**catalog.INSTANCE_TYPES, p5en.name: dearer}
    bill = cost.stack_cost(stack.spec, stack.layout, (), catalog.EC2_PRICES, instances)
    [pool] = [i for i in bill.items if i.kind == "gpu-pool"]
    nodes = stack.layout.pools["h100"].max_nodes
    assert pool.max_usd_month == pytest.approx(
        catalog.EC2_PRICES.hourly(dearer, stack.layout.pools["h100"].capacity_type)
        * catalog.HOURS_PER_MONTH
        * nodes
    )


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        (
            lambda r: r["gpu_pools"][0].update(
                capacity_reservation={"id": "cr-123", "availability_zone": "us-east-1a"}
            ),
            "gpu_pools[0].capacity_reservation.id",
            "'cr-123' is not a capacity reservation id",
        ),
        (
            lambda r: r["gpu_pools"][0].update(
                capacity_reservation={"id": RESERVATION, "availability_zone": "us-east-1d"}
            ),
            "gpu_pools[0].capacity_reservation.availability_zone",
            "us-east-1d is not one of the stack's zones (us-east-1a, us-east-1b); list it in cluster.availability_zones",
        ),
        (
            lambda r: r["gpu_pools"][0].update(
                capacity_reservation={"id": RESERVATION, "availability_zone": "east"}
            ),
            "gpu_pools[0].capacity_reservation.availability_zone",
            "'east' is not an availability zone",
        ),
        (
            lambda r: r["gpu_pools"][0].update(
                instance_type="auto",
                capacity_reservation={"id": RESERVATION, "availability_zone": "us-east-1a"},
            ),
            "gpu_pools[0]",
            "capacity_reservation reserves one instance type",
        ),
        (
            lambda r: r["gpu_pools"][0].update(fallback_instance_types=["p4de.24xlarge"]),
            "gpu_pools[0].fallback_instance_types[0]",
            "p4de.24xlarge has 8 GPUs, 96 vCPUs and 1152 GiB; the pool's p5.48xlarge has 8, 192 and 2048 GiB",
        ),
        (
            lambda r: r["gpu_pools"][0].update(fallback_instance_types=["p5.48xlarge"]),
            "gpu_pools[0]",
            "fallback_instance_types repeats instance_type 'p5.48xlarge'",
        ),
        (
            lambda r: r["gpu_pools"][0].update(fallback_instance_types=["x9.huge"]),
            "gpu_pools[0].fallback_instance_types",
            "unknown GPU instance type(s) 'x9.huge'",
        ),
    ],
)
def test_capacity_mistakes_are_one_located_line(tmp_path: Path, change: Any, path: str, words: str) -> None:
    raw = copy.deepcopy(_h100())
    change(raw)
    write_stack(tmp_path, "bad", raw)
    with pytest.raises(SpecError) as caught:
        load("bad", tmp_path)
    text = caught.value.render()
    assert f": {path}: " in text and words in text, text
    result = CliRunner().invoke(app, ["plan", "-s", "bad", "--stacks-dir", str(tmp_path)])
    assert result.exit_code == 2


def test_a_fallback_a_model_cannot_run_on_is_refused(tmp_path: Path) -> None:
    """g5.12xlarge has g6.12xlarge's shape, but its A10G GPUs have no FP8."""
    raw = _h100()
    raw["gpu_pools"][0] = {
        "name": "h100",
        "instance_type": "g6.12xlarge",
        "fallback_instance_types": ["g5.12xlarge"],
    }
    raw["models"][0] = {
        "name": "llama-8b",
        "source": "meta-llama/Llama-3.1-8B-Instruct",
        "revision": SOME_COMMIT,
        "pool": "h100",
        "engine": {"quantization": "fp8", "max_model_len": 8192, "max_num_seqs": 32},
    }
    write_stack(tmp_path, "small", raw)
    with pytest.raises(SpecError) as caught:
        load("small", tmp_path)
    assert (
        "gpu_pools[0].fallback_instance_types[0]: llama-8b does not fit g5.12xlarge: "
        in caught.value.render()
    )


def test_a_reservation_with_subnets_the_stack_does_not_make_is_refused(tmp_path: Path) -> None:
    raw = _h100({"id": RESERVATION, "availability_zone": "us-east-1a"})
    raw["cluster"] = cluster(
        existing_vpc_id="vpc-0123456789abcdef0",
        existing_private_subnet_ids=["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
    )
    write_stack(tmp_path, "byo", raw)
    with pytest.raises(SpecError, match="cannot tell which subnet is in the reservation's zone"):
        load("byo", tmp_path)


def test_a_fallback_without_room_for_the_pools_node_cache_on_nvme_is_refused(tmp_path: Path) -> None:
    """g4dn.2xlarge has g6.2xlarge's shape but half its NVMe: the pool's node cache would not fit there."""
    raw = _h100()
    raw["gpu_pools"][0] = {
        "name": "h100",
        "instance_type": "g6.2xlarge",
        "fallback_instance_types": ["g4dn.2xlarge"],
        "model_cache_gib": 300,
    }
    raw["models"][0] = {
        "name": "qwen",
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "revision": SOME_COMMIT,
        "pool": "h100",
        "weights": {"fetch": "node-cache"},
        "engine": {"dtype": "float16", "max_model_len": 4096},
    }
    write_stack(tmp_path, "cache", raw)
    with pytest.raises(SpecError) as caught:
        load("cache", tmp_path)
    assert (
        "gpu_pools[0].fallback_instance_types[0]: the pool's 300 GiB node cache is on local NVMe, and "
        "g4dn.2xlarge has 210 GiB of it" in caught.value.render()
    )


def test_the_plan_says_which_zone_a_placement_group_pins_and_how_to_check_it_offers_the_instance() -> None:
    """A cluster placement group is in one zone, named by the stack; a zone name is a different physical zone in
    each account, so the plan says how to check the instance is offered there (issue #35's placement-group zone)."""
    decided = load("prod-405b").decisions
    [pool] = [p for p in decided.layout.pools.values() if p.placement_group]
    [note] = [n for n in capacity.notes(decided.spec, decided.layout) if "placement group" in n]
    assert note.startswith(f"pool {pool.name}: one cluster placement group, so one zone")
    assert f"Values={pool.instance.name}" in note and "list that zone first" in note
    assert decisions.gpu_node_group(decided.spec, pool).zone == decisions.zones(decided.spec)[0]
