"""``weighted``: any blend of the shared scorers, weights from config (``load``, ``latency``, ``kv``,
``queue``, ``weight``). Without weights: load 1, latency 1."""

from __future__ import annotations

from runtime.config import StrategyConfig
from runtime.router.strategies.base import Scorer, Strategy
from runtime.router.strategies.scorers import KvScorer, LatencyScorer, LoadScorer, QueueScorer, WeightScorer

SCORERS: dict[str, type[Scorer]] = {
    "load": LoadScorer,
    "latency": LatencyScorer,
    "kv": KvScorer,
    "queue": QueueScorer,
    "weight": WeightScorer,
}
DEFAULT_WEIGHTS = {"load": 1.0, "latency": 1.0}


def build(cfg: StrategyConfig) -> Strategy:
    weights = cfg.weights or DEFAULT_WEIGHTS
    unknown = sorted(set(weights) - set(SCORERS))
    if unknown:
        raise ValueError(f"weighted strategy: unknown scorers {unknown}; known: {sorted(SCORERS)}")
    return Strategy("weighted", [(SCORERS[name](), w) for name, w in weights.items()])
