"""What `inferstack plan` and `inferstack size` show: rows and Markdown built from pure data.

Every figure of a model (placement, weights fetch path and cold starts, startup budget, rollout, idle state, cost) is
read from the stack's decisions (``Stack.decisions``, ``components.core.decisions``), made once per plan: the report
asks no decision module again, so it shows what the program deploys.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field

import yaml

from components.base import catalog, packing
from components.cli.output import markdown_table
from components.core import capacity, cost, endpoint, lifecycle, startup
from components.core.decisions import Decisions
from components.core.placement import Layout, Placement, PoolPlan
from components.core.stackfile import Stack
from components.core.startup import minutes
from components.core.weights import store
from components.deploy.synthesis import Resource, Synthesis
from components.kubernetes import images
from components.render import addons, api_keys, inference_extension, ingress, mig, scaling, tracing
from components.spec import ModelSpec, PlatformSpec

PLAN_COLUMNS = (
    "model",
    "engine",
    "instance",
    "TP x PP",
    "replicas",
    "GPUs (max)",
    "KV headroom",
    "$/month min",
    "$/month max",
    "$/M tokens (est.)",
)


WEIGHTS_COLUMNS = (
    "model",
    "store",
    "fetch",
    "weights/replica",
    "cold start (fetch + load)",
    "hub download",
    "node cache miss",
    "node cache hit",
    "streamer",
)


def _seconds(value: float) -> str:
    """Whole seconds, rounded up, as the startup budget counts them."""
    return f"{math.ceil(value):,} s"


def weights_rows(decided: Decisions) -> list[tuple[str, ...]]:
    """Per model: where its weights are in the store, how the engine gets them, and the cold start of each path
    (the chosen one is the startup budget's weights term: ``components.core.startup.weights_fetch``)."""
    rows = []
    for model in decided.spec.models:
        d = decided.models[model.name]
        way = d.fetch
        where = way.path.value + (f" ({way.medium.value})" if way.medium else "")
        rows.append(
            (
                model.name,
                f"`{store.location(decided.spec, model)}`",
                where,
                f"{d.weights_gib:.1f} GiB",
                f"**{d.weights_phase.seconds:,} s**",  # the startup budget's weights term
                *(_seconds(p.total_s) for p in d.cold_starts),
            )
        )
    return rows


DEPLOY_COLUMNS = (
    "model",
    "node",
    "image",
    "weights (fetch + load)",
    "engine start",
    "estimate",
    "startup budget",
    "rollout",
    "pulumi up waits (create / update)",
)


def deploy_rows(decided: Decisions) -> list[tuple[str, ...]]:
    """Per model: the cold start's phases, the budget, how it rolls, and how long `pulumi up` waits for it."""
    rows: list[tuple[str, ...]] = []
    for model in decided.spec.models:
        r = decided.models[model.name].rollout
        rows.append(
            (
                model.name,
                *(f"{p.seconds:,} s" for p in r.startup.phases),
                f"{r.startup.estimate_s:,} s",
                minutes(r.startup.budget_s) + (" (set)" if r.startup.set_in_spec else ""),
                f"surge {r.max_surge}, unavailable {r.max_unavailable}",
                f"{minutes(r.startup.budget_s)} / {minutes(r.update_timeout_s)}",
            )
        )
    return rows


@dataclass(frozen=True)
class PlanReport:
    rows: list[tuple[str, ...]]
    bill: cost.StackCost
    notes: list[str]
    deploy: list[tuple[str, ...]]
    deploy_notes: list[str]
    warnings: list[str]
    sharing: list[str]
    idle: list[tuple[str, ...]]
    versions: list[str] = field(default_factory=list)
    """Versions, canary steps, rollback rules and preparation Jobs (``components.core.lifecycle``)."""
    weights: list[tuple[str, ...]] = field(default_factory=list)

    def markdown(self, stack: Stack, synthesis: Synthesis) -> str:
        lines = [
            f"# inferstack plan: {stack.name}",
            "",
            f"Stack file `{stack.source}`, target `{stack.spec.target.value}`, "
            f"environment `{stack.spec.environment}`, namespace `{stack.spec.cluster.namespace}`.",
            "",
            "## Models",
            "",
            *markdown_table(PLAN_COLUMNS, self.rows),
            "",
            "## Model weights",
            "",
            "Prepared once into the model store by a Job per model; engines never download from the hub. "
            "Cold start is the seconds from a replica's start to its weights in the engine, on a fresh node "
            "(fetch + load; image pull and engine warm-up not included), from the catalog's bandwidth figures "
            f"(read {catalog.BANDWIDTH_READ_ON}); the chosen path's is the weights term of the First deploy "
            "startup budget.",
            "",
            *markdown_table(WEIGHTS_COLUMNS, self.weights, right_aligned_from=3),
            "",
            "## Cost per model (monthly)",
            "",
            "| model | capacity | per replica | at min replicas | at max replicas | max, on-demand | max, spot | "
            "tokens/s per replica (est.) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *(
                f"| {c.model} | {c.capacity.value} | {cost.monthly(c.usd_per_replica_month)} | "
                f"{cost.monthly(c.min_usd_month)} | {cost.monthly(c.max_usd_month)} | "
                f"{cost.monthly(c.on_demand_max_usd_month)} | {cost.monthly(c.spot_max_usd_month)} | "
                f"{f'{c.tokens_per_second_per_replica:,.0f}' if c.tokens_per_second_per_replica else '-'} |"
                for c in self.bill.models
            ),
            "",
            *self.sharing,
            "## Idle states",
            "",
            "What each model's replicas do when nobody asks, and what the next request waits for (estimates: "
            "components/core/startup.py).",
            "",
            *markdown_table(IDLE_COLUMNS, self.idle),
            "",
            "## Monthly cost of the stack",
            "",
            "| item | min | max |",
            "|---|---:|---:|",
            *(
                f"| {i.name} | {cost.monthly(i.min_usd_month)} | {cost.monthly(i.max_usd_month)} |"
                for i in self.bill.items
            ),
            f"| **total** | **{cost.monthly(self.bill.min_usd_month)}** | **{cost.monthly(self.bill.max_usd_month)}** |",
            "",
            f"Prices: {self.bill.prices.source}, read {self.bill.prices.read_on}. Spot uses an average discount per family.",
            f"$/M tokens is an estimate ({cost.THROUGHPUT_ASSUMPTION}).",
            "",
            "## Resources",
            "",
            "| type | count |",
            "|---|---:|",
            *(f"| `{t}` | {n} |" for t, n in sorted(Counter(r.type for r in synthesis.resources).items())),
            "",
            "## Decisions",
            "",
            *(f"- {note}" for note in self.notes),
            "",
            *(
                ["## Versions and rollouts", "", *(f"- {line}" for line in self.versions), ""]
                if self.versions
                else []
            ),
            *(self._first_deploy(synthesis) if not stack.spec.cluster.on_this_machine else []),
            *(["## Warnings", "", *(f"- {w}" for w in self.warnings), ""] if self.warnings else []),
        ]
        return "\n".join(lines)

    def _first_deploy(self, synthesis: Synthesis) -> list[str]:
        """How long a cold replica takes and `pulumi up` waits (nothing to deploy on target local)."""
        return [
            "## First deploy",
            "",
            "What `pulumi up` waits for, in order: read from the dependencies the program gives each resource (a "
            "step starts once the steps before it that it depends on are done; the items of one step run side by "
            "side), with the waits it sets (`pulumi up` fails past them; without one, the provider's default).",
            "",
            *(f"{i}. {step}" for i, step in enumerate(wait_steps(synthesis), 1)),
            "",
            "A cold replica's start (seconds; estimates from the catalog, components/core/startup.py; the weights are "
            "the Model weights table's cold start by the chosen path) and how long `pulumi up` waits for each "
            "engine Deployment, after the model's preparation Job.",
            "",
            *markdown_table(DEPLOY_COLUMNS, self.deploy),
            "",
            *(f"- {note}" for note in self.deploy_notes),
            *(f"- reads (must exist): `{r.type}` {r.inputs.get('id')}" for r in synthesis.reads),
            "",
        ]


_WAITED: dict[str, str] = {
    "aws:eks/cluster:Cluster": "EKS cluster",
    "aws:eks/addon:Addon": "EKS add-ons",
    "aws:eks/nodeGroup:NodeGroup": "node groups",
    "aws:elasticache/replicationGroup:ReplicationGroup": "ElastiCache",
    "docker-build:index:Image": "images built and pushed",
    "kubernetes:helm.sh/v4:Chart": "charts",
    "kubernetes:batch/v1:Job": "model store Jobs (to completion)",
    "kubernetes:apps/v1:Deployment": "Deployments (ready)",
    "kubernetes:apps/v1:StatefulSet": "StatefulSets (ready)",
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet": "LeaderWorkerSets",
}
"""The resources `pulumi up` spends its time waiting for, by type, and how a step names them."""
_CHART = "kubernetes:helm.sh/v4:Chart"


def _waited(resource: Resource) -> bool:
    """A chart is a component (its objects are waited for one by one inside it); the rest are resources."""
    return resource.type in _WAITED and (resource.custom or resource.type == _CHART)


def _wait_label(resource: Resource) -> str:
    inputs = resource.inputs
    name = str(
        inputs.get("metadata", {}).get("name")
        or inputs.get("addonName")
        or inputs.get("nodeGroupName")
        or inputs.get("chart")
        or resource.name
    )
    if resource.timeouts and "create" in resource.timeouts:
        return f"{name} (up to {minutes(int(resource.timeouts['create'].removesuffix('s')))})"
    return name


def wait_steps(synthesis: Synthesis) -> list[str]:
    """The resources `pulumi up` waits for (``_WAITED``), in the order their dependencies impose: each is one step
    after the deepest waited-for resource it depends on (directly, through resources nobody waits for, or through
    a component it or an ancestor depends on), and a step lists its resources by kind."""
    by_urn = {r.urn: r for r in synthesis.resources}
    children: dict[str, list[str]] = {}
    for r in synthesis.resources:
        if r.parent:
            children.setdefault(r.parent, []).append(r.urn)

    def expanded(urns: set[str]) -> set[str]:
        out: set[str] = set()
        todo = list(urns)
        while todo:
            urn = todo.pop()
            if urn in out:
                continue
            out.add(urn)
            if urn in by_urn and not by_urn[urn].custom:  # a component: its resources are waited for
                todo += children.get(urn, [])
        return out

    memo: dict[str, int] = {}

    def depth(urn: str) -> int:
        """Steps up to and including ``urn`` (0: nothing waited for on the way)."""
        if urn in memo:
            return memo[urn]
        memo[urn] = 0  # a cycle cannot happen in a Pulumi program; this only guards the recursion
        resource = by_urn.get(urn)
        if resource is None:
            return 0
        before = max((depth(d) for d in expanded(synthesis.waits_for(resource)) if d != urn), default=0)
        memo[urn] = before + (1 if _waited(resource) else 0)
        return memo[urn]

    partitioned = {  # launch templates whose user data cuts the GPUs into MIG instances (components.render.mig)
        r.name
        for r in synthesis.resources
        if r.type == "aws:ec2/launchTemplate:LaunchTemplate"
        and mig.MARKER in base64.b64decode(str(r.inputs.get("userData") or "")).decode()
    }
    steps: dict[int, dict[str, list[str]]] = {}
    for r in synthesis.resources:
        if _waited(r):
            label = _wait_label(r)
            if r.type == "aws:eks/nodeGroup:NodeGroup" and r.name in partitioned:
                label += " (its GPUs cut into MIG instances at boot, before kubelet)"
            steps.setdefault(depth(r.urn), {}).setdefault(_WAITED[r.type], []).append(label)
    return [
        "; ".join(f"{kind}: {', '.join(sorted(names))}" for kind, names in sorted(steps[level].items()))
        for level in sorted(steps)
    ]


def adapters_note(model: ModelSpec, placement: Placement) -> str:
    """What a model's LoRA adapters are and what they cost in memory (counted in the fit)."""
    lora = model.engine.lora
    names = ", ".join(f"{a.name} (rank {a.rank})" for a in model.adapters)
    memory = (
        f"{placement.fit.adapters_gib:.2f} GiB per GPU set aside for {lora.max_per_batch} slots at rank "
        f"{lora.max_rank}, counted in the fit"
        if placement.fit
        else f"{lora.max_per_batch} slots at rank {lora.max_rank} (CPU engine: no GPU memory)"
    )
    return f"{model.name}: adapters {names}; {memory}; up to {lora.loaded} loaded per replica (LRU)"


def plan_report(stack: Stack) -> PlanReport:
    decided = stack.decisions
    spec, layout = decided.spec, decided.layout
    bill = stack.bill
    by_model = {c.model: c for c in bill.models}
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for model in spec.models:
        d = decided.models[model.name]
        placement = d.placement
        c = by_model[model.name]
        e = model.engine
        instance = placement.instance.name if placement.instance else "cpu"
        headroom = f"{placement.fit.headroom_gib:.1f} GiB" if placement.fit else "-"
        per_m = f"${c.usd_per_million_tokens:.2f}" if c.usd_per_million_tokens else "-"
        replicas = f"{model.scaling.min_replicas}-{model.scaling.max_replicas}" + (
            f" x {model.serving_units} versions" if model.versions else ""
        )
        gpus = model.unit_replicas("max_replicas") * placement.gpu_fraction
        pd = model.disaggregation
        if pd is not None:  # both roles: the prefill's replicas on its own placement where it has one
            own = layout.placements.get(model.pd_roles()[1].name) if model.prefill_pool is not None else None
            prefill = pd.prefill.scaling
            replicas += f" + {prefill.min_replicas}-{prefill.max_replicas} prefill"
            if own is not None:
                gpus += prefill.max_replicas * own.gpu_fraction
                instance += f" + {own.instance.name if own.instance else 'cpu'} (prefill)"
        rows.append(
            (
                model.name,
                f"{e.kind.value} ({model.resolved_task().value})",
                instance,
                f"{e.tensor_parallel_size} x {e.pipeline_parallel_size}",
                replicas,
                f"{gpus:g}",
                headroom,
                cost.monthly(c.min_usd_month),
                cost.monthly(c.max_usd_month),
                per_m,
            )
        )
        notes.append(f"{model.name}: {placement.reason}")
        if model.adapters:
            notes.append(adapters_note(model, placement))
        if placement.multi_node and placement.instance is not None:
            notes.append(
                f"{model.name}: one LeaderWorkerSet group of {placement.nodes} x {placement.instance.name} per "
                f"replica (TP {e.tensor_parallel_size} x PP {e.pipeline_parallel_size}, "
                f"{cost.monthly(c.usd_per_replica_month)}/month per replica = {placement.nodes} nodes)"
            )
        notes.append(f"{model.name} weights: {d.fetch.reason}")
        if note := scaling.scaling_note(spec, d):
            notes.append(note)
    if not spec.gateway.runs_router and (note := inference_extension.routing_note(spec)):
        notes.append(note)
    if note := api_keys.tenants_note(spec):
        notes.append(note)
    for pool in layout.pools.values():
        cache = (
            f", {pool.model_cache_gib} GiB node cache on {pool.cache_medium.value} (one copy per model, shared "
            f"by up to {max((layout.placements[m].replicas_per_node for m in pool.models), default=1)} replicas "
            "per node)"
            if pool.cache_medium
            else ""
        )
        notes.append(
            f"pool {pool.name}: {pool.reason}; {pool.min_nodes}-{pool.max_nodes} nodes, "
            f"{pool.root_disk_gib} GiB root disk{cache}" + _links(pool)
        )
    deploy_notes = [
        n
        for n in (
            endpoint.note(spec),
            images.note(spec, stack.profile),
            ingress.gateway_api_note(spec),
            addons.volumes_note(spec, stack.profile.cloud if stack.profile else None),
            tracing.plan_line(spec),
        )
        if n
    ]
    deploy_notes += capacity.notes(spec, layout)
    return PlanReport(
        rows=rows,
        bill=bill,
        notes=notes,
        deploy=deploy_rows(decided),
        deploy_notes=deploy_notes,
        warnings=list(decided.warnings),
        versions=lifecycle.describe(spec, layout, decided.preparations),
        sharing=sharing_lines(spec, layout, by_model),
        idle=idle_rows(decided),
        weights=weights_rows(decided),
    )


IDLE_COLUMNS = ("model", "idles as", "after idle (s)", "wake (s, est.)", "cold start (s, est.)")


def idle_rows(decided: Decisions) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for model in decided.spec.models:
        s = decided.models[model.name].idle
        rows.append(
            (
                model.name,
                {"hot": "hot (no idle state)", "sleep": "sleep (vLLM level 1)", "zero": "zero replicas"}[
                    s.state
                ],
                f"{s.after_s:,}" if s.after_s is not None else "-",
                str(s.wake_s) if s.wake_s is not None else "-",
                f"{s.cold_start_s:,}",
            )
        )
    return rows


SHARING_COLUMNS = (
    "model",
    "pool",
    "share",
    "memory per engine",
    "KV budget per engine",
    "$/replica shared",
    "$/replica whole GPU",
    "saved at max",
)


def sharing_lines(spec: PlatformSpec, layout: Layout, costs: dict[str, cost.ModelCost]) -> list[str]:
    """The GPU sharing section: each shared pool's packing, each shared engine's memory and cost against a whole
    GPU. Empty when no pool shares its GPUs."""
    shared_pools = [p for p in layout.pools.values() if p.packing is not None]
    if not shared_pools:
        return []
    rows: list[tuple[str, ...]] = []
    lines = ["## GPU sharing", ""]
    for pool in shared_pools:
        pack = pool.packing
        assert pack is not None
        how = (
            f"time-slicing, {pack.slots_per_gpu} engines per GPU (device plugin replicas), memory fractions sum "
            f"to at most 1 so gpu_memory_utilization sums to at most {packing.SHARED_GPU_SAFE_TOTAL:g}"
            if pack.mechanism is packing.Mechanism.TIME_SLICING
            else "MIG (isolated instances; the device plugin's mixed strategy advertises the instances a node's GPUs "
            "are cut into, it does not cut them: on EKS each node's user data cuts them as below at boot, before "
            "kubelet, with nvidia-smi (the AMI has no nvidia-mig-parted), so new and repaired nodes come up cut; on a "
            "cluster you bring, apply the config below yourself or with the GPU operator's MIG manager)"
        )
        memory = pool.instance.gpu_spec.memory_gib
        if pack.node_layout is not None:  # MIG: every node is cut alike
            node = dataclasses.replace(pack, gpus=pack.node_layout)
            config = mig.parted_config(pool)
            lines += [
                f"Pool `{pool.name}` ({pool.instance.name}, {pool.instance.gpus} x {pool.instance.gpu}): {how}; at max "
                f"replicas {pack.nodes} node(s), each cut alike:",
                "",
                *(f"- {line}" for line in node.lines(memory)),
                "",
                "As an nvidia-mig-parted config (on EKS nodes at "
                f"`{mig.CONFIG}`; `nvidia-mig-parted apply -f <file> -c {mig.config_name(pool)}` elsewhere):",
                "",
                "```yaml",
                *yaml.safe_dump(config, sort_keys=False).splitlines(),
                "```",
                "",
            ]
        else:
            order = startup.staggered(spec, layout)
            chain = [m for m in pool.models if m not in order] + [m for m in pool.models if m in order]
            lines += [
                f"Pool `{pool.name}` ({pool.instance.name}, {pool.instance.gpus} x {pool.instance.gpu}): {how}; "
                f"at max replicas {len(pack.gpus)} GPU(s) on {pack.nodes} node(s):",
                "",
                *(f"- {line}" for line in pack.lines(memory)),
                "",
                "Engines sharing a GPU start one after another on the first `pulumi up` "
                f"({' -> '.join(chain)}: each waits for the one before to be ready): vLLM sizes its KV cache from "
                "the memory it sees change while it profiles at start, so a neighbour loading at the same moment "
                "shrinks it or leaves no room (the engine exits). Replicas the scaler adds later, or a node's "
                "engines restarting together, can still start side by side: an engine that exits so is restarted "
                "by its kubelet once its neighbour is up, within its startup budget.",
                "",
            ]
        for name in pool.models:
            placement = layout.placements[name]
            fit, share, c = placement.fit, placement.share, costs[name]
            if fit is None or share is None:
                continue
            model = next(m for m in spec.models if m.name == name)
            rows.append(
                (
                    name,
                    pool.name,
                    share.describe(),
                    f"{fit.budget_gib:.1f} GiB (gpu_memory_utilization {model.memory_utilization:g} of "
                    f"{fit.gpu_memory_gib:.1f} GiB)",
                    f"{fit.kv_budget_gib:.1f} GiB ({fit.kv_capacity_tokens:,} tokens, "
                    f"{fit.full_length_sequences} x {fit.max_model_len:,})",
                    cost.monthly(c.usd_per_replica_month),
                    cost.monthly(c.unshared_usd_per_replica_month),
                    cost.monthly(c.sharing_saves_usd_month),
                )
            )
    saved = sum(c.sharing_saves_usd_month for c in costs.values())
    return [
        *lines,
        *markdown_table(SHARING_COLUMNS, rows),
        "",
        f"Against a whole GPU per replica on the same instance types, sharing saves {cost.monthly(saved)} a month "
        "at max replicas (per model above; the pools' bill below is whole nodes).",
        "",
    ]


def _links(pool: PoolPlan) -> str:
    """What links a pool's nodes, where a model spans them."""
    if not (pool.efa_interfaces or pool.placement_group):
        return ""
    parts = [f"EFA x{pool.efa_interfaces} per node"] if pool.efa_interfaces else ["no EFA"]
    parts += ["cluster placement group (one zone)"] if pool.placement_group else []
    return "; " + ", ".join(parts)
