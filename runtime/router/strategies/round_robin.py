"""``round_robin``: each eligible replica in turn."""

from __future__ import annotations

from runtime.config import StrategyConfig
from runtime.router.strategies.base import Strategy
from runtime.router.strategies.scorers import RotationScorer


def build(cfg: StrategyConfig) -> Strategy:
    return Strategy("round_robin", [(RotationScorer(), 1.0)])
