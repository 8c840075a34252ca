"""Versions as pure decisions: the weighted split (exact without a session, sticky with one) and the
canary's verdict against the stable version and the SLO."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from runtime.config import RuntimeConfig
from runtime.versions import MAX_CLIENT_SHARE, Rule, Split, Verdict, Window, judge, rolled_back


def test_without_a_session_the_split_hits_the_weights_exactly() -> None:
    split = Split("chat", ("v1", "v2"), (90.0, 10.0))
    got = Counter(split.choose(None) for _ in range(1000))
    assert got == {"v1": 900, "v2": 100}


def test_a_session_stays_on_its_version_and_more_canary_weight_only_moves_sessions_to_the_canary() -> None:
    split = Split("chat", ("v1", "v2"), (90.0, 10.0))
    sessions = [f"user-{i}" for i in range(2000)]
    first = {s: split.choose(s) for s in sessions}
    assert all(split.choose(s) == v for s, v in first.items())  # sticky
    share = sum(v == "v2" for v in first.values()) / len(sessions)
    assert 0.07 < share < 0.13
    split.set_weights((75.0, 25.0))
    after = {s: split.choose(s) for s in sessions}
    assert not [s for s in sessions if first[s] == "v2" and after[s] == "v1"]  # no canary session goes back
    assert 0.21 < sum(v == "v2" for v in after.values()) / len(sessions) < 0.29


def test_an_unusable_version_gets_nothing_and_none_usable_gives_none() -> None:
    split = Split("chat", ("v1", "v2"), (50.0, 50.0))
    assert {split.choose(None, lambda v: v == "v1") for _ in range(10)} == {"v1"}
    assert split.choose("s", lambda v: v == "v2") == "v2"
    assert split.choose(None, lambda v: False) is None


def test_a_rollback_puts_all_weight_on_stable_and_says_why() -> None:
    split = Split("chat", ("v1", "v2"), (90.0, 10.0))
    assert split.set_weights(rolled_back(split.weights), "canary error rate 100%")
    assert split.weights == (100.0, 0.0) and split.override_reason == "canary error rate 100%"
    assert {split.choose(f"s{i}") for i in range(100)} == {"v1"}
    assert not split.set_weights((100.0, 0.0))  # unchanged


def test_one_client_holds_a_small_share_of_a_judged_canarys_keyed_requests() -> None:
    free = Split("chat", ("v1", "v2"), (90.0, 10.0))
    canary_keys = [k for k in (f"s{i}" for i in range(3000)) if free.choose(k) == "v2"][:60]
    assert {free.choose(k) for k in canary_keys} == {"v2"}  # no canary judged: sessions choose freely
    split = Split("chat", ("v1", "v2"), (90.0, 10.0), client_share=MAX_CLIENT_SHARE)
    got = Counter(split.choose(k, client="attacker") for k in canary_keys[:30])
    assert got == {"v2": 1, "v1": 29}  # its first request goes where its key says; then stable
    for _ in range(1000):  # others' traffic without keys: 100 canary requests, never capped
        split.choose(None)
    others = Counter(split.choose(k, client=k) for k in canary_keys[30:])  # thirty one-request sessions
    assert others == {"v2": 30}
    got = Counter(split.choose(k, client="attacker") for k in canary_keys[:30])
    assert got["v2"] <= MAX_CLIENT_SHARE * 100 + 1


RULE = Rule(
    max_error_rate=0.05,
    max_ttft_ratio=1.5,
    max_inter_token_ratio=1.5,
    ttft_slo_s=2.0,
    min_samples=3,
    min_requests=20,
)
N = {"ttft_samples": 20, "inter_token_samples": 20}  # requests behind the p95s: just enough to judge
GOOD = Window(probes=10, failures=0, ttft_p95_s=0.2, inter_token_p95_s=0.02, routable_replicas=1, **N)


@pytest.mark.parametrize(
    ("canary", "verdict", "metric"),
    [
        (GOOD, Verdict.ADVANCE, ""),
        (Window(probes=2, routable_replicas=1), Verdict.HOLD, ""),
        (Window(probes=10, failures=1, routable_replicas=1), Verdict.ROLLBACK, "error_rate"),
        (Window(probes=4, failures=4, routable_replicas=0), Verdict.ROLLBACK, "routable_replicas"),
        (Window(probes=10, ttft_p95_s=0.4, routable_replicas=1, **N), Verdict.ROLLBACK, "ttft_p95"),
        (
            Window(probes=10, inter_token_p95_s=0.05, routable_replicas=1, **N),
            Verdict.ROLLBACK,
            "inter_token_p95",
        ),
        (Window(probes=10, ttft_p95_s=0.29, routable_replicas=1, **N), Verdict.ADVANCE, ""),
    ],
)
def test_the_canary_verdict(canary: Window, verdict: Verdict, metric: str) -> None:
    d = judge(canary, GOOD, RULE)
    assert (d.verdict, d.metric) == (verdict, metric), d.reason
    if verdict is Verdict.ROLLBACK:
        assert d.reason


def test_the_slo_rolls_back_a_canary_even_when_stable_is_as_slow() -> None:
    slow = Window(probes=10, ttft_p95_s=2.5, routable_replicas=1, **N)
    d = judge(slow, slow, RULE)
    assert d.verdict is Verdict.ROLLBACK and "SLO" in d.reason


def _cfg(weights: tuple[float, float], names: tuple[str, str] = ("chat-v1", "chat-v2")) -> dict:
    return {
        "models": [
            {
                "name": n,
                "static_backends": [{"url": f"http://127.0.0.1:{9000 + i}"}],
                "version_of": {"model": "chat", "version": n.split("-")[1], "weight": w, "stable": i == 0},
            }
            for i, (n, w) in enumerate(zip(names, weights, strict=True))
        ]
    }


def test_the_runtime_config_checks_versions() -> None:
    cfg = RuntimeConfig.model_validate(_cfg((90, 10)))
    assert [t.name for t in cfg.versions()["chat"]] == ["chat-v1", "chat-v2"]
    assert cfg.models[1].served_name == "chat"
    with pytest.raises(ValidationError, match="weights add up to 95"):
        RuntimeConfig.model_validate(_cfg((90, 5)))
    with pytest.raises(ValidationError, match="name it 'chat-v2'"):
        RuntimeConfig.model_validate(_cfg((90, 10), ("chat-v1", "other-v2")))


def test_which_requests_without_a_session_reach_the_canary_cannot_be_told_from_their_order() -> None:
    """With a fixed deal, every tenth request reached a 10 % canary; a client counting its requests made
    exactly those slow, and the canary's latency tail (its verdict) was all its. The deal is shuffled per
    cycle: no position in the cycle holds more than a fair share of the canary's requests, and the weights
    are still hit exactly."""
    split = Split("chat", ("v1", "v2"), (90.0, 10.0), order=random.Random(7))
    picks = [split.choose(None) for _ in range(100 * 50)]
    assert Counter(picks) == {"v1": 4500, "v2": 500}
    canary_at = Counter(i % 10 for i, v in enumerate(picks) if v == "v2")
    assert max(canary_at.values()) < 0.2 * 500  # a fixed deal: all 500 at one position


def test_weights_a_feed_cannot_hold_are_never_installed() -> None:
    """The health monitor's feed is JSON: a NaN or a negative weight would make every request raise, and a
    weight of ten million would deal a cycle that long; neither is installed, and cycles stay short."""
    split = Split("chat", ("v1", "v2"), (90.0, 10.0), order=random.Random(1))
    assert not split.set_weights((float("nan"), 10.0)) and not split.set_weights((-5.0, 10.0))
    assert split.set_weights((1e7, 1.0))
    picks = Counter(split.choose(None) for _ in range(1000))
    assert picks["v1"] >= 990  # dealt from cycles of at most 100
