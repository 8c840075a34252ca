"""Money: the stack's projected monthly bill at max scale stays within budget; no spot in production
unless allowed.

The bill is read from the resources themselves (node groups at maxSize with their instance and capacity
types, root disks from launch templates, control planes, NAT gateways, KMS keys) priced with the same
price lists and formulas as `inferstack plan` (EC2's GPU prices, ``catalog.EC2_PRICES``, and AWS's for the rest,
``components.clouds.aws.prices``), so the plan's figure and the policy agree. The rule reads AWS resource types:
it prices AWS, and the AWS price list is the one pure module of the cloud code it may import (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from components.base import catalog
from components.clouds.aws import prices
from components.core import cost
from components.core.nodes import POOL_LABEL
from components.spec import CapacityType
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
    of_kind,
    of_type,
)
from policies.inference.rules.engines import is_karpenter_pool, node_pools
from policies.inference.rules.k8s import environment_of, memory_gib, stack_environment
from policies.inference.rules.reliability import ENVIRONMENTS_SCHEMA

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
MONTH = catalog.HOURS_PER_MONTH


@dataclass(frozen=True)
class Line:
    what: str
    usd_month: float
    urn: str | None = None


def _disk_usd(template: Res | None) -> float:
    if template is None:
        return 0.0
    total = 0.0
    mappings = template.props.get("blockDeviceMappings") or dig(template.props, "spec", "blockDeviceMappings")
    for mapping in as_list(mappings):
        ebs = as_map(as_map(mapping).get("ebs"))
        size = number(ebs.get("volumeSize")) or memory_gib(ebs.get("volumeSize")) or 0.0
        iops = number(ebs.get("iops")) or prices.EBS_GP3_BASELINE_IOPS
        throughput = number(ebs.get("throughput")) or prices.EBS_GP3_BASELINE_THROUGHPUT_MIBPS
        total += prices.gp3_disk_usd_month(size, iops, throughput)
    return total


def bill(resources: Sequence[Res]) -> tuple[list[Line], list[str]]:
    """Monthly cost at max scale, one line per billable resource, and what could not be priced."""
    lines: list[Line] = []
    unpriced: list[str] = []
    templates = of_type(resources, LAUNCH_TEMPLATE)
    # The node groups of one GPU pool (its reservation's, its own) share the pool's nodes: the costliest counts.
    gpu_pools: dict[str, Line] = {}
    for pool in node_pools(resources):
        if pool.res is None:
            continue
        nodes = pool.max_size or 0
        capacity = CapacityType.SPOT if pool.capacity_type.upper() == "SPOT" else CapacityType.ON_DEMAND
        # A node group that falls back to other instance types may run the dearest of them.
        known = [
            catalog.INSTANCE_TYPES[t]
            for t in as_list(pool.res.props.get("instanceTypes"))
            if t in catalog.INSTANCE_TYPES
        ] or ([pool.instance] if pool.instance is not None else [])
        if known:
            hourly = max(catalog.EC2_PRICES.hourly(i, capacity) for i in known)
        elif pool.instance_type == prices.SYSTEM_INSTANCE_TYPE:
            hourly = prices.SYSTEM_INSTANCE_USD_PER_HOUR
        else:
            unpriced.append(f"node group {pool.res.name} ({pool.instance_type})")
            continue
        if is_karpenter_pool(pool.res):
            ref = dig(pool.res.props, "spec", "template", "spec", "nodeClassRef", "name")
            template = next((c for c in of_kind(resources, "EC2NodeClass") if c.k8s_name == ref), None)
            what = f"Karpenter NodePool {pool.res.k8s_name}"
        else:
            ref = dig(pool.res.props, "launchTemplate", "id")
            template = next(
                (t for t in templates if ref in (f"{t.name}-id", t.name) or t.name == pool.res.name), None
            )
            what = f"node group {pool.res.name}"
        per_node = hourly * MONTH + _disk_usd(template)
        line = Line(
            f"{what}: {nodes} x {pool.instance_type} {capacity.value}", per_node * nodes, pool.res.urn
        )
        gpu_pool = pool.labels.get(POOL_LABEL)
        if gpu_pool is None:
            lines.append(line)
        elif gpu_pool not in gpu_pools or line.usd_month > gpu_pools[gpu_pool].usd_month:
            gpu_pools[gpu_pool] = line
    lines += gpu_pools.values()
    for r in of_type(resources, "aws:eks/cluster:Cluster"):
        lines.append(
            Line(f"EKS control plane {r.name}", prices.EKS_CONTROL_PLANE_USD_PER_HOUR * MONTH, r.urn)
        )
    nats = of_type(resources, "aws:ec2/natGateway:NatGateway")
    if nats:
        lines.append(
            Line(f"{len(nats)} NAT gateways (hourly)", len(nats) * prices.NAT_GATEWAY_USD_PER_HOUR * MONTH)
        )
    keys = of_type(resources, "aws:kms/key:Key")
    if keys:
        lines.append(Line(f"KMS keys ({len(keys)})", len(keys) * prices.KMS_KEY_USD_PER_MONTH))
    return lines, unpriced


def _budget(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    budget = number(config.get("monthly_budget_usd"))
    if budget is None:
        return
    lines, unpriced = bill(resources)
    total = sum(line.usd_month for line in lines)
    if total <= budget:
        return
    top = sorted(lines, key=lambda line: -line.usd_month)[: int(config["top_contributors"])]
    listing = "\n".join(f"  {cost.monthly(line.usd_month):>10}  {line.what}" for line in top)
    also = f"\n  (not priced: {', '.join(unpriced)})" if unpriced else ""
    yield Finding(
        f"projected monthly cost at max replicas is {cost.monthly(total)}, over the budget of "
        f"{cost.monthly(budget)} by {cost.monthly(total - budget)}; lower max_replicas or max_nodes of the "
        f"largest pools, use cheaper instance types or quantized models, or raise budget.monthly_usd_cap. "
        f"Top contributors:\n{listing}{also}",
        top[0].urn if top else None,
    )


BUDGET = Rule(
    name="monthly-cost-within-budget",
    category=Category.MONEY,
    severity=Severity.HIGH,
    description="Projected monthly cost with every node group at maxSize (GPU and system nodes, root disks, "
    "EKS, NAT, KMS; catalog prices) is at most monthly_budget_usd.",
    remediation="Lower max_replicas / max_nodes, pick cheaper instances or quantized models, or raise the budget.",
    stack_check=_budget,
    settings=(
        Setting(
            "monthly_budget_usd",
            {"type": ["number", "null"], "exclusiveMinimum": 0},
            None,
            "The environment's monthly budget in USD (None: no cap). `inferstack plan` takes budget.monthly_usd_cap.",
        ),
        Setting("top_contributors", {"type": "integer", "minimum": 1}, 5, "Bill lines shown in the message."),
    ),
)


def _spot(resources: Sequence[Res], config: Config) -> Iterator[Finding]:
    stack_env = stack_environment(resources)
    for pool in node_pools(resources):
        if pool.res is None or pool.capacity_type.upper() != "SPOT":
            continue
        env = environment_of(pool.res) or stack_env
        if env in set(config["environments"]) and not config["allow_spot"]:
            what = "Karpenter NodePool" if is_karpenter_pool(pool.res) else "node group"
            yield Finding(
                f"{what} {pool.res.k8s_name if pool.res.kind else pool.res.name}: spot capacity in {env}; AWS may "
                "reclaim every node with two minutes' notice. Use capacity_type: on-demand, or set "
                "budget.allow_spot_in_prod: true (policy config allow_spot) if interruptions are acceptable",
                pool.res.urn,
            )


SPOT = Rule(
    name="no-spot-in-prod",
    category=Category.MONEY,
    severity=Severity.MEDIUM,
    description="GPU node groups and Karpenter NodePools in the listed environments (prod by default) use on-demand capacity unless spot is "
    "explicitly allowed.",
    remediation="Set capacity_type: on-demand for the pool, or allow spot in the policy config.",
    stack_check=_spot,
    settings=(
        Setting("allow_spot", {"type": "boolean"}, False, "Allow spot capacity in the listed environments."),
        Setting("environments", ENVIRONMENTS_SCHEMA, ["prod"], "Environments where spot needs allow_spot."),
    ),
)

RULES = (BUDGET, SPOT)
