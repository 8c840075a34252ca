"""Discovery against a fake Kubernetes API server on loopback: list, watch, expiry, errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from runtime.config import KubernetesDiscovery, ModelTarget, StaticReplica
from runtime.discovery import KubeApi, fleet_urls, slice_urls, watch_replicas


def _slice(name: str, addrs: list[tuple[str, bool | None]], rv: str = "1") -> dict[str, Any]:
    endpoints = []
    for addr, ready in addrs:
        ep: dict[str, Any] = {"addresses": [addr]}
        if ready is not None:
            ep["conditions"] = {"ready": ready}
        endpoints.append(ep)
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": {"kubernetes.io/service-name": "llama"}},
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": endpoints,
    }


class FakeApiServer:
    """Serves list + watch for EndpointSlices; tests push events and inject faults."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.version = "10"
        self.events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.list_calls = 0
        self.watch_calls = 0
        self.fail_next_lists = 0
        self.gone_next_watch = False
        self.seen_auth: list[str] = []
        self.seen_params: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert request.path == "/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices"
        assert request.query["labelSelector"] == "kubernetes.io/service-name=llama"
        self.seen_auth.append(request.headers.get("Authorization", ""))
        self.seen_params.append(dict(request.query))
        if request.query.get("watch") != "1":
            self.list_calls += 1
            if self.fail_next_lists:
                self.fail_next_lists -= 1
                return web.Response(status=500, text="etcd is sad")
            return web.json_response({"metadata": {"resourceVersion": self.version}, "items": self.items})
        self.watch_calls += 1
        if self.gone_next_watch:
            self.gone_next_watch = False
            return web.json_response({"kind": "Status", "code": 410}, status=410)
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        while True:
            event = await self.events.get()
            if event is None:  # end this watch cleanly (server-side timeout)
                break
            await resp.write(json.dumps(event).encode() + b"\n")
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        await self.events.put(None)
        assert self.runner is not None
        await self.runner.cleanup()


@pytest_asyncio.fixture(loop_scope="function")
async def fake_api():
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()


def _target() -> ModelTarget:
    return ModelTarget(name="llama", discovery=KubernetesDiscovery(namespace="ml", service="llama"))


async def _next(it, timeout: float = 10.0) -> list[str]:
    return await asyncio.wait_for(anext(it), timeout)


def test_slice_urls_ready_only_named_port_ipv6() -> None:
    s = _slice("a", [("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None), ("fd00::5", True)])
    assert slice_urls(s, "http") == ["http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::5]:8000"]
    assert slice_urls(s, "grpc") == []
    unnamed = {"ports": [{"port": 9000}], "endpoints": [{"addresses": ["10.1.1.1"]}]}
    assert slice_urls(unnamed, "http") == ["http://10.1.1.1:9000"]
    assert fleet_urls({"a": s, "b": _slice("b", [("10.0.0.1", True)])}, "http")[0] == "http://10.0.0.1:8000"


async def test_static_yields_once() -> None:
    target = ModelTarget(
        name="m",
        static_backends=[StaticReplica(url="http://127.0.0.1:9/"), StaticReplica(url="http://127.0.0.1:8")],  # type: ignore[arg-type]
    )
    it = watch_replicas(target)
    assert await _next(it) == ["http://127.0.0.1:8", "http://127.0.0.1:9"]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(it), 0.2)


async def test_list_then_watch_changes(fake_api: FakeApiServer, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    fake_api.items = [_slice("llama-a", [("10.0.0.1", True), ("10.0.0.2", False)])]
    api = KubeApi(base_url=fake_api.url, token_path=token)
    it = watch_replicas(_target(), api)
    assert await _next(it) == ["http://10.0.0.1:8000"]
    assert fake_api.seen_auth[0] == "Bearer tok-1"

    # the second endpoint becomes ready
    await fake_api.events.put(
        {"type": "MODIFIED", "object": _slice("llama-a", [("10.0.0.1", True), ("10.0.0.2", True)], rv="11")}
    )
    assert await _next(it) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    # a bookmark and a no-op change yield nothing; a new slice does
    await fake_api.events.put({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}})
    await fake_api.events.put(
        {"type": "MODIFIED", "object": _slice("llama-a", [("10.0.0.1", True), ("10.0.0.2", True)], rv="13")}
    )
    await fake_api.events.put({"type": "ADDED", "object": _slice("llama-b", [("10.0.1.1", True)], rv="14")})
    assert await _next(it) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.1.1:8000"]
    await fake_api.events.put({"type": "DELETED", "object": _slice("llama-a", [], rv="15")})
    assert await _next(it) == ["http://10.0.1.1:8000"]
    assert fake_api.list_calls == 1
    assert fake_api.watch_calls == 1

    # the server ends the watch: we resume from the last version, without listing again
    token.write_text("tok-2")  # rotated token is picked up
    await fake_api.events.put(None)
    await fake_api.events.put({"type": "ADDED", "object": _slice("llama-c", [("10.0.2.1", True)], rv="16")})
    assert await _next(it) == ["http://10.0.1.1:8000", "http://10.0.2.1:8000"]
    assert fake_api.watch_calls == 2
    assert fake_api.seen_params[-1]["resourceVersion"] == "15"
    assert fake_api.seen_auth[-1] == "Bearer tok-2"
    await it.aclose()


async def test_expiry_relists_and_errors_back_off(fake_api: FakeApiServer) -> None:
    fake_api.items = [_slice("llama-a", [("10.0.0.1", True)])]
    api = KubeApi(base_url=fake_api.url, backoff_start_s=0.01, backoff_max_s=0.05)
    fake_api.fail_next_lists = 2  # the API server is down at first: we retry
    it = watch_replicas(_target(), api)
    assert await _next(it) == ["http://10.0.0.1:8000"]
    assert fake_api.list_calls == 3

    # ERROR 410 inside the watch: list again, and see the state the list reports
    fake_api.items = [_slice("llama-a", [("10.0.0.9", True)])]
    expired = {"kind": "Status", "code": 410, "reason": "Expired"}
    await fake_api.events.put({"type": "ERROR", "object": expired})
    assert await _next(it) == ["http://10.0.0.9:8000"]
    assert fake_api.list_calls == 4

    # HTTP 410 on the watch call itself: list again
    fake_api.gone_next_watch = True
    await fake_api.events.put(None)
    fake_api.items = [_slice("llama-a", [("10.0.0.7", True)])]
    assert await _next(it) == ["http://10.0.0.7:8000"]

    # garbage on the stream: treated as an error, retried with backoff, state recovered by a list
    fake_api.items = [_slice("llama-a", [("10.0.0.8", True)])]
    await fake_api.events.put({"type": "ERROR", "object": {"code": 500, "message": "boom"}})
    assert await _next(it) == ["http://10.0.0.8:8000"]
    await it.aclose()


def test_in_cluster_needs_env(monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="in-cluster"):
        KubeApi.in_cluster()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert KubeApi.in_cluster().base_url == "https://[fd00::1]:6443"
