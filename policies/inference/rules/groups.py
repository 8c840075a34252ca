"""Replicas that span nodes (LeaderWorkerSet groups): the group's GPUs are exactly its parallelism; in staging and
production its nodes talk over EFA inside one cluster placement group; never on spot unless the stack accepts it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from components.core import nodes
from policies.inference.rules.base import (
    Category,
    Config,
    Finding,
    Res,
    Rule,
    Setting,
    Severity,
    as_list,
    as_map,
    dig,
    number,
)
from policies.inference.rules.engines import Engine, NodePool, engines, gpu_pool_of, node_pools
from policies.inference.rules.fit import POOL_SETTING
from policies.inference.rules.k8s import GROUP_KIND, environment_of, stack_environment
from policies.inference.rules.reliability import ENVIRONMENTS_SCHEMA

EFA_RESOURCE = nodes.EFA_RESOURCE
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


def _groups(resources: Sequence[Res]) -> list[Engine]:
    return [e for e in engines(resources) if e.res.kind == GROUP_KIND]


def _size(engine: Engine) -> int:
    return int(number(dig(engine.res.props, "spec", "leaderWorkerTemplate", "size")) or 1)


def _group_gpus(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    for e in _groups(resources):
        size = _size(e)
        if size * e.gpus != e.args.gpus or e.args.nnodes != size:
            yield Finding(
                f"{e.res.display}: a group of {size} pods x {e.gpus} GPUs = {size * e.gpus} GPUs, started with "
                f"--nnodes {e.args.nnodes}, runs tensor x pipeline parallel {e.args.tp} x {e.args.pp} = "
                f"{e.args.gpus}; the group's GPUs must be exactly its parallelism and every node one pod of it: set "
                f"leaderWorkerTemplate.size and --nnodes to {max(1, e.args.gpus // max(e.gpus, 1))}",
                e.res.urn,
            )
    for e in engines(resources):
        if e.res.kind != GROUP_KIND and e.args.nnodes > 1:
            yield Finding(
                f"{e.res.display}: runs --nnodes {e.args.nnodes} in a {e.res.kind}, whose pods restart one by one; "
                "a multi-node engine belongs in a LeaderWorkerSet (its group restarts together)",
                e.res.urn,
            )


GROUP_GPUS = Rule(
    name="group-gpus-match-parallelism",
    category=Category.FIT,
    severity=Severity.HIGH,
    description="A multi-node engine is a LeaderWorkerSet whose size x GPUs per pod equals tensor x pipeline "
    "parallel size, and whose --nnodes equals its size.",
    remediation="Make tensor_parallel_size x pipeline_parallel_size whole nodes of the pool; inferstack renders "
    "the group's size and --nnodes from it.",
    stack_check=_group_gpus,
    settings=(POOL_SETTING,),
)


def launch_template(resources: Sequence[Res], pool: NodePool) -> Res | None:
    """A node group's launch template: the stack names both after the node group."""
    if pool.res is None:
        return None
    return next((r for r in resources if r.type == LAUNCH_TEMPLATE and r.name == pool.res.name), None)


def _links(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    stack_env = stack_environment(resources)
    pools = node_pools(resources, config)
    for e in _groups(resources):
        env = environment_of(e.res) or stack_env
        if env not in set(config["environments"]):
            continue
        pool = gpu_pool_of(e, pools)
        template = launch_template(resources, pool) if pool is not None else None
        missing = []
        interfaces = [as_map(i) for i in as_list(template.props.get("networkInterfaces"))] if template else []
        if not any(str(i.get("interfaceType")).startswith("efa") for i in interfaces):
            missing.append("EFA network interfaces on its nodes")
        if template is None or not dig(template.props, "placement", "groupName"):
            missing.append("a cluster placement group for its nodes")
        if not (e.container.request(EFA_RESOURCE) or e.container.limit(EFA_RESOURCE)):
            missing.append(f"{EFA_RESOURCE} requested by its pods")
        if missing:
            where = f"pool {pool.name} ({pool.instance_type})" if pool is not None else "its pool"
            yield Finding(
                f"{e.res.display}: a group spanning {_size(e)} nodes in {env} without {', '.join(missing)} "
                f"({where}); tensor and pipeline traffic then crosses the VPC over TCP. Use an instance type with "
                "EFA (p4d, p4de, p5, p5en, p6-b200, g6e.48xlarge, ...) and leave the pool's efa and "
                "placement_group on",
                e.res.urn,
            )


GROUP_LINKS = Rule(
    name="multi-node-needs-efa-and-placement-group",
    category=Category.PLACEMENT,
    severity=Severity.HIGH,
    description="In the listed environments (staging and prod by default), a LeaderWorkerSet engine's nodes have "
    "EFA interfaces and one cluster placement group, and its pods request the EFA devices.",
    remediation="Put the model on a pool of an EFA instance type with efa and placement_group on (the default "
    "for a pool whose model spans nodes).",
    stack_check=_links,
    settings=(
        POOL_SETTING,
        Setting("environments", ENVIRONMENTS_SCHEMA, ["staging", "prod"], "Environments that need EFA."),
    ),
)


def _spot(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    if config["allow_multi_node_spot"]:
        return
    pools = node_pools(resources, config)
    for e in _groups(resources):
        pool = gpu_pool_of(e, pools)
        if pool is not None and pool.capacity_type.upper() == "SPOT":
            yield Finding(
                f"{e.res.display}: a group of {_size(e)} nodes on spot pool {pool.name}; reclaiming any one node "
                "restarts the whole group (and spot capacity for several nodes at once is scarce). Use capacity_type "
                "on-demand, or set budget.allow_multi_node_spot: true if that is accepted",
                e.res.urn,
            )


GROUP_SPOT = Rule(
    name="no-multi-node-on-spot",
    category=Category.MONEY,
    severity=Severity.MEDIUM,
    description="A LeaderWorkerSet engine (a replica spanning nodes) runs on on-demand capacity unless the stack "
    "accepts spot for it.",
    remediation="Set capacity_type: on-demand for the pool, or budget.allow_multi_node_spot: true.",
    stack_check=_spot,
    settings=(
        POOL_SETTING,
        Setting(
            "allow_multi_node_spot",
            {"type": "boolean"},
            False,
            "Allow multi-node groups on spot (`inferstack plan` takes budget.allow_multi_node_spot).",
        ),
    ),
)

RULES = (GROUP_GPUS, GROUP_LINKS, GROUP_SPOT)
