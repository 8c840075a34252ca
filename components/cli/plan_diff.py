"""What a change to a stack does, from two plans: `inferstack plan --against BASE`. Pure.

``diff(base, head)`` compares two ``PlanRecord`` (``components.cli.plan_record``: what `plan --out` writes, or the
same built in memory) into a ``PlanDiff``: resources added, changed (the inputs that changed; the plan redacted
secrets already) and removed; each model's spec and decisions; the monthly bill at min and max replicas per pool, per
other line item and in total; $/M tokens; policy verdicts that appeared or went away; the rolling updates the
change starts. Changes that need attention come first: a node group or cluster Pulumi would replace (or delete), a
weights change that runs a model's store Job again, and capacity that drops. ``components.cli.diff_render`` writes
it as markdown and JSON; every list here is sorted for reading, so the same plans give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.cli.plan_record import PlanRecord

ABSENT = "(absent)"
"""How a value reads on the side of a change where it is not set."""


@dataclass(frozen=True)
class ReplaceOnChange:
    """Inputs of one resource type whose change makes Pulumi replace the resource (create new, delete old)."""

    type: str
    label: str
    inputs: tuple[str, ...]
    """Input paths in the Pulumi program's camelCase; a change at or under one replaces."""
    source: str


REPLACE_ON_CHANGE: tuple[ReplaceOnChange, ...] = (
    ReplaceOnChange(
        "aws:eks/nodeGroup:NodeGroup",
        "node group",
        (
            "amiType",
            "capacityType",
            "clusterName",
            "diskSize",
            "instanceTypes",
            "launchTemplate.id",
            "launchTemplate.name",
            "nodeGroupName",
            "nodeGroupNamePrefix",
            "nodeRoleArn",
            "remoteAccess",
            "subnetIds",
        ),
        # pulumi-aws bridges the Terraform AWS provider: a ForceNew attribute is a replacement in Pulumi.
        "hashicorp/terraform-provider-aws internal/service/eks/node_group.go (commit 012e0a32), ForceNew attributes "
        "of aws_eks_node_group; a launch template version, scaling, labels, taints, update config and Kubernetes "
        "version update in place",
    ),
    ReplaceOnChange(
        "aws:eks/cluster:Cluster",
        "EKS cluster",
        (
            "accessConfig.bootstrapClusterCreatorAdminPermissions",
            "bootstrapSelfManagedAddons",
            "kubernetesNetworkConfig.ipFamily",
            "kubernetesNetworkConfig.serviceIpv4Cidr",
            "name",
            "outpostConfig",
            "remoteNetworkConfig",
            "roleArn",
        ),
        "hashicorp/terraform-provider-aws internal/service/eks/cluster.go (commit 00555dc5), ForceNew attributes of "
        "aws_eks_cluster (pulumi-aws 7.51.1's Cluster docstring says the same of bootstrap_self_managed_addons); the "
        "Kubernetes version, logging, endpoint access and subnets update in place",
    ),
)
_REPLACE = {r.type: r for r in REPLACE_ON_CHANGE}
ROLLING_TEMPLATES = ("spec.template", "spec.leaderWorkerTemplate")
"""A change under a workload's pod template (a LeaderWorkerSet's group template) rolls its replicas."""


@dataclass(frozen=True)
class Change:
    path: str
    before: Any
    after: Any

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class ResourceRef:
    urn: str
    type: str
    name: str

    def as_json(self) -> dict[str, Any]:
        return {"urn": self.urn, "type": self.type, "name": self.name}


@dataclass(frozen=True)
class ResourceChange:
    resource: ResourceRef
    changes: tuple[Change, ...]
    replaced_by: tuple[str, ...] = ()
    """The changed inputs that make Pulumi replace it (``REPLACE_ON_CHANGE``); empty: it updates in place."""

    def as_json(self) -> dict[str, Any]:
        return {
            **self.resource.as_json(),
            "replaces": bool(self.replaced_by),
            "replaced_by": list(self.replaced_by),
            "changes": [c.as_json() for c in self.changes],
        }


@dataclass(frozen=True)
class Money:
    """A monthly figure before and after (USD)."""

    before: float
    after: float

    @property
    def delta(self) -> float:
        return self.after - self.before

    def as_json(self) -> dict[str, float]:
        return {"before": round(self.before, 2), "after": round(self.after, 2), "delta": round(self.delta, 2)}


@dataclass(frozen=True)
class CostLine:
    name: str
    kind: str  # "pool", or the bill's kind of the item (eks, nat, ...), or "total"
    min: Money
    max: Money

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "min": self.min.as_json(), "max": self.max.as_json()}


@dataclass(frozen=True)
class ModelDiff:
    name: str
    status: str  # "added", "removed" or "changed"
    changes: tuple[Change, ...]
    """Its spec (paths as in the stack file) and its decisions (placement, startup, rollout, weights)."""
    min_usd_month: Money
    max_usd_month: Money
    usd_per_million_tokens: tuple[float | None, float | None]
    replicas: tuple[str, str]
    instance: tuple[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "replicas": {"before": self.replicas[0], "after": self.replicas[1]},
            "instance": {"before": self.instance[0], "after": self.instance[1]},
            "min_usd_month": self.min_usd_month.as_json(),
            "max_usd_month": self.max_usd_month.as_json(),
            "usd_per_million_tokens": {
                "before": _round(self.usd_per_million_tokens[0]),
                "after": _round(self.usd_per_million_tokens[1]),
            },
            "changes": [c.as_json() for c in self.changes],
        }


@dataclass(frozen=True)
class Rollout:
    """A rolling update the change starts: a model's engine pod template changed."""

    model: str
    replicas: int
    """Replicas replaced at most (max replicas, every version)."""
    max_surge: int
    max_unavailable: int
    rounds: int
    about_s: int
    """Rounds x a cold replica's estimated start."""
    up_to_s: int
    """What `pulumi up` waits at most (rounds x the startup budget)."""
    reason: str

    def describe(self) -> str:
        how = (
            f"starting up to {self.max_surge} new before stopping old ones"
            if self.max_surge
            else f"at most {self.max_unavailable} at a time, each stopped before its replacement starts"
        )
        return (
            f"this update replaces {self.replicas} replica(s) of {self.model}, {how} ({self.reason}), "
            f"{self.rounds} round(s): about {_minutes(self.about_s)}, up to {_minutes(self.up_to_s)}"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "replicas": self.replicas,
            "max_surge": self.max_surge,
            "max_unavailable": self.max_unavailable,
            "rounds": self.rounds,
            "about_s": self.about_s,
            "up_to_s": self.up_to_s,
            "reason": self.reason,
            "text": self.describe(),
        }


ATTENTION_ORDER = ("replacement", "store-job", "capacity-drop")


@dataclass(frozen=True)
class Attention:
    kind: str  # one of ATTENTION_ORDER
    subject: str
    message: str

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "subject": self.subject, "message": self.message}


@dataclass(frozen=True)
class Verdict:
    rule: str
    level: str
    resource: str
    message: str

    def as_json(self) -> dict[str, str]:
        return {"rule": self.rule, "level": self.level, "resource": self.resource, "message": self.message}


@dataclass(frozen=True)
class PlanDiff:
    stack: str
    base: str
    """What the base is (a directory, or the stack file at a git revision)."""
    head: str
    attention: tuple[Attention, ...]
    added: tuple[ResourceRef, ...]
    changed: tuple[ResourceChange, ...]
    removed: tuple[ResourceRef, ...]
    models: tuple[ModelDiff, ...]
    costs: tuple[CostLine, ...]
    """Pools and other line items whose cost changed, then the total (always)."""
    verdicts_appeared: tuple[Verdict, ...]
    verdicts_gone: tuple[Verdict, ...]
    rollouts: tuple[Rollout, ...]
    warnings_appeared: tuple[str, ...] = field(default=())
    warnings_gone: tuple[str, ...] = field(default=())

    @property
    def total(self) -> CostLine:
        return self.costs[-1]

    @property
    def cost_increase_usd_month(self) -> float:
        """The larger of the monthly increases at min and at max replicas (0 when neither rises)."""
        return max(0.0, self.total.min.delta, self.total.max.delta)

    @property
    def replacements(self) -> tuple[Attention, ...]:
        return tuple(a for a in self.attention if a.kind == "replacement")

    @property
    def empty(self) -> bool:
        return not (
            self.added
            or self.changed
            or self.removed
            or self.models
            or self.verdicts_appeared
            or self.verdicts_gone
            or self.total.min.delta
            or self.total.max.delta
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _minutes(seconds: int) -> str:
    return f"{round(seconds / 60):,} min" if seconds >= 60 else f"{seconds} s"


def _scalar_list(value: Any) -> bool:
    return isinstance(value, list) and all(not isinstance(v, dict | list) for v in value)


def changes(before: Any, after: Any, prefix: str = "") -> list[Change]:
    """Every leaf that differs, as dotted paths (list items as ``[i]``) in key order. A list whose length changes,
    or a list of plain values, is one change: its items moved, so item-by-item paths would not mean anything."""
    if before == after:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[Change] = []
        for key in sorted(set(before) | set(after)):
            path = f"{prefix}.{key}" if prefix else str(key)
            out += changes(before.get(key, ABSENT), after.get(key, ABSENT), path)
        return out
    if (
        isinstance(before, list)
        and isinstance(after, list)
        and len(before) == len(after)
        and not (_scalar_list(before) and _scalar_list(after))
    ):
        out = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            out += changes(b, a, f"{prefix}[{i}]")
        return out
    return [Change(prefix, before, after)]


def _under(path: str, roots: Iterable[str]) -> list[str]:
    return [r for r in roots if path == r or path.startswith((f"{r}.", f"{r}["))]


def _ref(resource: Mapping[str, Any]) -> ResourceRef:
    return ResourceRef(str(resource["urn"]), str(resource["type"]), str(resource["name"]))


def _resource_changes(
    base: PlanRecord, head: PlanRecord
) -> tuple[list[ResourceRef], list[ResourceChange], list[ResourceRef]]:
    before = {r["urn"]: r for r in base.resources}
    after = {r["urn"]: r for r in head.resources}
    added = [_ref(after[u]) for u in sorted(set(after) - set(before))]
    removed = [_ref(before[u]) for u in sorted(set(before) - set(after))]
    changed = []
    for urn in sorted(set(before) & set(after)):
        found = changes(before[urn].get("inputs", {}), after[urn].get("inputs", {}))
        if not found:
            continue
        rule = _REPLACE.get(str(after[urn]["type"]))
        forcing = sorted({r for c in found for r in _under(c.path, rule.inputs)}) if rule else []
        changed.append(ResourceChange(_ref(after[urn]), tuple(found), tuple(forcing)))
    return added, changed, removed


MODEL_DECISIONS = (
    "pool",
    "instance",
    "nodes_per_replica",
    "gpus_per_replica",
    "startup.budget_s",
    "startup.estimate_s",
    "rollout.max_surge",
    "rollout.max_unavailable",
    "weights.fetch",
    "weights.store",
)
"""What placement and the decisions made of a model that a diff shows beside its spec (plan.json's keys)."""


def _get(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for part in path.split("."):
        value = value.get(part, ABSENT) if isinstance(value, Mapping) else ABSENT
    return value


def _replicas(m: Mapping[str, Any] | None) -> str:
    if m is None:
        return "-"
    units = f" x {m['serving_units']} versions" if m["serving_units"] > 1 else ""
    return f"{m['min_replicas']}-{m['max_replicas']}{units}"


def _model_diffs(base: PlanRecord, head: PlanRecord) -> list[ModelDiff]:
    before, after = base.models, head.models
    out = []
    order = [*after, *(n for n in before if n not in after)]  # the head's stack-file order, then the removed
    for name in order:
        b, a = before.get(name), after.get(name)
        if b is not None and a is not None:
            found = changes(b["spec"], a["spec"])
            found += [
                Change(f"({p})", _get(b, p), _get(a, p)) for p in MODEL_DECISIONS if _get(b, p) != _get(a, p)
            ]
            status = "changed"
            if (
                not found
                and b["min_usd_month"] == a["min_usd_month"]
                and b["max_usd_month"] == a["max_usd_month"]
            ):
                continue
        else:
            found, status = [], "added" if b is None else "removed"
        out.append(
            ModelDiff(
                name=name,
                status=status,
                changes=tuple(found),
                min_usd_month=Money(b["min_usd_month"] if b else 0.0, a["min_usd_month"] if a else 0.0),
                max_usd_month=Money(b["max_usd_month"] if b else 0.0, a["max_usd_month"] if a else 0.0),
                usd_per_million_tokens=(
                    b["usd_per_million_tokens"] if b else None,
                    a["usd_per_million_tokens"] if a else None,
                ),
                replicas=(_replicas(b), _replicas(a)),
                instance=(
                    str(b["instance"] or "cpu") if b else "-",
                    str(a["instance"] or "cpu") if a else "-",
                ),
            )
        )
    return out


def _costs(base: PlanRecord, head: PlanRecord) -> list[CostLine]:
    lines = []
    before, after = base.pools, head.pools
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name), after.get(name)
        line = CostLine(
            f"pool {name}",
            "pool",
            Money(b["min_usd_month"] if b else 0.0, a["min_usd_month"] if a else 0.0),
            Money(b["max_usd_month"] if b else 0.0, a["max_usd_month"] if a else 0.0),
        )
        if line.min.delta or line.max.delta:
            lines.append(line)
    items_before = {i["name"]: i for i in base.document["bill"]["items"] if i["pool"] is None}
    items_after = {i["name"]: i for i in head.document["bill"]["items"] if i["pool"] is None}
    for name in sorted(set(items_before) | set(items_after)):
        b, a = items_before.get(name), items_after.get(name)
        line = CostLine(
            name,
            str((a or b or {}).get("kind", "")),
            Money(b["min_usd_month"] if b else 0.0, a["min_usd_month"] if a else 0.0),
            Money(b["max_usd_month"] if b else 0.0, a["max_usd_month"] if a else 0.0),
        )
        if line.min.delta or line.max.delta:
            lines.append(line)
    bill_b, bill_a = base.document["bill"], head.document["bill"]
    total = CostLine(
        "total",
        "total",
        Money(bill_b["min_usd_month"], bill_a["min_usd_month"]),
        Money(bill_b["max_usd_month"], bill_a["max_usd_month"]),
    )
    return [*lines, total]


LEVEL_ORDER = {"mandatory": 0, "advisory": 1}


def _verdicts(record: PlanRecord) -> set[Verdict]:
    return {Verdict(v["rule"], v["level"], v["resource"], v["message"]) for v in record.verdicts}


def _sorted_verdicts(found: set[Verdict]) -> tuple[Verdict, ...]:
    return tuple(sorted(found, key=lambda v: (LEVEL_ORDER.get(v.level, 2), v.rule, v.resource, v.message)))


def _rollouts(base: PlanRecord, head: PlanRecord, changed: list[ResourceChange]) -> list[Rollout]:
    """Models whose engine workload's pod template changed: their replicas roll (head's strategy and budget)."""
    rolled = {c.resource.urn for c in changed if any(_under(ch.path, ROLLING_TEMPLATES) for ch in c.changes)}
    out = []
    before = base.models
    for name, m in head.models.items():
        if name not in before or not rolled & set(m["workloads"]):
            continue
        r = m["rollout"]
        out.append(
            Rollout(
                model=name,
                replicas=m["max_replicas"] * m["serving_units"],
                max_surge=r["max_surge"],
                max_unavailable=r["max_unavailable"],
                rounds=r["steps"],
                about_s=r["steps"] * m["startup"]["estimate_s"],
                up_to_s=r["update_timeout_s"],
                reason=r["reason"],
            )
        )
    return out


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _attention(
    base: PlanRecord, head: PlanRecord, changed: list[ResourceChange], removed: list[ResourceRef]
) -> list[Attention]:
    out: list[Attention] = []
    for c in changed:
        if c.replaced_by:
            rule = _REPLACE[c.resource.type]
            how = ", ".join(
                f"`{ch.path}` {_short(ch.before)} -> {_short(ch.after)}"
                for ch in c.changes
                if _under(ch.path, rule.inputs)
            )
            out.append(
                Attention(
                    "replacement",
                    c.resource.name,
                    f"{rule.label} `{c.resource.name}` is replaced (a new one is created, then the old one deleted): "
                    f"{how}",
                )
            )
    for r in removed:
        if r.type in _REPLACE:
            out.append(Attention("replacement", r.name, f"{_REPLACE[r.type].label} `{r.name}` is deleted"))
    before, after = base.models, head.models
    for name, a in after.items():
        b = before.get(name)
        if b is None:
            continue
        new_jobs = sorted(set(a["store_jobs"]) - set(b["store_jobs"]))
        if new_jobs:
            what = [
                f"`{c.path}` {_short(c.before)} -> {_short(c.after)}"
                for c in changes(b["spec"], a["spec"])
                if c.path in ("source", "revision") or c.path.startswith(("adapters", "versions"))
            ]
            jobs = ", ".join(f"`{u.rsplit('::', 1)[-1]}`" for u in new_jobs)
            out.append(
                Attention(
                    "store-job",
                    name,
                    f"{name}: weights change ({'; '.join(what) or 'store location'}): the store Job(s) {jobs} copy "
                    "them into the model store again before its engines start on them",
                )
            )
    for name, was in before.items():
        now = after.get(name)
        if now is None:
            out.append(
                Attention(
                    "capacity-drop", name, f"{name} is removed: its {_replicas(was)} replicas stop serving it"
                )
            )
            continue
        drops = []
        for key, label in (("min_replicas", "min replicas"), ("max_replicas", "max replicas")):
            if now[key] * now["serving_units"] < was[key] * was["serving_units"]:
                drops.append(
                    f"{label} {was[key] * was['serving_units']} -> {now[key] * now['serving_units']}"
                )
        tb, ta = was["tokens_per_second_per_replica"], now["tokens_per_second_per_replica"]
        if tb and ta:
            most_b, most_a = (
                tb * was["max_replicas"] * was["serving_units"],
                ta * now["max_replicas"] * now["serving_units"],
            )
            if most_a < most_b * 0.999:
                drops.append(f"tokens/s at max replicas (est.) {most_b:,.0f} -> {most_a:,.0f}")
        if drops:
            out.append(Attention("capacity-drop", name, f"{name}: capacity drops: {'; '.join(drops)}"))
    for name, bp in base.pools.items():
        ap = head.pools.get(name)
        if ap is not None and ap["max_nodes"] < bp["max_nodes"]:
            out.append(
                Attention(
                    "capacity-drop",
                    f"pool {name}",
                    f"pool {name}: max nodes {bp['max_nodes']} -> {ap['max_nodes']}",
                )
            )
    return sorted(out, key=lambda x: (ATTENTION_ORDER.index(x.kind), x.subject, x.message))


def diff(base: PlanRecord, head: PlanRecord, base_label: str, head_label: str) -> PlanDiff:
    """What changes from ``base`` to ``head`` (two plans of one stack)."""
    added, changed, removed = _resource_changes(base, head)
    vb, va = _verdicts(base), _verdicts(head)
    wb, wa = base.document["warnings"], head.document["warnings"]
    return PlanDiff(
        stack=head.stack,
        base=base_label,
        head=head_label,
        attention=tuple(_attention(base, head, changed, removed)),
        added=tuple(added),
        changed=tuple(changed),
        removed=tuple(removed),
        models=tuple(_model_diffs(base, head)),
        costs=tuple(_costs(base, head)),
        verdicts_appeared=_sorted_verdicts(va - vb),
        verdicts_gone=_sorted_verdicts(vb - va),
        rollouts=tuple(_rollouts(base, head, changed)),
        warnings_appeared=tuple(sorted(set(wa) - set(wb))),
        warnings_gone=tuple(sorted(set(wb) - set(wa))),
    )


@dataclass(frozen=True)
class Gate:
    """One ``--fail-on`` condition: ``replacement``, or ``cost-increase-over=USD``."""

    kind: str
    usd: float = 0.0

    def tripped(self, d: PlanDiff) -> str | None:
        """Why the diff fails this gate, or None."""
        if self.kind == "replacement" and d.replacements:
            return f"--fail-on replacement: {len(d.replacements)} replacement(s)"
        if self.kind == "cost-increase-over" and d.cost_increase_usd_month > self.usd:
            return (
                f"--fail-on cost-increase-over={self.usd:g}: the monthly cost rises by "
                f"${d.cost_increase_usd_month:,.0f}"
            )
        return None


class GateError(ValueError):
    pass


def parse_gate(text: str) -> Gate:
    """``replacement`` or ``cost-increase-over=USD`` (a number, `$` and `,` allowed)."""
    if text == "replacement":
        return Gate("replacement")
    name, sep, value = text.partition("=")
    if name == "cost-increase-over" and sep:
        try:
            usd = float(value.replace("$", "").replace(",", ""))
        except ValueError:
            usd = -1.0
        if usd >= 0:
            return Gate("cost-increase-over", usd)
        raise GateError(f"--fail-on {text}: give the USD a month as a number, e.g. cost-increase-over=500")
    raise GateError(
        f"--fail-on {text}: use `replacement` or `cost-increase-over=USD` (e.g. cost-increase-over=500)"
    )
