"""Routing decisions as a library: filters -> scorers in [0, 1] -> picker, for every front end.

The router is one front end; an Envoy external-processing endpoint picker, or anything else that needs
a pick, is another. Each keeps its own replica records (anything shaped like ``Replica``), fills a
``Context`` with what the strategy ``needs``, and calls ``Strategy.pick`` then ``Strategy.on_routed``.
Pure Python: no I/O, no server or metrics library, so any runtime service may import it.

    inputs.py     the Replica view, the request Context, the StrategySettings a strategy is built from
    kinds.py      Category (affinity / distribution), Need, Knob, Report, Problem
    pipeline.py   Filter, Scorer, Strategy (filters -> weighted blend -> best, ties at random); the load guard
    registry.py   register_scorer / register_filter; built-ins found by module, plug-ins by config; the knobs
    presets.py    named strategies as data (weights, filters)
    build.py      configured strategy -> Strategy, and the checks of its names
    lru.py        the bounded LRU map behind the prefix index and the session map
    fair_queue.py who gets the next free slot when replicas are full: bands, then tenants' token shares (VTC)
    scorers/      one module per scorer, with the knobs it owns (the registry finds them: builtin_scorers())
    filters/      one module per filter (registered_filters())

Adding a scorer is one new module in ``scorers/`` (or a plug-in module named in the router's
``plugins``) with a class decorated by ``register_scorer``; config may then weight it by name. Its knobs
are ``Knob`` records in that module, named in ``register_scorer(knobs=[...])``: ``runtime.config``
builds ``StrategyConfig``'s fields from them (a plug-in may read built-in knobs, not add its own).
"""

from runtime.scheduling.build import blend, build, knobs_read, problems, unknown_scorer, unknown_strategy
from runtime.scheduling.inputs import Context, Replica, StrategySettings
from runtime.scheduling.kinds import Category, Knob, Need, Problem, Report
from runtime.scheduling.pipeline import LOAD_GUARD_RATIO, Filter, Scorer, Strategy, invert_normalised
from runtime.scheduling.presets import PRESETS, Preset
from runtime.scheduling.registry import (
    FilterInfo,
    ScorerInfo,
    builtin_knobs,
    builtin_scorers,
    freeze_knobs,
    load_plugins,
    register_filter,
    register_scorer,
    registered_filters,
    registered_knobs,
    registered_scorers,
)

__all__ = [
    "LOAD_GUARD_RATIO",
    "PRESETS",
    "Category",
    "Context",
    "Filter",
    "FilterInfo",
    "Knob",
    "Need",
    "Preset",
    "Problem",
    "Replica",
    "Report",
    "Scorer",
    "ScorerInfo",
    "Strategy",
    "StrategySettings",
    "blend",
    "build",
    "builtin_knobs",
    "builtin_scorers",
    "freeze_knobs",
    "invert_normalised",
    "knobs_read",
    "load_plugins",
    "problems",
    "register_filter",
    "register_scorer",
    "registered_filters",
    "registered_knobs",
    "registered_scorers",
    "unknown_scorer",
    "unknown_strategy",
]
