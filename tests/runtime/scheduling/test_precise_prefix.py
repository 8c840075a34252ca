"""``precise_prefix``: scores are the share of the prompt's blocks each replica's engine holds (its KV
events), the routed-history index stands in for replicas without events, and every router replica that
follows the same events makes the same choice."""

from __future__ import annotations

from runtime.config import StrategyConfig
from runtime.kvcache.events import Stored
from runtime.kvcache.view import CacheIndex
from runtime.router.replicas import Breaker, Replica
from runtime.scheduling import Context, Need, Report, build
from runtime.scheduling.scorers.precise_prefix import PrecisePrefixScorer


def replicas(n: int) -> list[Replica]:
    return [Replica(f"http://10.0.0.{i}:8000", 8, Breaker(5, 1.0)) for i in range(n)]


def view(held: dict[str, tuple[int, ...]]) -> CacheIndex:
    index = CacheIndex(1000)
    for url, hashes in held.items():
        index.synced.add(url)
        index.apply(url, [Stored(hashes, None, 16)])
    return index


def test_the_score_is_the_share_of_leading_blocks_held() -> None:
    b = replicas(3)
    scorer = PrecisePrefixScorer.from_knobs(StrategyConfig())
    index = view({b[0].url: (1, 2, 3, 4), b[1].url: (1, 2), b[2].url: ()})
    ctx = Context(model="m", prompt_blocks=[1, 2, 3, 4], cache=index)
    assert scorer.score(b, ctx) == [1.0, 0.5, 0.0]
    assert scorer.report() == {Report.HIT_RATE: 1.0}


def test_replicas_without_events_are_scored_by_the_routed_history() -> None:
    b = replicas(2)
    scorer = PrecisePrefixScorer.from_knobs(StrategyConfig(prefix_block_tokens=1, prefix_chars_per_token=4))
    index = view({b[0].url: (7,)})  # b[1] has no event stream
    prompt = "a shared system prompt, long enough for a few blocks"
    first = Context(model="m", prompt=prompt, prompt_blocks=[9], cache=index)
    scorer.score(b, first)
    scorer.on_routed(b[1], first)  # the history learns where it went
    again = Context(model="m", prompt=prompt, prompt_blocks=[9], cache=index)
    assert scorer.score(b, again) == [0.0, 1.0]
    without_blocks = Context(model="m", prompt=prompt)  # the prompt could not be tokenized exactly
    assert scorer.score(b, without_blocks) == [0.0, 1.0]


def test_router_replicas_following_the_same_events_choose_alike() -> None:
    # three routers, each with its own strategy object, one shared truth (the engines' events)
    b = replicas(3)
    index = view({b[1].url: (1, 2, 3, 4, 5, 6)})
    routers = [build(StrategyConfig(name="precise_prefix")) for _ in range(3)]
    picks = {
        routers[i % 3].pick(b, Context(model="m", prompt_blocks=[1, 2, 3, 4, 5, 6, 7], cache=index)).url
        for i in range(9)
    }
    assert picks == {b[1].url}


def test_the_preset_needs_the_prompt_blocks() -> None:
    strategy = build(StrategyConfig(name="precise_prefix"))
    assert Need.PROMPT_BLOCKS in strategy.needs and Need.PROMPT in strategy.needs
