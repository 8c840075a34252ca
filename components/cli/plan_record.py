"""What `inferstack plan --out DIR` keeps of a plan for a later `plan --against DIR`: ``plan.json``, beside the
``resources.json`` and ``policy.json`` the plan writes anyway.

``plan.json`` holds the figures a review compares, read from the same objects the plan report shows (the stack's
decisions and its bill, ``components.core.decisions`` and ``components.core.cost``): per model its replicas, cost,
$/M tokens, startup budget, rollout, weights and spec (what the stack file says, defaults filled in); per GPU pool
its nodes and cost; the bill's line items. A plan compared against a base builds the same record in memory
(``PlanRecord.of``) and a base directory is read back into it (``read``), so both sides of a diff come from one
shape. ``FORMAT`` changes when that shape does: an older directory is refused with how to make a new one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.core.stackfile import Stack
    from components.deploy.synthesis import Synthesis

FORMAT = 1
"""The shape of plan.json; a base written with another cannot be compared."""
PLAN_FILE = "plan.json"
RESOURCES_FILE = "resources.json"
POLICY_FILE = "policy.json"
ENGINE_COMPONENT = "engine"  # components.render.flows.ENGINE, the engines' app.kubernetes.io/component
WEIGHTS_COMPONENT = "weights"  # components.render.weights.COMPONENT: the store Jobs'
COMPONENT_LABEL = "app.kubernetes.io/component"
MODEL_LABEL = "inferstack.io/model"  # components.render.common.MODEL_LABEL


class RecordError(Exception):
    """A base that cannot be compared: the message says why and how to make one that can."""


@dataclass(frozen=True)
class PlanRecord:
    """One plan as a diff reads it: plan.json's document, resources.json's resources, policy.json's verdicts."""

    document: dict[str, Any]
    resources: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]

    @classmethod
    def of(
        cls, document: dict[str, Any], resources: list[dict[str, Any]], policy: dict[str, Any]
    ) -> PlanRecord:
        return cls(document, resources, list(policy.get("verdicts", [])))

    @property
    def stack(self) -> str:
        return str(self.document["stack"])

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        return {m["name"]: m for m in self.document["models"]}

    @property
    def pools(self) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in self.document["pools"]}


def _urns(synthesis: Synthesis, component: str, units: set[str]) -> list[str]:
    """The URNs of the Kubernetes objects of ``component`` labelled with one of ``units`` (a model's serving units)."""
    found = []
    for r in synthesis.resources:
        labels = (r.inputs.get("metadata") or {}).get("labels") or {} if r.custom else {}
        if labels.get(COMPONENT_LABEL) == component and labels.get(MODEL_LABEL) in units:
            found.append(r.urn)
    return sorted(found)


def plan_document(stack: Stack, synthesis: Synthesis) -> dict[str, Any]:
    """plan.json: the figures of the stack's decisions and bill a review compares (see the module docstring)."""
    from components.core.weights import store  # noqa: PLC0415 - plan's imports are loaded by then

    decided, bill, spec = stack.decisions, stack.bill, stack.spec
    costs = {c.model: c for c in bill.models}
    models = []
    for model in spec.models:
        d = decided.models[model.name]
        c = costs[model.name]
        units = {u for u, ud in decided.units.items() if ud.model.served_name == model.name} | {model.name}
        r = d.rollout
        models.append(
            {
                "name": model.name,
                "pool": d.placement.pool,
                "instance": d.placement.instance.name if d.placement.instance else None,
                "nodes_per_replica": d.placement.nodes,
                "gpus_per_replica": d.placement.gpu_fraction,
                "min_replicas": model.scaling.min_replicas,
                "max_replicas": model.scaling.max_replicas,
                "serving_units": model.serving_units,
                "usd_per_replica_month": c.usd_per_replica_month,
                "min_usd_month": c.min_usd_month,
                "max_usd_month": c.max_usd_month,
                "tokens_per_second_per_replica": c.tokens_per_second_per_replica,
                "usd_per_million_tokens": c.usd_per_million_tokens,
                "startup": {
                    "estimate_s": r.startup.estimate_s,
                    "budget_s": r.startup.budget_s,
                    "phases": {p.name: p.seconds for p in r.startup.phases},
                },
                "rollout": {
                    "max_surge": r.max_surge,
                    "max_unavailable": r.max_unavailable,
                    "steps": r.steps,
                    "update_timeout_s": r.update_timeout_s,
                    "reason": r.reason,
                },
                "weights": {"store": store.location(spec, model), "fetch": d.fetch.path.value},
                "workloads": _urns(synthesis, ENGINE_COMPONENT, units),
                "store_jobs": _urns(synthesis, WEIGHTS_COMPONENT, units),
                "spec": model.model_dump(mode="json"),
            }
        )
    pool_items = {i.pool: i for i in bill.items if i.pool is not None}
    pools = [
        {
            "name": p.name,
            "instance": p.instance.name,
            "capacity_type": p.capacity_type.value,
            "min_nodes": p.min_nodes,
            "max_nodes": p.max_nodes,
            "models": list(p.models),
            "min_usd_month": pool_items[p.name].min_usd_month,
            "max_usd_month": pool_items[p.name].max_usd_month,
        }
        for p in decided.layout.pools.values()
    ]
    return {
        "format": FORMAT,
        "stack": stack.name,
        "source": stack.source,
        "target": spec.target.value,
        "environment": spec.environment,
        "prices": {"source": bill.prices.source, "read_on": bill.prices.read_on},
        "models": models,
        "pools": pools,
        "bill": {
            "items": [
                {
                    "name": i.name,
                    "kind": i.kind,
                    "pool": i.pool,
                    "min_usd_month": i.min_usd_month,
                    "max_usd_month": i.max_usd_month,
                }
                for i in bill.items
            ],
            "min_usd_month": bill.min_usd_month,
            "max_usd_month": bill.max_usd_month,
        },
        "warnings": list(decided.warnings),
    }


def write(out_dir: Path, document: dict[str, Any]) -> Path:
    path = out_dir / PLAN_FILE
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def _load(path: Path, base: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(
            f"{path}: cannot be read as JSON ({err}); write {base} again with `inferstack plan --out`"
        ) from None


def read(base: Path) -> PlanRecord:
    """The plan `inferstack plan --out BASE` wrote; ``RecordError`` (a message for people) when it is not one."""
    again = f"run `inferstack plan -s <stack> --out {base}` on the base (or pass a git revision as --against)"
    missing = [name for name in (PLAN_FILE, RESOURCES_FILE, POLICY_FILE) if not (base / name).is_file()]
    if PLAN_FILE in missing and not (base / RESOURCES_FILE).is_file():
        raise RecordError(f"{base} holds no plan ({', '.join(missing)} missing): {again}")
    if PLAN_FILE in missing:
        raise RecordError(
            f"{base} was written by an older inferstack (no {PLAN_FILE}: it has resources but not the figures a "
            f"diff compares): {again}"
        )
    if missing:
        raise RecordError(f"{base} is incomplete ({', '.join(missing)} missing): {again}")
    document = _load(base / PLAN_FILE, base)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else None
        raise RecordError(
            f"{base}/{PLAN_FILE} is in format {found!r}, this inferstack reads format {FORMAT}: {again}"
        )
    resources = _load(base / RESOURCES_FILE, base)
    policy = _load(base / POLICY_FILE, base)
    if not isinstance(resources, list) or not isinstance(policy, dict):
        raise RecordError(
            f"{base}: resources.json or policy.json is not what `inferstack plan` writes: {again}"
        )
    return PlanRecord.of(document, resources, policy)
