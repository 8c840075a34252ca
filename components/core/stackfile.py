"""Read a stack file into a validated spec and layout, turning every mistake into a ``Problem``.

The CLI reads ``stacks/Pulumi.<stack>.yaml`` directly; the Pulumi program gets the same object from
stack config. Both go through ``validate``, so `inferstack plan` and `pulumi up` agree on what is valid.

Two steps: each section's structure and own rules (pydantic, every section's problems together), then, on a spec
whose sections are valid, the cross-section rules (``components.spec.rules``) and the plan-time rules
(``components.core.plan_rules``) together. The plan-time rules include the target cloud's, and core cannot import
the clouds: the shells pass their profiles (``profiles=components.clouds.targets.PROFILES``).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from components.base.catalog import INSTANCE_TYPES
from components.base.problems import Problem, SpecError
from components.core import cloud, plan_rules
from components.core.cloud import Profile
from components.core.cost import StackCost
from components.core.decisions import Decisions
from components.core.paths import STACKS_DIR as STACKS_DIR  # noqa: PLC0414 - re-exported: callers look here
from components.core.placement import Layout
from components.spec import RULES_LATER, PlatformSpec, Target
from components.spec.platform import platform_problems

CONFIG_KEY = "inferstack:platform"


@dataclass(frozen=True)
class Stack:
    """A validated stack: its spec, where everything lands, and its other config (secrets stay opaque)."""

    name: str
    source: str
    decisions: Decisions
    """Every decision about the stack, made once while it was validated (``components.core.decisions``): the
    plan-time rules, the plan report, the Pulumi program and the renderers read them."""
    config: dict[str, Any]
    profile: Profile | None = None
    """Its target's, from the ``profiles`` it was loaded with (None: target local, which has none, or a target
    those profiles lack: then it is billed as target local is, at the catalog's EC2 prices with nothing else)."""

    @functools.cached_property
    def bill(self) -> StackCost:
        """What it costs at its target's prices (``components.core.cloud.bill``), priced once, when first read: the
        plan report and `inferstack cost` read it."""
        return cloud.bill(self.spec, self.layout, self.profile)

    @property
    def spec(self) -> PlatformSpec:
        return self.decisions.spec

    @property
    def layout(self) -> Layout:
        """Where everything lands."""
        return self.decisions.layout

    @property
    def served(self) -> tuple[PlatformSpec, Layout]:
        """The spec and layout the renderers see: each version of a model as a unit of its own."""
        return self.decisions.served_spec, self.decisions.served_layout


def stack_path(stack: str, stacks_dir: Path = STACKS_DIR) -> Path:
    return stacks_dir / f"Pulumi.{stack}.yaml"


def available_stacks(stacks_dir: Path = STACKS_DIR) -> list[str]:
    return sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in stacks_dir.glob("Pulumi.*.yaml")
    )


def load(stack: str, stacks_dir: Path = STACKS_DIR, *, profiles: Mapping[Target, Profile]) -> Stack:
    """Read, parse and validate ``stacks/Pulumi.<stack>.yaml`` (with the rules of its target's cloud in
    ``profiles``: a shell passes ``components.clouds.targets.PROFILES``); raise ``SpecError`` on any problem."""
    path = stack_path(stack, stacks_dir)
    source = str(path)
    if not path.is_file():
        known = ", ".join(available_stacks(stacks_dir)) or "none"
        raise SpecError(source, [Problem("", f"no such stack file; stacks in {stacks_dir}/: {known}")])
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise SpecError(source, [Problem("", f"not valid YAML at {where}: {err.problem}")]) from err
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(source, [Problem("", f"cannot read the file: {err}")]) from err
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise SpecError(source, [Problem("", "a stack file needs a top-level 'config:' mapping")])
    config: dict[str, Any] = document["config"]
    if CONFIG_KEY not in config:
        raise SpecError(
            source, [Problem("config", f"missing the '{CONFIG_KEY}' key that holds the platform spec")]
        )
    decided = validate(config[CONFIG_KEY], source, profiles=profiles)
    profile = profiles.get(decided.spec.target)
    return Stack(name=stack, source=source, decisions=decided, config=config, profile=profile)


def validate(raw: Any, source: str, *, profiles: Mapping[Target, Profile]) -> Decisions:
    """Structure first (pydantic: every section's problems), then the cross-section and plan-time rules together
    (the target cloud's, from its profile in ``profiles``); every problem, with field paths. A valid spec comes
    back with everything decided about it (its ``spec`` and ``layout`` among them)."""
    if not isinstance(raw, dict):
        raise SpecError(source, [Problem(CONFIG_KEY, f"must be a mapping, got {type(raw).__name__}")])
    try:
        spec = PlatformSpec.model_validate(raw, context={RULES_LATER: True})
    except ValidationError as err:
        raise SpecError(source, [_problem(e) for e in err.errors()]) from None
    profile = profiles.get(spec.target)
    target_cloud, instances = (
        (profile.cloud, profile.instances) if profile is not None else (None, INSTANCE_TYPES)
    )
    decided, found = plan_rules.check(spec, target_cloud, instances)
    problems = [*platform_problems(spec), *found]
    if problems or decided is None:
        raise SpecError(source, problems)
    return decided


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for a mapping's key: the key itself names the field
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(error: Any) -> Problem:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        hint = f"; known keys here: {', '.join(known)}" if known else ""
        return Problem(_path(loc), f"unknown key {loc[-1]!r}{hint}")
    if kind == "missing":
        return Problem(_path(loc), "required but missing")
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind not in ("value_error", "assertion_error"):
        message = f"{message} (got {error.get('input')!r})"
    return Problem(_path(loc), message)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``list[X]``, ``X | None`` or ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] | None = PlatformSpec
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return sorted(model.model_fields) if model is not None else []
