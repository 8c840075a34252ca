"""Property tests for every strategy: pure functions of replicas and request, no network."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import StrategyConfig
from runtime.router.replicas import Breaker, Circuit, Replica
from runtime.scheduling import PRESETS, Context, Report, build
from runtime.scheduling.lru import BoundedLru
from runtime.scheduling.scorers.prefix import PrefixScorer, block_hashes, within_bound

replica = st.fixed_dictionaries(
    {
        "inflight": st.integers(0, 8),
        "cap": st.integers(1, 8),
        "healthy": st.booleans(),
        "open": st.booleans(),
        "queued": st.floats(0, 20),
        "kv": st.one_of(st.none(), st.floats(0, 1)),
        "ttft": st.one_of(st.none(), st.floats(0.001, 5)),
        "weight": st.floats(0.1, 5),
    }
)


def make_replicas(specs: list[dict]) -> list[Replica]:
    out = []
    for i, s in enumerate(specs):
        breaker = Breaker(1, 60.0)
        if s["open"]:
            breaker.on_failure(now=0.0)
        b = Replica(f"http://10.0.0.{i}:8000", s["cap"], breaker, s["weight"])
        b.inflight = min(s["inflight"], s["cap"] + 1)
        b.healthy = s["healthy"]
        b.engine_queued = s["queued"]
        b.kv_usage = s["kv"]
        b.ttft_ewma_s = s["ttft"]
        out.append(b)
    return out


def eligible(b: Replica, ctx: Context) -> bool:
    return b.healthy and b.inflight < b.cap and b.breaker.allows(ctx.now) and b.url not in ctx.exclude


@pytest.mark.parametrize("name", list(PRESETS))
@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(replica, max_size=6), prompt=st.text(max_size=600), session=st.one_of(st.none(), st.text())
)
def test_only_eligible_replicas_are_picked(name: str, specs, prompt, session) -> None:
    strategy = build(StrategyConfig(name=name, prefix_block_tokens=4, prefix_chars_per_token=1))
    replicas = make_replicas(specs)
    ctx = Context(model="m", prompt=prompt, session=session, now=1.0)
    picked = strategy.pick(replicas, ctx)
    if any(eligible(b, ctx) for b in replicas):
        assert picked is not None and eligible(picked, ctx)
        strategy.on_routed(picked, ctx)
    else:
        assert picked is None


def test_every_preset_builds_with_default_knobs() -> None:
    for name in PRESETS:
        assert build(StrategyConfig(name=name)).name == name


@settings(max_examples=100, deadline=None)
@given(prompts=st.lists(st.text(min_size=40, max_size=200), min_size=1, max_size=10))
def test_prefix_aware_sends_equal_prefixes_to_the_same_replica_under_the_load_bound(prompts) -> None:
    cfg = StrategyConfig(
        name="prefix_aware", prefix_block_tokens=4, prefix_chars_per_token=4, load_guard_ratio=0.5
    )
    strategy = build(cfg)
    replicas = make_replicas([{**_idle(), "cap": 100} for _ in range(4)])
    first: dict[str, str] = {}
    tagged = [f"{i:015d}|{p}" for i, p in enumerate(prompts)]  # distinct first blocks: none extends another
    for prompt in tagged * 3:
        ctx = Context(model="m", prompt=prompt, now=1.0)
        b = strategy.pick(replicas, ctx)
        assert b is not None
        strategy.on_routed(b, ctx)
        b.inflight += 1  # load grows, but stays under the guard (at most 30 of 100)
        assert first.setdefault(prompt, b.url) == b.url


def test_prefix_load_guard_moves_a_hot_prefix_off_an_overloaded_replica() -> None:
    strategy = build(StrategyConfig(name="prefix_aware", prefix_block_tokens=4, load_guard_ratio=0.5))
    replicas = make_replicas([{**_idle(), "cap": 10} for _ in range(2)])
    prompt = "system prompt " * 20
    ctx = Context(model="m", prompt=prompt, now=1.0)
    home = strategy.pick(replicas, ctx)
    assert home is not None
    strategy.on_routed(home, ctx)
    home.inflight = 6  # above the guard (0.5 x 10)
    other = strategy.pick(replicas, Context(model="m", prompt=prompt, now=1.0))
    assert other is not None and other is not home


@settings(max_examples=50, deadline=None)
@given(bound=st.integers(1, 50), prompts=st.lists(st.text(min_size=0, max_size=400), max_size=40))
def test_prefix_index_never_exceeds_its_bound(bound, prompts) -> None:
    cfg = StrategyConfig(
        name="prefix_aware",
        prefix_block_tokens=2,
        prefix_chars_per_token=2,
        prefix_index_max_entries=bound,
    )
    strategy = build(cfg)
    replicas = make_replicas([{**_idle(), "cap": 1000} for _ in range(3)])
    for p in prompts:
        ctx = Context(model="m", prompt=p, now=1.0)
        b = strategy.pick(replicas, ctx)
        assert b is not None
        strategy.on_routed(b, ctx)
        assert strategy.reports()["prefix"][Report.INDEX_ENTRIES] <= bound


def test_block_hashes_chain_and_bound() -> None:
    a = block_hashes("abcdefgh", 4, 10)
    b = block_hashes("abcdXXXX", 4, 10)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert block_hashes("abcdefgh" * 100, 4, 3) == block_hashes("abcdefgh" * 2 + "abcd", 4, 3)
    assert block_hashes("abc", 4, 10) == []


def test_session_affinity_and_fallback_when_the_replica_leaves() -> None:
    strategy = build(StrategyConfig(name="session"))
    replicas = make_replicas([_idle() for _ in range(3)])
    ctx = Context(model="m", session="user-1", now=1.0)
    home = strategy.pick(replicas, ctx)
    assert home is not None
    strategy.on_routed(home, ctx)
    for _ in range(10):
        c = Context(model="m", session="user-1", now=1.0)
        assert strategy.pick(replicas, c) is home
    rest = [b for b in replicas if b is not home]
    moved = strategy.pick(rest, Context(model="m", session="user-1", now=1.0))
    assert moved in rest


def test_round_robin_cycles_evenly() -> None:
    strategy = build(StrategyConfig(name="round_robin"))
    replicas = make_replicas([_idle() for _ in range(3)])
    picks = [strategy.pick(replicas, Context(model="m", now=1.0)) for _ in range(9)]
    assert all(picks.count(b) == 3 for b in replicas)


@settings(max_examples=100, deadline=None)
@given(specs=st.lists(replica, min_size=1, max_size=6), n=st.integers(1, 20))
def test_prefix_aware_routes_traffic_with_nothing_in_common_as_least_load_does(specs, n) -> None:
    """With no prefix shared, ``prefix_aware`` makes ``least_load``'s decision (ties aside): on the
    routing benchmark's control workload any TTFT difference between the two is noise (bench/README.md)."""
    strategy = build(StrategyConfig(name="prefix_aware", prefix_block_tokens=4, prefix_chars_per_token=1))
    replicas = make_replicas(specs)
    for i in range(n):
        ctx = Context(model="m", prompt=f"{i:04d}" + "x" * 28, now=1.0)  # a first block no one else has
        ok = [b for b in replicas if eligible(b, ctx)]
        picked = strategy.pick(replicas, ctx)
        if not ok:
            assert picked is None
            continue
        assert picked is not None
        assert picked.inflight + picked.engine_queued == min(b.inflight + b.engine_queued for b in ok)
        strategy.on_routed(picked, ctx)


def test_least_load_and_least_latency_and_kv() -> None:
    replicas = make_replicas([_idle() for _ in range(3)])
    replicas[0].inflight, replicas[1].inflight, replicas[2].inflight = 3, 1, 2
    assert build(StrategyConfig(name="least_load")).pick(replicas, Context("m", now=1.0)) is replicas[1]
    replicas[0].ttft_ewma_s, replicas[1].ttft_ewma_s, replicas[2].ttft_ewma_s = 0.5, 0.9, 0.1
    assert build(StrategyConfig(name="least_latency")).pick(replicas, Context("m", now=1.0)) is replicas[2]
    for b in replicas:
        b.inflight = 0
    replicas[0].kv_usage, replicas[1].kv_usage, replicas[2].kv_usage = 0.9, 0.1, 0.5
    assert build(StrategyConfig(name="kv_aware")).pick(replicas, Context("m", now=1.0)) is replicas[1]


def test_weighted_blends_from_config_and_rejects_unknown_scorers() -> None:
    replicas = make_replicas([_idle() for _ in range(2)])
    replicas[0].weight, replicas[1].weight = 1.0, 3.0
    s = build(StrategyConfig(name="weighted", weights={"weight": 1.0}))
    assert s.pick(replicas, Context("m", now=1.0)) is replicas[1]
    with pytest.raises(ValueError, match="unknown scorer 'vibes'"):
        build(StrategyConfig(name="weighted", weights={"vibes": 1.0}))


def test_power_of_two_picks_the_lighter_of_its_sample() -> None:
    replicas = make_replicas([_idle() for _ in range(5)])
    for i, b in enumerate(replicas):
        b.inflight = i
    s = build(StrategyConfig(name="power_of_two"))
    s.filters[1].rng = random.Random(1)  # type: ignore[attr-defined]
    picks = [s.pick(replicas, Context("m", now=1.0)) for _ in range(200)]
    assert replicas[4] not in picks  # the busiest replica always loses its pairing


def test_breaker_half_open_allows_one_trial() -> None:
    br = Breaker(2, open_s=5.0)
    br.on_failure(0.0)
    assert br.state is Circuit.CLOSED
    br.on_failure(0.0)
    assert br.state is Circuit.OPEN and not br.allows(1.0)
    assert br.allows(6.0)
    br.on_start(6.0)
    assert br.state is Circuit.HALF_OPEN and not br.allows(6.0)
    br.on_failure(6.1)
    assert br.state is Circuit.OPEN
    br.on_start(12.0)
    br.on_abandon()  # the trial's client left: another request may try
    assert br.state is Circuit.HALF_OPEN and br.allows(12.0)
    br.on_start(12.0)
    br.on_success()
    assert br.state is Circuit.CLOSED and br.allows(12.0)


def test_bounded_lru_evicts_oldest() -> None:
    lru: BoundedLru[int, str] = BoundedLru(2)
    lru.put(1, "a")
    lru.put(2, "b")
    assert lru.get(1) == "a"
    lru.put(3, "c")
    assert 2 not in lru and 1 in lru and len(lru) == 2 and lru.evictions == 1


def _idle() -> dict:
    return {
        "inflight": 0,
        "cap": 10,
        "healthy": True,
        "open": False,
        "queued": 0.0,
        "kv": None,
        "ttft": None,
        "weight": 1.0,
    }


def test_prefix_held_by_two_replicas_goes_to_the_holder_that_started_fewer() -> None:
    strategy = build(StrategyConfig(name="prefix_aware", prefix_block_tokens=4, prefix_chars_per_token=1))
    a, b, c = make_replicas([{**_idle(), "cap": 100} for _ in range(3)])
    system = "shared system prompt " * 4
    for home, question in ((a, "question one"), (b, "question two")):  # the prompt was served by a, then b
        _route(strategy, [a, b, c], system + question, to=home)
    # one conversation each: a (the first holder) is within the bound; requests in flight do not count
    a.inflight = 5
    assert strategy.pick([a, b, c], Context(model="m", prompt=system + "another", now=1.0)) is a
    # a has started 3 conversations, b 1, c none: b, a holder within ceil(1.2 x 5 / 3) = 2, takes it;
    # c started fewer but does not hold the prompt, and b is not over the bound
    for i in range(2):
        _route(strategy, [a, b, c], f"{system}more {i}", to=a)
    assert strategy.pick([a, b, c], Context(model="m", prompt=system + "another", now=1.0)) is b
    # a conversation's own history still wins: its deeper prefix lives on a only
    history = system + "question one; answer one; question two"
    _route(strategy, [a, b, c], history, to=a)
    assert strategy.pick([a, b, c], Context(model="m", prompt=history + "; answer two", now=1.0)) is a


SYSTEM = "You are a helpful assistant of the routing team. " * 6


def _chat(*turns: str) -> str:
    """A chat prompt as the router sees it (``prompt_text``): the system prompt, then the turns."""
    return "\x1e".join(["system", SYSTEM, *turns])


def _route(strategy, replicas, prompt: str, to: Replica | None = None) -> Replica:
    ctx = Context(model="m", prompt=prompt, now=1.0)
    picked = strategy.pick(replicas, ctx)
    assert picked is not None
    strategy.on_routed(to or picked, ctx)
    return to or picked


def test_prefix_new_session_on_a_shared_prompt_goes_to_the_less_loaded_replica() -> None:
    """Load, for placing a new conversation, is how many conversations a replica started lately: its
    follow-ups will come back to it, though most of them are between turns (not in flight) now."""
    strategy = build(StrategyConfig(name="prefix_aware", prefix_block_tokens=4))
    a, b = make_replicas([{**_idle(), "cap": 64} for _ in range(2)])
    # conversations started on a and b; the system prompt is a shared prefix (a branch point) held by a
    _route(strategy, [a, b], _chat("user", "conversation 1, first question"), to=a)
    _route(strategy, [a, b], _chat("user", "conversation 2, first question"), to=a)
    _route(strategy, [a, b], "\x1e".join(["user", "another conversation without the system prompt"]), to=b)
    new = _chat("user", "conversation 3, first question")
    # a started 2, b 1: a stays within the bound (3 <= ceil(1.2 x 4 / 2)) and keeps its prompt
    assert strategy.pick([a, b], Context(model="m", prompt=new, now=1.0)) is a
    _route(strategy, [a, b], _chat("user", "conversation 4, first question"), to=a)
    # a started 3, b 1: clearly more (4 > ceil(1.2 x 5 / 2)); b takes it and copies the prompt
    assert strategy.pick([a, b], Context(model="m", prompt=new, now=1.0)) is b
    scorer = strategy.scorers[0][0]
    assert scorer.spilled == 1  # type: ignore[attr-defined]
    # started conversations fade with the window: much later, a's count no longer holds it back
    assert strategy.pick([a, b], Context(model="m", prompt=new, now=1000.0)) is a


def test_prefix_new_conversations_balance_whatever_the_prompts_popularity() -> None:
    """One hot system prompt and a cold one: conversations split evenly, and a prompt is copied only
    when its holder is over the bound (sticky follow-ups would otherwise follow the popularity)."""
    strategy = build(StrategyConfig(name="prefix_aware", prefix_block_tokens=4))
    a, b = make_replicas([{**_idle(), "cap": 64} for _ in range(2)])
    rng = random.Random(3)
    homes: dict[str, Replica] = {}
    for i in range(200):
        system = "hot system prompt. " * 8 if rng.random() < 0.8 else "cold system prompt. " * 8
        prompt = "\x1e".join(["system", system, "user", f"conversation {i}: a first question"])
        homes[prompt] = _route(strategy, [a, b], prompt)
    counts = [sum(1 for h in homes.values() if h is x) for x in (a, b)]
    assert max(counts) <= 0.6 * sum(counts)  # the bound: ceil(1.2 x the average of two)


def test_prefix_follow_up_stays_home_under_imbalance_until_the_load_guard() -> None:
    strategy = build(StrategyConfig(name="prefix_aware", prefix_block_tokens=4, load_guard_ratio=0.8))
    a, b = make_replicas([{**_idle(), "cap": 10} for _ in range(2)])
    turn1 = _chat("user", "first conversation, first question")
    _route(strategy, [a, b], turn1, to=a)
    _route(strategy, [a, b], _chat("user", "second conversation, first question"), to=b)  # b holds SYSTEM too
    turn2 = _chat("user", "first conversation, first question", "assistant", "an answer", "user", "more?")
    a.inflight, b.inflight = 6, 1  # a follow-up stays home under an imbalance of requests in flight
    assert strategy.pick([a, b], Context(model="m", prompt=turn2, now=1.0)) is a
    assert strategy.scorers[0][0].followups == 1  # type: ignore[attr-defined]
    a.inflight = 9  # past the guard (0.8 x 10): even a conversation's history moves
    assert strategy.pick([a, b], Context(model="m", prompt=turn2, now=1.0)) is b


def test_prefix_match_kind_is_told_by_the_index_tree() -> None:
    """A match ending at a leaf (nothing continued it) is a follow-up; at a branch point, shared."""
    strategy = build(StrategyConfig(name="prefix_aware", prefix_block_tokens=4))
    scorer = strategy.scorers[0][0]
    a, b = make_replicas([{**_idle(), "cap": 64} for _ in range(2)])
    _route(strategy, [a, b], _chat("user", "one: what is the capital of France, and why there?"), to=a)
    strategy.pick(
        [a, b],
        Context(model="m", prompt=_chat("user", "two: how do I sort a list of tuples in Python?"), now=1.0),
    )
    assert (scorer.shared, scorer.followups) == (1, 0)  # type: ignore[attr-defined]
    strategy.pick(
        [a, b],
        Context(
            model="m", prompt=_chat("user", "one: what is the capital of France, and why there?!"), now=1.0
        ),
    )
    assert (scorer.shared, scorer.followups) == (1, 1)  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 40), min_size=1, max_size=6), factor=st.floats(1.0, 3.0))
def test_bounded_load_admits_the_least_loaded_replica(loads, factor) -> None:
    total = float(sum(loads))
    assert within_bound(min(loads), total, len(loads), factor)  # someone can always take the request
    for load in loads:  # and the bound is monotone in the load
        if within_bound(load, total, len(loads), factor):
            assert all(within_bound(x, total, len(loads), factor) for x in loads if x <= load)


def test_adapter_aware_prefers_a_replica_holding_the_adapter_until_the_load_guard() -> None:
    strategy = build(StrategyConfig(name="adapter_aware", load_guard_ratio=0.5))
    replicas = make_replicas([{**_idle(), "cap": 10} for _ in range(3)])
    warm = replicas[2]
    warm.inflight = 3  # busier than the others, but under the guard: affinity (2) beats load (1)
    ctx = Context(model="m", now=1.0, adapter="sql", warm=frozenset({warm.url}))
    assert strategy.pick(replicas, ctx) is warm
    warm.inflight = 6  # past the guard: the adapter is loaded elsewhere instead of piling on
    assert strategy.pick(replicas, ctx) is not warm
    base = Context(model="m", now=1.0)  # base-model requests: plain least load
    assert strategy.pick(replicas, base) is not warm


def test_prefix_counts_of_started_conversations_decay_and_forget_departed_replicas() -> None:
    """The decayed counts the bounded-load rule reads: e^-1 after one window, unchanged by the epoch moving
    (once per window, in O(replicas) amortised over the window), and a replica that started nothing for
    long is forgotten then."""
    scorer = PrefixScorer(256, 8, 1000, 1.2, window_s=10.0)
    scorer._count_start("a", 100.0)
    scorer._count_start("a", 100.0)
    scorer._count_start("b", 105.0)
    assert scorer.started("a", 110.0) == pytest.approx(2 * math.exp(-1.0))
    assert scorer.started("b", 110.0) == pytest.approx(math.exp(-0.5))
    scorer._count_start("b", 110.0)  # a window since the epoch: it moves to 110, values unchanged
    assert scorer.epoch == 110.0
    assert scorer.started("a", 120.0) == pytest.approx(2 * math.exp(-2.0))
    assert scorer.started("b", 120.0) == pytest.approx((math.exp(-0.5) + 1) * math.exp(-1.0))
    scorer._count_start("b", 200.0)  # "a" decayed below 0.01 conversations: forgotten
    assert "a" not in scorer.grown
    assert scorer.started("a", 200.0) == 0.0
    assert scorer.started("b", 100_000.0) == 0.0  # no overflow after a long idle gap
    scorer._count_start("b", 100_000.0)
    assert scorer.started("b", 100_000.0) == pytest.approx(1.0)
