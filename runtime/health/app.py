"""The health monitor's HTTP surface: ``/v1/backends``, ``/metrics``, ``/healthz``, ``/readyz``."""

from __future__ import annotations

from aiohttp import web

from runtime.health.exposition import CONTENT_TYPE, registry_for, render
from runtime.health.monitor import Monitor

MONITOR_KEY = web.AppKey("monitor", Monitor)


#: The longest a front end's ``GET /v1/backends?after=N&wait_ms=W`` is held.
MAX_FEED_WAIT_S = 30.0


async def fleet_feed(request: web.Request) -> web.Response:
    """The feed; with ``after`` (the ``routing_changes`` the caller has) and ``wait_ms``, once a replica turned
    routable or not since, or after ``wait_ms`` (a long poll: readmissions reach front ends at once)."""
    monitor = request.app[MONITOR_KEY]
    after, wait_ms = request.query.get("after", ""), request.query.get("wait_ms", "")
    if after.isdigit() and wait_ms.isdigit():
        await monitor.routing_change_after(int(after), min(int(wait_ms) / 1000, MAX_FEED_WAIT_S))
    feed = monitor.feed()
    return web.Response(body=feed.model_dump_json().encode(), content_type="application/json")


def make_app(monitor: Monitor) -> web.Application:
    registry = registry_for(monitor)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=render(registry), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        ready = request.app[MONITOR_KEY].ready
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    app = web.Application()
    app[MONITOR_KEY] = monitor
    app.router.add_get("/v1/backends", fleet_feed)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)

    async def lifecycle(_: web.Application):  # type: ignore[no-untyped-def]
        await monitor.start()
        yield
        await monitor.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
