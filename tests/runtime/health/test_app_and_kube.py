"""The HTTP surface (/v1/backends, /metrics), Kubernetes Events and remediation, and the CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest_asyncio
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from runtime.config import KubernetesDiscovery
from runtime.discovery import watch_replicas
from runtime.health.app import make_app
from runtime.health.feed import FleetFeed
from runtime.health.kube import KubernetesActions, event_for
from runtime.health.monitor import Monitor
from runtime.health.state import Reason, State, Transition
from tests.runtime.health.conftest import config_for, wait_for
from tests.runtime.health.doubles import vllm_metrics

ROOT = Path(__file__).resolve().parents[3]


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_feed_and_metrics_endpoints(fakes):
    engine = await fakes(metrics_body=vllm_metrics(waiting=4, kv=0.5))
    monitor = Monitor(config_for([engine.url]), watch=watch_replicas, run_loops=False)
    runner, base = await start(make_app(monitor))
    try:
        await wait_for(lambda: monitor.ready)
        await monitor.probe_all()
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/v1/backends") as r:
                assert r.status == 200
                feed = FleetFeed.model_validate(await r.json())
            async with s.get(base + "/metrics") as r:
                text = await r.text()
            async with s.get(base + "/readyz") as r:
                assert r.status == 200
        assert feed.backends[0].url == engine.url and feed.backends[0].metrics.queued == 4
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }
        key = (("backend", engine.url), ("model", "tiny"))
        assert samples[("inferstack_health_backend_queued_requests", key)] == 4
        assert (
            samples[("inferstack_health_backend_state", (*key[:1], ("model", "tiny"), ("state", "healthy")))]
            == 1
        )
        assert samples[("inferstack_health_model_queue_depth", (("model", "tiny"),))] == 4
        assert samples[("inferstack_health_model_healthy_replicas", (("model", "tiny"),))] == 1
        assert samples[("inferstack_health_probes_total", (*key, ("result", "ok")))] == 1
    finally:
        await runner.cleanup()


class FakeApiServer:
    """Just enough of the Kubernetes API for events and pod deletion, on 127.0.0.1."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.deleted: list[str] = []
        self.pod_queries: list[str] = []
        self.delete_fault: str | None = None  # "hang": never answers (until released), "fail": a 500
        self.refused: list[str] = []  # deletes that hung or failed
        self.released = asyncio.Event()  # set at teardown: a hung handler ends

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self.create_event)
        app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self.delete_pod)
        return app

    async def list_pods(self, request: web.Request) -> web.Response:
        selector = request.query.get("fieldSelector", "")
        self.pod_queries.append(selector)
        items = []
        if selector == "status.podIP=127.0.0.1":
            items = [{"metadata": {"name": "engine-0", "namespace": request.match_info["ns"], "uid": "u-1"}}]
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

    async def create_event(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.events.append(body)
        return web.json_response(body, status=201)

    async def delete_pod(self, request: web.Request) -> web.Response:
        if self.delete_fault is not None:
            self.refused.append(request.match_info["name"])
            if self.delete_fault == "hang":
                await self.released.wait()
            return web.json_response({"kind": "Status", "status": "Failure", "code": 500}, status=500)
        self.deleted.append(request.match_info["name"])
        return web.json_response({"kind": "Status", "status": "Success"})


@pytest_asyncio.fixture(loop_scope="function")
async def api_server():
    fake = FakeApiServer()
    runner, base = await start(fake.app())
    yield fake, base
    fake.released.set()
    await runner.cleanup()


async def test_events_on_ejection_and_readmission(fakes, api_server):
    fake, api_base = api_server
    engine = await fakes()
    target = (
        config_for([engine.url])
        .models[0]
        .model_copy(
            update={"static_backends": [], "discovery": KubernetesDiscovery(namespace="llm", service="tiny")}
        )
    )
    actions = KubernetesActions.for_host(api_base, events=True, remediation=True)
    try:
        eject = Transition(State.DEGRADED, State.EJECTED, Reason.TIMEOUT, "GET /health: timeout")
        await actions.on_transition(target, engine.url, eject)
        back = Transition(State.EJECTED, State.HEALTHY, None, "")
        await actions.on_transition(target, engine.url, back)
        assert await actions.remediate(target, engine.url, 400.0)
    finally:
        await actions.close()
    reasons = [e["reason"] for e in fake.events]
    assert reasons == ["EngineEjected", "EngineReadmitted", "EngineRemediated"]
    first = fake.events[0]
    assert first["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "name": "engine-0",
        "namespace": "llm",
        "uid": "u-1",
    }
    assert first["type"] == "Warning" and "timeout" in first["message"]
    assert fake.deleted == ["engine-0"]
    assert fake.pod_queries[0] == "status.podIP=127.0.0.1"


async def test_monitor_remediates_once_per_episode(fakes, api_server):
    fake, api_base = api_server
    engine = await fakes(health_status=500)
    clock = [1000.0]
    cfg = config_for([engine.url], eject_after_failures=1, remediate_after_s=60)
    actions = KubernetesActions.for_host(api_base, events=False, remediation=True)
    monitor = Monitor(cfg, watch=watch_replicas, actions=actions, clock=lambda: clock[0], run_loops=False)
    await monitor.start()
    try:
        await wait_for(lambda: monitor.ready)
        # a static replica has no pod: remediation is attempted, nothing is deleted, and that is no remediation
        for _ in range(3):
            await monitor.probe_all()
            clock[0] += 40
        await monitor.wait_idle()
        assert monitor.counters.remediations["tiny"] == 0
        assert monitor.counters.remediation_failures["tiny"] == 1
        assert fake.deleted == []
    finally:
        await monitor.stop()


async def test_api_server_down_never_breaks_the_monitor(fakes, unused_tcp_port):
    engine = await fakes()
    target = config_for([engine.url]).models[0]
    target = target.model_copy(
        update={"static_backends": [], "discovery": KubernetesDiscovery(namespace="llm", service="tiny")}
    )
    actions = KubernetesActions.for_host(f"http://127.0.0.1:{unused_tcp_port}", events=True, remediation=True)
    try:
        t = Transition(State.DEGRADED, State.EJECTED, Reason.CONNECT, "")
        await actions.on_transition(target, engine.url, t)  # logs, does not raise
        assert not await actions.remediate(target, engine.url, 100)
    finally:
        await actions.close()


def test_event_text_is_pure():
    t = Transition(State.HEALTHY, State.EJECTED, Reason.HTTP_STATUS, "HTTP 500")
    assert event_for(t, "http://x:1", "m") == (
        "EngineEjected",
        "Warning",
        "model m: replica http://x:1 ejected (http_status): HTTP 500",
    )
    assert event_for(Transition(State.HEALTHY, State.DEGRADED, Reason.TIMEOUT, ""), "u", "m") is None


def test_bad_config_is_one_clear_message_and_exit_2(tmp_path):
    bad = tmp_path / "health.yaml"
    bad.write_text(
        "models:\n  - name: m\n    static_backends: [{url: 'http://127.0.0.1:1'}]\n"
        "health:\n  interval_ms: 5\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.health", "--config", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert f"{bad}: health.interval_ms: Input should be greater than or equal to 100 (got 5)" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "runtime.health", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "nope.yaml: cannot read config" in missing.stderr
