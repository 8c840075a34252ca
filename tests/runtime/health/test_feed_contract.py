"""The contract with the router: the monitor's real ``/v1/backends`` JSON, fed to the router's own reader
(``runtime.signal_loop``, shared with the endpoint picker)."""

from __future__ import annotations

import json
import time

from runtime.fleet_feed import read_feed
from runtime.router.fleet import Fleet
from runtime.signal_loop import apply_feed
from tests.runtime.health.conftest import config_for
from tests.runtime.health.doubles import vllm_metrics


async def test_router_applies_the_monitor_feed(fakes, monitors):
    good = await fakes(metrics_body=vllm_metrics(waiting=5, running=2, kv=0.3))
    bad = await fakes(health_status=503)
    stale = await fakes(metrics_body=vllm_metrics(waiting=9))
    config = config_for([good.url, bad.url, stale.url], eject_after_failures=1)
    monitor = await monitors(config)
    await monitor.probe_all()
    stale.engine.metrics_status = 500
    await monitor.probe_all()
    wire = json.loads(monitor.feed().model_dump_json())  # exactly what GET /v1/backends sends

    fleet = Fleet(config)
    fleet.models["tiny"].set_replicas([good.url, bad.url, stale.url])
    feed = read_feed(wire, time.time())
    assert feed is not None
    apply_feed(fleet.models, feed)
    by_url = {b.url: b for b in fleet.models["tiny"].replicas}
    assert (
        by_url[good.url].healthy and by_url[good.url].engine_queued == 5 and by_url[good.url].kv_usage == 0.3
    )
    assert not by_url[bad.url].healthy
    assert by_url[stale.url].healthy and by_url[stale.url].engine_queued != 9  # stale values are not applied
    assert read_feed({**wire, "generated_at": time.time() - 3600}, time.time()) is None
