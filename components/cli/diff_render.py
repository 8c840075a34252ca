"""A ``PlanDiff`` (``components.cli.plan_diff``) as diff.md (a pull-request comment a reviewer reads in ten seconds)
and diff.json (for scripts). Pure: the same diff gives the same bytes."""

from __future__ import annotations

import json
from typing import Any

from components.cli.output import json_text, markdown_table
from components.cli.plan_diff import Change, PlanDiff, ResourceChange


def marker(stack: str) -> str:
    """The first line of diff.md: CI finds its pull-request comment for the stack by it and updates it
    (examples/ci/), one comment per stack."""
    return f"<!-- inferstack-plan-diff: {stack} -->"


LONGEST_VALUE = 120
"""Characters of a changed value shown in diff.md; longer ones (base64 user data, whole command lines) are named by
their size there, and are whole in diff.json."""
TITLES = {"replacement": "replaced", "store-job": "store Job runs again", "capacity-drop": "capacity drops"}


def usd(value: float) -> str:
    return f"${value:,.0f}"


def signed(value: float) -> str:
    if round(value) == 0:
        return "$0"
    return f"+${value:,.0f}" if value > 0 else f"-${-value:,.0f}"


def per_m(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if len(text) > LONGEST_VALUE:
        return f"({len(text):,} characters)"
    return f"`{text}`"


def _change(c: Change) -> str:
    if isinstance(c.before, list) and isinstance(c.after, list):
        gone = [x for x in c.before if x not in c.after]
        new = [x for x in c.after if x not in c.before]
        if gone or new:
            parts = [f"adds {', '.join(_value(x) for x in new)}"] if new else []
            parts += [f"removes {', '.join(_value(x) for x in gone)}"] if gone else []
            return f"`{c.path}` {'; '.join(parts)}"
        return f"`{c.path}` reordered"
    return f"`{c.path}` {_value(c.before)} -> {_value(c.after)}"


def _resource(c: ResourceChange) -> list[str]:
    how = " **(replaced)**" if c.replaced_by else ""
    return [f"- `{c.resource.type}` {c.resource.name}{how}", *(f"  - {_change(ch)}" for ch in c.changes)]


def headline(d: PlanDiff) -> str:
    t = d.total
    verdicts = (
        f"; policy: {len(d.verdicts_appeared)} new violation(s), {len(d.verdicts_gone)} gone"
        if d.verdicts_appeared or d.verdicts_gone
        else ""
    )
    return (
        f"**Monthly cost {signed(t.max.delta)} at max replicas ({usd(t.max.before)} -> {usd(t.max.after)}), "
        f"{signed(t.min.delta)} at min ({usd(t.min.before)} -> {usd(t.min.after)}).** "
        f"Resources: {len(d.added)} added, {len(d.changed)} changed, {len(d.removed)} removed{verdicts}."
    )


MODEL_COLUMNS = ("model", "change", "replicas", "instance", "$/month min", "$/month max", "$/M tokens (est.)")
COST_COLUMNS = ("item", "min before", "min after", "min change", "max before", "max after", "max change")


def markdown(d: PlanDiff) -> str:
    lines = [
        marker(d.stack),
        f"## inferstack plan diff: {d.stack}",
        "",
        f"Base: {d.base}. Head: {d.head}.",
        "",
    ]
    if d.empty:
        return "\n".join([*lines, "No changes: the plans are the same.", ""])
    lines += [headline(d), ""]
    if d.attention:
        lines += ["### Needs attention", ""]
        lines += [f"- **{TITLES[a.kind]}**: {a.message}" for a in d.attention]
        lines += [""]
    if d.rollouts:
        lines += ["### Rollouts", "", *(f"- {r.describe()}" for r in d.rollouts), ""]
    if d.models:
        rows = [
            (
                m.name,
                m.status,
                m.replicas[1] if m.replicas[0] == m.replicas[1] else f"{m.replicas[0]} -> {m.replicas[1]}",
                m.instance[1] if m.instance[0] == m.instance[1] else f"{m.instance[0]} -> {m.instance[1]}",
                f"{usd(m.min_usd_month.after)} ({signed(m.min_usd_month.delta)})",
                f"{usd(m.max_usd_month.after)} ({signed(m.max_usd_month.delta)})",
                per_m(m.usd_per_million_tokens[1])
                if m.usd_per_million_tokens[0] == m.usd_per_million_tokens[1]
                else f"{per_m(m.usd_per_million_tokens[0])} -> {per_m(m.usd_per_million_tokens[1])}",
            )
            for m in d.models
        ]
        lines += [
            "### Models",
            "",
            *markdown_table(MODEL_COLUMNS, rows, right_aligned_from=4),
            "",
            "A model's cost is its replicas' share of their nodes; the monthly cost below bills whole nodes.",
            "",
        ]
        for m in d.models:
            if m.changes:
                lines += [f"- **{m.name}**: " + "; ".join(_change(c) for c in m.changes)]
        lines += [""] if any(m.changes for m in d.models) else []
    cost_rows = [
        (
            f"**{c.name}**" if c.kind == "total" else c.name,
            usd(c.min.before),
            usd(c.min.after),
            signed(c.min.delta),
            usd(c.max.before),
            usd(c.max.after),
            signed(c.max.delta),
        )
        for c in d.costs
    ]
    lines += ["### Monthly cost", "", *markdown_table(COST_COLUMNS, cost_rows, right_aligned_from=1), ""]
    if d.verdicts_appeared or d.verdicts_gone:
        lines += ["### Policy", ""]
        lines += [
            f"- new: {v.level.upper()} `{v.rule}` [{v.resource}]: {v.message}" for v in d.verdicts_appeared
        ]
        lines += [
            f"- gone: {v.level.upper()} `{v.rule}` [{v.resource}]: {v.message}" for v in d.verdicts_gone
        ]
        lines += [""]
    if d.warnings_appeared or d.warnings_gone:
        lines += ["### Plan warnings", ""]
        lines += [f"- new: {w}" for w in d.warnings_appeared] + [f"- gone: {w}" for w in d.warnings_gone]
        lines += [""]
    if d.added or d.changed or d.removed:
        lines += [
            "<details><summary>Resources: "
            f"{len(d.added)} added, {len(d.changed)} changed, {len(d.removed)} removed</summary>",
            "",
        ]
        if d.added:
            lines += [f"Added ({len(d.added)}):", "", *(f"- `{r.type}` {r.name}" for r in d.added), ""]
        if d.changed:
            lines += [f"Changed ({len(d.changed)}):", ""]
            for c in d.changed:
                lines += _resource(c)
            lines += [""]
        if d.removed:
            lines += [f"Removed ({len(d.removed)}):", "", *(f"- `{r.type}` {r.name}" for r in d.removed), ""]
        lines += ["</details>", ""]
    return "\n".join(lines)


def as_json(d: PlanDiff) -> str:
    return json_text(
        {
            "stack": d.stack,
            "base": d.base,
            "head": d.head,
            "empty": d.empty,
            "cost_increase_usd_month": round(d.cost_increase_usd_month, 2),
            "attention": [a.as_json() for a in d.attention],
            "rollouts": [r.as_json() for r in d.rollouts],
            "models": [m.as_json() for m in d.models],
            "costs": [c.as_json() for c in d.costs],
            "policy": {
                "appeared": [v.as_json() for v in d.verdicts_appeared],
                "gone": [v.as_json() for v in d.verdicts_gone],
            },
            "warnings": {"appeared": list(d.warnings_appeared), "gone": list(d.warnings_gone)},
            "resources": {
                "added": [r.as_json() for r in d.added],
                "changed": [c.as_json() for c in d.changed],
                "removed": [r.as_json() for r in d.removed],
            },
        }
    )
