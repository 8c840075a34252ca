"""The inference guardrails: every rule, in report order."""

from __future__ import annotations

from policies.inference.rules import (
    adapters,
    disaggregation,
    fairness,
    fit,
    groups,
    hygiene,
    lifecycle,
    money,
    names,
    placement,
    reliability,
    security,
    sharing,
    weights,
)
from policies.inference.rules.base import Category, Finding, Res, Rule, Setting, Severity

RULES: tuple[Rule, ...] = (
    *fit.RULES,
    *placement.RULES,
    *reliability.RULES,
    *sharing.RULES,
    *weights.RULES,
    *security.RULES,
    *money.RULES,
    *hygiene.RULES,
    *names.RULES,
    *groups.RULES,
    *lifecycle.RULES,
    *adapters.RULES,
    *disaggregation.RULES,
    *fairness.RULES,
)
BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}

__all__ = ["BY_NAME", "RULES", "Category", "Finding", "Res", "Rule", "Setting", "Severity"]
