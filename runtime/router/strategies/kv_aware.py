"""``kv_aware``: a load balancer that counts memory, not requests. It prefers the replica with the most
free KV cache (the health monitor's feed, or the router's own probe of ``/metrics``), then fewer
requests in flight (plus the engine's own queue).

What it is for: traffic whose requests differ widely in length (long documents beside short chats),
where two replicas with the same number of requests in flight can be far apart in KV memory and the
fuller one is the one that will preempt or queue. It does not know where prefixes are cached, so on
shared-prefix traffic it hits the cache like round robin does: use ``prefix_aware`` there.

KV usage arrives with the feed's period (500 ms to 2 s), so it only decides when the replicas are
far apart (weight 2 against 1: more than half the cache); in-flight requests, which the router counts
itself and are never stale, decide the rest. The engine's queue is part of the load score already;
a separate queue scorer would count the same stale signal twice.
"""

from __future__ import annotations

from runtime.config import StrategyConfig
from runtime.router.strategies.base import Strategy
from runtime.router.strategies.scorers import KvScorer, LoadScorer

DEFAULT_WEIGHTS = {"kv": 2.0, "load": 1.0}


def build(cfg: StrategyConfig) -> Strategy:
    w = {**DEFAULT_WEIGHTS, **cfg.weights}
    return Strategy("kv_aware", [(KvScorer(), w["kv"]), (LoadScorer(), w["load"])])
