"""The router's metrics and model list are not anyone's for the asking (#34 item 10), over real HTTP.

/metrics names every replica's address: it is served on a listener of its own (``router.metrics_port``, which
no ingress routes), never on the API port. ``/v1/models`` needs a key when keys are required, and lists only
the models a scoped key may use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from runtime.api_keys import hash_key
from tests.runtime.router.harness import Double, Loopback, RouterUnderTest

CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}


def _models(*names: str, replica: str) -> list[dict[str, object]]:
    return [{"name": n, "static_backends": [{"url": replica}]} for n in names]


def test_metrics_are_served_on_their_own_port_only(
    doubles: Callable[..., list[Double]], make_router: Callable[..., RouterUnderTest]
) -> None:
    (d,) = doubles(1)
    r = make_router([d.url], models=_models("a", replica=d.url))
    assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    status, _, body = r.request("GET", "/metrics")  # the API port: what an ingress routes
    assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error"
    assert d.url.removeprefix("http://") not in body.decode()
    text = r.metrics()  # the metrics listener
    assert "inferstack_router_requests_total{" in text and d.url in text, "the metrics name the replicas"
    ops = Loopback()  # the metrics port answers nothing of the API
    ops.port = r.metrics_port
    assert ops.request("POST", "/v1/chat/completions", CHAT)[0] == 405
    assert ops.request("GET", "/v1/models")[0] == 404
    assert ops.request("GET", "/healthz")[0] == 200


def test_the_model_list_needs_a_key_and_shows_a_scoped_key_its_models_only(
    doubles: Callable[..., list[Double]], make_router: Callable[..., RouterUnderTest]
) -> None:
    (d,) = doubles(1)
    keys = [
        {"name": "all", "sha256": hash_key("sk-all")},
        {"name": "only-b", "sha256": hashlib.sha256(b"sk-b").hexdigest(), "models": ["b"]},
    ]
    r = make_router([d.url], models=_models("a", "b", replica=d.url), require_api_key=True, api_keys=keys)

    def listed(key: str | None) -> tuple[int, list[str]]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, _, body = r.request("GET", "/v1/models", headers=headers)
        data = json.loads(body)
        return status, sorted(m["id"] for m in data.get("data", []))

    status, _ = listed(None)
    assert status == 401
    assert listed("sk-wrong")[0] == 401
    assert listed("sk-all") == (200, ["a", "b"])
    assert listed("sk-b") == (200, ["b"])


def test_without_required_keys_the_model_list_stays_open_and_a_known_key_still_sees_its_scope(
    doubles: Callable[..., list[Double]], make_router: Callable[..., RouterUnderTest]
) -> None:
    (d,) = doubles(1)
    keys = [{"name": "only-b", "sha256": hash_key("sk-b"), "models": ["b"]}]
    r = make_router([d.url], models=_models("a", "b", replica=d.url), require_api_key=False, api_keys=keys)
    status, _, body = r.request("GET", "/v1/models")
    assert status == 200 and sorted(m["id"] for m in json.loads(body)["data"]) == ["a", "b"]
    status, _, body = r.request("GET", "/v1/models", headers={"Authorization": "Bearer sk-b"})
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["b"]
