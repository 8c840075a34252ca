"""The batcher against a fake pooling engine: coalescing, order, poison isolation, backpressure."""

from __future__ import annotations

import array
import asyncio
import base64
import json

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.batcher.conftest import batcher_config
from tests.runtime.health.conftest import wait_for
from tests.runtime.health.doubles import FakeEngine, fake_vector, serve


async def post(session, url, body):
    async with session.post(url + "/v1/embeddings", json=body) as r:
        return r.status, await r.json(), dict(r.headers)


def embed_calls(engine):
    return [c for c in engine.engine.calls if c["path"] == "/v1/embeddings"]


async def test_concurrent_requests_share_engine_calls_and_get_their_own_results(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=0.2)
    b = await batcher_at(
        batcher_config([engine.url], max_batch_size=64, max_wait_ms=20, max_inflight_batches_per_backend=1)
    )
    requests = [{"model": "emb", "input": [f"req{i} item{j}" for j in range(1 + i % 3)]} for i in range(20)]
    requests.append({"model": "emb", "input": [5, 6, 7]})  # token ids
    requests.append({"model": "emb", "input": "a single string"})
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*(post(s, b.url, r) for r in requests))
    for req, (status, body, _) in zip(requests, results, strict=True):
        assert status == 200, body
        inputs = (
            req["input"]
            if isinstance(req["input"], list) and not isinstance(req["input"][0], int)
            else [req["input"]]
        )
        assert [d["index"] for d in body["data"]] == list(range(len(inputs)))
        assert [d["embedding"] for d in body["data"]] == [fake_vector(x) for x in inputs]
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] >= 0
    calls = embed_calls(engine)
    assert len(calls) < len(requests)  # coalesced
    engine_total = sum(len(c["body"]["input"]) for c in calls)
    assert engine_total == sum(len(r["data"]) for _, r, _ in results)
    # usage: the engine's per-call totals are split exactly, never invented
    fake_tokens = sum(
        len(x) if isinstance(x, list) else len(str(x).split()) for c in calls for x in c["body"]["input"]
    )
    assert sum(r["usage"]["prompt_tokens"] for _, r, _ in results) == fake_tokens


async def test_batches_respect_max_batch_size(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=0.05)
    b = await batcher_at(batcher_config([engine.url], max_batch_size=4, max_wait_ms=50))
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(
            *(post(s, b.url, {"model": "emb", "input": f"x{i}"}) for i in range(17))
        )
    assert all(status == 200 for status, _, _ in results)
    assert all(len(c["body"]["input"]) <= 4 for c in embed_calls(engine))


async def test_poison_input_fails_alone(fake_engine, batcher_at):
    engine = await fake_engine(embed_fail_on="POISON", embed_delay_s=0.1)
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=50, max_inflight_batches_per_backend=1))
    bodies = [{"model": "emb", "input": f"fine {i}"} for i in range(6)]
    bodies.insert(3, {"model": "emb", "input": ["ok part", "POISON"]})
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*(post(s, b.url, body) for body in bodies))
    statuses = [status for status, _, _ in results]
    assert statuses == [200, 200, 200, 400, 200, 200, 200]
    assert results[3][1]["error"]["message"] == "poison input"
    assert engine.engine.max_embeds_at_once == 1, "members are retried within the replica's call cap"
    for body, (_, out, _) in zip(bodies, results, strict=True):
        if body["input"] != ["ok part", "POISON"]:
            assert out["data"][0]["embedding"] == fake_vector(body["input"])


async def test_a_full_queue_is_503_overloaded_with_retry_after(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=30)  # the engine holds the first batch
    b = await batcher_at(
        batcher_config(
            [engine.url], max_queue=4, max_batch_size=2, max_wait_ms=0, max_inflight_batches_per_backend=1
        )
    )
    async with aiohttp.ClientSession() as s:
        first = [asyncio.create_task(post(s, b.url, {"model": "emb", "input": ["a", "b"]}))]
        await wait_for(lambda: len(embed_calls(engine)) == 1)  # dispatched, engine busy
        waiting = [
            asyncio.create_task(post(s, b.url, {"model": "emb", "input": ["c", "d"]})) for _ in range(2)
        ]
        await wait_for(lambda: b.batcher.models["emb"].depth == 4)
        status, body, headers = await post(s, b.url, {"model": "emb", "input": "e"})
        assert status == 503 and int(headers["Retry-After"]) >= 1  # load: not the caller's own limit (429)
        assert body["error"]["code"] == "overloaded"
        for t in [*first, *waiting]:
            t.cancel()
        await asyncio.gather(*first, *waiting, return_exceptions=True)


async def test_client_disconnect_drops_its_inputs_before_dispatch(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=0.5)
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=0, max_inflight_batches_per_backend=1))
    mb = b.batcher.models["emb"]
    async with aiohttp.ClientSession() as s:
        busy = asyncio.create_task(post(s, b.url, {"model": "emb", "input": "keeps the engine busy"}))
        await wait_for(lambda: len(embed_calls(engine)) == 1)
        leaver = asyncio.create_task(post(s, b.url, {"model": "emb", "input": "LEAVER"}))
        await wait_for(lambda: mb.depth == 1)
        leaver.cancel()  # closes the connection: the server cancels the handler
        await asyncio.gather(leaver, return_exceptions=True)
        stayer = await post(s, b.url, {"model": "emb", "input": "stayer"})
        assert stayer[0] == 200
        assert (await busy)[0] == 200
    sent = [x for c in embed_calls(engine) for x in c["body"]["input"]]
    assert "LEAVER" not in sent and "stayer" in sent
    # the leaver is counted as a client that went away, not as a server error
    assert b.batcher.metrics.requests.labels("emb", "499")._value.get() == 1
    assert b.batcher.metrics.requests.labels("emb", "500")._value.get() == 0


async def test_a_departed_clients_queue_space_is_free_at_once(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=30)  # the first call holds the only slot throughout
    b = await batcher_at(
        batcher_config([engine.url], max_queue=3, max_wait_ms=0, max_inflight_batches_per_backend=1)
    )
    mb = b.batcher.models["emb"]
    async with aiohttp.ClientSession() as s:
        busy = asyncio.create_task(post(s, b.url, {"model": "emb", "input": "busy"}))
        await wait_for(lambda: len(embed_calls(engine)) == 1)
        leaver = asyncio.create_task(post(s, b.url, {"model": "emb", "input": ["LEAVER 1", "LEAVER 2"]}))
        await wait_for(lambda: mb.depth == 2)
        status, _, _ = await post(s, b.url, {"model": "emb", "input": ["x", "y"]})
        assert status == 503  # 2 + 2 > 3: the leaver's inputs hold the queue
        leaver.cancel()  # closes its connection; the engine is still busy, so no dispatch happens
        await asyncio.gather(leaver, return_exceptions=True)
        await wait_for(lambda: mb.depth == 0)  # freed by the disconnect itself, not by a later dispatch
        stayer = asyncio.create_task(post(s, b.url, {"model": "emb", "input": ["stayer 1", "stayer 2"]}))
        await wait_for(lambda: mb.depth == 2)  # accepted where it was refused before
        queued = [item.value for q in mb.queues.values() for item in q]
        assert queued == ["stayer 1", "stayer 2"]
        for t in (busy, stayer):
            t.cancel()
        await asyncio.gather(busy, stayer, return_exceptions=True)
    assert len(embed_calls(engine)) == 1  # the leaver's inputs never reached the engine
    assert b.batcher.metrics.items.labels("emb", "dropped")._value.get() >= 2


async def test_a_partial_batch_goes_when_arrivals_pause_not_after_max_wait(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=1.0)
    b = await batcher_at(
        batcher_config(
            [engine.url], max_batch_size=32, max_wait_ms=600_000, max_inflight_batches_per_backend=1
        )
    )
    mb = b.batcher.models["emb"]
    async with aiohttp.ClientSession() as s, asyncio.timeout(30):  # max_wait_ms is ten minutes
        # a lone request on an idle replica: nobody else is coming, so it goes without waiting
        first = asyncio.create_task(post(s, b.url, {"model": "emb", "input": "alone"}))
        await wait_for(lambda: len(embed_calls(engine)) == 1)
        # a burst while the replica computes: held (partial), then sent together once it is free
        burst = [asyncio.create_task(post(s, b.url, {"model": "emb", "input": f"B{i}"})) for i in range(3)]
        await wait_for(lambda: mb.depth == 3)
        results = await asyncio.gather(first, *burst)
    assert all(status == 200 for status, _, _ in results)
    assert [sorted(c["body"]["input"]) for c in embed_calls(engine)] == [["alone"], ["B0", "B1", "B2"]]


async def test_requests_with_different_parameters_are_not_mixed(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=0.1)
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=30))
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(
            *(
                post(s, b.url, {"model": "emb", "input": f"x{i}", "dimensions": 8 if i % 2 else None})
                for i in range(8)
            )
        )
    for call in embed_calls(engine):
        assert len({call["body"].get("dimensions")}) == 1
        dims = call["body"].get("dimensions")
        assert all((int(x[1:]) % 2 == 1) == (dims == 8) for x in call["body"]["input"])


async def test_texts_and_token_ids_never_share_a_call(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=0.1)
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=30))
    inputs = [f"text {i}" if i % 2 else [i, i + 1] for i in range(8)]
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*(post(s, b.url, {"model": "emb", "input": x}) for x in inputs))
    assert all(status == 200 for status, _, _ in results)
    calls = embed_calls(engine)
    assert len(calls) < len(inputs)  # still coalesced, each kind with its own
    for call in calls:  # a mixed `input` is a 400 from vLLM, and every member would be retried alone
        assert len({isinstance(x, str) for x in call["body"]["input"]}) == 1, call["body"]["input"]


async def test_client_mistakes_are_4xx(fake_engine, batcher_at):
    engine = await fake_engine()
    b = await batcher_at(batcher_config([engine.url]))
    async with aiohttp.ClientSession() as s:
        async with s.post(b.url + "/v1/embeddings", data=b"{not json") as r:
            assert r.status == 400
        async with s.post(b.url + "/v1/embeddings", json=[1, 2]) as r:
            assert r.status == 400
        async with s.post(b.url + "/v1/embeddings", json={"input": "x"}) as r:
            assert r.status == 400
        async with s.post(b.url + "/v1/embeddings", json={"model": "nope", "input": "x"}) as r:
            assert r.status == 404 and "emb" in (await r.json())["error"]["message"]
        async with s.post(b.url + "/v1/embeddings", json={"model": "emb", "input": {"a": 1}}) as r:
            assert r.status == 400
        async with s.post(b.url + "/v1/embeddings", json={"model": "emb", "input": "x" * 100_000}) as r:
            assert r.status == 413
        nested = "[" * 300 + "]" * 300  # JSON readers take it, orjson's writer does not
        for fmt in ("float", "bytes"):
            raw = f'{{"model":"emb","input":"x","encoding_format":"{fmt}","extra":{nested}}}'.encode()
            async with s.post(b.url + "/v1/embeddings", data=raw) as r:
                assert r.status == 400, fmt


async def test_engine_unreachable_is_502_without_per_member_retries(batcher_at, unused_tcp_port):
    b = await batcher_at(batcher_config([f"http://127.0.0.1:{unused_tcp_port}"], max_wait_ms=50))
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(
            *(post(s, b.url, {"model": "emb", "input": f"x{i}"}) for i in range(4))
        )
    assert all(status == 502 and body["error"]["type"] == "bad_gateway" for status, body, _ in results)
    calls = b.batcher.metrics.engine_calls
    assert calls.labels("emb", "retry_alone")._value.get() == 0


async def test_score_passes_through(fake_engine, batcher_at):
    engine = await fake_engine()
    b = await batcher_at(batcher_config([engine.url]))
    body = {"model": "emb", "text_1": "a", "text_2": ["b"]}
    async with aiohttp.ClientSession() as s, s.post(b.url + "/v1/score", json=body) as r:
        assert r.status == 200 and (await r.json())["echo"]["text_1"] == "a"


async def test_metrics(fake_engine, batcher_at):
    engine = await fake_engine()
    b = await batcher_at(batcher_config([engine.url]))
    async with aiohttp.ClientSession() as s:
        await post(s, b.url, {"model": "emb", "input": ["a", "b", "c"]})
        async with s.get(b.url + "/metrics") as r:
            text = await r.text()
    samples = {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for f in text_string_to_metric_families(text)
        for x in f.samples
    }
    assert samples[("inferstack_batcher_batch_size_count", (("model", "emb"),))] == 1
    assert samples[("inferstack_batcher_batch_size_sum", (("model", "emb"),))] == 3
    assert samples[("inferstack_batcher_items_total", (("model", "emb"), ("outcome", "ok")))] == 3
    assert samples[("inferstack_batcher_queue_depth", (("model", "emb"),))] == 0
    assert ("inferstack_batcher_items_per_second", (("model", "emb"),)) in samples
    assert samples[("inferstack_batcher_wait_seconds_count", (("model", "emb"),))] == 3


async def test_queued_requests_fail_fast_when_the_last_replica_leaves(fake_engine):
    from tests.runtime.batcher.conftest import start_batcher
    from tests.runtime.health.conftest import wait_for as wait

    engine = await fake_engine(embed_delay_s=30)
    lists: asyncio.Queue[list[str]] = asyncio.Queue()

    async def watch(_target):
        while True:
            yield await lists.get()

    running = await start_batcher(batcher_config([engine.url], max_wait_ms=0), watch=watch)
    batcher, url = running.batcher, running.url
    try:
        await lists.put([engine.url])
        await wait(lambda: batcher.ready)
        async with aiohttp.ClientSession() as s:
            busy = asyncio.create_task(post(s, url, {"model": "emb", "input": "busy"}))
            await wait(lambda: len(embed_calls(engine)) == 1)
            queued = asyncio.create_task(post(s, url, {"model": "emb", "input": "queued"}))
            await wait(lambda: batcher.models["emb"].depth == 1)
            await lists.put([])  # the replica is gone
            status, body, _ = await queued
            assert status == 503 and body["error"]["type"] == "service_unavailable"
            status, _, _ = await post(s, url, {"model": "emb", "input": "late"})
            assert status == 503
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
    finally:
        await running.close()


async def test_unbatched_requests_share_the_queue_budget_and_get_503_beyond_it(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=0.5)
    b = await batcher_at(batcher_config([engine.url], max_queue=2))
    binary = {"model": "emb", "input": "x", "encoding_format": "bytes"}
    async with aiohttp.ClientSession() as s:
        first = [asyncio.create_task(post(s, b.url, binary)) for _ in range(2)]
        await wait_for(lambda: b.batcher.models["emb"].forwarded == 2)
        status, body, headers = await post(s, b.url, binary)
        assert status == 503 and body["error"]["code"] == "overloaded"
        assert int(headers["Retry-After"]) >= 1
        status, _, _ = await post(s, b.url, {"model": "emb", "input": "batched"})
        assert status == 503, "forwarded requests count against the batched queue too"
        assert [r[0] for r in await asyncio.gather(*first)] == [200, 200]
    assert b.batcher.models["emb"].forwarded == 0


async def test_a_replica_listed_twice_is_one_replica(fake_engine):
    from tests.runtime.batcher.conftest import start_batcher
    from tests.runtime.health.conftest import wait_for as wait

    engine = await fake_engine()
    lists: asyncio.Queue[list[str]] = asyncio.Queue()

    async def watch(_target):
        while True:
            yield await lists.get()

    running = await start_batcher(batcher_config([engine.url], max_wait_ms=0), watch=watch)
    try:
        await lists.put([engine.url, engine.url + "/"])
        await wait(lambda: running.batcher.ready)
        assert [b.url for b in running.batcher.models["emb"].replicas] == [engine.url.rstrip("/")]
    finally:
        await running.close()


async def test_queues_for_distinct_parameters_do_not_accumulate(fake_engine, batcher_at):
    engine = await fake_engine()
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=0))
    async with aiohttp.ClientSession() as s:
        for i in range(20):
            status, _, _ = await post(s, b.url, {"model": "emb", "input": "x", "extra": i})
            assert status == 200
    await wait_for(lambda: len(b.batcher.models["emb"].queues) <= 1)


async def test_partial_batches_wait_for_an_idle_replica_full_ones_do_not(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=1.0)
    b = await batcher_at(
        batcher_config([engine.url], max_batch_size=4, max_wait_ms=0, max_inflight_batches_per_backend=2)
    )
    mb = b.batcher.models["emb"]
    async with aiohttp.ClientSession() as s:
        first = asyncio.create_task(post(s, b.url, {"model": "emb", "input": "A"}))
        await wait_for(lambda: len(embed_calls(engine)) == 1)  # the replica was idle: it went at once
        held = [asyncio.create_task(post(s, b.url, {"model": "emb", "input": f"B{i}"})) for i in range(2)]
        await wait_for(lambda: mb.depth == 2)  # partial, replica busy: held although max_wait_ms is 0
        assert len(embed_calls(engine)) == 1
        more = [asyncio.create_task(post(s, b.url, {"model": "emb", "input": f"B{i}"})) for i in range(2, 4)]
        await wait_for(lambda: len(embed_calls(engine)) == 2)  # full: uses the second slot
        assert sorted(embed_calls(engine)[1]["body"]["input"]) == ["B0", "B1", "B2", "B3"]
        results = await asyncio.gather(first, *held, *more)
    assert all(status == 200 for status, _, _ in results)


class Base64Engine(FakeEngine):
    """A fake engine that honours ``encoding_format: base64`` as vLLM does (float32, native order)."""

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = await super().embeddings(_Replay(request, body))
        if body.get("encoding_format") == "base64" and resp.status == 200:
            out = json.loads(resp.body)  # type: ignore[attr-defined]
            for d in out["data"]:
                d["embedding"] = b64(d["embedding"])
            return web.json_response(out)
        return resp


class _Replay:
    def __init__(self, request: web.Request, body: dict) -> None:
        self.path, self._body = request.path, body

    async def json(self) -> dict:
        return self._body


def b64(vector: list[float]) -> str:
    return base64.b64encode(array.array("f", vector).tobytes()).decode()


async def test_float_and_base64_clients_share_calls_and_get_their_own_format(batcher_at):
    served = await serve(Base64Engine(embed_delay_s=0.2))
    try:
        b = await batcher_at(batcher_config([served.url], max_wait_ms=50, max_inflight_batches_per_backend=1))
        bodies = [
            {"model": "emb", "input": f"x{i}", **({"encoding_format": "base64"} if i % 2 else {})}
            for i in range(8)
        ]
        bodies.append({"model": "emb", "input": ["p", "q"], "encoding_format": "float"})
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(post(s, b.url, body) for body in bodies))
        for body, (status, out, _) in zip(bodies, results, strict=True):
            assert status == 200, out
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            want = [fake_vector(x) for x in inputs]
            if body.get("encoding_format") == "base64":
                assert [d["embedding"] for d in out["data"]] == [b64(v) for v in want]  # byte-identical
            else:
                assert [d["embedding"] for d in out["data"]] == want
            assert [d["index"] for d in out["data"]] == list(range(len(inputs)))
        calls = embed_calls(served)
        assert all(c["body"]["encoding_format"] == "base64" for c in calls)
        assert len(calls) < len(bodies)
    finally:
        await served.close()


async def test_other_dtypes_are_not_converted_and_bytes_formats_pass_through(fake_engine, batcher_at):
    engine = await fake_engine()
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=0))
    async with aiohttp.ClientSession() as s:
        status, _, _ = await post(s, b.url, {"model": "emb", "input": "x", "embed_dtype": "float16"})
        assert status == 200
        status, _, _ = await post(s, b.url, {"model": "emb", "input": ["y", "z"], "encoding_format": "bytes"})
        assert status == 200
    first, second = embed_calls(engine)
    assert first["body"] == {"model": "emb", "input": ["x"], "embed_dtype": "float16"}
    assert second["body"] == {"model": "emb", "input": ["y", "z"], "encoding_format": "bytes"}


async def test_routes_methods_and_probes(fake_engine, batcher_at):
    engine = await fake_engine()
    b = await batcher_at(batcher_config([engine.url]))
    async with aiohttp.ClientSession() as s:
        async with s.get(b.url + "/healthz") as r:
            assert r.status == 200
        async with s.get(b.url + "/readyz") as r:
            assert r.status == 200 and (await r.json())["ready"] is True
        async with s.get(b.url + "/v1/embeddings") as r:
            assert r.status == 405 and "error" in await r.json()
        async with s.post(b.url + "/v1/chat/completions", json={"model": "emb"}) as r:
            assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"


async def test_stopping_answers_the_requests_of_calls_in_flight(fake_engine, batcher_at):
    engine = await fake_engine(embed_delay_s=30)
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=0))
    async with aiohttp.ClientSession() as s:
        call = asyncio.create_task(post(s, b.url, {"model": "emb", "input": "in flight"}))
        await wait_for(lambda: len(embed_calls(engine)) == 1)
        await b.batcher.stop()  # before the server closes the connection: the client is still there
        status, body, _ = await asyncio.wait_for(call, 10)  # a hang guard, not a timing assertion
    assert status == 503 and body["error"]["type"] == "service_unavailable"


async def test_the_rate_window_forgets_old_batches_without_a_scrape(fake_engine, batcher_at):
    import time

    engine = await fake_engine()
    b = await batcher_at(batcher_config([engine.url], max_wait_ms=0))
    mb = b.batcher.models["emb"]
    mb._done_window.extend((time.monotonic() - 60, 1) for _ in range(1000))  # a minute of batches
    async with aiohttp.ClientSession() as s:
        assert (await post(s, b.url, {"model": "emb", "input": "x"}))[0] == 200
    assert len(mb._done_window) == 1  # nobody asked for the rate, yet the old entries are gone


async def test_a_connection_in_use_when_its_replica_leaves_is_closed_not_pooled(fake_engine):
    from runtime.batcher.service import ReplicaClient
    from runtime.upstream import Exchange

    engine = await fake_engine(embed_delay_s=0.2)
    replica = ReplicaClient(engine.url)
    request = replica.request(b"/v1/embeddings", b'{"model":"emb","input":["x"]}')
    ex = await Exchange.open(replica.pool, request, 2.0)
    replica.pool.close()  # discovery dropped the replica while its call was running
    await ex.head(10)
    assert ex.status == 200 and await ex.read_all(10)
    assert replica.pool._idle == []  # closed when the call ended, not kept open for nobody
