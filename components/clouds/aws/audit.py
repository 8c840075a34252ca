"""The least-privilege audit every IAM and key policy document of the stack must pass.

The tests run it over every document a committed stack registers (``tests/components/test_iam.py``), so a
new statement that grants too much fails review before any account sees it.
"""

from __future__ import annotations

import json
from typing import Any

from components.clouds.aws.iam import PolicyDocument


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def audit(document: PolicyDocument, key_policy: bool = False) -> list[str]:
    """Least-privilege problems in one document: wildcard actions, and any wildcard action on ``*``.

    Trust policies (with a Principal) are audited for wildcard principals instead. In a KMS key policy
    (``key_policy``) the resource ``*`` means the key the policy is attached to, so it needs no excuse, and a
    wildcard principal passes only when pinned to one account and one service.
    """
    problems: list[str] = []
    for i, statement in enumerate(_as_list(document.get("Statement", []))):
        if statement.get("Effect") != "Allow":
            continue
        actions = [str(a) for a in _as_list(statement.get("Action", []))]
        resources = [str(r) for r in _as_list(statement.get("Resource", []))]
        principal = statement.get("Principal")
        wildcard = principal is not None and (principal == "*" or "*" in json.dumps(principal))
        if wildcard and not (key_policy and _pinned_to_account_and_service(statement)):
            problems.append(f"statement {i}: wildcard principal {principal}")
        if "NotAction" in statement or "NotResource" in statement:
            problems.append(f"statement {i}: NotAction/NotResource grants more than it names")
        wild = [a for a in actions if "*" in a]
        if wild and "*" in resources:
            problems.append(f"statement {i}: wildcard actions {wild} on resource *")
        elif wild:
            problems.append(f"statement {i}: wildcard actions {wild}")
        if "*" in resources and not key_policy and not str(statement.get("Sid", "")).endswith("AnyResource"):
            problems.append(f"statement {i}: resource * without an ...AnyResource Sid saying why")
    return problems


def _pinned_to_account_and_service(statement: dict[str, Any]) -> bool:
    """A key policy statement for "any principal" that only this account's callers can use, and only
    through one AWS service (the pattern of AWS's own ``aws/ebs`` key)."""
    equals = statement.get("Condition", {}).get("StringEquals", {})
    return bool(equals.get("kms:CallerAccount")) and bool(equals.get("kms:ViaService"))
