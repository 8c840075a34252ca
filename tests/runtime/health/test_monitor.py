"""The monitor against fake engines on loopback: states, signals, and every fault one engine's problem."""

from __future__ import annotations

import asyncio
import math
import ssl

import aiohttp
import pytest

from runtime.health.probe import classify
from runtime.health.state import Reason, State
from tests.runtime.health.conftest import config_for, wait_for
from tests.runtime.health.doubles import vllm_metrics


def status(monitor, url):
    return next(b for b in monitor.feed().backends if b.url == url)


async def test_healthy_engine_and_its_signals(fakes, monitors):
    engine = await fakes(metrics_body=vllm_metrics(running=3, waiting=2, kv=0.4, queries=100, hits=20))
    monitor = await monitors(config_for([engine.url]))
    await monitor.probe_all()
    b = status(monitor, engine.url)
    assert b.state is State.HEALTHY and b.routable and not b.metrics_stale
    assert (b.metrics.running, b.metrics.queued, b.metrics.kv_usage) == (3, 2, 0.4)
    assert b.metrics.ttft_p95_s is None  # one snapshot: no window yet, and not zero

    engine.engine.metrics_body = vllm_metrics(queries=200, hits=95, ttft_fast=0, ttft_total=10, preemptions=2)
    await monitor.probe_all()
    b = status(monitor, engine.url)
    assert b.metrics.prefix_hit_rate == pytest.approx(0.75)
    assert b.metrics.ttft_p95_s is not None and 0.1 < b.metrics.ttft_p95_s <= 1.0
    assert b.metrics.preemptions_window == 2
    summary = monitor.feed().models[0]
    assert (
        summary.healthy_replicas == 1
        and summary.queue_depth == 0
        and summary.ttft_p95_s == b.metrics.ttft_p95_s
    )


async def test_500s_eject_after_k_and_readmit_after_m(fakes, monitors):
    engine = await fakes()
    monitor = await monitors(config_for([engine.url], eject_after_failures=3, readmit_after_successes=2))
    await monitor.probe_all()
    engine.engine.health_status = 500
    states = []
    for _ in range(3):
        await monitor.probe_all()
        states.append(status(monitor, engine.url).state)
    assert states == [State.DEGRADED, State.DEGRADED, State.EJECTED]
    b = status(monitor, engine.url)
    assert b.reason is Reason.HTTP_STATUS and "500" in b.detail and not b.routable
    assert b.metrics_stale

    engine.engine.health_status = 200
    await monitor.probe_all()
    assert status(monitor, engine.url).state is State.EJECTED
    await monitor.probe_all()
    assert status(monitor, engine.url).state is State.HEALTHY
    assert monitor.counters.ejections[("tiny", engine.url)] == 1
    assert monitor.counters.readmissions[("tiny", engine.url)] == 1


async def test_hang_is_a_timeout_and_does_not_delay_others(fakes, monitors):
    good, hung = await fakes(), await fakes(health_hang=True)
    # the hung one never answers: a timeout that a loaded machine's stall cannot fail the good one with
    monitor = await monitors(config_for([good.url, hung.url], timeout_ms=2000))
    await monitor.probe_all()
    assert status(monitor, good.url).state is State.HEALTHY
    b = status(monitor, hung.url)
    assert b.state is State.EJECTED and b.reason is Reason.TIMEOUT


async def test_a_burst_of_probes_keeps_at_most_the_in_flight_bound_out_and_the_rest_wait_their_turn(
    fakes, monitors, monkeypatch
):
    """A fleet found at once parses at most MAX_PROBES_IN_FLIGHT answers at a time (memory does not grow
    with the fleet); every replica still gets its probe."""
    from runtime.health import monitor as monitor_module

    monkeypatch.setattr(monitor_module, "MAX_PROBES_IN_FLIGHT", 3)
    served = [await fakes(health_hang=True) for _ in range(8)]
    monitor = await monitors(config_for([s.url for s in served], timeout_ms=10_000))
    round_ = asyncio.create_task(monitor.probe_all())
    out = lambda: sum(s.engine.healths_at_once for s in served)  # noqa: E731
    await wait_for(lambda: out() == 3)
    await asyncio.sleep(0.3)  # room for a fourth, were there no bound
    assert out() == 3
    for s in served:
        s.engine.release()
    await asyncio.wait_for(round_, 20)
    assert all(status(monitor, s.url).state is State.HEALTHY for s in served)


async def test_stale_metrics_are_flagged_not_zeroed(fakes, monitors):
    engine = await fakes(metrics_body=vllm_metrics(waiting=7))
    monitor = await monitors(config_for([engine.url]))
    await monitor.probe_all()
    engine.engine.metrics_status = 503
    await monitor.probe_all()
    b = status(monitor, engine.url)
    assert b.state is State.DEGRADED and b.reason is Reason.METRICS_UNAVAILABLE
    assert b.metrics_stale and b.metrics.queued == 7  # the last known value, flagged
    assert monitor.feed().models[0].queue_depth is None  # aggregates skip stale replicas


async def test_malformed_metrics_degrade_only(fakes, monitors):
    engine = await fakes(metrics_body="<html>this is not prometheus</html>\x00\xff")
    monitor = await monitors(config_for([engine.url]))
    for _ in range(5):
        await monitor.probe_all()
    b = status(monitor, engine.url)
    assert b.state is State.DEGRADED and b.reason is Reason.METRICS_MALFORMED and b.routable


async def test_enormous_metrics_are_refused_within_the_limit(fakes, monitors):
    huge = vllm_metrics() + "# padding\n" * 600_000  # ~6 MiB
    engine = await fakes(metrics_body=huge)
    monitor = await monitors(config_for([engine.url], max_metrics_bytes=1024 * 1024))
    await monitor.probe_all()
    b = status(monitor, engine.url)
    assert b.state is State.DEGRADED and b.reason is Reason.METRICS_MALFORMED
    assert "exceeds" in b.detail or "Content-Length" in b.detail


async def test_trickling_metrics_time_out(fakes, monitors):
    engine = await fakes(metrics_trickle=True)
    monitor = await monitors(config_for([engine.url], timeout_ms=2000))  # the trickle never ends
    await monitor.probe_all()
    b = status(monitor, engine.url)
    assert b.state is State.DEGRADED and b.reason is Reason.METRICS_UNAVAILABLE and "Timeout" in b.detail


async def test_flapping_engine_is_not_readmitted_on_single_successes(fakes, monitors):
    engine = await fakes()
    monitor = await monitors(config_for([engine.url], eject_after_failures=2, readmit_after_successes=3))
    await monitor.probe_all()
    engine.engine.health_status = 503
    await monitor.probe_all()
    await monitor.probe_all()
    assert status(monitor, engine.url).state is State.EJECTED
    for _ in range(6):  # up, down, up, down ...
        engine.engine.health_status = 200 if engine.engine.health_status != 200 else 503
        await monitor.probe_all()
        assert status(monitor, engine.url).state is State.EJECTED
    assert monitor.counters.ejections[("tiny", engine.url)] == 1


async def test_synthetic_probe_catches_hung_generation(fakes, monitors):
    engine = await fakes(completion_hang=True)
    monitor = await monitors(
        config_for([engine.url], synthetic_probe_every=1, synthetic_timeout_ms=200, eject_after_failures=1)
    )
    await monitor.probe_all()
    b = status(monitor, engine.url)
    assert b.state is State.EJECTED and b.reason is Reason.SYNTHETIC_TIMEOUT
    assert engine.engine.calls[0]["body"]["max_tokens"] == 1


async def test_synthetic_probe_for_embedding_models_and_errors(fakes, monitors):
    engine = await fakes(completion_status=500)
    monitor = await monitors(config_for([engine.url], task="embed", synthetic_probe_every=2))
    await monitor.probe_all()
    assert status(monitor, engine.url).state is State.HEALTHY
    assert engine.engine.calls[0]["path"] == "/v1/embeddings"
    monitor2 = await monitors(config_for([engine.url], synthetic_probe_every=1, eject_after_failures=1))
    await monitor2.probe_all()
    assert status(monitor2, engine.url).reason is Reason.SYNTHETIC_FAILED


async def test_connection_refused_and_tls_errors(fakes, monitors, unused_tcp_port):
    engine = await fakes()
    tls_url = engine.url.replace("http://", "https://")  # a TLS handshake against a plain-HTTP server
    refused = f"http://127.0.0.1:{unused_tcp_port}"
    monitor = await monitors(config_for([tls_url, refused]))
    await monitor.probe_all()
    assert status(monitor, refused).reason is Reason.CONNECT
    assert status(monitor, tls_url).reason in (Reason.TLS, Reason.CONNECT, Reason.PROTOCOL)
    assert status(monitor, tls_url).state is State.EJECTED


def test_error_classification():
    key = aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None)
    dns = aiohttp.ClientConnectorDNSError(key, OSError(-2, "Name or service not known"))
    cert = aiohttp.ClientConnectorCertificateError(key, ssl.SSLCertVerificationError("bad cert"))
    assert classify(dns)[0] is Reason.DNS
    assert classify(cert)[0] is Reason.TLS
    assert classify(TimeoutError())[0] is Reason.TIMEOUT
    assert classify(aiohttp.ServerDisconnectedError())[0] is Reason.PROTOCOL


async def test_running_loops_eject_a_dying_engine(fakes):
    """The real loops (not manual rounds), bounded by a generous wait."""
    from runtime.discovery import watch_replicas
    from runtime.health.monitor import Monitor

    engine = await fakes()
    monitor = Monitor(config_for([engine.url], interval_ms=100, eject_after_failures=2), watch=watch_replicas)
    await monitor.start()
    try:
        await wait_for(lambda: any(t.health.state is State.HEALTHY for t in monitor.all_trackers()))
        engine.engine.health_status = 503
        await wait_for(lambda: all(t.health.state is State.EJECTED for t in monitor.all_trackers()))
    finally:
        await monitor.stop()


async def test_discovery_changes_add_and_remove_replicas(fakes):
    from runtime.health.monitor import Monitor

    a, b = await fakes(), await fakes()
    lists: asyncio.Queue[list[str]] = asyncio.Queue()

    async def watch(_target):
        while True:
            yield await lists.get()

    monitor = Monitor(config_for([a.url]), watch=watch, run_loops=False)
    await monitor.start()
    try:
        await lists.put([a.url])
        await wait_for(lambda: len(monitor.all_trackers()) == 1)
        await lists.put([a.url, b.url])
        await wait_for(lambda: len(monitor.all_trackers()) == 2)
        await monitor.probe_all()
        await lists.put([b.url])
        await wait_for(lambda: [t.url for t in monitor.all_trackers()] == [b.url])
        assert monitor.feed().models[0].replicas == 1
    finally:
        await monitor.stop()


def test_feed_round_trips_through_json():
    from runtime.health.feed import FleetFeed

    feed = FleetFeed(generated_at=1.0, interval_ms=5000, stale_after_s=15.0)
    again = FleetFeed.model_validate_json(feed.model_dump_json())
    assert again == feed and again.is_fresh(10.0) and not again.is_fresh(100.0)
    assert math.isclose(again.stale_after_s, 15.0)


async def test_replicas_of_a_model_with_adapters_report_the_adapters_they_hold(fakes, monitors):
    engine = await fakes()
    engine.engine.models = [
        {"id": "tiny", "object": "model", "parent": None},
        {"id": "tiny-sql", "object": "model", "parent": "tiny"},
        {"id": "other-adapter", "object": "model", "parent": "elsewhere"},
    ]
    cfg = config_for([engine.url]).model_dump()
    cfg["models"][0]["adapters"] = [
        {"name": "tiny-sql", "path": "/a/sql"},
        {"name": "tiny-chat", "path": "/a/c"},
    ]
    from runtime.config import RuntimeConfig

    monitor = await monitors(RuntimeConfig.model_validate(cfg))
    await monitor.probe_all()
    assert status(monitor, engine.url).adapters == ["tiny-sql"]
    engine.engine.models = engine.engine.models[:1]  # the replica restarted: its adapters are gone
    await monitor.probe_all()
    assert status(monitor, engine.url).adapters == []
    plain = await fakes()
    other = await monitors(config_for([plain.url]))
    await other.probe_all()
    assert status(other, plain.url).adapters is None  # no adapters: the list is not read
