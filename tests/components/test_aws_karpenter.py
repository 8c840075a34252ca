"""cluster.node_provisioner: karpenter — NodePools and EC2NodeClasses instead of managed GPU node groups."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from components.clouds.aws import audit, decisions, iam, karpenter
from components.core import nodes
from components.core.stackfile import Stack
from components.deploy import synthesis as plan
from components.render import karpenter as karpenter_render
from tests.components.helpers import engine_deployments
from tests.components.test_aws import _key_arn, _taggable
from tests.stacks import load


@functools.cache
def _stack() -> Stack:
    """prod with Karpenter (a stack file in a temporary directory, read whole by ``load`` and then removed)."""
    document = yaml.safe_load(Path("stacks/Pulumi.prod.yaml").read_text())
    document["config"]["inferstack:platform"]["cluster"]["node_provisioner"] = "karpenter"
    with tempfile.TemporaryDirectory(prefix="inferstack-karpenter-") as directory:
        (Path(directory) / "Pulumi.prodk.yaml").write_text(yaml.safe_dump(document))
        return load("prodk", Path(directory))


@functools.cache
def _synth() -> plan.Synthesis:
    return plan.synthesize(_stack())


def _of(type_: str) -> list[plan.Resource]:
    return [r for r in _synth().resources if r.type == type_]


def _by_name(type_: str) -> dict[str, dict[str, Any]]:
    return {r.inputs["metadata"]["name"]: r.inputs for r in _of(type_)}


def test_gpu_pools_become_node_pools_and_only_the_system_group_is_managed() -> None:
    stack = _stack()
    groups = [r.inputs["nodeGroupName"] for r in _of("aws:eks/nodeGroup:NodeGroup")]
    assert groups == [decisions.node_group_name(stack.spec, decisions.SYSTEM_POOL)]
    pools = _by_name("kubernetes:karpenter.sh/v1:NodePool")
    classes = _by_name("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    assert set(pools) == set(classes) == set(stack.layout.pools)
    for name, plan_ in stack.layout.pools.items():
        template = pools[name]["spec"]["template"]
        requirements = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
        fallbacks = stack.spec.pool(name).fallback_instance_types
        assert requirements["node.kubernetes.io/instance-type"] == [plan_.instance.name, *fallbacks]
        assert requirements["karpenter.sh/capacity-type"] == [plan_.capacity_type.value]
        assert template["metadata"]["labels"][nodes.POOL_LABEL] == name
        assert template["spec"]["taints"] == [{"key": nodes.GPU_TAINT_KEY, "effect": nodes.GPU_TAINT_EFFECT}]
        assert template["spec"]["nodeClassRef"] == {
            "group": "karpenter.k8s.aws",
            "kind": "EC2NodeClass",
            "name": name,
        }
        assert pools[name]["spec"]["limits"] == {
            nodes.GPU_RESOURCE: str(plan_.max_nodes * plan_.instance.gpus)
        }
        node_class = classes[name]["spec"]
        assert node_class["role"] == decisions.node_role_name(stack.spec)
        # One AMI release, pinned by the spec (never @latest: drift would replace GPU nodes on every release).
        version = stack.spec.cluster.karpenter_ami_version
        assert node_class["amiSelectorTerms"] == [{"alias": f"al2023@{version}"}] and "latest" not in version
        assert node_class["metadataOptions"]["httpTokens"] == "required"
        assert node_class["metadataOptions"]["httpPutResponseHopLimit"] == 1
        assert node_class["blockDeviceMappings"][0]["ebs"]["volumeSize"] == f"{plan_.root_disk_gib}Gi"
        assert node_class["blockDeviceMappings"][0]["ebs"]["encrypted"] is True
        assert node_class["blockDeviceMappings"][0]["ebs"]["kmsKeyID"] == _key_arn(
            _synth(), stack.spec, "disks"
        )
        assert node_class["subnetSelectorTerms"] == [
            {"tags": {"karpenter.sh/discovery": stack.spec.cluster_name}}
        ]
        assert decisions.tags(stack.spec, stack.name).items() <= node_class["tags"].items()


def test_engine_pods_fit_only_their_pools_node_pool() -> None:
    stack = _stack()
    pools = _by_name("kubernetes:karpenter.sh/v1:NodePool")
    shapes = {
        name: (
            p["spec"]["template"]["metadata"]["labels"],
            [
                nodes.Taint(t["key"], t["effect"], t.get("value"))
                for t in p["spec"]["template"]["spec"]["taints"]
            ],
        )
        for name, p in pools.items()
    }
    engines = engine_deployments(_synth())
    assert len(engines) == len(stack.spec.models)
    for model, engine in engines.items():
        pod = engine["spec"]["template"]["spec"]
        fits = [n for n, (labels, taints) in shapes.items() if nodes.schedulable(pod, labels, taints)]
        assert fits == [stack.layout.placements[model].pool]


def test_controller_chart_queue_events_role_and_node_access() -> None:
    stack = _stack()
    name = stack.spec.cluster_name
    charts = [
        r.inputs
        for r in _of("kubernetes:helm.sh/v4:Chart")
        if r.inputs.get("chart") == karpenter_render.CHART
    ]
    assert len(charts) == 1
    chart = charts[0]
    assert chart["version"] == stack.spec.addons.versions.karpenter and chart["namespace"] == "kube-system"
    queue = _of("aws:sqs/queue:Queue")[0].inputs
    assert chart["values"]["settings"] == {"clusterName": name, "interruptionQueue": queue["name"]}
    assert queue["sqsManagedSseEnabled"] is True
    patterns = sorted(
        json.loads(r.inputs["eventPattern"])["detail-type"][0]
        for r in _of("aws:cloudwatch/eventRule:EventRule")
    )
    assert patterns == sorted(p["detail-type"][0] for p in karpenter.INTERRUPTION_EVENTS.values())
    assert len(_of("aws:cloudwatch/eventTarget:EventTarget")) == len(patterns)
    entries = [r.inputs for r in _of("aws:eks/accessEntry:AccessEntry")]
    assert [e["type"] for e in entries] == ["EC2_LINUX"]
    associations = {
        r.inputs["serviceAccount"]: r.inputs
        for r in _of("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }
    # The chart's service account is the one Pod Identity hands the controller's role to.
    namespace, account = karpenter_render.SERVICE_ACCOUNT
    assert chart["values"]["serviceAccount"]["name"] == account
    assert associations[account]["namespace"] == namespace == chart["namespace"]
    inline = {r.name: json.loads(r.inputs["policy"]) for r in _of("aws:iam/rolePolicy:RolePolicy")}
    controller = inline[f"{name}-karpenter-controller"]
    assert audit.audit(controller) == []
    # EC2 encrypts the volumes Karpenter launches with the disks key on its behalf: that key, through EC2 only.
    [kms] = [s for s in controller["Statement"] if any(a.startswith("kms:") for a in s["Action"])]
    assert kms["Resource"] == _key_arn(_synth(), _stack().spec, "disks")
    assert kms["Condition"] == {
        "StringEquals": {"kms:ViaService": iam.via_service("ec2", _stack().spec.cluster.region)}
    }
    assert audit.audit(json.loads(_of("aws:sqs/queuePolicy:QueuePolicy")[0].inputs["policy"])) == []
    # Everything it may delete or terminate must carry this cluster's ownership tag.
    for statement in controller["Statement"]:
        if any(a in ("ec2:TerminateInstances", "ec2:DeleteLaunchTemplate") for a in statement["Action"]):
            assert statement["Condition"]["StringEquals"] == {
                f"aws:ResourceTag/kubernetes.io/cluster/{name}": "owned"
            }


def test_karpenter_stack_tags_every_taggable_aws_resource() -> None:
    stack = _stack()
    expected = decisions.tags(stack.spec, stack.name)
    taggable = [r for r in _synth().resources if r.type.startswith("aws:") and _taggable(r.type)]
    missing = [
        f"{r.type} {r.name}" for r in taggable if not expected.items() <= (r.inputs.get("tags") or {}).items()
    ]
    assert missing == []


def test_every_kubernetes_object_of_karpenter_has_a_name() -> None:
    for type_ in ("kubernetes:karpenter.sh/v1:NodePool", "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"):
        assert all(r.inputs["metadata"]["name"] for r in _of(type_))
