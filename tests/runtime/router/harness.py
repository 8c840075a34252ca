"""Test harness: a router and scriptable engine doubles, each on loopback in a background event loop.

Running the servers in their own thread lets tests be plain synchronous code (``http.client``, the
sync ``openai`` client, hypothesis) while the router under test runs on a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from runtime.config import RuntimeConfig
from runtime.router.__main__ import drain, make_metrics_server, make_server, serve
from runtime.router.app import Router
from runtime.router.reload import load_router_files
from runtime.server import Server

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread; ``run`` executes a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def completion(
    model: str = "m", text: str = "ok", prompt_tokens: int = 5, completion_tokens: int = 2
) -> bytes:
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    ).encode()


def sse_chunk(i: int, model: str = "m", usage: bool = False) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}],
    }
    if usage:
        body["choices"] = []
        body["usage"] = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@dataclass
class Double:
    """A scriptable engine. ``mode`` decides how generation requests are answered."""

    name: str
    mode: str = (
        "ok"  # ok | 503 | 500 | hang | reset_mid_stream | reset_before | trickle | wrong_ctype | garbage
        # | split_usage
    )
    chunks: int = 3
    trickle_s: float = 0.05
    delay_s: float = 0.0
    healthy: bool = True
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    metrics_text: str = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
    #: when given, generation requests are held (after being recorded) until :meth:`release`
    hold: asyncio.Event | None = None
    runner: web.AppRunner | None = None
    loop: asyncio.AbstractEventLoop | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        headers = {k.lower(): v for k, v in request.headers.items()}
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.requests.append(
            {"path": request.path, "headers": headers, "raw": raw, "body": body, "peer": peer}
        )
        if self.hold is not None:
            await self.hold.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        mode = self.mode
        if mode == "503":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if mode == "500":
            return web.json_response({"error": {"message": "internal error"}}, status=500)
        if mode == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if mode == "reset_before":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if mode == "wrong_ctype":
            return web.Response(body=b"<html>gateway</html>", content_type="text/html")
        if mode == "garbage":
            assert request.transport is not None
            request.transport.write(b"HTTP/1.1 2OO NOPE\r\n\r\n\x00\x01garbage")
            request.transport.close()
            return web.Response()
        if mode in ("big", "big_chunked"):
            payload = json.dumps(
                {
                    "object": "list",
                    "data": [
                        {"object": "embedding", "index": i, "embedding": [0.125] * 1000} for i in range(300)
                    ],
                    "usage": {"prompt_tokens": 300, "total_tokens": 300},
                }
            ).encode()
            if mode == "big":
                return web.Response(body=payload, content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(0, len(payload), 65536):
                await resp.write(payload[i : i + 65536])
                await asyncio.sleep(0.001)
            await resp.write_eof()
            return resp
        if request.path == "/v1/embeddings":
            return web.json_response(
                {
                    "object": "list",
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
                    "model": body.get("model"),
                    "usage": {"prompt_tokens": 3, "total_tokens": 3},
                }
            )
        if not body.get("stream"):
            return web.Response(body=completion(body.get("model", "m")), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(self.chunks):
                await resp.write(sse_chunk(i, body.get("model", "m")))
                if mode == "reset_mid_stream" and i == 1:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                if mode == "trickle":
                    await asyncio.sleep(self.trickle_s)
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):  # as vLLM: only when asked
                event = sse_chunk(0, body.get("model", "m"), usage=True)
                if mode == "split_usage":  # the usage event in two writes, split right after its name
                    at = event.index(b'"usage"') + len(b'"usage"')
                    await resp.write(event[:at])
                    await asyncio.sleep(0.05)  # two reads for the router, not a synchronisation
                    event = event[at:]
                await resp.write(event)
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        return resp

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text)

    async def start(self) -> None:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            app.router.add_post(path, self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.loop = asyncio.get_running_loop()

    def release(self) -> None:
        """Let the held requests (and later ones) answer; callable from any thread."""
        if self.hold is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self.hold.set)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


class Loopback:
    """A router listening on 127.0.0.1:``port``; ``request`` sends it one request."""

    port = 0
    metrics_port = 0  # the router's metrics listener (never the API port)

    def metrics(self) -> str:
        """The router's /metrics text, from its metrics listener."""
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200, (resp.status, body[:200])
            return body.decode()
        finally:
            conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-case headers, body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        hs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hs)
        resp = conn.getresponse()
        out = resp.read()
        conn.close()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, out


class RouterUnderTest(Loopback):
    """A Router + lean Server in the loop thread, configured from a dict."""

    def __init__(self, lt: LoopThread, cfg: dict[str, Any]) -> None:
        self.lt = lt
        self.cfg = RuntimeConfig.model_validate(cfg)
        self.router: Router | None = None
        self.server: Server | None = None
        self.ops: Server | None = None
        self.port = 0

    async def _start(self) -> None:
        self.router = Router(self.cfg)
        self.server = make_server(self.router)
        await self.router.start()
        self.port = await self.server.start("127.0.0.1", 0)
        self.ops = make_metrics_server(self.router)
        self.metrics_port = self.router.metrics_port = await self.ops.start("127.0.0.1", 0)
        # static discovery lands within a few loop turns; a deadline for a loaded machine, then it is a fault
        deadline = asyncio.get_running_loop().time() + 10
        models = self.router.fleet.models.values()
        while not all(m.replicas for m in models if m.target.static_backends):
            if asyncio.get_running_loop().time() > deadline:
                await self._stop()
                raise RuntimeError("the router did not list its static replicas within 10 s")
            await asyncio.sleep(0.01)

    def start(self) -> RouterUnderTest:
        self.lt.run(self._start())
        return self

    async def _stop(self) -> None:
        assert self.router is not None and self.server is not None
        await drain(self.router, self.server, 0.5)
        if self.ops is not None:
            await self.ops.drain(0.0, lambda: 0)
        await self.router.stop()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.lt.run(self._stop())

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, fn: Callable[[], T]) -> T:
        """Run a plain function in the loop thread (to poke router state safely)."""

        async def wrap() -> T:
            return fn()

        return self.lt.run(wrap())


class RouterFromFile(Loopback):
    """A router started from a config file as ``python -m runtime.router`` starts it (files checked,
    plug-ins imported, the reload watch running), in the loop thread, on any free port (``--port 0``)."""

    def __init__(self, lt: LoopThread, path: Path) -> None:
        self.lt = lt
        self.path = path
        cfg, keys = load_router_files(path)
        any_port = {"port": 0, "metrics_port": 0}
        self.router = Router(cfg.model_copy(update={"router": cfg.router.model_copy(update=any_port)}))
        self.router.keys = keys
        self.task: asyncio.Task[None] | None = None

    def start(self) -> RouterFromFile:
        async def start() -> asyncio.Task[None]:
            ready = asyncio.Event()
            task = asyncio.get_running_loop().create_task(serve(self.router, self.path, ready))
            await ready.wait()
            return task

        self.task = self.lt.run(start())
        self.port, self.metrics_port = self.router.port, self.router.metrics_port
        return self

    def stop(self) -> None:
        async def stop() -> None:
            if self.task is not None:
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)

        self.lt.run(stop())


def router_cfg(replica_urls: list[str], **router: Any) -> dict[str, Any]:
    models = router.pop("models", None)
    cap = router.pop("cap", 64)
    return {
        "models": models
        or [
            {
                "name": "m",
                "static_backends": [{"url": u} for u in replica_urls],
                "max_concurrency_per_backend": cap,
            }
        ],
        "router": {
            "host": "127.0.0.1",
            "port": 8080,
            "probe_interval_ms": 60_000,
            "retry_backoff_ms": 1,
            **router,
        },
    }
