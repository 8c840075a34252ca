"""``kv_aware``: prefer replicas with free KV cache and a short engine queue (from the health monitor's
feed, or the router's own probe of ``/metrics``), then fewer in-flight requests."""

from __future__ import annotations

from runtime.config import StrategyConfig
from runtime.router.strategies.base import Strategy
from runtime.router.strategies.scorers import KvScorer, LoadScorer, QueueScorer

DEFAULT_WEIGHTS = {"kv": 2.0, "queue": 1.0, "load": 1.0}


def build(cfg: StrategyConfig) -> Strategy:
    w = {**DEFAULT_WEIGHTS, **cfg.weights}
    return Strategy(
        "kv_aware", [(KvScorer(), w["kv"]), (QueueScorer(), w["queue"]), (LoadScorer(), w["load"])]
    )
