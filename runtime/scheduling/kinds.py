"""The words scorers and filters declare themselves with, and the shape of a configuration mistake."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Category(StrEnum):
    """Which way a scorer pulls. Affinity scores (prefix, session) count only on endpoints under the
    load guard, so a hot prefix cannot pile onto an overloaded replica; distribution scores always count."""

    AFFINITY = "affinity"
    DISTRIBUTION = "distribution"


class Need(StrEnum):
    """What a scorer reads beyond the endpoints' own counters; a front end fills only what is needed."""

    PROMPT = "prompt"  # the text a prefix cache sees first (costs a parse of the body)
    SESSION = "session"  # the session key header
    ENGINE_STATS = "engine_stats"  # engine queue / KV usage, from the health feed or a probe
    ADAPTER = "adapter"  # which replicas hold the LoRA adapter a request asks for
    PROMPT_BLOCKS = "prompt_blocks"  # the engines' block hashes of the prompt, and their KV-event view


class Report(StrEnum):
    """What a scorer reports for metrics (``Scorer.report``)."""

    INDEX_ENTRIES = "index_entries"  # entries in a bounded index (prefix blocks, sessions)
    HIT_RATE = "hit_rate"  # share of lookups that found an endpoint


@dataclass(frozen=True)
class Problem:
    """A configuration mistake: ``field`` is relative to the strategy's (or the plug-in list's) place."""

    field: str
    message: str
