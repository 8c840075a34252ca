"""The words scorers and filters declare themselves with (their category, needs, knobs and reports), and
the shape of a configuration mistake."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

T = TypeVar("T", int, float, str, bool)

#: What a scorer, filter or knob may be called: it is a key in config files and a metric label.
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class Category(StrEnum):
    """Which way a scorer pulls. Affinity scores (prefix, session) count only on replicas under the
    load guard, so a hot prefix cannot pile onto an overloaded replica; distribution scores always count."""

    AFFINITY = "affinity"
    DISTRIBUTION = "distribution"


class Need(StrEnum):
    """What a scorer reads beyond the replicas' own counters; a front end fills only what is needed."""

    PROMPT = "prompt"  # the text a prefix cache sees first (costs a parse of the body)
    SESSION = "session"  # the session key header
    ENGINE_STATS = "engine_stats"  # engine queue / KV usage, from the health feed or a probe
    ADAPTER = "adapter"  # which replicas hold the LoRA adapter a request asks for
    PROMPT_BLOCKS = "prompt_blocks"  # the engines' block hashes of the prompt, and their KV-event view


class Report(StrEnum):
    """What a scorer reports for metrics (``Scorer.report``)."""

    INDEX_ENTRIES = "index_entries"  # entries in a bounded index (prefix blocks, sessions)
    HIT_RATE = "hit_rate"  # share of lookups that found a replica


@dataclass(frozen=True)
class Knob(Generic[T]):
    """A tuning knob a scorer reads when it is made, declared once, in the module that owns it, and named
    by every scorer that reads it (``register_scorer(knobs=[...])``).

    The record is the knob's one definition: ``runtime.config.StrategyConfig`` has a field for every knob
    of the registered scorers, with this type, default, range and description, and a stack file's
    ``models[].routing`` offers the ones marked ``stack``. A scorer reads its value, typed, with
    ``read``. Bounds are written as the field's (``ge=1``, not ``ge=1.0``): they are the JSON Schema's."""

    name: str  # the StrategyConfig field
    type: type[T]
    default: T
    description: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    stack: bool = False  # a stack file may set it per model (components' RoutingSpec offers it)
    #: Where the field sits in StrategyConfig, and so in every rendered runtime config: knobs with a
    #: position first, in its order, then the others by name. The knobs that predate these records keep
    #: their places with it (rendered configs do not change); a new knob leaves it out.
    position: int | None = None

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(f"knob name {self.name!r}: use lower case letters, digits and _")
        default: object = self.default
        if type(default) is not self.type:  # 1 for a float knob would be the schema's "1", not "1.0"
            raise ValueError(f"knob {self.name}: its default {default!r} is not of type {self.type.__name__}")
        bounds: dict[str, tuple[Callable[[Any, Any], bool], float | None]] = {
            ">=": (operator.ge, self.ge),
            ">": (operator.gt, self.gt),
            "<=": (operator.le, self.le),
            "<": (operator.lt, self.lt),
        }
        for sign, (holds, bound) in bounds.items():
            if bound is not None and not holds(default, bound):
                raise ValueError(f"knob {self.name}: its default {default!r} is not {sign} {bound}")

    def read(self, settings: object) -> T:
        """This knob's value in ``settings``: a ``StrategyConfig``, or anything with the knob as an attribute."""
        value = getattr(settings, self.name)
        if isinstance(value, self.type):
            return value
        raise TypeError(f"knob {self.name}: {value!r} is not of type {self.type.__name__}")


@dataclass(frozen=True)
class Problem:
    """A configuration mistake: ``field`` is relative to the strategy's (or the plug-in list's) place."""

    field: str
    message: str
