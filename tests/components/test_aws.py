"""The AWS layer under Pulumi's mocks: what each committed stack creates on AWS, with which inputs."""

from __future__ import annotations

import functools
import importlib
import inspect
import ipaddress
import json
import math
from pathlib import Path
from typing import Any

import pytest

from components.base import catalog
from components.clouds import targets
from components.clouds.aws import addons, decisions, prices, registry
from components.clouds.aws.cloud import EKS
from components.core import cost, nodes, placement
from components.core.stackfile import STACKS_DIR, Stack, available_stacks
from components.core.weights import fetch
from components.deploy import synthesis as plan
from components.kubernetes import images
from components.spec import ApiAccess, PlatformSpec, Target
from tests.components.helpers import cluster, engine_workloads, minimal, pod_templates, write_stack
from tests.stacks import load, synthesized


@functools.cache
def _synth(name: str) -> plan.Synthesis:
    """One synthesis per committed stack (fresh mocks each; the result is plain data, shared read-only)."""
    return synthesized(name)


EKS_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target is Target.EKS]
KUBERNETES_STACKS = [s for s in available_stacks(STACKS_DIR) if load(s).spec.target is Target.KUBERNETES]
K8S_EFFECT = {v: k for k, v in decisions.EKS_TAINT_EFFECT.items()}


def _of(synthesis: plan.Synthesis, type_: str) -> list[plan.Resource]:
    return [r for r in synthesis.resources if r.type == type_]


def _one(synthesis: plan.Synthesis, type_: str) -> plan.Resource:
    found = _of(synthesis, type_)
    assert len(found) == 1, f"{type_}: {len(found)}"
    return found[0]


def _named(synthesis: plan.Synthesis, type_: str, name: str) -> plan.Resource:
    found = [r for r in _of(synthesis, type_) if r.name == name]
    assert len(found) == 1, f"{type_} {name}: {len(found)}"
    return found[0]


def _key_arn(synthesis: plan.Synthesis, spec: PlatformSpec, purpose: str) -> str:
    """The ARN of the stack's KMS key for ``purpose`` (``decisions.KMS_KEYS``): its alias names the key id."""
    alias = _named(synthesis, "aws:kms/alias:Alias", f"{spec.cluster_name}-{purpose}")
    return plan.mock_arn("aws:kms/key:Key", alias.inputs["targetKeyId"], spec.cluster.region)


def _node_groups(synthesis: plan.Synthesis) -> dict[str, dict[str, Any]]:
    return {r.inputs["nodeGroupName"]: r.inputs for r in _of(synthesis, "aws:eks/nodeGroup:NodeGroup")}


def _labels_and_taints(inputs: dict[str, Any]) -> tuple[dict[str, str], list[nodes.Taint]]:
    """A node group's node labels and taints as AWS would get them (from the captured inputs)."""
    taints = [
        nodes.Taint(t["key"], K8S_EFFECT[t["effect"]], t.get("value")) for t in inputs.get("taints", [])
    ]
    return inputs.get("labels", {}), taints


@pytest.mark.parametrize("name", EKS_STACKS)
def test_network_spans_the_zones_with_public_private_subnets_nat_and_discovery_tags(name: str) -> None:
    stack = load(name)
    spec = stack.spec
    synthesis = _synth(stack.name)
    net = decisions.network_plan(spec)
    vpc = _one(synthesis, "aws:ec2/vpc:Vpc").inputs
    assert vpc["cidrBlock"] == spec.cluster.vpc_cidr
    assert vpc["enableDnsHostnames"] is True
    subnets = [r.inputs for r in _of(synthesis, "aws:ec2/subnet:Subnet")]
    public = [s for s in subnets if "kubernetes.io/role/elb" in s["tags"]]
    private = [s for s in subnets if "kubernetes.io/role/internal-elb" in s["tags"]]
    assert len(public) == len(private) == len(net.zones) >= 2
    assert (
        {s["availabilityZone"] for s in private} == set(net.zones) == {s["availabilityZone"] for s in public}
    )
    blocks = [ipaddress.ip_network(s["cidrBlock"]) for s in subnets]
    assert all(b.subnet_of(ipaddress.ip_network(spec.cluster.vpc_cidr)) for b in blocks)  # type: ignore[arg-type]
    assert not any(a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])
    for s in private:
        assert s["tags"]["karpenter.sh/discovery"] == spec.cluster_name
        assert s["tags"][f"kubernetes.io/cluster/{spec.cluster_name}"] == "shared"
    assert all(s.get("mapPublicIpOnLaunch") is False for s in public)
    assert len(_of(synthesis, "aws:ec2/natGateway:NatGateway")) == net.nat_gateways == len(net.zones)
    # Every private route table sends the internet through a NAT gateway; the public one through the IGW.
    tables = [r.inputs for r in _of(synthesis, "aws:ec2/routeTable:RouteTable")]
    assert sum(1 for t in tables if t["routes"][0].get("natGatewayId")) == len(private)
    assert sum(1 for t in tables if t["routes"][0].get("gatewayId")) == 1
    endpoint = _one(synthesis, "aws:ec2/vpcEndpoint:VpcEndpoint").inputs
    assert endpoint["serviceName"] == f"com.amazonaws.{spec.cluster.region}.s3"
    assert endpoint["vpcEndpointType"] == "Gateway"
    assert len(endpoint["routeTableIds"]) == len(private)


@pytest.mark.parametrize("name", EKS_STACKS)
def test_cluster_has_version_kms_secrets_logs_endpoint_access_and_addons(name: str) -> None:
    stack = load(name)
    spec = stack.spec
    synthesis = _synth(stack.name)
    cluster = _one(synthesis, "aws:eks/cluster:Cluster").inputs
    key = _named(synthesis, "aws:kms/key:Key", f"{spec.cluster_name}-secrets")
    assert cluster["name"] == spec.cluster_name
    assert cluster["version"] == spec.cluster.kubernetes_version
    assert cluster["encryptionConfig"]["resources"] == ["secrets"]
    assert cluster["encryptionConfig"]["provider"]["keyArn"] == _key_arn(synthesis, spec, "secrets")
    assert key.inputs["enableKeyRotation"] is True
    assert set(cluster["enabledClusterLogTypes"]) == {
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    }
    endpoint = spec.cluster.api_endpoint
    assert endpoint is not None
    assert cluster["vpcConfig"]["endpointPrivateAccess"] is True
    assert cluster["vpcConfig"]["endpointPublicAccess"] is (endpoint.access is ApiAccess.PUBLIC)
    assert cluster["vpcConfig"].get("publicAccessCidrs") == (endpoint.public_cidrs or None)
    assert len(cluster["vpcConfig"]["subnetIds"]) == len(decisions.network_plan(spec).zones)
    assert cluster["accessConfig"]["authenticationMode"] == "API"
    assert cluster["upgradePolicy"]["supportType"] == "STANDARD"
    log_group = _named(synthesis, "aws:cloudwatch/logGroup:LogGroup", f"{spec.cluster_name}-control-plane")
    assert log_group.inputs["name"] == f"/aws/eks/{spec.cluster_name}/cluster"
    assert log_group.inputs["retentionInDays"] == spec.cluster.control_plane_log_retention_days
    assert log_group.inputs["kmsKeyId"] == _key_arn(synthesis, spec, "logs")
    addons = {r.inputs["addonName"]: r.inputs for r in _of(synthesis, "aws:eks/addon:Addon")}
    assert set(addons) == {"vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent", "aws-ebs-csi-driver"}
    assert (
        addons["aws-ebs-csi-driver"]["podIdentityAssociations"][0]["serviceAccount"]
        == "ebs-csi-controller-sa"
    )


def test_prod_api_endpoint_answers_only_its_deployers() -> None:
    vpc_config = _one(_synth("prod"), "aws:eks/cluster:Cluster").inputs["vpcConfig"]
    assert vpc_config["endpointPublicAccess"] is True
    assert vpc_config["publicAccessCidrs"] == load("prod").spec.cluster.api_endpoint.public_cidrs
    assert not [c for c in vpc_config["publicAccessCidrs"] if c.endswith("/0")]


def test_a_public_endpoint_is_limited_to_its_source_ranges(tmp_path: Path) -> None:
    cidrs = ["203.0.113.0/24", "198.51.100.7/32"]
    stack = _write(tmp_path, "pub", {"api_endpoint": {"access": "public", "public_cidrs": cidrs}})
    synthesis = plan.synthesize(stack)
    vpc_config = _one(synthesis, "aws:eks/cluster:Cluster").inputs["vpcConfig"]
    assert vpc_config["endpointPublicAccess"] is True
    assert vpc_config["publicAccessCidrs"] == cidrs
    assert "securityGroupIds" not in vpc_config
    assert _of(synthesis, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule") == []


def test_a_private_endpoint_admits_https_from_the_deployers_in_the_vpc_and_nothing_else(
    tmp_path: Path,
) -> None:
    vpc = "vpc-0123456789abcdef0"
    runner = "sg-0123456789abcdef0"
    stack = _write(
        tmp_path,
        "private",
        {
            "existing_vpc_id": vpc,
            "existing_private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
            "api_endpoint": {
                "access": "private",
                "deployer_cidrs": ["10.20.0.0/24"],
                "deployer_security_group_ids": [runner],
            },
        },
    )
    synthesis = plan.synthesize(stack)
    group = _one(synthesis, "aws:ec2/securityGroup:SecurityGroup")
    assert group.inputs["vpcId"] == vpc
    vpc_config = _one(synthesis, "aws:eks/cluster:Cluster").inputs["vpcConfig"]
    assert vpc_config["endpointPublicAccess"] is False and vpc_config["endpointPrivateAccess"] is True
    assert "publicAccessCidrs" not in vpc_config
    assert vpc_config["securityGroupIds"] == [f"{group.name}-id"]
    rules = [r.inputs for r in _of(synthesis, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")]
    assert {(r.get("cidrIpv4"), r.get("referencedSecurityGroupId")) for r in rules} == {
        ("10.20.0.0/24", None),
        (None, runner),
    }
    assert all(
        (r["ipProtocol"], r["fromPort"], r["toPort"], r["securityGroupId"])
        == ("tcp", 443, 443, f"{group.name}-id")
        for r in rules
    )


@pytest.mark.parametrize("name", EKS_STACKS)
def test_gpu_node_groups_follow_the_placement_of_models_and_their_weights(name: str) -> None:
    stack = load(name)
    spec, layout = stack.spec, stack.layout
    synthesis = _synth(stack.name)
    groups = _node_groups(synthesis)
    templates = {r.name: r.inputs for r in _of(synthesis, "aws:ec2/launchTemplate:LaunchTemplate")}
    assert len(groups) == len(layout.pools) + 1
    for pool in layout.pools.values():
        group = groups[decisions.node_group_name(spec, pool.name)]
        pool_spec = spec.pool(pool.name)
        assert pool_spec is not None
        members = [m for m in spec.models if layout.placements[m.name].pool == pool.name]
        gpus_max = sum(m.scaling.max_replicas * m.engine.gpus * m.serving_units for m in members)
        gpus_min = sum(m.scaling.min_replicas * m.engine.gpus * m.serving_units for m in members)
        if pool.packing is not None:  # a shared pool: nodes from its packing (test_gpu_sharing.py)
            gpus_max = pool.packing.nodes * pool.instance.gpus
            gpus_min = pool.min_nodes * pool.instance.gpus
        expected_max = pool_spec.max_nodes or max(math.ceil(gpus_max / pool.instance.gpus), 1)
        assert group["scalingConfig"]["maxSize"] == expected_max
        assert group["scalingConfig"]["minSize"] == max(
            pool_spec.min_nodes, math.ceil(gpus_min / pool.instance.gpus)
        )
        assert group["scalingConfig"]["desiredSize"] == group["scalingConfig"]["minSize"]
        assert group["instanceTypes"] == [pool.instance.name, *pool_spec.fallback_instance_types]
        assert group["amiType"] == "AL2023_x86_64_NVIDIA"
        assert group["capacityType"] == pool_spec.capacity_type.value.upper().replace("-", "_")
        assert group["labels"][nodes.POOL_LABEL] == pool.name
        products = {catalog.INSTANCE_TYPES[t].gpu_spec.product_label for t in group["instanceTypes"]}
        assert group["labels"].get(nodes.GPU_PRODUCT_LABEL) == (
            products.pop() if len(products) == 1 else None
        )
        assert group["labels"][decisions.AUTOSCALER_GPU_LABEL]  # the autoscaler waits for its GPUs
        assert group["taints"] == [{"key": "nvidia.com/gpu", "effect": "NO_SCHEDULE"}]
        template = templates[group["nodeGroupName"]]
        assert group["launchTemplate"]["id"] == f"{group['nodeGroupName']}-id"
        assert "diskSize" not in group  # the launch template owns the disk
        disk = template["blockDeviceMappings"][0]["ebs"]
        # Weights sit on the root disk only as a node cache without NVMe; streamed weights need none.
        on_root = pool.model_cache_gib if pool.cache_medium is fetch.CacheMedium.ROOT_DISK else 0
        assert disk["volumeSize"] == pool.root_disk_gib >= on_root + placement.IMAGE_DISK_GIB
        assert disk["volumeType"] == "gp3"
        assert disk["encrypted"] == "true"
        meta = template["metadataOptions"]
        assert meta["httpTokens"] == "required"
        assert meta["httpPutResponseHopLimit"] == 1


@pytest.mark.parametrize("name", EKS_STACKS)
def test_every_launch_template_enforces_imdsv2_and_tags_what_it_launches(name: str) -> None:
    stack = load(name)
    synthesis = _synth(stack.name)
    expected = decisions.tags(stack.spec, name)
    for template in _of(synthesis, "aws:ec2/launchTemplate:LaunchTemplate"):
        assert template.inputs["metadataOptions"]["httpTokens"] == "required"
        kinds = {t["resourceType"] for t in template.inputs["tagSpecifications"]}
        assert kinds == {"instance", "volume", "network-interface"}
        for spec_ in template.inputs["tagSpecifications"]:
            assert expected.items() <= spec_["tags"].items()


@pytest.mark.parametrize("name", EKS_STACKS)
def test_engine_pods_land_only_on_their_pool_and_nothing_else_lands_on_gpu_nodes(name: str) -> None:
    """The pairing: each engine's rendered nodeSelector and tolerations against the node groups' inputs."""
    stack = load(name)
    synthesis = _synth(stack.name)
    groups = {n: _labels_and_taints(i) for n, i in _node_groups(synthesis).items()}
    system = decisions.node_group_name(stack.spec, decisions.SYSTEM_POOL)
    workloads = engine_workloads(synthesis)
    served, layout = stack.served
    assert len(workloads) == len(served.models)
    for model, workload in workloads.items():
        for template in pod_templates(workload).values():
            pod = template["spec"]
            fits = sorted(
                n for n, (labels, taints) in groups.items() if nodes.schedulable(pod, labels, taints)
            )
            pool = layout.placements[model].pool
            if pool is None:
                assert system in fits
            else:
                assert fits == [decisions.node_group_name(stack.spec, pool)], model
    # A pod with no toleration (the gateway, monitoring) may use the system nodes and no GPU node.
    plain: dict[str, object] = {}
    assert [n for n, (labels, taints) in groups.items() if nodes.schedulable(plain, labels, taints)] == [
        system
    ]


def test_gpu_taint_reaches_eks_in_its_own_spelling() -> None:
    assert decisions.eks_taint(nodes.gpu_taint()) == {"key": nodes.GPU_TAINT_KEY, "effect": "NO_SCHEDULE"}
    assert decisions.eks_taint(nodes.Taint("k", "NoExecute", "v")) == {
        "key": "k",
        "effect": "NO_EXECUTE",
        "value": "v",
    }


def _taggable(type_: str) -> bool:
    """Whether the pulumi_aws resource class behind a type token takes ``tags``."""
    _, module, name = type_.split(":")
    cls = getattr(importlib.import_module(f"pulumi_aws.{module.split('/')[0]}"), name)
    return "tags" in inspect.signature(cls._internal_init).parameters


@pytest.mark.parametrize("name", EKS_STACKS)
def test_every_taggable_aws_resource_carries_stack_environment_and_cost_tags(name: str) -> None:
    stack = load(name)
    synthesis = _synth(stack.name)
    expected = {"inferstack:stack": name, "inferstack:environment": stack.spec.environment, **stack.spec.tags}
    aws_resources = [r for r in synthesis.resources if r.type.startswith("aws:")]
    taggable = [r for r in aws_resources if _taggable(r.type)]
    assert len(taggable) > 30
    missing = [
        f"{r.type} {r.name}" for r in taggable if not expected.items() <= (r.inputs.get("tags") or {}).items()
    ]
    assert missing == []


@pytest.mark.parametrize("name", KUBERNETES_STACKS)
def test_kubernetes_target_stacks_create_nothing_on_aws(name: str) -> None:
    synthesis = _synth(name)
    assert synthesis.resources
    cloud = [r.type for r in synthesis.resources if r.type.startswith(("aws:", "pulumi:providers:aws"))]
    assert cloud == []  # runtime images are built (docker-build) and pushed to gateway.image_registry
    assert not [r for r in synthesis.resources if r.type.startswith("inferstack:aws:")]
    stack = load(name)
    assert targets.fixed_costs(stack.spec, stack.layout) == ()


class _ProviderMonitor(plan.CapturingMonitor):
    """Also records which provider each custom resource was registered with."""

    providers: dict[str, str]

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802
        response = super().RegisterResource(request)
        type(self).providers[response.urn] = request.provider
        return response


@pytest.mark.parametrize("name", EKS_STACKS)
def test_every_kubernetes_resource_uses_the_provider_built_from_the_cluster(name: str, monkeypatch) -> None:
    _ProviderMonitor.providers = {}
    monkeypatch.setattr(plan, "CapturingMonitor", _ProviderMonitor)
    synthesis = plan.synthesize(load(name))
    provider = _one(synthesis, "pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == plan.REDACTED  # the kubeconfig is a secret
    k8s = [r for r in synthesis.resources if r.custom and r.type.startswith("kubernetes:")]
    assert len(k8s) >= 2 * len(load(name).spec.models)
    wrong = [r.name for r in k8s if not _ProviderMonitor.providers[r.urn].startswith(provider.urn + "::")]
    assert wrong == []


def test_kubeconfig_authenticates_with_aws_eks_get_token() -> None:
    from components.clouds.aws.cluster import kubeconfig

    config = kubeconfig("c1", "https://example.eks", "Q0E=", "eu-west-1")
    user = config["users"][0]["user"]["exec"]
    assert user["command"] == "aws"
    assert user["args"] == [
        "eks",
        "get-token",
        "--cluster-name",
        "c1",
        "--region",
        "eu-west-1",
        "--output",
        "json",
    ]
    assert config["clusters"][0]["cluster"] == {
        "server": "https://example.eks",
        "certificate-authority-data": "Q0E=",
    }


def test_subnet_plan_splits_the_vpc_into_private_quarters_and_small_public_blocks() -> None:
    spec = PlatformSpec.model_validate(
        {**minimal(), "cluster": cluster(vpc_cidr="10.8.0.0/16", region="eu-west-1")}
    )
    net = decisions.network_plan(spec)
    assert net.zones == ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
    assert [s.cidr for s in net.private] == ["10.8.0.0/18", "10.8.64.0/18", "10.8.128.0/18"]
    assert [s.cidr for s in net.public] == ["10.8.192.0/22", "10.8.196.0/22", "10.8.200.0/22"]
    assert net.nat_gateways == 3
    single = PlatformSpec.model_validate(
        {
            **minimal(),
            "cluster": cluster(single_nat_gateway=True, availability_zones=["us-east-1d", "us-east-1f"]),
        }
    )
    plan_ = decisions.network_plan(single)
    assert plan_.nat_gateways == 1 and plan_.zones == ["us-east-1d", "us-east-1f"]
    assert [plan_.nat_zone(i) for i in range(2)] == [0, 0]
    assert decisions.zones(
        PlatformSpec.model_validate({**minimal(), "cluster": cluster(region="ap-northeast-1")})
    ) == [
        "ap-northeast-1a",
        "ap-northeast-1c",
        "ap-northeast-1d",
    ]


def _write(tmp_path: Path, name: str, fields: dict[str, Any]) -> Stack:
    platform = {**minimal(), "environment": name, "cluster": cluster(**fields)}
    write_stack(tmp_path, name, platform)
    return load(name, tmp_path)


def test_existing_subnets_replace_the_vpc_and_admin_roles_get_access_entries(tmp_path: Path) -> None:
    private = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
    admin = "arn:aws:iam::123456789012:role/platform-admins"
    stack = _write(
        tmp_path,
        "byo",
        {
            "existing_private_subnet_ids": private,
            "existing_vpc_id": "vpc-0123456789abcdef0",
            "admin_role_arns": [admin],
        },
    )
    synthesis = plan.synthesize(stack)
    for type_ in (
        "aws:ec2/vpc:Vpc",
        "aws:ec2/flowLog:FlowLog",  # an existing VPC keeps the flow logs its owner set up
        "aws:ec2/subnet:Subnet",
        "aws:ec2/natGateway:NatGateway",
        "aws:ec2/eip:Eip",
    ):
        assert _of(synthesis, type_) == []
    assert _one(synthesis, "aws:eks/cluster:Cluster").inputs["vpcConfig"]["subnetIds"] == private
    assert all(g["subnetIds"] == private for g in _node_groups(synthesis).values())
    entry = _one(synthesis, "aws:eks/accessEntry:AccessEntry").inputs
    assert entry["principalArn"] == admin and entry["type"] == "STANDARD"
    association = _one(synthesis, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation").inputs
    assert association["policyArn"].endswith(":cluster-access-policy/AmazonEKSClusterAdminPolicy")
    assert association["accessScope"] == {"type": "cluster"}
    assert [i.kind for i in EKS.fixed_costs(stack.spec, stack.layout)].count("nat") == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"existing_private_subnet_ids": ["subnet-0123456789abcdef0"]}, "at least two zones"),
        (
            {"existing_private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]},
            "go together",
        ),
        (
            {"existing_vpc_id": "vpc-12", "existing_private_subnet_ids": ["subnet-0123456789abcdef0"] * 2},
            "not a VPC id",
        ),
        ({"name": "a-very-long-cluster-name-that-does-not-fit-in-iam"}, "at most 40"),
        ({"existing_private_subnet_ids": ["vpc-1", "subnet-0123456789abcdef0"]}, "not a subnet id"),
        ({"vpc_cidr": "10.0.0.0/24"}, "/16 to /20"),
        ({"vpc_cidr": "10.0.0.300/16"}, "not an IPv4 CIDR"),
        ({"availability_zones": ["eu-west-1a", "eu-west-1b"]}, "not zones of region us-east-1"),
        ({"availability_zones": ["us-east-1a"]}, "2 to 4 zones"),
        ({"admin_role_arns": ["arn:aws:iam::123:user/bob"]}, "not an IAM role ARN"),
        ({"control_plane_log_retention_days": 100}, "use e.g. 90"),
        ({"model_bucket": "Models_Bucket"}, "not an S3 bucket name"),
        (
            {"endpoint_public_access": True, "api_public_cidrs": ["203.0.113.0/24"]},
            "replaced by api_endpoint; write `api_endpoint: {access: public, public_cidrs: [203.0.113.0/24]}`",
        ),
        ({"endpoint_public_access": False}, "access: private, deployer_cidrs"),
        ({"api_endpoint": None}, "say how `pulumi up` reaches the EKS API"),
        ({"api_endpoint": {"access": "public"}}, "access public needs public_cidrs"),
        ({"api_endpoint": {"access": "public", "public_cidrs": ["203.0.113/24"]}}, "not an IPv4 CIDR"),
        ({"api_endpoint": {"access": "public", "public_cidrs": ["2001:db8::/32"]}}, "not an IPv4 CIDR"),
        ({"api_endpoint": {"access": "private"}}, "needs a stated way in"),
        (
            {"api_endpoint": {"access": "private", "deployer_cidrs": ["10.0.0.0/24"]}},
            "this stack creates that VPC",
        ),
        (
            {"api_endpoint": {"access": "private", "deployer_security_group_ids": ["sg-12"]}},
            "not a security group id",
        ),
        ({"existing_public_subnet_ids": ["subnet-0123456789abcdef0"]}, "needs existing_private_subnet_ids"),
    ],
)
def test_aws_spec_mistakes_are_reported_with_the_field(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    from components.base.problems import SpecError

    write_stack(tmp_path, "bad", {**minimal(), "cluster": cluster(**fields)})
    with pytest.raises(SpecError) as err:
        load("bad", tmp_path)
    text = err.value.render()
    assert message in text and "cluster" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("name", EKS_STACKS)
def test_plan_bills_the_aws_items_from_the_resources_it_creates(name: str, tmp_path: Path) -> None:
    stack = load(name)
    synthesis = _synth(stack.name)
    fixed = EKS.fixed_costs(stack.spec, stack.layout)
    items = {i.kind: i for i in fixed}
    month = catalog.HOURS_PER_MONTH
    nats = len(_of(synthesis, "aws:ec2/natGateway:NatGateway"))
    assert items["nat"].max_usd_month == pytest.approx(nats * prices.NAT_GATEWAY_USD_PER_HOUR * month)
    system = _node_groups(synthesis)[decisions.node_group_name(stack.spec, decisions.SYSTEM_POOL)]
    per_node = prices.SYSTEM_INSTANCE_USD_PER_HOUR * month
    assert items["system-nodes"].min_usd_month == pytest.approx(system["scalingConfig"]["minSize"] * per_node)
    assert items["system-nodes"].max_usd_month == pytest.approx(system["scalingConfig"]["maxSize"] * per_node)
    assert items["eks"].min_usd_month == pytest.approx(prices.EKS_CONTROL_PLANE_USD_PER_HOUR * month)
    templates = {r.name: r.inputs for r in _of(synthesis, "aws:ec2/launchTemplate:LaunchTemplate")}
    disk_gib_max = sum(
        templates[n]["blockDeviceMappings"][0]["ebs"]["volumeSize"] * g["scalingConfig"]["maxSize"]
        for n, g in _node_groups(synthesis).items()
    )
    assert items["ebs"].max_usd_month >= disk_gib_max * prices.EBS_GP3_USD_PER_GIB_MONTH
    bill = cost.stack_cost(stack.spec, stack.layout, fixed, catalog.EC2_PRICES, catalog.INSTANCE_TYPES)
    assert {"gpu-pool", "eks", "system-nodes", "nat", "ebs", "kms"} <= {i.kind for i in bill.items}
    keys = len(_of(synthesis, "aws:kms/key:Key"))
    assert keys == len(decisions.kms_keys(stack.spec))
    assert items["kms"].max_usd_month == pytest.approx(keys * prices.KMS_KEY_USD_PER_MONTH)
    # resources.json lists the AWS resources the summary prices.
    plan.write(synthesis, tmp_path, "summary\n")
    written = json.loads((tmp_path / "resources.json").read_text())
    assert (
        sum(1 for r in written if r["type"] == "aws:eks/nodeGroup:NodeGroup") == len(stack.layout.pools) + 1
    )


@pytest.mark.parametrize("name", EKS_STACKS)
def test_buckets_are_versioned_sse_kms_with_their_own_keys_private_and_tls_only(name: str) -> None:
    """The model bucket with the models key; with batch.enabled the batch files' bucket with the batches key."""
    synthesis = _synth(name)
    spec = load(name).spec
    buckets = {f"{spec.cluster_name}-models": "models"}
    if spec.batch.enabled:
        buckets[f"{spec.cluster_name}-batches"] = "batches"
    assert {r.name for r in _of(synthesis, "aws:s3/bucket:Bucket")} == set(buckets)

    def of(type_: str, bucket: str) -> dict[str, Any]:
        [found] = [r for r in _of(synthesis, type_) if r.name == bucket]
        return found.inputs

    for bucket, purpose in buckets.items():
        versioning = of("aws:s3/bucketVersioning:BucketVersioning", bucket)
        assert versioning["versioningConfiguration"] == {"status": "Enabled"}
        sse = of(
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", bucket
        )
        rule = sse["rules"][0]
        assert rule["applyServerSideEncryptionByDefault"] == {
            "sseAlgorithm": "aws:kms",
            "kmsMasterKeyId": _key_arn(synthesis, spec, purpose),
        }
        assert rule["bucketKeyEnabled"] is True
        block = of("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", bucket)
        assert all(
            block[k] is True
            for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        )
        policy = json.loads(of("aws:s3/bucketPolicy:BucketPolicy", bucket)["policy"])
        assert policy["Statement"][0]["Effect"] == "Deny"
        assert policy["Statement"][0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


@pytest.mark.parametrize("name", EKS_STACKS)
def test_runtime_images_get_immutable_scanned_ecr_repositories(name: str) -> None:
    synthesis = _synth(name)
    repos = {
        r.inputs["name"].rsplit("/", 1)[-1]: r.inputs for r in _of(synthesis, "aws:ecr/repository:Repository")
    }
    spec = load(name).spec
    assert set(repos) == set(images.runtime_images(spec))
    assert ("batches" in repos) == spec.batch.enabled  # the batch service's image only where it runs
    for repo in repos.values():
        assert repo["imageTagMutability"] == "IMMUTABLE"
        assert repo["imageScanningConfiguration"] == {"scanOnPush": True}
    assert len(_of(synthesis, "aws:ecr/lifecyclePolicy:LifecyclePolicy")) == len(repos)


def test_images_are_built_from_runtime_images_with_content_tags_and_pushed(
    tmp_path: Path, monkeypatch
) -> None:
    """docker-build is opaque without its plugin: assert what it is asked to build and push."""
    root = tmp_path / "repo"
    (root / "runtime" / "images").mkdir(parents=True)
    (root / "runtime" / "images" / "router.Dockerfile").write_text("FROM python:3.11-slim\n")
    (root / "runtime" / "app.py").write_text("print('hi')\n")
    (root / "pyproject.toml").write_text("[project]\nname='x'\n")
    stack = load("prod")

    def program(_decided: object) -> None:
        key = "arn:aws:kms:us-east-1:123456789012:key/images"
        registry.Registry(stack.spec, decisions.tags(stack.spec, "prod"), root, key)

    monkeypatch.setattr(plan, "_run_program", program)
    synthesis = plan.synthesize(stack)
    image = _one(synthesis, "docker-build:index:Image").inputs
    tag = images.context_tag(root, "router")
    assert image["push"] is True
    assert image["platforms"] == ["linux/amd64"]
    assert image["dockerfile"]["location"] == str(root / "runtime/images/router.Dockerfile")
    assert image["context"]["location"] == str(root)
    assert image["tags"][0].endswith(f":{tag}")
    # The tag follows the sources: same sources, same tag; a changed file, a new tag.
    assert images.context_tag(root, "router") == tag
    (root / "runtime" / "app.py").write_text("print('changed')\n")
    assert images.context_tag(root, "router") != tag


@pytest.mark.parametrize("name", EKS_STACKS)
def test_load_balancer_controller_gets_the_vpc_and_runs_as_the_pod_identity_account(name: str) -> None:
    synthesis = _synth(name)
    vpc = _one(synthesis, "aws:ec2/vpc:Vpc")
    charts = [
        r.inputs
        for r in _of(synthesis, "kubernetes:helm.sh/v4:Chart")
        if r.inputs.get("chart") == "aws-load-balancer-controller"
    ]
    if name == "prod":
        assert charts
    namespace, account = addons.LB_CONTROLLER_SERVICE_ACCOUNT
    association = next(
        r.inputs
        for r in _of(synthesis, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if r.inputs["serviceAccount"] == account
    )
    assert association["namespace"] == namespace
    for chart in charts:
        assert chart["values"]["vpcId"] == f"{vpc.name}-id"  # the mocks' id of the VPC the layer created
        assert chart["values"]["serviceAccount"]["name"] == account
        assert chart["namespace"] == namespace


def test_inferstack_plan_shows_the_aws_footprint_with_cost_for_prod_and_none_for_kind(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from components.cli.main import app

    runner = CliRunner()
    prod, kind = tmp_path / "prod", tmp_path / "kind"
    assert runner.invoke(app, ["plan", "-s", "prod", "--out", str(prod)]).exit_code == 0
    assert runner.invoke(app, ["plan", "-s", "kind", "--out", str(kind)]).exit_code == 0
    summary = (prod / "summary.md").read_text()
    for line in ("EKS control plane", "system nodes", "NAT gateways", "node root disks", "pool h100"):
        assert line in summary
    assert "`aws:eks/cluster:Cluster` | 1" in summary
    types = {r["type"] for r in json.loads((prod / "resources.json").read_text())}
    assert {"aws:eks/cluster:Cluster", "aws:eks/nodeGroup:NodeGroup", "aws:s3/bucket:Bucket"} <= types
    kind_summary = (kind / "summary.md").read_text()
    assert "EKS control plane" not in kind_summary and "aws:" not in kind_summary
    assert not [r for r in json.loads((kind / "resources.json").read_text()) if r["type"].startswith("aws:")]


def test_prod_exports_cluster_kubeconfig_bucket_vpc_images_and_node_groups(monkeypatch) -> None:
    import pulumi

    exported: dict[str, Any] = {}
    monkeypatch.setattr(pulumi, "export", exported.__setitem__)
    stack = load("prod")
    plan.synthesize(stack)
    assert {"cluster_name", "kubeconfig", "model_bucket", "node_groups", "images", "vpc_id"} <= set(exported)
    assert set(exported["node_groups"]) == {
        g.node_group_name for g in decisions.node_groups(stack.spec, stack.layout)
    }
    # The kubeconfig is the provider's, which the plan redacts as a secret (see the provider test).
    assert exported["kubeconfig"] is not None


@pytest.mark.parametrize("name", EKS_STACKS)
def test_the_cluster_autoscaler_gets_an_identity_that_may_scale_only_this_clusters_groups(name: str) -> None:
    stack = load(name)
    synthesis = _synth(name)
    namespace, account = addons.CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
    association = next(
        r.inputs
        for r in _of(synthesis, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if r.inputs["serviceAccount"] == account
    )
    assert association["namespace"] == namespace
    inline = {r.name: json.loads(r.inputs["policy"]) for r in _of(synthesis, "aws:iam/rolePolicy:RolePolicy")}
    statements = inline[f"{stack.spec.cluster_name}-autoscaler-scale"]["Statement"]
    scale = next(s for s in statements if "autoscaling:SetDesiredCapacity" in s["Action"])
    owner = f"aws:ResourceTag/k8s.io/cluster-autoscaler/{stack.spec.cluster_name}"
    assert scale["Condition"] == {"StringEquals": {owner: "owned"}}
    # The chart values the add-ons install it with: this cluster, its Kubernetes minor, that account.
    values = addons.cluster_autoscaler(stack.spec).values
    assert values["autoDiscovery"] == {"clusterName": stack.spec.cluster_name}
    assert values["image"]["tag"] == f"v{stack.spec.cluster.kubernetes_version}.0"
    assert values["rbac"]["serviceAccount"]["name"] == account
