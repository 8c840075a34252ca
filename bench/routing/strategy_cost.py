"""CPU cost of a routing decision: ``pick`` + ``on_routed`` per request, on the shared workload's prompts.

    .venv/bin/python -m bench.routing.strategy_cost          # a few seconds; no engines, no network

The prompts are the routing benchmark's (seed 7: 384 chat requests of ~7,000 characters as the router
sees them), sent in arrival order to two replicas whose in-flight counts change as they would; each
strategy is rebuilt per repeat so its index starts empty, as in a run. The router's budget is ~120 us
per request in all; prefix hashing is the hot part of ``prefix_aware``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.routing import workload as wl
from runtime.config import StrategyConfig
from runtime.router.payload import prompt_text
from runtime.router.replicas import Breaker, Replica
from runtime.scheduling import Context, build


def prompts(seed: int) -> list[str]:
    work = wl.shared(seed)
    turns = [(s.start_s + 0.8 * k, t) for s in work.sessions for k, t in enumerate(s.turns)]
    return [prompt_text({"messages": t.messages}) for _, t in sorted(turns, key=lambda x: x[0])]


def cost_us(name: str, texts: list[str]) -> float:
    strategy = build(StrategyConfig(name=name))
    backends = [Replica(f"http://127.0.0.1:{9000 + i}", 64, Breaker(5, 1.0)) for i in range(2)]
    started = time.perf_counter()
    for j, text in enumerate(texts):
        backends[j % 2].inflight = j % 5
        ctx = Context(model="m", prompt=text, now=float(j) / 20)
        picked = strategy.pick(backends, ctx)
        assert picked is not None
        strategy.on_routed(picked, ctx)
    return (time.perf_counter() - started) / len(texts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    texts = prompts(args.seed)
    print(f"{len(texts)} prompts, {statistics.mean(map(len, texts)):.0f} characters on average")
    for name in ("round_robin", "least_load", "prefix_aware", "kv_aware"):
        samples = [cost_us(name, texts) for _ in range(args.repeat)]
        print(
            f"{name:14s} min {min(samples):6.1f} us  median {statistics.median(samples):6.1f} us per request"
        )


if __name__ == "__main__":
    main()
