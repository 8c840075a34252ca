"""The pack's rules over `inferstack plan`'s synthesized resources: same rules, same config, no Pulumi CLI.

``prepare`` reads the config (the stack's own, with ``--policy-config FILE`` on top) before anything is
synthesized, so a bad file is reported at once; ``Policy.run`` judges the resources and returns verdicts
that print one per violation (level, rule, resource, message) and fail the plan on a mandatory one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from components.core.stackfile import Stack
from policies.inference import config as policy_config
from policies.inference.config import PolicyConfigError
from policies.inference.pack import PACK_NAME
from policies.inference.rules import RULES, Res

__all__ = [
    "Captured",
    "Policy",
    "PolicyConfigError",
    "PolicyResult",
    "Synthesized",
    "Verdict",
    "evaluate",
    "prepare",
    "resources_of",
]


class Captured(Protocol):
    """One resource as `inferstack plan` captured it (``components.deploy.synthesis.Resource``)."""

    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def urn(self) -> str: ...
    @property
    def inputs(self) -> Mapping[str, Any]: ...


class Synthesized(Protocol):
    """What `inferstack plan` synthesized (``components.deploy.synthesis.Synthesis``). A protocol, not an import: the plan
    runs the Pulumi program and calls the pack, so the pack must not import it back."""

    @property
    def resources(self) -> Sequence[Captured]: ...


@dataclass(frozen=True)
class Verdict:
    rule: str
    level: str
    resource: str  # how the resource reads to a person; 'stack' when the finding is about the whole stack
    urn: str | None
    message: str

    def as_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "level": self.level,
            "resource": self.resource,
            "urn": self.urn,
            "message": self.message,
        }


def resources_of(synthesis: Synthesized) -> list[Res]:
    return [Res(r.type, r.name, r.urn, r.inputs) for r in synthesis.resources]


def evaluate(
    resources: Sequence[Res], config: dict[str, Any], default_level: str = policy_config.MANDATORY
) -> list[Verdict]:
    """Every violation of every enabled rule, with the level the config gives the rule."""
    resolved = policy_config.resolve(config, default_level)
    by_urn = {r.urn: r.display for r in resources}
    verdicts: list[Verdict] = []
    for rule in RULES:
        setting = resolved[rule.name]
        if setting.level == policy_config.DISABLED:
            continue
        try:
            findings = rule.run(resources, setting.settings)
        except Exception as err:  # a rule bug must not hide the other verdicts, nor pass silently
            verdicts.append(
                Verdict(
                    rule.name, setting.level, "stack", None, f"the rule failed to run ({err!r}); report it"
                )
            )
            continue
        for finding in findings:
            where = by_urn.get(finding.urn or "", "stack")
            verdicts.append(Verdict(rule.name, setting.level, where, finding.urn, finding.message))
    return verdicts


@dataclass
class PolicyResult:
    environment: str
    source: str
    verdicts: list[Verdict] = field(default_factory=list)
    rules: int = len(RULES)
    checked: bool = True

    @property
    def failed(self) -> bool:
        return any(v.level == policy_config.MANDATORY for v in self.verdicts)

    def lines(self) -> list[str]:
        head = f"Policy {PACK_NAME} ({self.rules} rules, config: {self.source})"
        if not self.checked:
            return [f"{head}: nothing to check (no cloud or cluster resources)"]
        if not self.verdicts:
            return [f"{head}: clean, no violations"]
        mandatory = sum(v.level == policy_config.MANDATORY for v in self.verdicts)
        out = [
            f"{head}: {len(self.verdicts)} violation(s), {mandatory} mandatory"
            + (" -- the plan fails" if mandatory else " -- advisory only")
        ]
        order = {policy_config.MANDATORY: 0, policy_config.ADVISORY: 1}
        for v in sorted(self.verdicts, key=lambda v: (order.get(v.level, 2), v.rule, v.resource)):
            first, *rest = v.message.splitlines()
            out.append(f"  {v.level.upper():<9} {v.rule}  [{v.resource}]")
            out.append(f"      {first}")
            out += [f"      {line}" for line in rest]
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "pack": PACK_NAME,
            "environment": self.environment,
            "config": self.source,
            "failed": self.failed,
            "verdicts": [v.as_json() for v in self.verdicts],
        }

    def write(self, out_dir: Path) -> Path:
        path = out_dir / "policy.json"
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_json(), indent=2) + "\n")
        return path


@dataclass(frozen=True)
class Policy:
    """A stack's effective policy config, ready to judge its synthesis."""

    environment: str
    config: dict[str, Any]
    source: str

    def run(self, synthesis: Synthesized, *, has_resources: bool = True) -> PolicyResult:
        if not has_resources:
            return PolicyResult(self.environment, self.source, checked=False)
        default = policy_config.level_for(self.environment)
        verdicts = evaluate(resources_of(synthesis), self.config, default)
        return PolicyResult(self.environment, self.source, verdicts)


def prepare(stack: Stack, config_file: Path | None = None) -> Policy:
    """The stack's policy config (environment level, budget, spot allowance), with ``config_file`` on top.

    Raises ``PolicyConfigError`` (a message for people) when the file is missing or wrong.
    """
    derived = policy_config.for_spec(stack.spec)
    if config_file is None:
        return Policy(stack.spec.environment, derived, f"derived from {stack.source}")
    overlay = policy_config.load(config_file)
    return Policy(stack.spec.environment, policy_config.merge(derived, overlay), str(config_file))
