"""Routing strategies: one module each, every module exposes ``build(StrategyConfig) -> Strategy``."""

from __future__ import annotations

from collections.abc import Callable

from runtime.config import Strategy as StrategyName
from runtime.config import StrategyConfig
from runtime.router.strategies import (
    kv_aware,
    least_latency,
    least_load,
    power_of_two,
    prefix_aware,
    round_robin,
    session,
    weighted,
)
from runtime.router.strategies.base import Context, Strategy

BUILDERS: dict[StrategyName, Callable[[StrategyConfig], Strategy]] = {
    StrategyName.ROUND_ROBIN: round_robin.build,
    StrategyName.LEAST_LOAD: least_load.build,
    StrategyName.LEAST_LATENCY: least_latency.build,
    StrategyName.WEIGHTED: weighted.build,
    StrategyName.POWER_OF_TWO: power_of_two.build,
    StrategyName.SESSION: session.build,
    StrategyName.PREFIX_AWARE: prefix_aware.build,
    StrategyName.KV_AWARE: kv_aware.build,
}


def build(cfg: StrategyConfig) -> Strategy:
    return BUILDERS[cfg.name](cfg)


__all__ = ["BUILDERS", "Context", "Strategy", "build"]
