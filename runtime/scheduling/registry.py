"""Scorers and filters by name: each declares itself where it is defined, nothing else lists it.

Built-ins are one module each under ``runtime/scheduling/scorers/`` and ``runtime/scheduling/filters/``,
found with ``pkgutil`` on first use: adding one is adding a file. Out-of-tree plug-ins are modules
named in the router's ``plugins`` list; importing one runs its ``@register_scorer`` /
``@register_filter`` decorators, after which config may name what it registered.

A declaration says what the control plane and every front end need to know without running the
scorer: its category, what it reads from the request (``needs``), the knobs it reads (``Knob`` records,
declared in the module that owns each), and what it reports to metrics. ``runtime.config`` builds
``StrategyConfig`` from the knobs of the scorers registered when it is imported (``freeze_knobs``): every
built-in one. A plug-in imported later may read those knobs but declare no new one.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from runtime.scheduling.kinds import NAME, Category, Knob, Need, Problem, Report
from runtime.scheduling.pipeline import LOAD_GUARD_RATIO, Filter, Scorer

S = TypeVar("S", bound=type[Scorer])
F = TypeVar("F", bound=type[Filter])

BUILTIN_PACKAGES = ("runtime.scheduling.scorers", "runtime.scheduling.filters")


@dataclass(frozen=True)
class ScorerInfo:
    """A registered scorer, as configuration and documentation see it."""

    name: str
    category: Category
    needs: frozenset[Need]
    knobs: tuple[Knob[Any], ...]  # what it reads, the load guard included for affinity
    reports: tuple[Report, ...]
    summary: str  # first line of the class docstring
    module: str
    make: type[Scorer]

    @property
    def builtin(self) -> bool:
        return self.module.startswith(BUILTIN_PACKAGES)

    @property
    def knob_names(self) -> frozenset[str]:
        return frozenset(knob.name for knob in self.knobs)


@dataclass(frozen=True)
class FilterInfo:
    name: str
    summary: str
    module: str
    make: type[Filter]


_scorers: dict[str, ScorerInfo] = {}
_filters: dict[str, FilterInfo] = {}
_knobs: dict[str, Knob[Any]] = {}  # every registered scorer's, by name
_frozen: frozenset[str] | None = None  # the knobs StrategyConfig was built with, once it is


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


def _check_knobs(scorer: str, module: str, knobs: Sequence[Knob[Any]]) -> None:
    seen = dict(_knobs)
    for knob in knobs:
        if not isinstance(knob, Knob):
            raise TypeError(
                f"scorer {scorer!r} ({module}): knobs takes Knob records (runtime.scheduling.Knob, declared"
                f" in the module that owns each), not {knob!r}"
            )
        old = seen.setdefault(knob.name, knob)
        if old != knob:
            raise ValueError(
                f"knob {knob.name!r} of scorer {scorer!r} ({module}) is declared twice, differently: declare"
                " a knob once, in the module that owns it, and import its record where it is read"
            )
        if _frozen is not None and knob.name not in _frozen:
            raise ValueError(
                f"scorer {scorer!r} ({module}) declares knob {knob.name!r}, which StrategyConfig has no field"
                " for: it was built from the scorers registered before this module was imported. A plug-in"
                " may read the built-in knobs; a new knob comes with a module in runtime/scheduling/scorers/"
            )


def register_scorer(
    name: str,
    category: Category,
    *,
    needs: Iterable[Need] = (),
    knobs: Iterable[Knob[Any]] = (),
    reports: Iterable[Report] = (),
) -> Callable[[S], S]:
    """Class decorator: register a ``Scorer`` under ``name`` and set its class attributes from this.
    ``knobs`` are the records of the knobs it reads (an affinity scorer gets the load guard's too)."""

    def register(cls: S) -> S:
        _check_new("scorer", name, cls.__module__, cls.__qualname__, _scorers)
        declared = tuple(knobs)
        if category is Category.AFFINITY and LOAD_GUARD_RATIO not in declared:
            declared = (*declared, LOAD_GUARD_RATIO)
        _check_knobs(name, cls.__module__, declared)
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
        for knob in declared:
            _knobs.setdefault(knob.name, knob)
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


def _place(knob: Knob[Any]) -> tuple[bool, int, str]:
    return (knob.position is None, knob.position or 0, knob.name)


def registered_knobs() -> Mapping[str, Knob[Any]]:
    """The knobs of every registered scorer, in ``StrategyConfig``'s order (see ``Knob.position``)."""
    _discover()
    return {knob.name: knob for knob in sorted(_knobs.values(), key=_place)}


def builtin_knobs() -> Mapping[str, Knob[Any]]:
    """The knobs of the built-in scorers (those a stack file may know of), in ``StrategyConfig``'s order."""
    read = {knob.name for info in builtin_scorers().values() for knob in info.knobs}
    return {name: knob for name, knob in registered_knobs().items() if name in read}


def freeze_knobs() -> tuple[Knob[Any], ...]:
    """The registered knobs, for ``StrategyConfig`` to be built from, once: a scorer registered after this
    may declare only these (a field added later would reach no configuration)."""
    global _frozen  # noqa: PLW0603 - the registry is module state, like _scorers
    knobs = tuple(registered_knobs().values())
    _frozen = frozenset(knob.name for knob in knobs)
    return knobs


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
