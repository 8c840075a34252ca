"""Prefill/decode disaggregation (``runtime.router.disagg``) with engine doubles: the two-phase request, and
every way it recovers when the prefill or the transfer fails. The real engines' side is in
``tests/integration/test_pd_nixl.py``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from runtime.config import RuntimeConfig
from runtime.router.disagg import (
    decode_body,
    kv_params_of,
    prefill_body,
    unsplittable,
    without_kv_params,
)
from runtime.router.payload import stream_start
from runtime.router.replicas import Circuit
from tests.runtime.router.harness import Double, RouterUnderTest, router_cfg

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
KV = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2]],
    "remote_engine_id": "engine-p",
    "remote_request_id": "cmpl-1-0-abc",
    "remote_host": "10.0.0.7",
    "remote_port": 5600,
    "tp_size": 1,
}
ROLE_CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
ERROR_EVENT = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}}\n\n'
)


@dataclass
class Engine(Double):
    """A double that also loads LoRA adapters as vLLM 0.32 does (``/v1/load_lora_adapter``)."""

    loaded: list[str] = field(default_factory=list)

    async def load(self, request: web.Request) -> web.Response:
        self.loaded.append((await request.json())["lora_name"])
        return web.Response(text="Success")

    async def start(self) -> None:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions"):
            app.router.add_post(path, self.generate)
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.loaded = []


@dataclass
class Prefill(Engine):
    """A prefill engine: a kv_producer answers ``kv_transfer_params`` (or misbehaves as ``mode`` says)."""

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if self.mode not in ("ok", "400"):
            return await super().generate(request)
        body = json.loads(await request.read())
        self.requests.append({"path": request.path, "body": body})
        if self.mode == "400":  # the request's own fault (vLLM validates it before prefilling anything)
            return web.json_response({"error": {"message": "bad", "code": 400}}, status=400)
        answer = json.loads(b"{}" if body.get("stream") else b'{"choices":[{"index":0,"text":"x"}]}')
        answer["kv_transfer_params"] = {**KV, "remote_request_id": f"r{len(self.requests)}"}
        return web.json_response(answer)


@dataclass
class LeasingPrefill(Prefill):
    """A prefill engine that holds each prefill's KV blocks for ``lease_s`` from its answer, then frees them for
    other requests (NixlConnector's ``kv_lease_duration``; no decode heartbeats renew it here)."""

    lease_s: float = 1.0
    expires: dict[str, float] = field(default_factory=dict)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        answer = await super().generate(request)
        self.expires[f"r{len(self.requests)}"] = time.monotonic() + self.lease_s
        return answer


@dataclass
class Decode(Engine):
    """A decode engine (kv_consumer, ``kv_load_failure_policy: fail``): ``kv_mode`` says what it does with a
    request that carries a prefill's KV (ok | fail | hang | late: reads the blocks ``late_s`` after it got the
    request, from ``source``, and answers from whatever they hold by then); one without is answered as ``mode``
    says."""

    kv_mode: str = "ok"
    late_s: float = 0.0
    source: LeasingPrefill | None = None

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        if "kv_transfer_params" not in body or self.kv_mode == "ok":
            return await super().generate(request)
        self.requests.append({"path": request.path, "body": body})
        if self.kv_mode == "late":
            await asyncio.sleep(self.late_s)
            assert self.source is not None
            freed = time.monotonic() >= self.source.expires[body["kv_transfer_params"]["remote_request_id"]]
            text = "from blocks another request reused" if freed else "ok"
            return web.json_response({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]})
        if self.kv_mode == "hang":
            await asyncio.sleep(3600)
        if not body.get("stream"):  # vLLM's GenerationError: an HTTP 500
            return web.json_response({"error": {"message": "Internal server error", "code": 500}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})  # a 200, then an error event
        await resp.prepare(request)
        await resp.write(ROLE_CHUNK)
        await resp.write(ERROR_EVENT + b"data: [DONE]\n\n")
        return resp


def pd_cfg(prefills: list[str], decodes: list[str], **prefill: Any) -> dict[str, Any]:
    cfg = router_cfg([], breaker_failures=prefill.pop("breaker_failures", 3))
    cfg["models"] = [
        {
            "name": "m",
            "static_backends": [{"url": u} for u in decodes],
            "prefill": {"target": "m-prefill", **prefill},
        },
        {"name": "m-prefill", "static_backends": [{"url": u} for u in prefills]},
    ]
    cfg["router"]["routes"] = [
        {"model": "m", "strategy": {"name": "kv_aware"}},
        {"model": "m-prefill", "strategy": {"name": "round_robin"}},
    ]
    return cfg


@pytest.fixture
def engines(lt):
    started: list[Double] = []

    def make(kind: type[Double], n: int = 1, **kw: Any) -> list[Double]:
        out = [kind(name=f"{kind.__name__}{i}", **kw) for i in range(n)]
        for d in out:
            lt.run(d.start())
        started.extend(out)
        return out

    yield make
    for d in started:
        lt.run(d.stop())


@pytest.fixture
def pd_router(lt):
    started: list[RouterUnderTest] = []

    def make(cfg: dict[str, Any]) -> RouterUnderTest:
        r = RouterUnderTest(lt, cfg).start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


def _count(r: RouterUnderTest, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in r.metrics().splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _kv_requests(d: Double) -> list[dict[str, Any]]:
    return [q for q in d.requests if "kv_transfer_params" in q["body"]]


# --- the two bodies and the verdicts, as pure functions ------------------------------------------------
def test_the_prefill_generates_one_token_unstreamed_and_keeps_its_kv_for_a_remote_decode() -> None:
    payload = {
        **CHAT,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 9,
        "min_tokens": 3,
        "kv_transfer_params": {"remote_host": "evil"},
    }
    sent = json.loads(prefill_body(payload))
    assert sent["max_tokens"] == 1 and sent["max_completion_tokens"] == 1
    assert sent["stream"] is False and "stream_options" not in sent and "min_tokens" not in sent
    assert sent["kv_transfer_params"] == {"do_remote_decode": True}
    assert sent["messages"] == CHAT["messages"]


def test_the_decode_carries_the_prefills_kv_params_and_never_the_clients() -> None:
    payload = {**CHAT, "kv_transfer_params": {"remote_host": "evil", "remote_port": 22}}
    plain = without_kv_params(json.dumps(payload).encode(), payload)
    assert "kv_transfer_params" not in json.loads(plain)
    assert json.loads(decode_body(plain, KV)) == {**CHAT, "kv_transfer_params": KV}
    untouched = json.dumps(CHAT).encode()
    assert without_kv_params(untouched, CHAT) is untouched


def test_a_prefill_answer_without_where_the_kv_is_gives_no_params() -> None:
    assert kv_params_of(json.dumps({"kv_transfer_params": KV}).encode()) == KV
    assert kv_params_of(b'{"choices":[]}') is None
    assert kv_params_of(json.dumps({"kv_transfer_params": {**KV, "remote_host": None}}).encode()) is None
    assert kv_params_of(b"not json") is None


def test_several_choices_and_prompt_logprobs_are_not_split() -> None:
    assert unsplittable(CHAT) is None
    assert unsplittable({**CHAT, "n": 2}) == "several choices"
    assert unsplittable({**CHAT, "prompt_logprobs": 1}) == "prompt logprobs"
    assert unsplittable({"prompt": "x", "echo": True, "logprobs": 1}) == "prompt logprobs"


def test_a_streams_start_is_judged_past_the_chat_role_event() -> None:
    assert stream_start(ROLE_CHUNK) == "wait"
    assert stream_start(ROLE_CHUNK + ERROR_EVENT) == "error"
    assert stream_start(ERROR_EVENT) == "error"  # completions: the error comes first
    token = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    assert stream_start(ROLE_CHUNK + token) == "generated"
    assert stream_start(b'data: {"choices":[{"index":0,"text":"a"}]}\n\n') == "generated"
    assert stream_start(b"data: [DONE]\n\n") == "generated"
    assert stream_start(b'data: {"choices":[{"index":0,"text":"a"') == "wait"  # not whole yet


# --- the runtime config ---------------------------------------------------------------------------------
def test_a_prefill_target_must_be_another_generation_target_without_adapters_or_versions() -> None:
    ok = pd_cfg(["http://p:1"], ["http://d:1"])
    assert RuntimeConfig.model_validate(ok).prefill_targets() == {"m-prefill": "m"}
    missing = pd_cfg(["http://p:1"], ["http://d:1"])
    missing["models"][0]["prefill"]["target"] = "nope"
    with pytest.raises(ValidationError, match="not another model target"):
        RuntimeConfig.model_validate(missing)
    adapters = pd_cfg(["http://p:1"], ["http://d:1"])
    adapters["models"][1]["adapters"] = [{"name": "a", "path": "/a"}]
    with pytest.raises(ValidationError, match="lists adapters"):
        RuntimeConfig.model_validate(adapters)
    sglang = pd_cfg(["http://p:1"], ["http://d:1"])
    sglang["models"][1]["engine"] = "sglang"
    with pytest.raises(ValidationError, match="its engine is sglang"):
        RuntimeConfig.model_validate(sglang)


# --- the two-phase request through the router -------------------------------------------------------------
def test_a_request_is_prefilled_on_one_replica_and_decoded_with_its_kv_on_another(engines, pd_router) -> None:
    (p,) = engines(Prefill)
    (d,) = engines(Decode)
    r = pd_router(pd_cfg([p.url], [d.url]))
    status, _, body = r.request(
        "POST", "/v1/chat/completions", {**CHAT, "kv_transfer_params": {"remote_host": "x"}}
    )
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "ok"
    (sent,) = p.requests
    assert sent["body"]["max_tokens"] == 1 and sent["body"]["stream"] is False
    assert sent["body"]["kv_transfer_params"] == {"do_remote_decode": True}
    (decoded,) = d.requests
    assert decoded["body"]["kv_transfer_params"] == {**KV, "remote_request_id": "r1"}
    assert decoded["body"]["max_tokens"] == 5
    assert _count(r, "inferstack_router_pd_requests_total", outcome="disaggregated") == 1


def test_a_streamed_request_streams_its_decode(engines, pd_router) -> None:
    (p,) = engines(Prefill)
    (d,) = engines(Decode)
    r = pd_router(pd_cfg([p.url], [d.url]))
    status, headers, body = r.request("POST", "/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body.count(b"data: {") == 3 and body.endswith(b"data: [DONE]\n\n")
    assert "stream_options" not in p.requests[0]["body"] and p.requests[0]["body"]["stream"] is False
    assert d.requests[0]["body"]["kv_transfer_params"]["remote_engine_id"] == "engine-p"


def test_the_prefill_target_is_not_a_model_clients_can_call(engines, pd_router) -> None:
    (p,) = engines(Prefill)
    (d,) = engines(Decode)
    r = pd_router(pd_cfg([p.url], [d.url]))
    _, _, body = r.request("GET", "/v1/models")
    assert [m["id"] for m in json.loads(body)["data"]] == ["m"]
    assert r.request("POST", "/v1/chat/completions", {**CHAT, "model": "m-prefill"})[0] == 404


def test_a_failing_prefill_is_retried_on_another_then_the_decode_computes_the_prompt(
    engines, pd_router
) -> None:
    bad, good = engines(Prefill, 2)
    bad.mode = "500"
    (d,) = engines(Decode)
    r = pd_router(pd_cfg([bad.url, good.url], [d.url]))
    for _ in range(2):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert len(_kv_requests(d)) == 2  # every request was disaggregated in the end
    good.mode = "503"
    status, _, _ = r.request("POST", "/v1/chat/completions", CHAT)
    assert status == 200  # both prefills failed: decode-only
    assert "kv_transfer_params" not in d.requests[-1]["body"]
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="prefill_error") == 1
    assert _count(r, "inferstack_router_pd_requests_total", outcome="decode_only") == 1


def test_a_prefill_that_hangs_is_cut_at_its_timeout_and_the_decode_computes_the_prompt(
    engines, pd_router
) -> None:
    (p,) = engines(Prefill, mode="hang")
    (d,) = engines(Decode)
    r = pd_router(pd_cfg([p.url], [d.url], timeout_ms=300, attempts=1))
    started = time.monotonic()
    status, _, _ = r.request("POST", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 3})
    assert status == 200 and time.monotonic() - started < 5
    assert "kv_transfer_params" not in d.requests[-1]["body"]
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="prefill_timeout") == 1


def test_a_prefill_refusing_the_request_is_not_retried_and_the_decode_answers_it(engines, pd_router) -> None:
    a, b = engines(Prefill, 2)
    for p in (a, b):
        p.mode = "400"
    (d,) = engines(Decode)
    r = pd_router(pd_cfg([a.url, b.url], [d.url]))
    assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    assert len(a.requests) + len(b.requests) == 1
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="prefill_refused") == 1
    state = r.call(lambda: r.router.fleet.models["m-prefill"].by_url[a.url].breaker.state)
    assert state is Circuit.CLOSED


def test_no_healthy_prefill_replica_means_decode_only_at_once(engines, pd_router) -> None:
    (d,) = engines(Decode)
    r = pd_router(pd_cfg(["http://127.0.0.1:9"], [d.url]))  # nothing listens on the discard port
    for _ in range(4):
        assert r.request("POST", "/v1/chat/completions", CHAT)[0] == 200
    reasons = {"prefill_error", "no_prefill_replica"}
    assert sum(_count(r, "inferstack_router_pd_fallbacks_total", reason=why) for why in reasons) == 4


@pytest.mark.parametrize("stream", [False, True])
def test_a_decode_that_cannot_load_the_kv_is_sent_again_without_it_and_the_prefill_stops_being_paired(
    engines, pd_router, stream: bool
) -> None:
    (p,) = engines(Prefill)
    (d,) = engines(Decode, kv_mode="fail")
    r = pd_router(pd_cfg([p.url], [d.url], breaker_failures=2))
    for _ in range(4):
        status, _, body = r.request("POST", "/v1/chat/completions", {**CHAT, "stream": stream})
        assert status == 200 and b"error" not in body
    assert len(p.requests) == 2  # its transfers failed twice: its circuit opened, though /health is fine
    state = r.call(lambda: r.router.fleet.models["m-prefill"].by_url[p.url].breaker.state)
    assert state is Circuit.OPEN
    assert r.call(lambda: r.router.fleet.models["m-prefill"].by_url[p.url].healthy)
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="transfer_failed") == 2
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="no_prefill_replica") == 2
    decode = r.call(lambda: r.router.fleet.models["m"].by_url[d.url].breaker.state)
    assert decode is Circuit.CLOSED  # the decode replica is not blamed for its partner's transfers


def test_a_streamed_decode_whose_kv_never_arrives_is_cut_at_the_transfer_bound(engines, pd_router) -> None:
    (p,) = engines(Prefill)
    (d,) = engines(Decode, kv_mode="hang")
    r = pd_router(pd_cfg([p.url], [d.url], transfer_timeout_ms=400))
    started = time.monotonic()
    status, _, body = r.request("POST", "/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")
    assert time.monotonic() - started < 5
    assert "kv_transfer_params" not in d.requests[-1]["body"]
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="transfer_timeout") == 1


def test_a_non_streamed_decode_waiting_on_a_prefill_that_froze_is_given_up(engines, pd_router) -> None:
    (p,) = engines(Prefill)
    (d,) = engines(Decode, kv_mode="hang")
    r = pd_router(pd_cfg([p.url], [d.url]))

    def freeze() -> (
        None
    ):  # what the signal loop concludes of a SIGSTOPped engine whose /health stops answering
        time.sleep(1.5)
        r.call(lambda: setattr(r.router.fleet.models["m-prefill"].by_url[p.url], "healthy", False))

    threading.Thread(target=freeze, daemon=True).start()
    started = time.monotonic()
    status, _, _ = r.request("POST", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 3})
    assert status == 200 and time.monotonic() - started < 8
    assert "kv_transfer_params" not in d.requests[-1]["body"]
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="transfer_timeout") == 1


def test_a_lora_request_loads_its_adapter_on_both_the_prefill_and_the_decode_replica(
    engines, pd_router
) -> None:
    (p,) = engines(Prefill)
    (d,) = engines(Decode)
    cfg = pd_cfg([p.url], [d.url])
    cfg["models"][0]["adapters"] = [{"name": "sql", "path": "/adapters/sql"}]
    r = pd_router(cfg)
    assert r.request("POST", "/v1/chat/completions", {**CHAT, "model": "sql"})[0] == 200
    assert p.loaded == ["sql"] and d.loaded == ["sql"]
    assert p.requests[0]["body"]["model"] == "sql" and d.requests[0]["body"]["model"] == "sql"
    assert d.requests[0]["body"]["kv_transfer_params"]["remote_engine_id"] == "engine-p"


def test_a_non_streamed_decode_never_answers_from_kv_whose_lease_ran_out(engines, pd_router) -> None:
    """vLLM's prefill engine frees a prefill's blocks when its lease runs out, and a decode that reads them later
    reads whatever another request wrote there ("Potentially invalid KV blocks ... may have expired"): a
    non-streamed decode's answer is due before the lease, else it is sent again without the KV."""
    (p,) = engines(LeasingPrefill, lease_s=1.0)
    (d,) = engines(Decode, kv_mode="late", late_s=2.0, source=p)
    r = pd_router(pd_cfg([p.url], [d.url], kv_lease_s=1))
    started = time.monotonic()
    status, _, body = r.request("POST", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 3})
    assert status == 200 and b"reused" not in body
    assert time.monotonic() - started < 5
    assert "kv_transfer_params" not in d.requests[-1]["body"]
    assert _count(r, "inferstack_router_pd_fallbacks_total", reason="kv_lease") == 1
    state = r.call(lambda: r.router.fleet.models["m-prefill"].by_url[p.url].breaker.state)
    assert state is Circuit.CLOSED  # a long answer is not the prefill replica's failure


def test_a_batch_runs_through_both_phases_and_every_line_is_answered_once(engines, lt, tmp_path) -> None:
    """The Batch API through P/D: the batch service (a process) sends each line to the router, which prefills it
    on the prefill replica and decodes it with the KV, as any client request."""
    from tests.runtime.batch_service.harness import BatchStack, chat_line, jsonl, results, run_batch, wait_for

    (p,) = engines(Prefill)
    (d,) = engines(Decode)
    pd = pd_cfg([p.url], [d.url])
    stack = BatchStack(
        lt, tmp_path, [d], router_extra={"models": pd["models"], "routes": pd["router"]["routes"]}
    )
    try:
        stack.start()
        client = stack.client()
        ids = [f"line-{i}" for i in range(6)]
        done = wait_for(client, run_batch(client, jsonl(chat_line(i) for i in ids)), {"completed", "failed"})
        assert done.status == "completed" and done.request_counts.completed == 6, done
        out, err = results(client, done)
        assert err == [] and [line["custom_id"] for line in out] == ids
        assert all(line["response"]["body"]["choices"][0]["message"]["content"] == "ok" for line in out)
        assert len(p.requests) == 6 and all(q["body"]["max_tokens"] == 1 for q in p.requests)
        decoded = _kv_requests(d)
        assert len(decoded) == 6 and {q["body"]["max_tokens"] for q in decoded} == {2}
        assert {q["body"]["kv_transfer_params"]["remote_request_id"] for q in decoded} == {
            f"r{i}" for i in range(1, 7)
        }
        assert all(q["headers"].get("x-inferstack-priority") == "low" for q in decoded)
        assert isinstance(stack.router, RouterUnderTest)
        assert _count(stack.router, "inferstack_router_pd_requests_total", outcome="disaggregated") == 6
    finally:
        stack.stop()


def test_the_pd_bench_reads_why_requests_were_not_disaggregated_from_the_routers_counter() -> None:
    from prometheus_client import generate_latest

    from bench.pd.run import fallback_reasons, report, why_not
    from runtime.router.metrics import RouterMetrics

    metrics = RouterMetrics()
    for model, reason in (("m", "prefill_timeout"), ("m", "prefill_timeout"), ("n", "transfer_failed")):
        metrics.pd_fallback(model, reason)
    reasons = fallback_reasons(generate_latest(metrics.registry).decode())
    assert reasons == {"prefill_timeout": 2.0, "transfer_failed": 1.0}
    pd = {
        "requests": 48, "errors": 0, "ttft_p50_ms": 1, "ttft_p95_ms": 1, "itl_p50_ms": 1, "itl_p95_ms": 1,
        "tokens_per_s": 1, "disaggregated": 45.0, "fallbacks_by_reason": reasons,
    }  # fmt: skip
    text = report({"machine": {}, "args": {"requests": 48, "concurrency": 4, "prompt_words": 300, "max_tokens": 32},
                   "modes": {"pd": pd}})  # fmt: skip
    assert (
        "45 of 48 requests disaggregated; decode-only fallbacks by reason: prefill_timeout 2, transfer_failed 1"
        in text
    )
    assert why_not({}) == "the fallbacks' reasons were not recorded"
