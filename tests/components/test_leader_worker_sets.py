"""Replicas that span nodes (#20): sizing and placement rules as properties, bad input, the LeaderWorkerSet objects
(CRD schema of the LWS project, pod templates through kubernetes-validate strict), the AWS side (EFA interfaces,
placement group, self-referencing security group), add-ons and policies."""

from __future__ import annotations

import copy
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from components.base import catalog, sizing
from components.base.problems import SpecError
from components.core import multinode
from components.core.placement import place
from components.deploy import synthesis as plan
from components.render import addons, common, dashboards, engine_args, groups
from components.spec import PlatformSpec
from tests.components.helpers import decided, engine_workloads, minimal, pod_templates, write_stack
from tests.stacks import load

ROOT = Path(__file__).resolve().parents[2]
LWS_SCHEMA = Path(__file__).parent / "schemas" / "leaderworkerset.x-k8s.io_v1.yaml"
STACK = "prod-405b"
EIGHT_GPU = [i for i in catalog.INSTANCE_TYPES.values() if i.gpus == 8]


# Sizing and placement: properties --------------------------------------------------------------------------


archs = st.sampled_from(sorted(catalog.MODELS)).map(lambda k: catalog.MODELS[k])
shapes = st.builds(
    sizing.EngineShape,
    quantization=st.sampled_from(["none", "fp8", "awq"]),
    max_model_len=st.sampled_from([2048, 8192, 32_768, 131_072]),
    max_num_seqs=st.sampled_from([16, 64, 256]),
)


@settings(max_examples=60, deadline=None)
@given(arch=archs, shape=shapes)
def test_a_group_fills_whole_nodes_and_a_model_that_fits_one_node_is_never_split(
    arch: catalog.ModelArch, shape: sizing.EngineShape
) -> None:
    found = multinode.candidates(arch, shape)
    single = {c.instance.name for c in sizing.candidates(arch, shape, fixed_parallelism=False)}
    for c in found:
        # nodes x GPUs per node = TP x PP, exactly
        assert c.nodes * c.instance.gpus == c.tensor_parallel_size * c.pipeline_parallel_size or c.nodes == 1
        if c.nodes > 1:
            assert c.instance.name not in single, f"{c.instance.name} holds it on one node, yet it was split"
            assert c.tensor_parallel_size == c.instance.gpus  # TP inside a node, stages across nodes
            # the smallest group that fits: one node fewer does not
            if c.nodes > 2:
                smaller = sizing.EngineShape(
                    **{
                        **shape.__dict__,
                        "tensor_parallel_size": c.instance.gpus,
                        "pipeline_parallel_size": c.nodes - 1,
                    }
                )
                assert not sizing.memory_fit(arch, smaller, c.instance.gpu_spec).fits
        # cost per replica = nodes x node price (one node's share for a replica smaller than a node)
        share = c.gpus_per_replica / c.instance.gpus
        assert c.usd_per_replica_month == pytest.approx(
            c.instance.on_demand_usd_per_hour * catalog.HOURS_PER_MONTH * share
        )
        if c.nodes > 1:
            assert c.usd_per_replica_month == pytest.approx(
                c.nodes * c.instance.on_demand_usd_per_hour * catalog.HOURS_PER_MONTH
            )


@settings(max_examples=80, deadline=None)
@given(gpus=st.integers(1, 64), per_node=st.sampled_from([1, 4, 8]))
def test_group_nodes_is_whole_nodes_or_nothing(gpus: int, per_node: int) -> None:
    nodes = multinode.group_nodes(gpus, per_node)
    if gpus <= per_node:
        assert nodes == 1
    elif gpus % per_node:
        assert nodes is None
    else:
        assert nodes is not None and nodes * per_node == gpus


def _spec(tp: int, pp: int, instance: str, **engine: Any) -> dict[str, Any]:
    raw = minimal()
    raw["gpu_pools"][0]["instance_type"] = instance
    raw["models"][0]["source"] = "meta-llama/Llama-3.1-405B-Instruct"
    raw["models"][0]["engine"].update(
        {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "max_model_len": 8192, **engine}
    )
    return raw


@settings(max_examples=25, deadline=None)
@given(
    instance=st.sampled_from([i.name for i in EIGHT_GPU if i.gpu_spec.supports_bf16]),
    pp=st.integers(2, 4),
    replicas=st.integers(1, 3),
)
def test_a_placed_group_takes_whole_nodes_and_its_pool_and_cost_count_them(
    instance: str, pp: int, replicas: int
) -> None:
    raw = _spec(8, pp, instance)
    raw["models"][0]["scaling"] = {"min_replicas": replicas, "max_replicas": replicas}
    try:
        layout = place(PlatformSpec.model_validate(raw))
    except SpecError as error:  # too little memory even across the nodes: a fit problem, never a shape one
        assert all("does not fit" in p.message for p in error.problems), error.render()
        return
    placement = layout.placements["m"] if "m" in layout.placements else next(iter(layout.placements.values()))
    node = catalog.INSTANCE_TYPES[instance]
    assert placement.nodes == pp and placement.nodes * node.gpus == 8 * pp
    pool = next(iter(layout.pools.values()))
    assert pool.min_nodes >= replicas * pp
    assert pool.multi_node and pool.placement_group
    assert pool.efa_interfaces == catalog.INSTANCE_TYPES[instance].efa_interfaces


# Bad input -----------------------------------------------------------------------------------------------------


def _problems(raw: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        place(PlatformSpec.model_validate(raw))
    return caught.value.render()


def test_tp_x_pp_that_fills_no_whole_nodes_names_the_field_and_the_sizes_that_do() -> None:
    text = _problems(_spec(6, 1, "g6e.12xlarge"))
    assert "models[0].engine.tensor_parallel_size" in text
    assert "fills no whole number of g6e.12xlarge nodes" in text and "8, 12, 16" in text


def test_stated_nodes_that_disagree_with_the_parallel_sizes_is_one_error_with_the_fix() -> None:
    text = _problems(_spec(8, 2, "p5.48xlarge", nodes=3))
    assert "models[0].engine.nodes: 3 node(s) stated" in text and "set nodes to 2" in text


def test_tensorrt_llm_across_nodes_is_a_plan_error_naming_engine_and_version() -> None:
    text = _problems(_spec(8, 2, "p5.48xlarge", kind="trtllm", dtype="auto"))
    assert "models[0].engine.kind: TensorRT-LLM (nvcr.io/nvidia/tensorrt-llm/release:1.0.0)" in text
    assert "trtllm-serve 1.0.0" in text and "use kind vllm or sglang" in text


def test_sleep_on_a_group_is_a_plan_error() -> None:
    """Sleep mode is for single-node replicas (the router's calls reach a group's leader only)."""
    raw = _spec(8, 2, "p5.48xlarge")
    raw["models"][0]["scaling"] = {"min_replicas": 1, "max_replicas": 1, "sleep_after_idle_s": 300}
    text = _problems(raw)
    assert "models[0].scaling.sleep_after_idle_s: a replica of" in text
    assert "spans 2 x p5.48xlarge" in text and "one node only" in text


def test_efa_asked_for_on_an_instance_type_without_it_lists_the_types_with_it() -> None:
    raw = _spec(1, 1, "g6e.xlarge")
    raw["models"][0]["source"] = "meta-llama/Llama-3.1-8B-Instruct"
    raw["gpu_pools"][0]["efa"] = True
    text = _problems(raw)
    assert "gpu_pools[0].efa: g6e.xlarge has no EFA" in text and "p5.48xlarge" in text


def test_a_placement_group_needs_known_zones_and_a_group_needs_managed_node_groups() -> None:
    raw = _spec(8, 2, "p5.48xlarge")
    raw["cluster"]["existing_vpc_id"] = "vpc-0123456789abcdef0"
    raw["cluster"]["existing_private_subnet_ids"] = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
    assert "gpu_pools[0].placement_group: a cluster placement group keeps its nodes in one zone" in _problems(
        raw
    )
    raw = _spec(8, 2, "p5.48xlarge")
    raw["cluster"]["node_provisioner"] = "karpenter"
    assert "cluster.node_provisioner: pool" in _problems(raw)


def test_the_cli_says_so_and_exits_2(tmp_path: Path) -> None:
    write_stack(tmp_path, "bad", _spec(6, 1, "g6e.12xlarge"))
    result = subprocess.run(
        [sys.executable, "-m", "components.cli.main", "plan", "-s", "bad", "--stacks-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "models[0].engine.tensor_parallel_size" in result.stderr


# inferstack size ---------------------------------------------------------------------------------------------


def test_size_proposes_groups_where_no_single_node_holds_the_model() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "components.cli.main", "size", "llama-3.1-405b", "--max-model-len", "16384"],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "250"},
    )
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    # 405B in bfloat16 (~756 GiB) is more than 8 x H100 hold: two p5 nodes, over 32 EFA interfaces each.
    assert (
        "8 x 2" in rows["p5.48xlarge"]
        and "EFA x32, 3,200 Gbps, cluster placement group" in rows["p5.48xlarge"]
    )
    assert "$80,358" in rows["p5.48xlarge"]  # two nodes at $55.04/h for 730 h
    # 8 x B200 holds it on one node: never split there.
    assert "8 x 1" in rows["p6-b200.48xlarge"]


# The committed multi-node stack ----------------------------------------------------------------------------------


@cache
def _plan() -> plan.Synthesis:
    return plan.synthesize(load(STACK))


def _resources(kind: str) -> list[plan.Resource]:
    return [r for r in _plan().resources if r.type == kind]


def test_the_405b_stack_runs_each_replica_as_one_group_of_two_p5_nodes() -> None:
    stack = load(STACK)
    placement = stack.layout.placements["llama-3-405b"]
    assert (placement.instance.name if placement.instance else None, placement.nodes) == ("p5.48xlarge", 2)
    [lws] = [m for m in _plan().kubernetes_manifests() if m["kind"] == groups.KIND]
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    assert "replicas" not in lws["spec"]  # KEDA owns the group count
    [scaled] = [m for m in _plan().kubernetes_manifests() if m["kind"] == "ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": groups.API_VERSION,
        "kind": groups.KIND,
        "name": common.engine_name("llama-3-405b"),
    }
    [service] = [
        m
        for m in _plan().kubernetes_manifests()
        if m["kind"] == "Service" and m["metadata"]["name"] == common.engine_name("llama-3-405b")
    ]
    assert service["spec"]["selector"][groups.ROLE_LABEL] == groups.LEADER  # one endpoint per group
    for role, template in pod_templates(lws).items():
        container = template["spec"]["containers"][0]
        resources = container["resources"]["limits"]
        assert resources["nvidia.com/gpu"] == "8" and resources[groups.EFA_RESOURCE] == "32"
        assert resources[groups.HUGEPAGES_RESOURCE] == groups.EFA_HUGEPAGES
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
        assert env["FI_PROVIDER"] == "efa" and env["VLLM_HOST_IP"] == {
            "fieldRef": {"fieldPath": "status.podIP"}
        }
        assert ("startupProbe" in container) == (role == "leader")
        args = container["args"]
        assert args[args.index("--nnodes") + 1] == "2"
        assert ("--headless" in args) == (role == "worker")


def test_replica_counts_of_a_group_read_its_leader_stateful_set_not_a_deployment() -> None:
    """A LeaderWorkerSet has no Deployment: the dashboard's replica panel reads the leader StatefulSet LWS names
    after the set (one leader per group); a single-node model still reads its Deployment."""
    stack = load(STACK)
    engine = common.engine_name("llama-3-405b")
    group = stack.decisions.models[stack.spec.models[0].name]
    [panel] = [p for p in dashboards.model_panels(stack.spec, group) if p.title == "Replicas"]
    exprs = [expr for expr, _ in panel.targets]
    assert all(f'statefulset="{engine}"' in e for e in exprs) and not any("deployment" in e for e in exprs)
    single = PlatformSpec.model_validate(minimal())
    one = decided(single).models[single.models[0].name]
    [panel] = [p for p in dashboards.model_panels(single, one) if p.title == "Replicas"]
    assert all("kube_deployment_" in expr for expr, _ in panel.targets)


def test_the_405b_plan_has_efa_interfaces_a_placement_group_and_the_device_plugin() -> None:
    [template] = [r for r in _resources("aws:ec2/launchTemplate:LaunchTemplate") if r.name.endswith("-h100")]
    interfaces = template.inputs["networkInterfaces"]
    assert len(interfaces) == 32 == catalog.INSTANCE_TYPES["p5.48xlarge"].efa_interfaces
    assert [(i["networkCardIndex"], i["deviceIndex"]) for i in interfaces[:2]] == [(0, 0), (1, 1)]
    assert {i["interfaceType"] for i in interfaces} == {"efa"}
    [group] = _resources("aws:ec2/placementGroup:PlacementGroup")
    assert group.inputs["strategy"] == "cluster"
    assert template.inputs["placement"]["groupName"] == group.inputs["name"]
    [efa] = _resources("aws:ec2/securityGroup:SecurityGroup")[-1:]
    rules = _resources("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule") + _resources(
        "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
    )
    selfs = [r for r in rules if r.name.startswith(efa.name + "-self")]
    assert len(selfs) == 2 and all(r.inputs["ipProtocol"] == "-1" for r in selfs)
    [node_group] = [r for r in _resources("aws:eks/nodeGroup:NodeGroup") if r.name.endswith("-h100")]
    assert len(node_group.inputs["subnetIds"]) == 1  # a cluster placement group is one zone
    charts = {r.name: r.inputs for r in _resources("kubernetes:helm.sh/v4:Chart")}
    assert charts["aws-efa-k8s-device-plugin"]["version"] == "0.5.10"
    assert charts[addons.LWS_RELEASE]["chart"] == "oci://registry.k8s.io/lws/charts/lws"
    assert charts[addons.LWS_RELEASE]["version"] == "0.8.0"


def test_the_plan_summary_shows_nodes_efa_placement_group_and_cost(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "components.cli.main", "plan", "-s", STACK, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "250"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "2 x p5.48xlarge per replica" in summary
    assert "EFA x32" in summary and "cluster placement group" in summary
    assert "$80,358" in summary


# LeaderWorkerSet objects against the LWS API -------------------------------------------------------------------


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema as the API server applies it: a field it does not know is pruned, which for us is a bug, so
    an object with properties admits no others (unless it preserves unknown fields)."""
    out = copy.deepcopy(schema)
    if (
        out.get("type") == "object"
        and "properties" in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out.setdefault("additionalProperties", False)
    for key in ("properties",):
        if key in out:
            out[key] = {k: _structural(v) for k, v in out[key].items()}
    if "items" in out:
        out["items"] = _structural(out["items"])
    return out


def _lws_errors(manifest: dict[str, Any], version: str = "1.33.0") -> list[str]:
    schema = _structural(yaml.safe_load(LWS_SCHEMA.read_text()))
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(manifest)
    ]
    for role, template in pod_templates(manifest).items():
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": role},
            "template": template,
        }
        try:
            kubernetes_validate.validate(wrapped, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{role}: {error}")
    return errors


def test_every_rendered_leader_worker_set_follows_the_lws_api_and_its_pods_kubernetes() -> None:
    workloads = [w for w in engine_workloads(_plan()).values() if w["kind"] == groups.KIND]
    assert workloads
    for workload in workloads:
        assert workload["apiVersion"] == groups.API_VERSION
        assert _lws_errors(workload) == []


def test_the_lws_check_catches_a_wrong_field_a_wrong_value_and_a_bad_pod() -> None:
    [good] = [w for w in engine_workloads(_plan()).values() if w["kind"] == groups.KIND]
    typo = copy.deepcopy(good)
    typo["spec"]["leaderWorkerTemplate"]["restartPolicys"] = typo["spec"]["leaderWorkerTemplate"].pop(
        "restartPolicy"
    )
    value = copy.deepcopy(good)
    value["spec"]["startupPolicy"] = "WhenReady"
    pod = copy.deepcopy(good)
    pod["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagePullPolcy"] = (
        "Always"
    )
    assert any("restartPolicys" in e for e in _lws_errors(typo))
    assert any("WhenReady" in e for e in _lws_errors(value))
    assert any("worker" in e and "imagePullPolcy" in e for e in _lws_errors(pod))


# Group members' command lines ----------------------------------------------------------------------------------


def test_a_worker_is_headless_and_finds_its_rank_and_leader_in_what_lws_sets() -> None:
    spec = PlatformSpec.model_validate(_spec(8, 2, "p5.48xlarge"))
    model = spec.models[0]
    leader = engine_args.group_command(model, engine_args.in_group(2, leader=True)).args
    worker = engine_args.group_command(model, engine_args.in_group(2, leader=False)).args
    assert leader[-8:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        "29501",
    ]
    assert worker[-9:] == [
        "--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr", "$(LWS_LEADER_ADDRESS)",
        "--master-port", "29501", "--headless",
    ]  # fmt: skip
    sglang = PlatformSpec.model_validate(_spec(8, 2, "p5.48xlarge", kind="sglang")).models[0]
    args = engine_args.group_command(sglang, engine_args.in_group(2, leader=False)).args
    assert args[-6:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--dist-init-addr",
        "$(LWS_LEADER_ADDRESS):5000",
    ]
