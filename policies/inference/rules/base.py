"""What every rule is made of: plain resources in, findings out.

A rule is a pure function over resource properties. The same function runs in three places: the
CrossGuard pack (``pulumi preview --policy-pack policies/inference``), ``inferstack plan`` (offline, over
the resources the mock runtime captured) and the tests. Nothing here imports pulumi_aws or
pulumi_kubernetes; resources are plain mappings with the providers' camelCase property names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from components.core.redaction import REDACTED

SECRET = REDACTED
"""How a secret value reads once it is plain data: the plan's redaction, and the pack's for Pulumi secrets."""

Props = Mapping[str, Any]
Config = Mapping[str, Any]


class Category(StrEnum):
    FIT = "fit"
    PLACEMENT = "placement"
    RELIABILITY = "reliability"
    SECURITY = "security"
    MONEY = "money"
    HYGIENE = "hygiene"


class Severity(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Res:
    """One resource as a rule sees it: type token, logical name, URN and plain properties."""

    type: str
    name: str
    urn: str
    props: Props

    @property
    def kind(self) -> str | None:
        kind = self.props.get("kind")
        return kind if isinstance(kind, str) and self.type.startswith("kubernetes:") else None

    @property
    def metadata(self) -> Props:
        meta = self.props.get("metadata")
        return meta if isinstance(meta, Mapping) else {}

    @property
    def k8s_name(self) -> str:
        return str(self.metadata.get("name") or self.name)

    @property
    def namespace(self) -> str | None:
        ns = self.metadata.get("namespace")
        return ns if isinstance(ns, str) and ns else None

    @property
    def labels(self) -> Mapping[str, str]:
        labels = self.metadata.get("labels")
        return labels if isinstance(labels, Mapping) else {}

    @property
    def from_chart(self) -> bool:
        """Rendered by a Helm chart during a real preview (its URN's type chain runs through a Chart).

        Under `inferstack plan` charts are opaque, so only the Chart resource itself is seen.
        """
        parts = self.urn.split("::")
        parents = parts[2].split("$")[:-1] if len(parts) >= 4 else []
        return any(t.startswith("kubernetes:helm.sh/") for t in parents)

    @property
    def display(self) -> str:
        """How a verdict names the resource: 'Deployment inference/llama-3-8b-engine' or the type and name."""
        if self.kind:
            where = f"{self.namespace}/" if self.namespace else ""
            return f"{self.kind} {where}{self.k8s_name}"
        return f"{self.type.rsplit(':', 1)[-1]} {self.name}"


@dataclass(frozen=True)
class Finding:
    """One violation: what is wrong and what to change, and the resource it belongs to (None: the stack)."""

    message: str
    urn: str | None = None


@dataclass(frozen=True)
class Setting:
    """One configurable threshold of a rule (a property of its CrossGuard config schema)."""

    name: str
    schema: Mapping[str, Any]
    default: Any
    description: str

    def json_schema(self) -> dict[str, Any]:
        return {**self.schema, "default": self.default, "description": self.description}


ResourceCheck = Callable[[Res, Config], Iterable[str]]
StackCheck = Callable[[Sequence[Res], Config], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    """A named check with its description, remediation, severity and settings.

    Exactly one of ``resource_check`` (called once per resource, messages attach to it) or
    ``stack_check`` (called once with every resource) is set.
    """

    name: str
    category: Category
    severity: Severity
    description: str
    remediation: str
    resource_check: ResourceCheck | None = None
    stack_check: StackCheck | None = None
    settings: tuple[Setting, ...] = field(default=())

    def __post_init__(self) -> None:
        if (self.resource_check is None) == (self.stack_check is None):
            raise ValueError(f"rule {self.name}: give exactly one of resource_check and stack_check")

    @property
    def scope(self) -> str:
        return "resource" if self.resource_check is not None else "stack"

    def config(self, raw: Config | None = None) -> dict[str, Any]:
        """The rule's settings: defaults, overlaid with what the policy config gives (CrossGuard applies
        schema defaults itself, but not in unit tests or offline, so the rule always does)."""
        out = {s.name: s.default for s in self.settings}
        for key, value in (raw or {}).items():
            if key != "enforcementLevel":
                out[key] = value
        return out

    def check_resource(self, res: Res, raw: Config | None = None) -> list[str]:
        if self.resource_check is None:
            return []
        return list(self.resource_check(res, self.config(raw)))

    def check_stack(self, resources: Sequence[Res], raw: Config | None = None) -> list[Finding]:
        if self.stack_check is None:
            return []
        return list(self.stack_check(resources, self.config(raw)))

    def run(self, resources: Sequence[Res], raw: Config | None = None) -> list[Finding]:
        """Every finding over a whole stack, whatever the scope (the offline runner and the tests use this)."""
        if self.stack_check is not None:
            return self.check_stack(resources, raw)
        return [Finding(m, r.urn) for r in resources for m in self.check_resource(r, raw)]


# Plain data -----------------------------------------------------------------------------------------


def as_map(value: Any) -> Props:
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def dig(value: Any, *path: str | int) -> Any:
    """``value[path[0]][path[1]]...`` or None when any step is missing or of the wrong shape."""
    for step in path:
        if isinstance(step, int):
            items = as_list(value)
            value = items[step] if -len(items) <= step < len(items) else None
        else:
            value = as_map(value).get(step)
        if value is None:
            return None
    return value


def number(value: Any) -> float | None:
    """A number from a JSON number or a numeric string ('2', '0.9'); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def strings(value: Any) -> Iterator[str]:
    """Every string inside a nested value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from strings(v)


def of_type(resources: Sequence[Res], *types: str) -> list[Res]:
    return [r for r in resources if r.type in types]


def of_kind(resources: Sequence[Res], *kinds: str) -> list[Res]:
    return [r for r in resources if r.kind in kinds]
