"""Issue #34's attacks on the health monitor, each made the way it would happen, against the real services on
127.0.0.1: a fault between the monitor and the engines (the router and the endpoint picker keep routing, no
pod is deleted), a client that picks session keys to land slow requests on a canary, a canary that restarts
once, pods that come and go for months, an engine whose metrics page holds 50,000 buckets, and one whose
model list is JSON nested past the interpreter's stack.

Each failed on the code before the fix (see the report of the commit that added it); the monitor is driven
round by round (``probe_all``) on a test clock, so nothing here waits on time.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from runtime.config import RuntimeConfig
from runtime.discovery import watch_replicas
from runtime.health.app import make_app
from runtime.health.exposition import registry_for, render
from runtime.health.kube import KubernetesActions
from runtime.health.monitor import DEPARTED_KEEP_S, Monitor
from runtime.health.state import Reason, State
from runtime.picker.decide import Pick, decide
from runtime.picker.fleet import Fleet as PickerFleet
from runtime.picker.metrics import scheduling_families
from tests.runtime.health.conftest import config_for, wait_for
from tests.runtime.health.doubles import vllm_metrics
from tests.runtime.health.test_app_and_kube import FakeApiServer, start
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


def until(check: Callable[[], bool], limit_s: float = 20.0) -> None:
    """Poll a condition with a generous bound (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


# --- item 8: a fault between the monitor and the engines ------------------------------------------------


def test_a_monitor_that_cannot_see_the_engines_does_not_empty_the_model_for_router_or_picker(
    lt: LoopThread,
) -> None:
    doubles = [Double(f"d{i}") for i in range(3)]
    for d in doubles:
        lt.run(d.start())
    models = [{"name": "m", "static_backends": [{"url": d.url} for d in doubles]}]
    monitor = Monitor(
        RuntimeConfig.model_validate({"models": models, "health": {"eject_after_failures": 1}}),
        watch=watch_replicas,
        run_loops=False,
    )
    runner, base = lt.run(start(make_app(monitor)))
    front = {"models": models, "router": {"health_feed_url": f"{base}/v1/backends", "probe_interval_ms": 100}}
    router = RouterUnderTest(lt, front).start()
    picker = PickerFleet(RuntimeConfig.model_validate(front))
    lt.run(picker.start())
    try:
        until(lambda: monitor.ready)
        lt.run(monitor.probe_all())  # every replica admitted
        fleets = (router.router.fleet, picker)  # type: ignore[union-attr]

        def rounds() -> list[int]:
            return router.call(lambda: [f.signals.rounds for f in fleets])

        until(lambda: router.call(lambda: all(r.healthy for f in fleets for r in f.models["m"].replicas)))
        assert router.request("POST", "/v1/chat/completions", CHAT)[0] == 200

        # The monitor's network fails: its /health probes fail, the engines serve on (routers reach them).
        for d in doubles:
            d.healthy = False
        lt.run(monitor.probe_all())
        assert all(t.health.state is State.EJECTED for t in monitor.all_trackers())
        seen = rounds()
        until(lambda: all(now >= then + 2 for now, then in zip(rounds(), seen, strict=True)))

        status, _, body = router.request("POST", "/v1/chat/completions", CHAT)
        assert status == 200, body  # before: 503 "no healthy replica of 'm' right now"
        pick = router.call(
            lambda: decide(picker.models, "POST", "/v1/chat/completions", {}, json.dumps(CHAT).encode(), 0.0)
        )
        assert isinstance(pick, Pick), pick  # before: a 503 answer
        assert router.call(lambda: all(f.models["m"].panic for f in fleets))
        # Routed to, yet still reported ejected (as Envoy's health stats stay true in panic): the dashboards'
        # healthy replicas and the alerts see the ejections
        metrics = router.metrics()  # the router's metrics listener
        healthy = [
            line for line in metrics.splitlines() if line.startswith("inferstack_router_backend_healthy{")
        ]
        assert len(healthy) == 3 and all(line.endswith(" 0.0") for line in healthy), healthy  # before: 1.0
        picker_healthy = router.call(lambda: scheduling_families(picker.models)[2].samples)
        assert [s.value for s in picker_healthy] == [0.0] * 3
        text = render(registry_for(monitor)).decode()
        assert 'inferstack_health_model_panic{model="m"} 1.0' in text
        assert json.loads(monitor.feed().model_dump_json())["models"][0]["panic"] is True
    finally:
        router.stop()
        lt.run(picker.stop())
        lt.run(runner.cleanup())
        for d in doubles:
            lt.run(d.stop())


async def test_a_monitor_side_fault_deletes_no_pod_and_wedged_pods_go_one_at_a_time(fakes, api_server):
    fake_api, api_base = api_server
    engines = [await fakes() for _ in range(4)]
    urls = [e.url for e in engines]
    target = {"name": "m", "discovery": {"namespace": "llm", "service": "m"}}  # pods behind the replicas
    config = RuntimeConfig.model_validate(
        {"models": [target], "health": {"eject_after_failures": 1, "remediate_after_s": 30}}
    )

    async def watch(_: Any):  # EndpointSlices, as the fake cluster lists them
        yield urls

    clock = Clock()
    actions = KubernetesActions.for_host(api_base, events=False, remediation=True)
    m = Monitor(config, watch=watch, actions=actions, clock=clock, run_loops=False)
    await m.start()
    try:
        await wait_for(lambda: len(m.all_trackers()) == 4)
        await m.probe_all()  # all admitted
        for e in engines:  # the monitor's own network fails: every replica looks wedged
            e.engine.health_status = 503
        await m.probe_all()
        for _ in range(3):
            clock.now += 31
            await m.probe_all()
        await m.wait_idle()
        assert fake_api.deleted == []  # before: all four pods deleted
        assert m.in_panic("m")

        for e in engines[:2]:  # two come back: two of four out is no panic; those two are wedged for real
            e.engine.health_status = 200
        for _ in range(2):
            await m.probe_all()
        assert not m.in_panic("m")
        for _ in range(3):  # rounds within one remediate_interval_s (300 s): one pod
            clock.now += 31
            await m.probe_all()
        await m.wait_idle()
        assert fake_api.deleted == ["engine-0"]
        clock.now += 300
        await m.probe_all()
        await m.wait_idle()
        assert fake_api.deleted == ["engine-0", "engine-0"]  # the other wedged one, an interval later
    finally:
        await m.stop()


async def test_a_hung_or_refused_pod_deletion_leaves_the_episode_open_and_is_counted(fakes, api_server):
    """A delete the API never answers is given up after remediate_timeout_s (before: it held the one-at-a-time
    slot for good), and one it refuses (500) is counted, not taken for a remediation (before: the episode was
    closed, the pod never deleted): the wedged pod is deleted an interval later, once the API takes it."""
    fake_api, api_base = api_server
    engines = [await fakes() for _ in range(3)]
    urls = [e.url for e in engines]
    target = {"name": "m", "discovery": {"namespace": "llm", "service": "m"}}
    health = {"eject_after_failures": 1, "remediate_after_s": 30, "remediate_timeout_s": 0.2}
    config = RuntimeConfig.model_validate({"models": [target], "health": health})

    async def watch(_: Any):
        yield urls

    clock = Clock()
    actions = KubernetesActions.for_host(api_base, events=False, remediation=True)
    m = Monitor(config, watch=watch, actions=actions, clock=clock, run_loops=False)
    await m.start()
    try:
        await wait_for(lambda: len(m.all_trackers()) == 3)
        await m.probe_all()  # all admitted
        engines[0].engine.health_status = 503  # one of three wedged: no panic
        await m.probe_all()
        for fault, refused in (("hang", 1), ("fail", 2)):
            fake_api.delete_fault = fault
            clock.now += 301
            await m.probe_all()
            await asyncio.wait_for(m.wait_idle(), 20)  # a hang guard: the attempt ends by itself
            assert len(fake_api.refused) == refused and fake_api.deleted == []
            assert (m.counters.remediations["m"], m.counters.remediation_failures["m"]) == (0, refused)
        fake_api.delete_fault = None
        clock.now += 301
        await m.probe_all()
        await m.wait_idle()
        assert fake_api.deleted == ["engine-0"]
        assert (m.counters.remediations["m"], m.counters.remediation_failures["m"]) == (1, 2)
        text = render(registry_for(m)).decode()
        assert 'inferstack_health_remediation_failures_total{model="m"} 2.0' in text
        clock.now += 301
        await m.probe_all()
        await m.wait_idle()
        assert fake_api.deleted == ["engine-0"]  # the episode is closed: once per episode
    finally:
        await m.stop()


@pytest_asyncio.fixture(loop_scope="function")
async def api_server():
    fake = FakeApiServer()
    runner, base = await start(fake.app())
    yield fake, base
    fake.released.set()
    await runner.cleanup()


# --- item 9: the canary verdict ----------------------------------------------------------------------


@dataclass
class TimedEngine(Double):
    """An engine whose TTFT histogram holds what it served: a prompt saying "slow" took 8 s to its first
    token, any other 50 ms (recorded, not slept)."""

    ttfts: list[float] = field(default_factory=list)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.ttfts.append(8.0 if b"slow" in await request.read() else 0.05)
        return await super().generate(request)

    async def metrics(self, _: web.Request) -> web.Response:
        name = "vllm:time_to_first_token_seconds"
        lines = [f'{name}_bucket{{le="{le}"}} {sum(t <= le for t in self.ttfts)}' for le in (0.1, 1.0, 10.0)]
        lines += [f'{name}_bucket{{le="+Inf"}} {len(self.ttfts)}', f"{name}_count {len(self.ttfts)}"]
        return web.Response(text="\n".join(lines) + "\nvllm:num_requests_waiting 0\n")


def _canary_keys(n: int) -> list[str]:
    """Session keys whose public hash lands in the canary's range (90-100 of a 90/10 split): what a client
    who read ``runtime.versions`` computes offline."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        i += 1
        h = int.from_bytes(hashlib.blake2b(f"k{i}".encode(), digest_size=8).digest(), "big")
        if h / 2**64 * 100 >= 90:
            out.append(f"k{i}")
    return out


def test_one_api_key_picking_canary_session_keys_cannot_roll_the_canary_back(lt: LoopThread) -> None:
    stable, canary = TimedEngine("v1"), TimedEngine("v2")
    for e in (stable, canary):
        lt.run(e.start())
    urls = [stable.url, canary.url]
    keys = {"legit": "sk-legit", "attacker": "sk-attacker"}
    config = {
        "models": [
            {
                "name": f"chat-{v}",
                "static_backends": [{"url": url}],
                "version_of": {"model": "chat", "version": v, "weight": w, "stable": v == "v1"},
            }
            for v, url, w in (("v1", urls[0], 90), ("v2", urls[1], 10))
        ],
        "router": {
            "api_keys": [
                {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest()}
                for name, key in keys.items()
            ]
        },
        "health": {"canaries": [{"model": "chat", "evaluation_interval_s": 10, "min_samples": 1}]},
    }
    router = RouterUnderTest(lt, config).start()
    clock = Clock()
    m = Monitor(RuntimeConfig.model_validate(config), watch=watch_replicas, clock=clock, run_loops=False)
    try:
        lt.run(m.start())
        until(lambda: m.ready)
        lt.run(m.probe_all())  # the window's start
        chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(200):  # everyone else: no session key, spread 90/10 exactly
            auth = {"Authorization": f"Bearer {keys['legit']}"}
            assert router.request("POST", "/v1/chat/completions", chat, auth)[0] == 200
        slow = {"model": "chat", "messages": [{"role": "user", "content": "slow " * 50}]}
        for key in _canary_keys(40):  # one client, forty session keys that all hash onto the canary
            auth = {"Authorization": f"Bearer {keys['attacker']}", "x-session-id": key}
            assert router.request("POST", "/v1/chat/completions", slow, auth)[0] == 200
        clock.now += 9
        lt.run(m.probe_all())  # every replica's window holds the traffic before the verdict is due
        clock.now += 2  # the evaluation interval ends
        lt.run(m.probe_all())
        v = m.feed().versions[0]
        assert not v.rolled_back, v.reason  # before: "canary ttft_p95 ... is ...x the stable version's"
        assert canary.ttfts.count(8.0) <= 2  # the attacker's share of the canary: its first request or so
        assert v.verdicts == {"v2": "advance"}
    finally:
        lt.run(m.stop())
        router.stop()
        for e in (stable, canary):
            lt.run(e.stop())


def _single_replica_canary(stable_url: str, canary_url: str) -> RuntimeConfig:
    """Model chat at v1 (90 %) with a one-replica canary v2 (10 %), judged every 30 s on at least 3 probes."""
    return RuntimeConfig.model_validate(
        {
            "models": [
                {
                    "name": f"chat-{v}",
                    "static_backends": [{"url": url}],
                    "version_of": {"model": "chat", "version": v, "weight": w, "stable": v == "v1"},
                }
                for v, url, w in (("v1", stable_url, 90), ("v2", canary_url, 10))
            ],
            "health": {
                "eject_after_failures": 3,
                "canaries": [{"model": "chat", "evaluation_interval_s": 30, "min_samples": 3}],
            },
        }
    )


async def test_a_single_replica_canary_that_restarts_once_is_not_rolled_back(fakes, monitors) -> None:
    stable, canary = await fakes(), await fakes()
    config = _single_replica_canary(stable.url, canary.url)
    clock = Clock()
    m = await monitors(config, clock=clock)
    for status in [200] * 3 + [503] * 4 + [200] * 10:  # out for four probes (ejected), then back: a restart
        canary.engine.health_status = status
        clock.now += 2
        await m.probe_all()
    assert m.feed().versions[0].verdicts == {"v2": "advance"}
    assert not m.feed().versions[0].rolled_back  # before: rolled back at the third failed probe


async def test_a_canary_that_is_out_when_its_interval_ends_is_held_not_advanced(fakes, monitors) -> None:
    """Failed probes held for the restart grace are not a pass: a canary out at its verdict is on hold."""
    stable, canary = await fakes(), await fakes()
    config = _single_replica_canary(stable.url, canary.url)
    clock = Clock()
    m = await monitors(config, clock=clock)
    verdicts: list[str] = []
    for status in [200] * 13 + [503] * 4 + [200] * 15:  # out across the first verdict (t=30), then back
        canary.engine.health_status = status
        clock.now += 2
        await m.probe_all()
        verdict = m.feed().versions[0].verdicts.get("v2")
        if verdict is not None and (not verdicts or verdicts[-1] != verdict):
            verdicts.append(verdict)
    assert verdicts == ["hold", "advance"]  # before: ["advance"] while the canary was out
    assert not m.feed().versions[0].rolled_back


# --- item 14: what the monitor keeps -----------------------------------------------------------------


async def test_pods_that_come_and_go_leave_no_state_behind(fakes) -> None:
    """A departed pod's counters stay on /metrics for DEPARTED_KEEP_S (its ejection must reach Prometheus, or
    ``increase()`` and the ejection alert lose it), then go: months of rollouts keep only what lives."""
    engine = await fakes(health_status=503)
    lists: asyncio.Queue[list[str]] = asyncio.Queue()

    async def watch(_: Any):
        while True:
            yield await lists.get()

    clock = Clock()
    m = Monitor(config_for([engine.url], eject_after_failures=1), watch=watch, clock=clock, run_loops=False)
    await m.start()
    runner, base = await start(make_app(m))

    async def scrape() -> str:
        async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as resp:
            return await resp.text()

    try:
        for generation in range(8):  # a rollout each: five new pods, the old ones gone
            urls = [f"{engine.url}/pod-{generation}-{i}" for i in range(5)]
            await lists.put(urls)
            await wait_for(lambda urls=urls: sorted(t.url for t in m.all_trackers()) == urls)
            await m.probe_all()  # each pod ejected (503)
            if generation:  # the pods that just left still show their ejections
                assert f'backend="{engine.url}/pod-{generation - 1}-0"' in await scrape()
            clock.now += DEPARTED_KEEP_S
        assert "pod-6-" not in await scrape()  # before: every pod that ever lived, 40 of them
        c = m.counters
        kept = (
            {url for _, url, _ in c.probes} | {url for _, url in c.ejections} | {r[1] for r in m._remediated}
        )
        assert kept == set(urls)
    finally:
        await runner.cleanup()
        await m.stop()


async def test_an_exposition_with_50000_buckets_fails_only_its_replica(fakes, monitors) -> None:
    name = "vllm:time_to_first_token_seconds"
    hostile_page = "".join(f'{name}_bucket{{le="{i}e-5"}} {i}\n' for i in range(1, 50_001))
    hostile = await fakes(metrics_body=hostile_page + f'{name}_bucket{{le="+Inf"}} 50000\n')
    good = await fakes(metrics_body=vllm_metrics(waiting=2, ttft_fast=3, ttft_total=4))
    m = await monitors(config_for([hostile.url, good.url]))
    for _ in range(2):
        await m.probe_all()
    by_url = {t.url: t for t in m.all_trackers()}
    bad = by_url[hostile.url]
    assert not bad.histograms  # before: a window of 50,000-bucket snapshots, every round
    status = bad.status(0)
    assert status.routable and status.metrics_stale and status.reason is Reason.METRICS_MALFORMED
    assert "buckets" in status.detail or "series" in status.detail
    fine = by_url[good.url].status(0)
    assert fine.state is State.HEALTHY and fine.metrics.queued == 2 and not fine.metrics_stale


async def test_a_model_list_nested_past_the_stack_costs_only_its_replica(fakes, monitors) -> None:
    deep = b"[" * 200_000 + b"]" * 200_000  # json.loads: RecursionError
    hostile = await fakes(models_body=b'{"object": "list", "data": ' + deep + b"}")
    good = await fakes(models=[{"id": "sql", "parent": "tiny"}])
    config = RuntimeConfig.model_validate(
        {
            "models": [
                {
                    "name": "tiny",
                    "static_backends": [{"url": hostile.url}, {"url": good.url}],
                    "adapters": [{"name": "sql", "path": "/adapters/sql"}],
                }
            ]
        }
    )
    m = await monitors(config)
    await m.probe_all()  # before: RecursionError out of the round, no replica's result recorded
    by_url = {b.url: b for b in m.feed().backends}
    assert by_url[hostile.url].state is State.HEALTHY and by_url[hostile.url].adapters is None
    assert by_url[good.url].state is State.HEALTHY and by_url[good.url].adapters == ["sql"]
