"""Tenants that cannot starve each other, over real HTTP: the router's wait line serves a higher band first,
then the tenant served the fewest weighted tokens; a request header can only lower a band; the deadline, the
queue bound and the cold-start hold still apply; the metrics carry tenant and band from the config only."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from runtime.api_keys import hash_key
from tests.runtime.router.harness import RouterUnderTest, router_cfg
from tests.runtime.router.test_activator import _cold_router, _publish, _queue_depth

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
PRIORITY = "x-inferstack-priority"


def _keys() -> list[dict[str, Any]]:
    return [
        {"name": "vip", "sha256": hash_key("sk-vip-0123456789")},
        {"name": "plain", "sha256": hash_key("sk-plain-0123456789")},
        {"name": "heavy", "sha256": hash_key("sk-heavy-0123456789")},
        {"name": "light", "sha256": hash_key("sk-light-0123456789")},
        {"name": "acme-ci", "sha256": hash_key("sk-acme-ci-0123456789"), "tenant": "acme"},
    ]


TENANTS = [{"name": "vip", "band": "interactive"}, {"name": "acme", "weight": 2, "band": "batch"}]


def _until(cond, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.01)
    return True


class Line:
    """A router in front of one held replica with room for one request: requests queue behind the first,
    and the order the replica then sees them in is the line's order."""

    def __init__(self, doubles, make_router, **router: Any) -> None:
        (self.d,) = doubles(1, hold=asyncio.Event())
        router = {"require_api_key": True, "api_keys": _keys(), "tenants": TENANTS, **router}
        self.r = make_router([self.d.url], cap=1, **router)
        self.pool = ThreadPoolExecutor(16)
        self.sent: list[Future[tuple[int, dict[str, str], bytes]]] = []

    def send(self, key: str, tag: str, headers: dict[str, str] | None = None, **body: Any) -> Future:
        hs = {"Authorization": f"Bearer sk-{key}-0123456789", **(headers or {})}
        payload = {**CHAT, "messages": [{"role": "user", "content": tag}], **body}
        fut = self.pool.submit(self.r.request, "POST", "/v1/chat/completions", payload, hs)
        self.sent.append(fut)
        return fut

    def queued(self, n: int) -> None:
        """Wait until ``n`` requests wait in line (one at a time keeps the arrival order known)."""
        assert _until(lambda: self.r.call(lambda: len(self.r.router.fleet.models["m"].queue)) == n)

    def hold_the_slot(self) -> None:
        self.send("plain", "holder")
        assert _until(lambda: len(self.d.requests) == 1)

    def order(self) -> list[str]:
        """Release the replica; the tags in the order it was sent them (after the holder)."""
        self.d.release()
        for fut in self.sent:
            assert fut.result()[0] == 200
        self.pool.shutdown()
        return [req["body"]["messages"][0]["content"] for req in self.d.requests][1:]


def test_a_higher_band_goes_first_and_a_header_cannot_raise_a_band(doubles, make_router) -> None:
    """plain (standard) asks for interactive in the header and queues first; vip (interactive by its key)
    queues after it: vip gets the slot first. A header that asks for a lower band is honoured (vip lowering
    itself to best-effort goes last)."""
    line = Line(doubles, make_router)
    line.hold_the_slot()
    line.send("plain", "plain-says-interactive", {PRIORITY: "interactive"})
    line.queued(1)
    line.send("vip", "vip-lowers-itself", {PRIORITY: "best-effort"})
    line.queued(2)
    line.send("vip", "vip")
    line.queued(3)
    assert line.order() == ["vip", "plain-says-interactive", "vip-lowers-itself"]


def test_a_light_tenant_is_not_stuck_behind_a_heavy_tenants_backlog(doubles, make_router) -> None:
    """heavy's long prompts fill the line; light's short chat, arriving last, is served after at most one of
    them (FIFO served it last)."""
    line = Line(doubles, make_router)
    line.hold_the_slot()
    long_prompt = "x" * 20_000
    for i in range(4):
        line.send("heavy", f"heavy-{i}", messages=[{"role": "user", "content": f"heavy-{i} {long_prompt}"}])
        line.queued(i + 1)
    line.send("light", "light")
    line.queued(5)
    order = [tag.split(" ")[0] for tag in line.order()]
    assert order.index("light") <= 1, order


def test_weights_come_from_the_tenant_a_key_names(doubles, make_router) -> None:
    """acme's key is in the batch band by its tenant: a standard key's later request goes before it."""
    line = Line(doubles, make_router)
    line.hold_the_slot()
    line.send("acme-ci", "acme")
    line.queued(1)
    line.send("plain", "plain")
    line.queued(2)
    assert line.order() == ["plain", "acme"]


def test_fifo_by_config_serves_in_arrival_order(doubles, make_router) -> None:
    line = Line(doubles, make_router, queue_order="fifo")
    line.hold_the_slot()
    line.send("plain", "plain")
    line.queued(1)
    line.send("vip", "vip")
    line.queued(2)
    assert line.order() == ["plain", "vip"]


def test_the_deadline_and_the_bound_still_refuse_a_low_band_request(doubles, make_router) -> None:
    """A best-effort request behind a full replica is refused at the queue deadline (503 overloaded), and
    the line's bound refuses a request beyond it, counted as shed for its tenant and band."""
    line = Line(doubles, make_router, queue_deadline_ms=300, queue_max_requests=1)
    line.hold_the_slot()
    started = time.monotonic()
    status, _, body = line.send("vip", "late", {PRIORITY: "best-effort"}).result(10)
    assert status == 503 and json.loads(body)["error"]["code"] == "overloaded"
    assert 0.25 < time.monotonic() - started < 5
    line.sent.pop()
    waiting = line.send("plain", "waiting")
    line.queued(1)
    status, _, _ = line.r.request(
        "POST", "/v1/chat/completions", CHAT, {"Authorization": "Bearer sk-light-0123456789"}
    )
    assert status == 503
    metrics = line.r.metrics()
    assert 'inferstack_router_queue_waiting{band="standard",model="m",tenant="plain"} 1.0' in metrics
    assert 'inferstack_router_fair_shed_total{band="best-effort",model="m",tenant="vip"} 1.0' in metrics
    assert 'inferstack_router_fair_shed_total{band="standard",model="m",tenant="light"} 1.0' in metrics
    line.d.release()
    assert waiting.result()[0] == 200
    metrics = line.r.metrics()
    assert 'inferstack_router_fair_admitted_total{band="standard",model="m",tenant="plain"} 2.0' in metrics


def test_tenant_labels_never_come_from_the_request(doubles, make_router) -> None:
    """Without a key a request is the fixed tenant 'other'; header values name no tenant and no new band."""
    (d,) = doubles(1)
    r = make_router([d.url], tenants=TENANTS)
    assert r.request("POST", "/v1/chat/completions", CHAT, {PRIORITY: "made-up-band"})[0] == 200
    assert r.request("POST", "/v1/chat/completions", CHAT, {"x-inferstack-tenant": "evil"})[0] == 200
    metrics = r.metrics()
    assert 'inferstack_router_fair_admitted_total{band="standard",model="m",tenant="other"} 2.0' in metrics
    assert "made-up-band" not in metrics and "evil" not in metrics


def test_the_cold_start_hold_still_holds_a_low_band_request(doubles, lt, tmp_path) -> None:
    """No replica yet: a best-effort request is held (and counted in the queue depth that wakes the model)
    until one appears, then served."""
    (d,) = doubles(1)
    r = _cold_router(lt, tmp_path, 10_000, tenants=TENANTS)
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(r.request, "POST", "/v1/chat/completions", CHAT, {PRIORITY: "best-effort"})
            assert _until(lambda: _queue_depth(r) == 1)
            assert 'inferstack_router_queue_depth{model="m"} 1.0' in r.metrics()
            _publish(tmp_path / "endpoints.json", [d])
            assert held.result(10)[0] == 200
    finally:
        r.stop()


def test_a_tenants_count_is_settled_to_the_real_usage(doubles, make_router) -> None:
    """Charged its estimate at admission (prompt from the body's size + max_tokens), a tenant's counter ends at the
    tokens the answer reported (the double's usage: 5 prompt + 2 completion), divided by its weight."""
    (d,) = doubles(1)
    tenants = [{"name": "plain", "weight": 2}]
    r = make_router([d.url], require_api_key=True, api_keys=_keys(), tenants=tenants)
    hs = {"Authorization": "Bearer sk-plain-0123456789"}
    assert r.request("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 500}, hs)[0] == 200
    assert (
        r.request("POST", "/v1/chat/completions", CHAT, {"Authorization": "Bearer sk-light-0123456789"})[0]
        == 200
    )
    share = r.call(lambda: r.router.fleet.models["m"].queue.waiters.share)
    assert share.counter("plain") == 7 / 2
    assert share.counter("light") == 7


def test_a_batch_line_refused_for_headroom_is_shed_in_its_owners_batch_band(lt, doubles) -> None:
    """The batch service's lines are the batch band, charged to the batch's owner (x-inferstack-key): one refused
    for want of headroom is counted as shed for that owner's tenant in that band."""
    (d,) = doubles(1, hold=asyncio.Event())
    keys = [*_keys(), {"name": "batches", "sha256": hash_key("sk-batches-0123456789")}]
    cfg: dict[str, Any] = {
        **router_cfg([d.url], cap=2, require_api_key=True, api_keys=keys, tenants=TENANTS),
        "batches": {"router_url": "http://127.0.0.1:9", "headroom_share": 0.5, "router_key_name": "batches"},
    }
    r = RouterUnderTest(lt, cfg).start()
    try:
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(
                r.request,
                "POST",
                "/v1/chat/completions",
                CHAT,
                {"Authorization": "Bearer sk-plain-0123456789"},
            )
            assert _until(lambda: len(d.requests) == 1)
            line = {
                "Authorization": "Bearer sk-batches-0123456789",
                "x-inferstack-key": "acme-ci",
                PRIORITY: "low",
            }
            assert r.request("POST", "/v1/chat/completions", CHAT, line)[0] == 503
            d.release()
            assert busy.result()[0] == 200
        assert 'inferstack_router_fair_shed_total{band="batch",model="m",tenant="acme"} 1.0' in r.metrics()
    finally:
        r.stop()
