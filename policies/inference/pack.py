"""Thin CrossGuard wrappers around the pure rules, and the pack's metadata.

``policies()`` builds one ``ResourceValidationPolicy`` or ``StackValidationPolicy`` per rule; it never
starts anything. ``__main__.py`` hands them to ``PolicyPack``, which starts the analyzer server and blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy import Severity as PolicySeverity
from pulumi_policy.proxy import UNKNOWN_ARRAY_VALUE, UNKNOWN_OBJECT_VALUE, _is_unknown
from pulumi_policy.secret import Secret

from policies.inference.rules import RULES, Res, Rule
from policies.inference.rules.base import SECRET

PACK_NAME = "inferstack-inference"
PACK_DESCRIPTION = (
    "Inference guardrails for inferstack: GPU fit, placement, reliability, security, money and hygiene. "
    "Advisory in dev, mandatory in staging and prod (see policies/inference/config/)."
)
_UNKNOWN = (UNKNOWN_ARRAY_VALUE, UNKNOWN_OBJECT_VALUE)


def plain(value: Any) -> Any:
    """CrossGuard property values as plain data, the shape `inferstack plan` captures: proxies unwrapped,
    unknown preview values as None, secrets as ``SECRET``, integral floats as ints."""
    if isinstance(value, Secret):
        return SECRET
    if isinstance(value, Mapping):
        target = _target(value)
        return {str(k): plain(target[k]) for k in target}
    if isinstance(value, list | tuple) or _is_list_proxy(value):
        target = _target(value)
        return [plain(v) for v in target]
    if _is_unknown(value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _target(value: Any) -> Any:
    try:
        inner = value["__target"]
    except (KeyError, TypeError, IndexError):
        return value
    return inner if inner is not None else value


def _is_list_proxy(value: Any) -> bool:
    return type(value).__name__ in ("_ListProxy", "_ListSecretsProxy")


def resource(resource_type: str, name: str, urn: str, props: Mapping[str, Any]) -> Res:
    return Res(resource_type, name, urn, plain(props))


def _severity(rule: Rule) -> PolicySeverity:
    return PolicySeverity(rule.severity.value)


def _schema(rule: Rule) -> PolicyConfigSchema | None:
    if not rule.settings:
        return None
    return PolicyConfigSchema(properties={s.name: s.json_schema() for s in rule.settings})


def _resource_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        res = resource(args.resource_type, args.name, args.urn, args.props)
        for message in rule.check_resource(res, args.get_config()):
            report_violation(f"{message}", None)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        config_schema=_schema(rule),
        severity=_severity(rule),
        remediation_steps=rule.remediation,
        tags=[rule.category.value],
    )


def _stack_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [resource(r.resource_type, r.name, r.urn, r.props) for r in args.resources]
        for finding in rule.check_stack(resources, args.get_config()):
            report_violation(finding.message, finding.urn)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        config_schema=_schema(rule),
        severity=_severity(rule),
        remediation_steps=rule.remediation,
        tags=[rule.category.value],
    )


def policy(rule: Rule) -> ResourceValidationPolicy | StackValidationPolicy:
    return _resource_policy(rule) if rule.scope == "resource" else _stack_policy(rule)


def policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """One CrossGuard policy per rule; building them starts nothing."""
    return [policy(r) for r in RULES]


# The pack's own default when no policy config is given: block. Dev's config file turns it to advisory.
DEFAULT_ENFORCEMENT = EnforcementLevel.MANDATORY
