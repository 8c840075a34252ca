"""The fair queue's order: bands first, then token-weighted shares between tenants (VTC), then arrival."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import ApiKey, Band, Tenant
from runtime.scheduling.fair_queue import (
    BANDS,
    EXPECTED_OUTPUT_TOKENS,
    OTHER_TENANT,
    RANK,
    FairQueue,
    Place,
    TenantTable,
    lowered,
    request_cost,
)


def _serve(q: FairQueue[str], rounds: int, places: dict[str, Place]) -> Counter[str]:
    """Keep every tenant backlogged; pop and charge ``rounds`` times; tokens served per tenant."""
    served: Counter[str] = Counter()
    for name, place in places.items():
        q.push(name, place)
        q.push(name, place)  # two each: a tenant always has one waiting while the other is served
    for _ in range(rounds):
        entry = q.pop()
        assert entry is not None
        q.share.charge(entry.place, entry.place.cost)
        served[entry.item] += entry.place.cost
        q.push(entry.item, entry.place)  # backlogged: another request at once
    return served


def test_a_higher_band_always_goes_first_whatever_the_counters_and_arrival() -> None:
    q: FairQueue[str] = FairQueue()
    q.share.counters["vip"] = 1e9  # served far more than anyone
    q.push("late-best-effort", Place("a", Band.BEST_EFFORT))
    q.push("batch", Place("b", Band.BATCH))
    q.push("standard", Place("c", Band.STANDARD))
    q.push("interactive", Place("vip", Band.INTERACTIVE))
    assert [q.pop().item for _ in range(4)] == ["interactive", "standard", "batch", "late-best-effort"]  # type: ignore[union-attr]
    assert q.pop() is None and len(q) == 0


def test_equal_weights_share_tokens_not_requests() -> None:
    """A tenant of long prompts and one of short chats, both backlogged: each is served the same tokens, so
    the short one gets ~100 requests for each long one."""
    q: FairQueue[str] = FairQueue()
    served = _serve(q, 2000, {"heavy": Place("heavy", cost=1000), "light": Place("light", cost=10)})
    assert abs(served["heavy"] - served["light"]) <= 1000
    assert served["light"] > 0.45 * sum(served.values())


def test_weights_divide_the_tokens_served() -> None:
    q: FairQueue[str] = FairQueue()
    places = {"gold": Place("gold", weight=3.0, cost=100), "tin": Place("tin", weight=1.0, cost=100)}
    served = _serve(q, 4000, places)
    assert 2.9 < served["gold"] / served["tin"] < 3.1


def test_a_tenant_back_from_idle_banks_no_credit() -> None:
    """Served a lot while the other was away, a tenant is not starved when the other comes back with a burst:
    the newcomer's counter is lifted to the waiting tenants' lowest."""
    q: FairQueue[str] = FairQueue()
    q.share.counters.update({"busy": 50_000.0, "away": 0.0})
    q.push("busy-1", Place("busy", cost=100))
    for i in range(5):
        q.push(f"away-{i}", Place("away", cost=100))
    assert q.share.counter("away") == 50_000.0
    order = []
    while (entry := q.pop()) is not None:
        q.share.charge(entry.place, entry.place.cost)
        order.append(entry.item)
    assert order.index("busy-1") <= 1  # not behind the whole burst


def test_the_real_usage_settles_the_charge() -> None:
    q: FairQueue[str] = FairQueue()
    a, b = Place("a", cost=500), Place("b", cost=100)
    q.push("a", a)
    q.push("b", b)
    q.share.charge(a, a.cost)  # each has one request served already
    q.share.charge(b, b.cost)
    assert q.peek().item == "b"  # type: ignore[union-attr]
    q.share.charge(a, 20 - a.cost)  # a's request used 20 tokens, not the 500 expected
    assert q.peek().item == "a"  # type: ignore[union-attr]


def test_fifo_ignores_bands_and_tenants() -> None:
    q: FairQueue[str] = FairQueue(fifo=True)
    q.push("first", Place("x", Band.BEST_EFFORT, cost=10_000))
    q.push("second", Place("y", Band.INTERACTIVE))
    assert [q.pop().item, q.pop().item] == ["first", "second"]  # type: ignore[union-attr]


def test_a_put_back_goes_to_its_own_place_not_the_end() -> None:
    q: FairQueue[str] = FairQueue()
    p = Place("t")
    first = q.push("1", p)
    q.push("2", p)
    assert q.pop() is first
    q.push("1", p, again=first)  # woken, beaten to the slot
    q.push("3", p)
    assert [q.pop().item for _ in range(3)] == ["1", "2", "3"]  # type: ignore[union-attr]


def test_a_header_can_only_lower_the_band() -> None:
    assert lowered(Band.STANDARD, "interactive") is Band.STANDARD
    assert lowered(Band.BATCH, "standard") is Band.BATCH
    assert lowered(Band.STANDARD, "batch") is Band.BATCH
    assert lowered(Band.INTERACTIVE, "best-effort") is Band.BEST_EFFORT
    assert lowered(Band.STANDARD, "urgent!!") is Band.STANDARD
    assert lowered(Band.STANDARD, None) is Band.STANDARD


def test_tenants_come_from_the_config_never_from_the_request() -> None:
    table = TenantTable([Tenant(name="acme", weight=2, band=Band.INTERACTIVE)], Band.BATCH)
    acme_key = ApiKey(name="acme-ci", sha256="0" * 64, tenant="acme")
    own = ApiKey(name="solo", sha256="1" * 64)
    assert table.place(acme_key, None, 7) == Place("acme", Band.INTERACTIVE, 2.0, 7)
    assert table.place(acme_key, "standard", 7).band is Band.STANDARD
    assert table.place(own, "interactive", 7) == Place("solo", Band.BATCH, 1.0, 7)
    assert table.place(None, None, 7).tenant == OTHER_TENANT


def test_the_cost_is_the_prompt_plus_the_expected_output() -> None:
    assert request_cost(100, {"max_tokens": 50, "n": 2}, "chat") == 200
    assert request_cost(100, {}, "chat") == 100 + EXPECTED_OUTPUT_TOKENS
    assert request_cost(100, {"max_tokens": 50}, "embeddings") == 100


PUSHES = st.lists(
    st.tuples(st.sampled_from("abcd"), st.sampled_from(BANDS), st.integers(1, 5000)), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(PUSHES, st.lists(st.booleans(), max_size=120))
def test_any_interleaving_keeps_the_order_invariants(pushes, pops) -> None:
    """Whatever is pushed and popped (and charged): every pop is from the highest band waiting, and within it
    from a tenant whose counter is lowest; a tenant's own requests of a band leave in arrival order; the
    per-line counts add up to the length."""
    q: FairQueue[int] = FairQueue()
    last_seq: dict[tuple[str, Band], int] = {}
    waiting: list[tuple[int, Place]] = []
    todo = list(enumerate(pushes))
    for pop in [*pops, *([True] * (len(pushes) + 1))]:
        if not pop and todo:
            i, (tenant, band, cost) = todo.pop(0)
            place = Place(tenant, band, cost=cost)
            q.push(i, place)
            waiting.append((i, place))
            continue
        if not q:
            if todo:
                continue
            break
        top = min(RANK[p.band] for _, p in waiting)
        low = min(q.share.counter(p.tenant) for _, p in waiting if RANK[p.band] == top)
        entry = q.pop()
        assert entry is not None
        assert RANK[entry.place.band] == top
        assert q.share.counter(entry.place.tenant) == low
        key = (entry.place.tenant, entry.place.band)
        assert entry.item > last_seq.get(key, -1)
        last_seq[key] = entry.item
        waiting.remove((entry.item, entry.place))
        q.share.charge(entry.place, entry.place.cost)
        assert sum(n for _, _, n in q.waiting()) == len(q) == len(waiting)
