"""API keys (hashes only), model scopes and per-key request/token rate limits."""

from __future__ import annotations

import json

from runtime.api_keys import Bucket, KeyTable, admit, charge_tokens, hash_key
from runtime.config import ApiKey

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _keys() -> list[dict]:
    return [
        {"name": "alice", "sha256": hash_key("sk-alice")},
        {"name": "scoped", "sha256": hash_key("sk-scoped"), "models": ["other"]},
        {"name": "slow", "sha256": hash_key("sk-slow"), "requests_per_minute": 2},
        {"name": "thrifty", "sha256": hash_key("sk-thrifty"), "tokens_per_minute": 5},
    ]


def test_keys_scopes_and_limits_over_http(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url], require_api_key=True, api_keys=_keys())

    def call(key: str | None) -> tuple[int, dict, dict]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, h, body = r.request("POST", "/v1/chat/completions", CHAT, headers)
        return status, h, json.loads(body)

    assert call(None)[0] == 401
    assert call("sk-wrong")[0] == 401
    status, _, body = call("sk-alice")
    assert status == 200
    status, _, body = call("sk-scoped")
    assert status == 403 and body["error"]["type"] == "permission_error"
    assert call("sk-slow")[0] == 200
    assert call("sk-slow")[0] == 200
    status, headers, body = call("sk-slow")
    assert (
        status == 429 and int(headers["retry-after"]) >= 1 and body["error"]["code"] == "rate_limit_exceeded"
    )
    assert call("sk-thrifty")[0] == 200  # usage 5 + 2 = 7 tokens charged: bucket below zero
    assert call("sk-thrifty")[0] == 429
    status, _, _ = r.request("POST", "/v1/chat/completions", CHAT, {"Authorization": "Basic abc"})
    assert status == 401


def test_optional_keys_still_apply_limits_to_known_keys(doubles, make_router) -> None:
    (d,) = doubles(1)
    r = make_router([d.url], require_api_key=False, api_keys=_keys())
    assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200  # anonymous allowed
    assert r.request("POST", "/v1/chat/completions", CHAT, {"Authorization": "Bearer sk-scoped"})[0] == 403


def test_bucket_refills_over_time() -> None:
    b = Bucket(60, now=0.0)
    b.level = 0.0
    assert b.refill(0.5) == 0.5
    assert b.refill(100.0) == 60.0
    b.level = -3.0
    assert b.seconds_until_positive() >= 1.0


def test_key_table_keeps_buckets_across_reload() -> None:
    key = ApiKey(name="a", sha256=hash_key("k"), requests_per_minute=1)
    t1 = KeyTable([key], now=0.0)
    principal = t1.by_hash[key.sha256]
    assert admit(principal, "m", 0.0) is None
    t2 = KeyTable([key], now=1.0, previous=t1)
    assert t2.by_hash[key.sha256] is principal
    denied = admit(t2.by_hash[key.sha256], "m", 1.0)
    assert denied is not None and denied.status == 429
    charge_tokens(None, 10, 0.0)  # anonymous: nothing to charge
