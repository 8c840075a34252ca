"""Routing decisions as a library: filters -> scorers in [0, 1] -> picker, for every front end.

The router is one front end; an Envoy external-processing endpoint picker, or anything else that needs
a pick, is another. Each keeps its own endpoint records (anything shaped like ``Endpoint``), fills a
``Context`` with what the strategy ``needs``, and calls ``Strategy.pick`` then ``Strategy.on_routed``.
Pure Python: no I/O, no server or metrics library, so any runtime service may import it.

    inputs.py     the Endpoint view, the request Context, the Knobs scorers read
    kinds.py      Category (affinity / distribution), Need, Report, Problem
    pipeline.py   Filter, Scorer, Strategy (filters -> weighted blend -> best, ties at random)
    registry.py   register_scorer / register_filter; built-ins found by module, plug-ins by config
    presets.py    named strategies as data (weights, filters)
    build.py      configured strategy -> Strategy, and the checks of its names
    lru.py        the bounded LRU map behind the prefix index and the session map
    scorers/      one module per scorer: adapter, kv, latency, load, precise_prefix, prefix, queue, rotation,
                  session, weight
    filters/      one module per filter: sample_two

Adding a scorer is one new module in ``scorers/`` (or a plug-in module named in the router's
``plugins``) with a class decorated by ``register_scorer``; config may then weight it by name.
"""

from runtime.scheduling.build import blend, build, knobs_read, problems, unknown_scorer, unknown_strategy
from runtime.scheduling.inputs import Context, Endpoint, Knobs, StrategySettings
from runtime.scheduling.kinds import Category, Need, Problem, Report
from runtime.scheduling.pipeline import Filter, Scorer, Strategy, invert_normalised
from runtime.scheduling.presets import PRESETS, Preset
from runtime.scheduling.registry import (
    FilterInfo,
    ScorerInfo,
    builtin_scorers,
    load_plugins,
    register_filter,
    register_scorer,
    registered_filters,
    registered_scorers,
)

__all__ = [
    "PRESETS",
    "Category",
    "Context",
    "Endpoint",
    "Filter",
    "FilterInfo",
    "Knobs",
    "Need",
    "Preset",
    "Problem",
    "Report",
    "Scorer",
    "ScorerInfo",
    "Strategy",
    "StrategySettings",
    "blend",
    "build",
    "builtin_scorers",
    "invert_normalised",
    "knobs_read",
    "load_plugins",
    "problems",
    "register_filter",
    "register_scorer",
    "registered_filters",
    "registered_scorers",
    "unknown_scorer",
    "unknown_strategy",
]
