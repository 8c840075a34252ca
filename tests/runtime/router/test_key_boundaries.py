"""What a key may learn and claim (#34 hardening), over real HTTP against the router: a scoped key's 404 and
model list name only models in its scope, and only the batch service's key may mark a request low priority
(a low-priority refusal is charged to nobody's limit)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.api_keys import hash_key
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg

CHAT = "/v1/chat/completions"


def _bearer(raw: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {raw}"}


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"within {timeout_s:.0f} s: {what}"
        threading.Event().wait(0.01)


def test_a_scoped_key_learns_no_model_outside_its_scope(
    doubles: Callable[..., list[Double]], make_router: Callable[..., RouterUnderTest]
) -> None:
    """The unknown-model 404 listed every served model and adapter, and the model list named an adapter's
    base model, whatever the key's scope."""
    (d,) = doubles(1)
    keys = [
        {"name": "adapter-only", "sha256": hash_key("sk-adapter"), "models": ["sql"]},
        {"name": "all", "sha256": hash_key("sk-all")},
    ]
    models = [
        {
            "name": "base-secret",
            "static_backends": [{"url": d.url}],
            "adapters": [{"name": "sql", "path": "/adapters/sql"}],
        },
        {"name": "other-secret", "static_backends": [{"url": d.url}]},
    ]
    r = make_router([], require_api_key=True, api_keys=keys, models=models)
    ask = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}

    status, _, raw = r.request("POST", CHAT, ask, _bearer("sk-adapter"))
    error = json.loads(raw)["error"]
    assert status == 404 and error["code"] == "model_not_found", raw
    assert error["message"].endswith("served: sql"), error["message"]
    assert "secret" not in error["message"]
    status, _, raw = r.request("GET", "/v1/models", None, _bearer("sk-adapter"))
    assert status == 200
    listed = json.loads(raw)["data"]
    assert [(m["id"], m["parent"]) for m in listed] == [("sql", None)], listed
    assert b"secret" not in raw

    # a key without a scope still learns everything served
    status, _, raw = r.request("POST", CHAT, ask, _bearer("sk-all"))
    assert status == 404
    assert json.loads(raw)["error"]["message"].endswith("served: base-secret, other-secret, sql")
    listed = json.loads(r.request("GET", "/v1/models", None, _bearer("sk-all"))[2])["data"]
    assert {m["id"]: m["parent"] for m in listed} == {
        "base-secret": None,
        "sql": "base-secret",
        "other-secret": None,
    }


def test_only_the_batch_service_key_may_mark_a_request_low_priority(
    lt: LoopThread, doubles: Callable[..., list[Double]]
) -> None:
    """A low-priority request without headroom is refused before any rate limit, uncharged: honoured from
    anyone, a client could mark its requests low and be refused for free. The batch service's mark is
    honoured; a client's is dropped (the engine never sees it) and its request is an ordinary one."""
    (d,) = doubles(1, hold=asyncio.Event())
    keys = [
        {"name": "alice", "sha256": hash_key("sk-alice")},
        {"name": "carol", "sha256": hash_key("sk-carol")},
        {"name": "batches", "sha256": hash_key("sk-batches")},
    ]
    cfg: dict[str, Any] = {
        **router_cfg([d.url], cap=2, require_api_key=True, api_keys=keys),
        "batches": {"router_url": "http://127.0.0.1:9", "headroom_share": 0.5, "router_key_name": "batches"},
    }
    r = RouterUnderTest(lt, cfg).start()
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    low = {"x-inferstack-priority": "low"}
    try:
        with ThreadPoolExecutor(2) as pool:
            try:
                busy = pool.submit(r.request, "POST", CHAT, chat, _bearer("sk-alice"))
                _until(lambda: len(d.requests) == 1, "alice's request held by the engine (no headroom left)")
                status, _, raw = r.request("POST", CHAT, chat, {**_bearer("sk-batches"), **low})
                assert status == 503 and json.loads(raw)["error"]["code"] == "overloaded", raw
                carol = pool.submit(r.request, "POST", CHAT, chat, {**_bearer("sk-carol"), **low})
                _until(lambda: len(d.requests) == 2 or carol.done(), "carol's request reached the engine")
            finally:
                d.release()
            assert busy.result()[0] == 200
            status, _, raw = carol.result()
        assert status == 200, f"carol's mark was honoured: {raw!r}"
        assert "x-inferstack-priority" not in d.requests[1]["headers"], "a client's mark is not passed on"
    finally:
        r.stop()
