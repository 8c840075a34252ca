"""A model served in versions, through the router with engine doubles: split by weight, sticky sessions,
listed once, per-version metrics, a failed canary request retried on the stable version, a rollback
from the health monitor's feed."""

from __future__ import annotations

import http.client
import json
import time

from runtime.fleet_feed import read_feed
from runtime.router.signals import apply_version_weights
from runtime.versions import Split
from tests.runtime.router.harness import RouterUnderTest, router_cfg

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}


def _versions(stable: str, canary: str, weights: tuple[int, int] = (90, 10)) -> list[dict]:
    return [
        {
            "name": f"chat-{v}",
            "static_backends": [{"url": url}],
            "version_of": {"model": "chat", "version": v, "weight": w, "stable": v == "v1"},
        }
        for v, url, w in (("v1", stable, weights[0]), ("v2", canary, weights[1]))
    ]


def test_requests_split_by_weight_and_the_model_is_listed_once(doubles, make_router) -> None:
    stable, canary = doubles(2)
    r = make_router([], models=_versions(stable.url, canary.url))
    for _ in range(200):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert (len(stable.requests), len(canary.requests)) == (180, 20)
    assert canary.requests[0]["body"]["model"] == "chat"  # the engine serves the model's name
    models = json.loads(r.request("GET", "/v1/models")[2])["data"]
    assert [m["id"] for m in models] == ["chat"]
    text = r.metrics()
    assert 'inferstack_router_version_requests_total{model="chat",status="200",version="v2"} 20.0' in text
    assert 'inferstack_router_version_requests_total{model="chat",status="200",version="v1"} 180.0' in text
    assert 'inferstack_router_version_weight{model="chat",version="v2"} 10.0' in text
    assert 'inferstack_router_version_ttft_seconds_count{model="chat",version="v2"} 20.0' in text
    assert (
        'inferstack_router_requests_total{backend="' + canary.url + '",model="chat-v2",status="200"} 20.0'
        in text
    )


def test_a_session_stays_on_one_version(doubles, make_router) -> None:
    stable, canary = doubles(2)
    r = make_router([], models=_versions(stable.url, canary.url, (50, 50)))
    for i in range(20):
        for _ in range(3):
            r.request("POST", "/v1/chat/completions", CHAT, headers={"x-session-id": f"s{i}"})
    sessions = {d.name: {req["headers"]["x-session-id"] for req in d.requests} for d in (stable, canary)}
    assert sessions["d0"] and sessions["d1"] and not sessions["d0"] & sessions["d1"]


def test_a_failing_canary_loses_no_request_its_retries_go_to_stable(doubles, make_router) -> None:
    stable, canary = doubles(2)
    canary.mode = "503"
    r = make_router([], models=_versions(stable.url, canary.url, (50, 50)), breaker_failures=1000)
    statuses = [r.request("POST", "/v1/chat/completions", CHAT)[0] for _ in range(40)]
    assert statuses == [200] * 40
    assert len(canary.requests) == 20 and len(stable.requests) == 40
    text = r.metrics()
    assert 'inferstack_router_version_requests_total{model="chat",status="503",version="v2"} 20.0' in text


def test_a_rollback_in_the_health_feed_sends_everything_to_stable(doubles, make_router) -> None:
    stable, canary = doubles(2)
    r = make_router([], models=_versions(stable.url, canary.url))
    feed = read_feed(
        {
            "generated_at": time.time(),
            "backends": [],
            "versions": [{"model": "chat", "weights": {"v1": 100, "v2": 0}, "reason": "x"}],
        },
        time.time(),
    )
    assert feed is not None
    r.call(lambda: apply_version_weights(r.router.fleet.splits, feed))
    for _ in range(50):
        r.request("POST", "/v1/chat/completions", CHAT)
    assert len(canary.requests) == 0 and len(stable.requests) == 50
    assert 'inferstack_router_version_weight{model="chat",version="v2"} 0.0' in r.metrics()


def test_a_version_is_not_reachable_by_its_target_name(doubles, make_router) -> None:
    stable, canary = doubles(2)
    r = make_router([], models=_versions(stable.url, canary.url))
    status, _, body = r.request("POST", "/v1/chat/completions", {**CHAT, "model": "chat-v2"})
    assert status == 404 and b"served: chat" in body


def test_a_canary_answering_500_is_retried_on_stable_but_a_stable_500_reaches_the_client(
    doubles, make_router
) -> None:
    stable, canary = doubles(2)
    canary.mode = "500"
    r = make_router([], models=_versions(stable.url, canary.url, (50, 50)), breaker_failures=1000)
    assert [r.request("POST", "/v1/chat/completions", CHAT)[0] for _ in range(10)] == [200] * 10
    assert len(canary.requests) == 5 and len(stable.requests) == 10
    stable.mode = "500"
    canary.mode = "ok"
    statuses = [r.request("POST", "/v1/chat/completions", CHAT)[0] for _ in range(10)]
    assert statuses.count(500) == 5  # the stable version's own errors are the engine's answer, as before


def _canary_sessions(n: int) -> list[str]:
    """Session keys whose public hash lands on the canary of a 90/10 split: what an attacker computes."""
    free = Split("chat", ("v1", "v2"), (90.0, 10.0))
    return [k for k in (f"s{i}" for i in range(5000)) if free.choose(k) == "v2"][:n]


def test_a_client_without_a_key_cannot_fill_a_judged_canary_by_choosing_session_keys(lt, doubles) -> None:
    """Without a key, a fresh canary-bound session key per request used to count as a fresh client each time,
    so one client made up all of the canary's traffic (and its latency tail, which the verdict reads). The
    client is now its address: the X-Forwarded-For entry the trusted proxy wrote, not the forged ones left
    of it. That address gets its first canary request, then the stable version; another address gets its own."""
    stable, canary = doubles(2)
    cfg = router_cfg([], models=_versions(stable.url, canary.url), trusted_proxy_hops=1)
    cfg["health"] = {"canaries": [{"model": "chat"}]}
    r = RouterUnderTest(lt, cfg).start()
    try:
        keys = _canary_sessions(61)
        for i, key in enumerate(keys[:30]):  # a forged entry per request, then the proxy's own
            headers = {"x-session-id": key, "x-forwarded-for": f"10.0.{i}.1, 203.0.113.7"}
            assert r.request("POST", "/v1/chat/completions", CHAT, headers=headers)[0] == 200
        assert (len(canary.requests), len(stable.requests)) == (1, 29)
        headers = {"x-session-id": keys[30], "x-forwarded-for": "198.51.100.9"}
        assert r.request("POST", "/v1/chat/completions", CHAT, headers=headers)[0] == 200
        assert len(canary.requests) == 2
        # a second X-Forwarded-For of the client's own: which copy the proxy appended to is unknown, so the
        # client is the connection's peer (here the test's loopback address), one client however it varies
        for i, key in enumerate(keys[31:61]):
            assert _post_with_two_forwarded_for(r.port, key, "203.0.113.8", f"10.1.{i}.1") == 200
        assert len(canary.requests) == 3
    finally:
        r.stop()


def _post_with_two_forwarded_for(port: int, session: str, first: str, second: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = json.dumps(CHAT).encode()
        conn.putrequest("POST", "/v1/chat/completions")
        for name, value in [
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("x-session-id", session),
            ("x-forwarded-for", first),
            ("x-forwarded-for", second),
        ]:
            conn.putheader(name, value)
        conn.endheaders(body)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()
