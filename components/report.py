"""What `inferstack plan` and `inferstack size` show: rows and Markdown built from pure data."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from components import (
    capacity,
    catalog,
    cost,
    endpoint,
    images,
    lifecycle,
    multinode,
    rollout,
    sizing,
    targets,
)
from components.placement import PoolPlan
from components.plan import Synthesis
from components.render import ingress, scaling
from components.spec import PlatformSpec, Target
from components.stackfile import Stack
from components.startup import minutes

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


DEPLOY_COLUMNS = (
    "model",
    "node",
    "image",
    "weights",
    "load",
    "estimate",
    "startup budget",
    "rollout",
    "pulumi up waits (create / update)",
)


def markdown_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def deploy_rows(spec: PlatformSpec, plans: dict[str, rollout.Rollout]) -> list[tuple[str, ...]]:
    """Per model: the cold start's phases, the budget, how it rolls, and how long `pulumi up` waits for it."""
    rows: list[tuple[str, ...]] = []
    for model in spec.models:
        r = plans[model.name]
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
    versions: list[str] = field(default_factory=list)
    """Versions, canary steps, rollback rules and preparation Jobs (``components.lifecycle``)."""

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
            f"Prices: {catalog.PRICE_SOURCE}, read {catalog.PRICE_READ_ON}. Spot uses an average discount per family.",
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
            *(self._first_deploy(synthesis) if stack.spec.target is not Target.LOCAL else []),
            *(["## Warnings", "", *(f"- {w}" for w in self.warnings), ""] if self.warnings else []),
        ]
        return "\n".join(lines)

    def _first_deploy(self, synthesis: Synthesis) -> list[str]:
        """How long a cold replica takes and `pulumi up` waits (nothing to deploy on target local)."""
        return [
            "## First deploy",
            "",
            "A cold replica's start (seconds; estimates from the catalog, components/startup.py) and how long "
            "`pulumi up` waits for each engine Deployment.",
            "",
            *markdown_table(DEPLOY_COLUMNS, self.deploy),
            "",
            *(f"- {note}" for note in self.deploy_notes),
            *(f"- reads (must exist): `{r.type}` {r.inputs.get('id')}" for r in synthesis.reads),
            "",
        ]


def plan_report(stack: Stack) -> PlanReport:
    spec, layout = stack.spec, stack.layout
    bill = cost.stack_cost(spec, layout, targets.fixed_infrastructure(spec, layout))
    by_model = {c.model: c for c in bill.models}
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for model in spec.models:
        placement = layout.placements[model.name]
        c = by_model[model.name]
        e = model.engine
        instance = placement.instance.name if placement.instance else "cpu"
        headroom = f"{placement.fit.headroom_gib:.1f} GiB" if placement.fit else "-"
        per_m = f"${c.usd_per_million_tokens:.2f}" if c.usd_per_million_tokens else "-"
        rows.append(
            (
                model.name,
                f"{e.kind.value} ({model.resolved_task().value})",
                instance,
                f"{e.tensor_parallel_size} x {e.pipeline_parallel_size}",
                f"{model.scaling.min_replicas}-{model.scaling.max_replicas}"
                + (f" x {model.serving_units} versions" if model.versions else ""),
                str(model.scaling.max_replicas * placement.gpus_per_replica * model.serving_units),
                headroom,
                cost.monthly(c.min_usd_month),
                cost.monthly(c.max_usd_month),
                per_m,
            )
        )
        notes.append(f"{model.name}: {placement.reason}")
        if placement.multi_node and placement.instance is not None:
            notes.append(
                f"{model.name}: one LeaderWorkerSet group of {placement.nodes} x {placement.instance.name} per "
                f"replica (TP {e.tensor_parallel_size} x PP {e.pipeline_parallel_size}, "
                f"{cost.monthly(c.usd_per_replica_month)}/month per replica = {placement.nodes} nodes)"
            )
        if note := scaling.scaling_note(spec, model):
            notes.append(note)
    for pool in layout.pools.values():
        notes.append(
            f"pool {pool.name}: {pool.reason}; {pool.min_nodes}-{pool.max_nodes} nodes, "
            f"{pool.root_disk_gib} GiB root disk" + _links(pool)
        )
    plans = rollout.plans(spec, layout)
    deploy_notes = [n for n in (endpoint.note(spec), images.note(spec), ingress.gateway_api_note(spec)) if n]
    deploy_notes += capacity.notes(spec, layout)
    return PlanReport(
        rows=rows,
        bill=bill,
        notes=notes,
        deploy=deploy_rows(spec, plans),
        deploy_notes=deploy_notes,
        warnings=rollout.warnings(spec, layout),
        versions=lifecycle.describe(spec, layout),
    )


def _links(pool: PoolPlan) -> str:
    """What links a pool's nodes, where a model spans them."""
    if not (pool.efa_interfaces or pool.placement_group):
        return ""
    parts = [f"EFA x{pool.efa_interfaces} per node"] if pool.efa_interfaces else ["no EFA"]
    parts += ["cluster placement group (one zone)"] if pool.placement_group else []
    return "; " + ", ".join(parts)


SIZE_COLUMNS = (
    "instance",
    "GPUs",
    "TP x PP",
    "nodes/replica",
    "between nodes",
    "replicas/node",
    "KV headroom",
    "seqs at full length",
    "$/month/replica",
    "spot",
)


def size_rows(found: list[sizing.Candidate]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for c in found:
        spot = c.usd_per_replica_month * catalog.SPOT_FRACTION.get(c.instance.family, 1.0)
        rows.append(
            (
                c.instance.name,
                f"{c.instance.gpus} x {c.instance.gpu}",
                f"{c.tensor_parallel_size} x {c.pipeline_parallel_size}",
                str(c.nodes),
                multinode.interconnect(c.instance).describe() if c.nodes > 1 else "-",
                str(c.replicas_per_node) if c.nodes == 1 else "-",
                f"{c.fit.headroom_gib:.1f} GiB",
                f"{c.fit.full_length_sequences} ({c.fit.kv_coverage:.0%})",
                cost.monthly(c.usd_per_replica_month),
                cost.monthly(spot),
            )
        )
    return rows
