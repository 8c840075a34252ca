"""``least_latency``: lowest EWMA of time to first token; load breaks near-ties."""

from __future__ import annotations

from runtime.config import StrategyConfig
from runtime.router.strategies.base import Strategy
from runtime.router.strategies.scorers import LatencyScorer, LoadScorer


def build(cfg: StrategyConfig) -> Strategy:
    return Strategy("least_latency", [(LatencyScorer(), 1.0), (LoadScorer(), 0.1)])
