"""Rendered resources of real stacks, copies with one thing changed, and CrossGuard-style evaluation."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from pulumi_policy import PolicyResource, ResourceValidationArgs, StackValidationArgs
from pulumi_policy.proxy import unknown_checking_proxy

from components.core.stackfile import available_stacks
from components.spec import Target
from policies.inference import pack
from policies.inference.offline import resources_of
from policies.inference.rules import BY_NAME, Res
from tests.stacks import load, synthesized

BROKEN = Path(__file__).parent / "stacks"
# Every committed stack with cloud or cluster resources (target local has none to judge).
COMMITTED = tuple(s for s in available_stacks() if load(s).spec.target is not Target.LOCAL)


@cache
def _rendered(stack: str, stacks_dir: str) -> tuple[Res, ...]:
    return tuple(resources_of(synthesized(stack, Path(stacks_dir))))


def rendered(stack: str, stacks_dir: Path = Path("stacks")) -> list[Res]:
    """Every resource the real program registers for a stack (synthesized once per test session)."""
    return list(_rendered(stack, str(stacks_dir)))


Select = Callable[[Res], bool]


def k8s(kind: str, name: str) -> Select:
    return lambda r: r.kind == kind and r.k8s_name == name


def aws(type_suffix: str, name: str) -> Select:
    return lambda r: r.type.endswith(type_suffix) and r.name == name


def mutate(resources: Sequence[Res], select: Select, change: Callable[[dict[str, Any]], object]) -> list[Res]:
    """A copy of ``resources`` where the one selected resource's properties went through ``change``."""
    out, hits = [], 0
    for r in resources:
        if select(r):
            props = copy.deepcopy(dict(r.props))
            change(props)
            out.append(Res(r.type, r.name, r.urn, props))
            hits += 1
        else:
            out.append(r)
    assert hits == 1, f"selector matched {hits} resources"
    return out


def drop(resources: Sequence[Res], select: Select) -> list[Res]:
    out = [r for r in resources if not select(r)]
    assert len(out) == len(resources) - 1
    return out


def container(props: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in props["spec"]["template"]["spec"]["containers"] if name is None or c["name"] == name
    )
    return found


def crossguard(rule_name: str, resources: Sequence[Res], config: dict[str, Any] | None = None) -> list[str]:
    """Run one rule the way the analyzer does: its CrossGuard policy object, proxied props, report callback."""
    rule = BY_NAME[rule_name]
    policy = pack.policy(rule)
    messages: list[str] = []

    def report(message: str, urn: str | None = None) -> None:
        messages.append(message)

    if rule.scope == "resource":
        for r in resources:
            args = ResourceValidationArgs(
                r.type,
                unknown_checking_proxy(copy.deepcopy(dict(r.props))),
                r.urn,
                r.name,
                None,
                None,
                config,
            )
            policy.validate(args, report)
    else:
        items = [
            PolicyResource(
                r.type,
                unknown_checking_proxy(copy.deepcopy(dict(r.props))),
                r.urn,
                r.name,
                None,
                None,
                None,
                [],
                {},
            )
            for r in resources
        ]
        policy.validate(StackValidationArgs(items, config), report)
    return messages


ENGINE_8B_DEV = k8s("Deployment", "llama-3-8b-engine")
