"""Scorers and filters by name: each declares itself where it is defined, nothing else lists it.

Built-ins are one module each under ``runtime/scheduling/scorers/`` and ``runtime/scheduling/filters/``,
found with ``pkgutil`` on first use: adding one is adding a file. Out-of-tree plug-ins are modules
named in the router's ``plugins`` list; importing one runs its ``@register_scorer`` /
``@register_filter`` decorators, after which config may name what it registered.

A declaration says what the control plane and every front end need to know without running the
scorer: its category, what it reads from the request (``needs``), which ``StrategyConfig`` knobs it
reads, and what it reports to metrics.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from runtime.scheduling.kinds import Category, Need, Problem, Report
from runtime.scheduling.pipeline import Filter, Scorer

S = TypeVar("S", bound=type[Scorer])
F = TypeVar("F", bound=type[Filter])

#: Knob every affinity scorer is subject to (the pipeline's load guard), so none declares it itself.
GUARD_KNOB = "load_guard_ratio"
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
BUILTIN_PACKAGES = ("runtime.scheduling.scorers", "runtime.scheduling.filters")


@dataclass(frozen=True)
class ScorerInfo:
    """A registered scorer, as configuration and documentation see it."""

    name: str
    category: Category
    needs: frozenset[Need]
    knobs: tuple[str, ...]  # StrategyConfig fields it reads, the load guard included for affinity
    reports: tuple[Report, ...]
    summary: str  # first line of the class docstring
    module: str
    make: type[Scorer]

    @property
    def builtin(self) -> bool:
        return self.module.startswith(BUILTIN_PACKAGES)


@dataclass(frozen=True)
class FilterInfo:
    name: str
    summary: str
    module: str
    make: type[Filter]


_scorers: dict[str, ScorerInfo] = {}
_filters: dict[str, FilterInfo] = {}


def _summary(cls: type) -> str:
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def _check_new(
    kind: str, name: str, module: str, qualname: str, taken: Mapping[str, ScorerInfo | FilterInfo]
) -> None:
    if not NAME.match(name):
        raise ValueError(f"{kind} name {name!r} ({module}): use lower case letters, digits and _")
    old = taken.get(name)
    if old is not None and (old.module, old.make.__qualname__) != (module, qualname):
        raise ValueError(f"{kind} {name!r} is registered twice: by {old.module} and by {module}")


def register_scorer(
    name: str,
    category: Category,
    *,
    needs: Iterable[Need] = (),
    knobs: Iterable[str] = (),
    reports: Iterable[Report] = (),
) -> Callable[[S], S]:
    """Class decorator: register a ``Scorer`` under ``name`` and set its class attributes from this."""

    def register(cls: S) -> S:
        _check_new("scorer", name, cls.__module__, cls.__qualname__, _scorers)
        declared = tuple(knobs)
        if category is Category.AFFINITY and GUARD_KNOB not in declared:
            declared = (*declared, GUARD_KNOB)
        info = ScorerInfo(
            name=name,
            category=category,
            needs=frozenset(needs),
            knobs=declared,
            reports=tuple(reports),
            summary=_summary(cls),
            module=cls.__module__,
            make=cls,
        )
        cls.name = name
        cls.affinity = category is Category.AFFINITY
        cls.needs = info.needs
        cls.reports = info.reports
        _scorers[name] = info
        return cls

    return register


def register_filter(name: str) -> Callable[[F], F]:
    """Class decorator: register a ``Filter`` under ``name`` (presets list filters by name)."""

    def register(cls: F) -> F:
        _check_new("filter", name, cls.__module__, cls.__qualname__, _filters)
        cls.name = name
        _filters[name] = FilterInfo(name=name, summary=_summary(cls), module=cls.__module__, make=cls)
        return cls

    return register


@functools.cache
def _discover() -> None:
    """Import every built-in scorer and filter module, once (their decorators register them)."""
    for package_name in BUILTIN_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.iter_modules(package.__path__, f"{package_name}."):
            importlib.import_module(module.name)


def registered_scorers() -> Mapping[str, ScorerInfo]:
    """Every registered scorer: the built-ins and the plug-ins loaded so far."""
    _discover()
    return _scorers


def builtin_scorers() -> Mapping[str, ScorerInfo]:
    """The scorers every router image has (what the control plane may name in a stack file)."""
    return {name: info for name, info in registered_scorers().items() if info.builtin}


def registered_filters() -> Mapping[str, FilterInfo]:
    _discover()
    return _filters


def load_plugins(modules: Sequence[str]) -> list[Problem]:
    """Import plug-in modules (each registers what it defines); one problem per module that fails."""
    _discover()
    problems: list[Problem] = []
    for i, module in enumerate(modules):
        try:
            importlib.import_module(module)
        except Exception as err:  # a plug-in is someone else's code: any failure is a config problem
            problems.append(
                Problem(f"plugins[{i}]", f"cannot import {module!r}: {type(err).__name__}: {err}")
            )
    return problems
