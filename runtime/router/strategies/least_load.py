"""``least_load``: fewest in-flight requests plus engine queue."""

from __future__ import annotations

from runtime.config import StrategyConfig
from runtime.router.strategies.base import Strategy
from runtime.router.strategies.scorers import LoadScorer


def build(cfg: StrategyConfig) -> Strategy:
    return Strategy("least_load", [(LoadScorer(), 1.0)])
