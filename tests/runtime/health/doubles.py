"""Test-double engines on 127.0.0.1: real HTTP servers whose answers a test scripts.

Every behaviour a bad engine can show (500s, hangs, garbage, enormous or trickling bodies) is one
attribute away, so fault tests stay short. Nothing here ever listens beyond loopback.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {hits}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preemptions}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="tiny"}} {ttft_fast}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0",model_name="tiny"}} {ttft_total}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} {ttft_total}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="tiny"}} {ttft_total}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="tiny"}} 1.0
"""


def vllm_metrics(**values: float) -> str:
    base = {
        "running": 0,
        "waiting": 0,
        "kv": 0.0,
        "queries": 0,
        "hits": 0,
        "preemptions": 0,
        "ttft_fast": 0,
        "ttft_total": 0,
    }
    base.update(values)
    return VLLM_METRICS.format(**base)


@dataclass
class FakeEngine:
    """What the fake replies; tests change the fields between probe rounds."""

    health_status: int = 200
    health_hang: bool = False
    metrics_status: int = 200
    metrics_body: str | bytes = field(default_factory=vllm_metrics)
    metrics_trickle: bool = False  # sends bytes slowly, forever
    completion_hang: bool = False
    completion_status: int = 200
    embed_fail_on: str | None = None  # embedding input that makes the whole call fail (a poison input)
    embed_delay_s: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)  # what /v1/models lists (vLLM's shape)
    models_body: bytes | None = None  # raw /v1/models answer instead (hostile JSON)
    embeds_at_once: int = 0  # embedding calls in progress now, and the most seen at once
    max_embeds_at_once: int = 0
    healths_at_once: int = 0  # /health calls in progress now (a hanging one counts until released)
    _hang: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self._hang.set()

    async def health(self, _: web.Request) -> web.StreamResponse:
        self.healths_at_once += 1
        try:
            if self.health_hang:
                await self._hang.wait()
        finally:
            self.healths_at_once -= 1
        return web.Response(status=self.health_status, text="" if self.health_status == 200 else "down")

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        if self.metrics_trickle:
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            while not self._hang.is_set():
                await resp.write(b"# x\n")
                await asyncio.sleep(0.05)
            return resp
        body = self.metrics_body.encode() if isinstance(self.metrics_body, str) else self.metrics_body
        return web.Response(status=self.metrics_status, body=body, content_type="text/plain")

    async def list_models(self, _: web.Request) -> web.StreamResponse:
        if self.models_body is not None:
            return web.Response(body=self.models_body, content_type="application/json")
        return web.json_response({"object": "list", "data": self.models})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.calls.append({"path": request.path, "body": await request.json()})
        if self.completion_hang:
            await self._hang.wait()
        if self.completion_status != 200:
            return web.json_response({"error": {"message": "boom"}}, status=self.completion_status)
        return web.json_response(
            {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "x"}], "usage": {}}
        )

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls.append({"path": request.path, "body": body})
        self.embeds_at_once += 1
        self.max_embeds_at_once = max(self.max_embeds_at_once, self.embeds_at_once)
        try:
            if self.embed_delay_s:
                await asyncio.sleep(self.embed_delay_s)
        finally:
            self.embeds_at_once -= 1
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]  # one token-id list
        if self.embed_fail_on is not None and any(i == self.embed_fail_on for i in inputs):
            return web.json_response(
                {"object": "error", "message": "poison input", "type": "BadRequestError", "code": 400},
                status=400,
            )
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(x)} for i, x in enumerate(inputs)
        ]
        tokens = sum(len(x) if isinstance(x, list) else len(str(x).split()) for x in inputs)
        return web.json_response(
            {
                "id": "embd-1",
                "object": "list",
                "created": 1,
                "model": body.get("model"),
                "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
            }
        )


async def _score(self: FakeEngine, request: web.Request) -> web.StreamResponse:
    body = await request.json()
    self.calls.append({"path": request.path, "body": body})
    return web.json_response({"object": "list", "data": [{"index": 0, "score": 0.5}], "echo": body})


FakeEngine.score = _score  # type: ignore[attr-defined]


def fake_vector(x: Any) -> list[float]:
    """A deterministic 4-d vector per input, so tests can check each result went to its owner."""
    text = json.dumps(x)
    return [float(len(text)), float(sum(map(ord, text)) % 997), float(text.count("a")), 1.0]


class Served:
    """A running fake engine and its URL."""

    def __init__(self, engine: FakeEngine, runner: web.AppRunner, url: str) -> None:
        self.engine = engine
        self.runner = runner
        self.url = url

    async def close(self) -> None:
        self.engine.release()
        await self.runner.cleanup()


async def serve(engine: FakeEngine) -> Served:
    app = web.Application()
    app.router.add_get("/health", engine.health)
    app.router.add_get("/metrics", engine.metrics)
    app.router.add_get("/v1/models", engine.list_models)
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_post("/v1/embeddings", engine.embeddings)
    app.router.add_post("/v1/score", engine.score)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return Served(engine, runner, f"http://127.0.0.1:{port}")
