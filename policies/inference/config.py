"""Policy config: enforcement per environment and rule thresholds, in the format CrossGuard reads.

The file is what ``pulumi preview --policy-pack policies/inference --policy-pack-config FILE`` takes and
what ``inferstack plan --policy-config FILE`` takes::

    {
      "all": "mandatory",
      "monthly-cost-within-budget": {"monthly_budget_usd": 250000},
      "containers-have-probes": {"enforcementLevel": "advisory", "exempt_containers": ["ns/app/sidecar"]}
    }

Without a file, `inferstack plan` derives it from the stack (``for_spec``): advisory in dev-like
environments, mandatory elsewhere, the budget and the spot allowance from the spec. The committed
``config/<stack>.json`` files are exactly that derivation (a test keeps them in step), so the pack in CI
and the offline plan judge a stack the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.spec import PlatformSpec
from policies.inference.rules import BY_NAME

ADVISORY = "advisory"
MANDATORY = "mandatory"
DISABLED = "disabled"
LEVELS = (ADVISORY, MANDATORY, DISABLED)
ADVISORY_ENVIRONMENTS = ("dev", "kind", "local", "sandbox", "test")
"""Environments where violations warn instead of block; every other environment (staging, prod, ...) blocks."""
CONFIG_DIR = Path(__file__).parent / "config"
ALL = "all"


class PolicyConfigError(Exception):
    """A policy config file that cannot be used; the message says where and what to change."""


def level_for(environment: str) -> str:
    return ADVISORY if environment in ADVISORY_ENVIRONMENTS else MANDATORY


def for_spec(spec: PlatformSpec) -> dict[str, Any]:
    """The policy config a stack implies: its environment's enforcement, its budget, its spot allowance."""
    out: dict[str, Any] = {ALL: level_for(spec.environment)}
    if spec.budget.monthly_usd_cap is not None:
        out["monthly-cost-within-budget"] = {"monthly_budget_usd": spec.budget.monthly_usd_cap}
    if spec.budget.allow_spot_in_prod:
        out["no-spot-in-prod"] = {"allow_spot": True}
    if spec.budget.allow_multi_node_spot:
        out["no-multi-node-on-spot"] = {"allow_multi_node_spot": True}
    return out


def merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay`` on top of ``base``; a rule's settings merge key by key, a bare level replaces the level."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    for key, value in overlay.items():
        if isinstance(value, Mapping):
            current = out.get(key)
            merged = dict(current) if isinstance(current, Mapping) else {}
            if isinstance(current, str):
                merged["enforcementLevel"] = current
            out[key] = {**merged, **value}
        elif isinstance(current := out.get(key), Mapping) and key != ALL:
            out[key] = {**current, "enforcementLevel": value}
        else:
            out[key] = value
    return out


def validate(config: Any, source: str) -> dict[str, Any]:
    """Check a config document against the rules' names and settings; raise with every problem."""
    if not isinstance(config, Mapping):
        raise PolicyConfigError(
            f"{source}: a policy config is a JSON object of rule name -> level or settings"
        )
    problems: list[str] = []
    for key, value in config.items():
        if key == ALL:
            if value not in LEVELS:
                problems.append(f"{source}: all: {value!r} is not one of {', '.join(LEVELS)}")
            continue
        rule = BY_NAME.get(key)
        if rule is None:
            problems.append(
                f"{source}: {key!r} is not a rule of this pack; rules: {', '.join(sorted(BY_NAME))}"
            )
            continue
        if isinstance(value, str):
            if value not in LEVELS:
                problems.append(f"{source}: {key}: {value!r} is not one of {', '.join(LEVELS)}")
            continue
        if not isinstance(value, Mapping):
            problems.append(f"{source}: {key}: give a level ({', '.join(LEVELS)}) or an object of settings")
            continue
        known = {s.name: s for s in rule.settings}
        for name, setting_value in value.items():
            if name == "enforcementLevel":
                if setting_value not in LEVELS:
                    problems.append(
                        f"{source}: {key}.enforcementLevel: {setting_value!r} is not one of {', '.join(LEVELS)}"
                    )
            elif name not in known:
                names = ", ".join(sorted(known)) or "none"
                problems.append(f"{source}: {key}.{name}: unknown setting; {key} takes: {names}")
            elif not _type_ok(known[name].schema, setting_value):
                schema = known[name].schema
                bounds = {k: schema[k] for k in ("minimum", "exclusiveMinimum", "maximum") if k in schema}
                limits = f" ({', '.join(f'{k} {v}' for k, v in bounds.items())})" if bounds else ""
                problems.append(
                    f"{source}: {key}.{name}: {setting_value!r} is not a valid {schema.get('type')}{limits}"
                )
    if problems:
        raise PolicyConfigError("\n".join(problems))
    return dict(config)


def _type_ok(schema: Mapping[str, Any], value: Any) -> bool:
    kinds = schema.get("type")
    allowed = kinds if isinstance(kinds, list) else [kinds]
    checks = {
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    if not any(checks.get(str(k), lambda v: True)(value) for k in allowed):
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return False
        if "maximum" in schema and value > schema["maximum"]:
            return False
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return all(_type_ok(schema["items"], v) for v in value)
    return True


def load(path: Path) -> dict[str, Any]:
    """Read and check a policy config file (JSON, or YAML)."""
    source = str(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise PolicyConfigError(f"{source}: cannot read the policy config: {err.strerror or err}") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise PolicyConfigError(
            f"{source}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}"
        ) from None
    return validate(document, source)


@dataclass(frozen=True)
class Resolved:
    """One rule's effective enforcement level and settings under a config."""

    level: str
    settings: dict[str, Any]


def resolve(config: Mapping[str, Any], default_level: str = MANDATORY) -> dict[str, Resolved]:
    """Per rule: level (rule's enforcementLevel, else 'all', else the default) and raw settings."""
    base = config.get(ALL, default_level)
    out = {}
    for name in BY_NAME:
        entry = config.get(name)
        if isinstance(entry, str):
            out[name] = Resolved(entry, {})
        elif isinstance(entry, Mapping):
            settings = {k: v for k, v in entry.items() if k != "enforcementLevel"}
            out[name] = Resolved(str(entry.get("enforcementLevel", base)), settings)
        else:
            out[name] = Resolved(str(base), {})
    return out


def committed_path(stack: str) -> Path:
    return CONFIG_DIR / f"{stack}.json"


def dumps(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
