"""From a configured strategy (a preset's name, weights, knobs) to a ready ``Strategy``; and the checks
that say, before anything is built, what in such a configuration is wrong."""

from __future__ import annotations

import random
from collections.abc import Mapping

from runtime.scheduling.inputs import StrategySettings
from runtime.scheduling.kinds import Problem
from runtime.scheduling.pipeline import LOAD_GUARD_RATIO, Strategy
from runtime.scheduling.presets import PRESETS
from runtime.scheduling.registry import ScorerInfo, registered_filters, registered_scorers


def blend(name: str, configured: Mapping[str, float]) -> dict[str, float]:
    """The weights a strategy runs with: the preset's, overridden and extended by the configured ones
    (for a preset with ``replace_weights``, the configured ones alone when there are any)."""
    preset = PRESETS[name]
    if preset.replace_weights and configured:
        return dict(configured)
    return {**preset.weights, **configured}


def unknown_strategy(name: str) -> str | None:
    """Why ``name`` is not a strategy (with the names that are), or None."""
    return None if name in PRESETS else f"unknown strategy {name!r}; known: {', '.join(PRESETS)}"


def unknown_scorer(name: str, known: Mapping[str, ScorerInfo]) -> str | None:
    """Why ``name`` is not among the ``known`` scorers (with their names), or None."""
    return None if name in known else f"unknown scorer {name!r}; known: {', '.join(sorted(known))}"


def problems(name: str, weights: Mapping[str, float]) -> list[Problem]:
    """Unknown strategy or scorer names (every registered scorer counts, plug-ins included)."""
    found = [Problem("name", m) for m in [unknown_strategy(name)] if m]
    known = registered_scorers()
    return found + [Problem(f"weights.{s}", m) for s in weights if (m := unknown_scorer(s, known))]


def knobs_read(name: str, weights: Mapping[str, float]) -> frozenset[str]:
    """The names of the knobs that make a difference to this strategy (its scorers' declared knobs)."""
    known = registered_scorers()
    return frozenset(
        knob.name
        for scorer, weight in blend(name, weights).items()
        if weight > 0 and scorer in known
        for knob in known[scorer].knobs
    )


def build(settings: StrategySettings, rng: random.Random | None = None) -> Strategy:
    """A fresh strategy (empty indexes); ``ValueError`` listing every problem when names are unknown."""
    found = problems(settings.name, settings.weights)
    if found:
        raise ValueError("; ".join(f"{p.field}: {p.message}" for p in found))
    known = registered_scorers()
    chosen = [
        (known[scorer].make.from_knobs(settings), weight)
        for scorer, weight in blend(settings.name, settings.weights).items()
        if weight > 0
    ]
    registered = registered_filters()
    return Strategy(
        settings.name,
        chosen,
        filters=[registered[f].make() for f in PRESETS[settings.name].filters],
        load_guard_ratio=LOAD_GUARD_RATIO.read(settings),
        rng=rng,
    )
