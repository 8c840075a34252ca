"""Streams that survive their engine: a stream whose engine resets, hangs, errs or ends early after the client got
its first bytes goes on on another replica, and the client reads one stream (``runtime.router.migration``).

The engines are doubles of a deterministic model (:class:`FakeModel`): token ``k`` is id ``100 + k`` with text
``" w<k>"``, and a request continues from the tokens its prompt already holds (token ids, or the text of a partial
assistant message / of a completion's prompt), as a greedy engine does. Each double can be told to fail after a
number of tokens: reset the connection, hang, send an error event, or end without a finish. Which request fails is
scripted across the doubles in the order requests arrive (``Fleet.plan``), whichever replica the router picks.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web

from runtime.router.migration import Progress, Seam, migratable
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest, router_cfg

PROMPT_IDS = [1, 2, 3, 4, 5]
LENGTH = 12  # the fake model's answer: 12 tokens, then its end of sequence
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": True, "temperature": 0}


def token(k: int) -> str:
    return f" w{k}"


def full(k: int) -> str:
    return "".join(token(i) for i in range(k))


@dataclass
class Fleet:
    """The doubles of one test and their script: the n-th generation request (in arrival order, on any double)
    fails as ``plan[n]`` says: (how, after how many tokens), or None."""

    engines: list[FakeModel]
    plan: list[tuple[str, int] | None]
    log: list[tuple[FakeModel, dict[str, Any]]]
    hold_after: int = 10**9  # requests after this many wait for their double's ``release``

    def arrived(self, engine: FakeModel, request: dict[str, Any]) -> tuple[str, int] | None:
        self.log.append((engine, request))
        return self.plan[len(self.log) - 1] if len(self.log) <= len(self.plan) else None

    def body(self, n: int) -> dict[str, Any]:
        return dict(self.log[n][1]["body"])

    def path(self, n: int) -> str:
        return str(self.log[n][1]["path"])

    @property
    def running(self) -> int:
        return sum(e.running for e in self.engines)

    @property
    def cancelled(self) -> int:
        return sum(e.cancelled for e in self.engines)


@dataclass
class FakeModel(Double):
    """A greedy model's engine double (module docstring)."""

    fleet: Fleet | None = None
    running: int = 0  # generations in progress now

    def _start_at(self, path: str, body: dict[str, Any]) -> tuple[list[int], str]:
        """(prompt ids, text the answer already holds) of a request."""
        if path.endswith("/completions") and "messages" not in body:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                return prompt, ""
            text = str(prompt)
            at = text.find(" w")
            return PROMPT_IDS, text[at:] if at >= 0 else ""
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        if body.get("continue_final_message") and last.get("role") == "assistant":
            return PROMPT_IDS, str(last.get("content") or "")
        return PROMPT_IDS, ""

    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        seen = {"path": request.path, "body": body, "raw": raw, "headers": dict(request.headers)}
        self.requests.append(seen)
        assert self.fleet is not None
        failure = self.fleet.arrived(self, seen)
        if self.hold is not None and len(self.fleet.log) > self.fleet.hold_after:
            await self.hold.wait()
        chat = request.path == "/v1/chat/completions"
        prompt, held_text = self._start_at(request.path, body)
        done = sum(1 for t in prompt if t >= 100)
        if held_text:  # the text path: continue the text as the greedy model would
            done = 0
            while len(full(done + 1)) <= len(held_text):
                done += 1
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or (10**6 if chat else 16)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        reach = max((len(s) for s in stops), default=1) - 1
        ids_asked = bool(body.get("return_token_ids"))
        usage_asked = bool((body.get("stream_options") or {}).get("include_usage"))
        failing, fail_after = failure is not None, failure[1] if failure is not None else 0
        how = failure[0] if failure is not None else None
        if not body.get("stream"):
            text = full(min(LENGTH, done + asked))[len(full(done)) :]
            if how == "reset":
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            answer = {
                "id": "cmpl-x",
                "object": "chat.completion" if chat else "text_completion",
                "created": 1,
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": LENGTH, "total_tokens": 5 + LENGTH},
            }
            return web.json_response(answer)
        rid, created = f"cmpl-{self.name}-{len(self.requests)}", 1000 + len(self.requests)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})

        def event(choice: dict[str, Any], **top: Any) -> bytes:
            obj = "chat.completion.chunk" if chat else "text_completion"
            e = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": body.get("model"),
                "choices": [choice],
            }
            return b"data: " + orjson.dumps({**e, **top}) + b"\n\n"

        def choice(text: str, ids: list[int] | None, finish: str | None = None) -> dict[str, Any]:
            c: dict[str, Any] = (
                {"index": 0, "delta": {"content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            if ids_asked and ids is not None:
                c["token_ids"] = ids
            return c

        self.running += 1
        try:
            await resp.prepare(request)
            if chat:
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                await resp.write(event(first, **({"prompt_token_ids": prompt} if ids_asked else {})))
            elif ids_asked:
                await resp.write(event({**choice("", []), "prompt_token_ids": prompt}))
            out = ""  # this answer's text so far, and what of it was sent
            sent = 0
            n = 0
            k = done
            finish: str | None = None
            base = full(done)
            lead = held_text[len(base) :] if held_text else ""
            while finish is None:
                if failing and n == fail_after:
                    if how == "reset":
                        assert request.transport is not None
                        request.transport.close()
                        return resp
                    if how == "hang":  # until the router lets go (a real engine then aborts the request)
                        while request.transport is not None and not request.transport.is_closing():
                            await asyncio.sleep(0.01)
                        raise ConnectionResetError
                    if how == "error":
                        err = {
                            "error": {"message": "engine died", "type": "InternalServerError", "code": 500}
                        }
                        await resp.write(b"data: " + orjson.dumps(err) + b"\n\n")
                        await resp.write(b"data: [DONE]\n\n")
                        return resp
                    if how == "truncate":
                        await resp.write_eof()
                        return resp
                if k >= LENGTH:
                    finish = "stop"
                    await resp.write(event(choice(out[sent:], [], finish)))
                    break
                piece = token(k)[len(lead) :] if lead else token(k)
                lead = ""
                out += piece
                k += 1
                n += 1
                hit = next((s for s in stops if s in out), None)
                if hit is not None:
                    out = out[: out.index(hit)]
                    finish = "stop"
                elif n >= asked:
                    finish = "length"
                upto = len(out) if finish is not None else max(sent, len(out) - reach)
                await resp.write(event(choice(out[sent:upto], [99 + k], finish)))
                sent = upto
                await asyncio.sleep(self.trickle_s)
            if usage_asked:
                usage = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": n,
                    "total_tokens": len(prompt) + n,
                }
                e = {"id": rid, "object": "x", "created": created, "model": body.get("model"), "choices": []}
                await resp.write(b"data: " + orjson.dumps({**e, "usage": usage}) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        return resp


@pytest.fixture
def models(lt: LoopThread) -> Iterator[Callable[..., Fleet]]:
    started: list[FakeModel] = []

    def make(n: int = 2, *plan: tuple[str, int] | None) -> Fleet:
        fleet = Fleet([], list(plan), [])
        for i in range(n):
            d = FakeModel(name=f"f{i}", trickle_s=0.005, fleet=fleet)
            lt.run(d.start())
            started.append(d)
            fleet.engines.append(d)
        return fleet

    yield make
    for d in started:
        lt.run(d.stop())


@pytest.fixture
def router(lt: LoopThread) -> Iterator[Callable[..., RouterUnderTest]]:
    started: list[RouterUnderTest] = []

    def make(fleet: Fleet, **settings: Any) -> RouterUnderTest:
        cfg = router_cfg(
            [e.url for e in fleet.engines],
            default_strategy={"name": "round_robin"},
            stream_stall_timeout_ms=settings.pop("stall_ms", 10_000),
            **settings,
        )
        r = RouterUnderTest(lt, cfg).start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


@dataclass
class Read:
    status: int
    events: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    done: bool  # [DONE] came
    whole: bool  # the chunked body ended properly (not a cut socket)

    def text(self) -> str:
        out = []
        for e in self.events:
            for c in e.get("choices") or []:
                out.append(c.get("text") if "text" in c else (c.get("delta") or {}).get("content") or "")
        return "".join(t or "" for t in out)

    def usage(self) -> dict[str, int] | None:
        found = [e["usage"] for e in self.events if e.get("usage")]
        assert len(found) <= 1, found
        return found[0] if found else None


def stream(r: RouterUnderTest, body: dict[str, Any], path: str = "/v1/chat/completions") -> Read:
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    whole = True
    try:
        raw = resp.read()
    except http.client.IncompleteRead as err:
        raw, whole = err.partial, False
    conn.close()
    events: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    done = False
    for block in raw.split(b"\n\n"):
        if not block.startswith(b"data: "):
            continue
        value = block[6:]
        if value == b"[DONE]":
            done = True
            continue
        parsed = json.loads(value)
        (errors if "error" in parsed else events).append(parsed)
    return Read(resp.status, events, errors, done, whole)


def metric(r: RouterUnderTest, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in r.metrics().splitlines() if line.startswith(prefix))


def wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


# --- HTTP: the router with engine doubles ------------------------------------------------------------------
def test_a_chat_stream_whose_engine_resets_goes_on_elsewhere_as_one_stream(models, router) -> None:
    f = models(2, ("reset", 3))
    r = router(f)
    got = stream(r, CHAT)
    assert got.status == 200 and got.whole and got.done and not got.errors
    assert got.text() == full(LENGTH)  # no token lost, none twice
    assert len({e["id"] for e in got.events}) == 1 and len({e["created"] for e in got.events}) == 1
    roles = [c for e in got.events for c in e["choices"] if "role" in (c.get("delta") or {})]
    assert len(roles) == 1
    assert all("token_ids" not in c for e in got.events for c in e["choices"])  # the client did not ask
    assert all("prompt_token_ids" not in e for e in got.events)
    assert got.usage() is None  # nor for the usage
    assert got.events[-1]["choices"][0]["finish_reason"] == "stop"
    # the other replica went on from the token ids: the prompt's, then the three generated
    assert len(f.log) == 2 and f.log[0][0] is not f.log[1][0]
    assert f.path(1) == "/v1/completions"
    assert f.body(1)["prompt"] == [*PROMPT_IDS, 100, 101, 102]
    assert f.body(1)["temperature"] == 0
    assert metric(r, 'inferstack_router_migrations_total{model="m",reason="reset"}') == 1
    assert metric(r, 'inferstack_router_migrated_tokens_total{model="m"}') == 3


def test_usage_counts_the_prompt_and_every_token_once_across_the_seam(models, router) -> None:
    r = router(models(2, ("reset", 3)))
    got = stream(r, {**CHAT, "stream_options": {"include_usage": True}})
    assert got.text() == full(LENGTH)
    assert got.usage() == {"prompt_tokens": 5, "completion_tokens": LENGTH, "total_tokens": 5 + LENGTH}
    assert metric(r, 'inferstack_router_tokens_total{direction="out",model="m"}') == LENGTH


def test_a_completion_continues_with_max_tokens_less_what_was_generated(models, router) -> None:
    f = models(2, ("reset", 4))
    r = router(f)
    body = {"model": "m", "prompt": "once", "max_tokens": 10, "stream": True}
    got = stream(r, {**body, "stream_options": {"include_usage": True}}, "/v1/completions")
    assert got.text() == full(10)
    assert got.events[-2]["choices"][0]["finish_reason"] == "length"
    assert got.usage() == {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}
    assert f.body(1)["max_tokens"] == 6 and f.body(1)["prompt"] == [*PROMPT_IDS, 100, 101, 102, 103]


def test_a_hung_engine_is_left_after_the_stall_timeout_and_the_stream_goes_on(models, router) -> None:
    f = models(2, ("hang", 3))
    r = router(f, stall_ms=300)
    started = time.monotonic()
    got = stream(r, CHAT)
    assert got.text() == full(LENGTH) and got.done
    assert time.monotonic() - started < 5
    assert metric(r, 'inferstack_router_migrations_total{model="m",reason="timeout"}') == 1
    wait_until(lambda: f.running == 0)  # the hung engine's request was let go (its connection closed)


def test_an_error_event_or_an_early_end_mid_stream_moves_the_stream(models, router) -> None:
    for how, reason in (("error", "error_event"), ("truncate", "truncated")):
        r = router(models(2, (how, 3)))
        got = stream(r, CHAT)
        assert got.text() == full(LENGTH) and not got.errors, how
        assert metric(r, f'inferstack_router_migrations_total{{model="m",reason="{reason}"}}') == 1


def test_a_replacement_that_dies_too_is_replaced_again(models, router) -> None:
    f = models(3, ("reset", 2), ("reset", 3))
    r = router(f)
    got = stream(r, {**CHAT, "stream_options": {"include_usage": True}})
    assert got.text() == full(LENGTH) and got.done and not got.errors
    assert got.usage() == {"prompt_tokens": 5, "completion_tokens": LENGTH, "total_tokens": 5 + LENGTH}
    assert len({id(engine) for engine, _ in f.log}) == 3  # three replicas, each once
    assert f.body(2)["prompt"] == [*PROMPT_IDS, *range(100, 105)]
    assert metric(r, 'inferstack_router_migrations_total{model="m",reason="reset"}') == 2
    assert metric(r, 'inferstack_router_migrated_tokens_total{model="m"}') == 2 + 5


def test_no_replica_left_ends_the_stream_with_an_error_event_not_a_cut_socket(models, router) -> None:
    r = router(models(2, ("reset", 2), ("reset", 2)))
    got = stream(r, CHAT)
    assert got.status == 200 and got.whole  # the chunked body ends properly
    assert got.text() == full(4)  # what the two engines generated reached the client once
    (error,) = got.errors
    assert error["error"]["code"] == "stream_error"


def test_the_limit_of_migrations_ends_the_stream_with_an_error_event(models, router) -> None:
    f = models(3, ("reset", 2), ("reset", 2))
    r = router(f, max_migrations_per_request=1)
    got = stream(r, CHAT)
    assert got.whole and len(got.errors) == 1 and got.text() == full(4)
    assert "moved 1 times already" in got.errors[0]["error"]["message"]
    assert len(f.log) == 2


def test_without_migrations_a_broken_stream_ends_with_an_error_event_as_before(models, router) -> None:
    f = models(2, ("reset", 3))
    r = router(f, max_migrations_per_request=0)
    got = stream(r, CHAT)
    assert got.text() == full(3) and len(got.errors) == 1 and len(f.log) == 1
    assert "return_token_ids" not in f.body(0)  # nothing asked of the engine that is not needed


def test_a_client_that_leaves_mid_migration_leaves_nothing_running_on_the_engines(lt, models, router) -> None:
    f = models(2, ("reset", 2))
    r = router(f)
    lt.run(_hold_later(f))
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    conn.request(
        "POST", "/v1/chat/completions", body=json.dumps(CHAT), headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    wait_until(lambda: len(f.log) == 2)  # the continuation reached the other replica, which holds it
    conn.close()  # the client leaves while its stream is being moved
    with contextlib.suppress(Exception):
        resp.close()
    wait_until(lambda: r.call(lambda: r.router.inflight) == 0)
    for engine in f.engines:
        engine.release()
    wait_until(lambda: f.cancelled == 1 and f.running == 0)  # the replacement's stream was let go
    assert r.call(lambda: sum(x.inflight for x in r.router.fleet.models["m"].replicas)) == 0
    assert len(f.log) == 2


async def _hold_later(f: Fleet) -> None:
    """Every double holds the requests that come after the first (the events made in the doubles' loop)."""
    for engine in f.engines:
        engine.hold = asyncio.Event()
    f.hold_after = 1


def test_stop_strings_continue_from_the_text_the_client_has_and_lose_nothing(models, router) -> None:
    f = models(2, ("reset", 4))
    r = router(f)
    got = stream(r, {**CHAT, "stop": ["w9 ", "zzzz"]})
    # the first engine held back the last 3 characters it had (vLLM's stop buffer); the replacement, sent the
    # client's text as a partial assistant message, generated them again
    assert got.text() == full(9) + " "
    assert got.events[-1]["choices"][0]["finish_reason"] == "stop"
    assert f.path(1) == "/v1/chat/completions"
    body = f.body(1)
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": full(4)[:-3]}


def test_a_non_streamed_request_whose_engine_dies_is_answered_whole_by_another(models, router) -> None:
    f = models(2, ("reset", 0))
    r = router(f)
    status, _, raw = r.request("POST", "/v1/chat/completions", {**CHAT, "stream": False, "max_tokens": 50})
    assert status == 200
    assert json.loads(raw)["choices"][0]["message"]["content"] == full(LENGTH)
    assert f.body(1)["max_tokens"] == 50 and f.body(1)["messages"] == CHAT["messages"]  # the whole budget


def test_a_stream_with_its_max_tokens_used_up_ends_here_with_its_usage(models, router) -> None:
    f = models(2, ("truncate", 3))
    r = router(f)
    got = stream(r, {**CHAT, "max_tokens": 3, "stream_options": {"include_usage": True}})
    # the engine sent its three tokens and ended before their finish: nothing is left to generate
    assert got.text() == full(3) and got.done and len(f.log) == 1
    assert got.events[-2]["choices"][0]["finish_reason"] == "length"
    assert got.usage() == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


# --- the decisions ---------------------------------------------------------------------------------
def _progress(payload: dict[str, Any], kind: str = "chat") -> Progress:
    return Progress(kind, payload, 4096, True, True, lambda body: body)


def _feed(p: Progress, *events: dict[str, Any]) -> list[dict[str, Any]]:
    raw = p.feed(b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events))
    return [json.loads(x[6:]) for x in raw.split(b"\n\n") if x.startswith(b"data: {")]


def test_a_stop_string_across_the_seam_ends_the_stream_there() -> None:
    seam = Seam(("abc",), "xab"[-2:])
    assert seam.feed("c and more") == ("", "abc")
    with_stop = Seam(("abc",), "ab", include=True)
    assert with_stop.feed("cd") == ("c", "abc")
    waits = Seam(("abc",), "ab")
    assert waits.feed("") == ("", None)  # not yet ruled out: held
    assert waits.feed("x") == ("", None)
    assert waits.feed("yz") == ("xyz", None)  # ruled out: passed on, and nothing more is held


def test_the_replacement_events_are_rewritten_into_the_first_stream() -> None:
    p = _progress({**CHAT, "stop": ["abc"]})
    first = {"id": "A", "created": 7, "model": "m", "object": "chat.completion.chunk"}
    _feed(p, {**first, "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    _feed(p, {**first, "choices": [{"index": 0, "delta": {"content": "xxab"}, "token_ids": [5]}]})
    p.started = True
    cont = p.continuation()
    assert cont is not None and cont.path == b"/v1/chat/completions"  # stop strings: the text path
    second = {"id": "B", "created": 9, "model": "m", "object": "chat.completion.chunk"}
    out = _feed(
        p,
        {
            **second,
            "prompt_token_ids": [9],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        },
        {**second, "choices": [{"index": 0, "delta": {"content": "cde"}, "token_ids": [6]}]},
    )
    assert [e["id"] for e in out] == ["A"] and out[0]["created"] == 7
    assert out[0]["choices"][0]["finish_reason"] == "stop" and out[0]["choices"][0]["delta"]["content"] == ""
    assert p.done and p.stop_hit == "abc"


def test_what_can_be_moved() -> None:
    assert migratable(CHAT, "chat")
    assert not migratable({**CHAT, "n": 2}, "chat")
    assert not migratable({**CHAT, "stream": False}, "chat")
    assert not migratable({"model": "m", "prompt": ["a", "b"], "stream": True}, "completions")
    assert migratable({"model": "m", "prompt": [1, 2], "stream": True}, "completions")
    assert not migratable({"model": "m", "prompt": "a", "stream": True, "echo": True}, "completions")
    assert not migratable({"model": "m", "input": "a", "stream": True}, "embeddings")


def test_an_adapter_and_the_sampling_fields_move_with_the_request() -> None:
    p = _progress({**CHAT, "model": "my-adapter", "seed": 3, "top_p": 0.5, "max_tokens": 20, "min_tokens": 4})
    _feed(
        p,
        {
            "id": "A",
            "created": 1,
            "prompt_token_ids": [1],
            "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        },
        {"id": "A", "created": 1, "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [7, 8]}]},
    )
    p.started = True
    cont = p.continuation()
    assert cont is not None
    body = json.loads(cont.body)
    assert body["model"] == "my-adapter" and body["seed"] == 3 and body["top_p"] == 0.5
    assert body["prompt"] == [1, 7, 8] and body["max_tokens"] == 18 and body["min_tokens"] == 2
    assert "messages" not in body and body["return_token_ids"] is True


def _versioned(lt: LoopThread, stable: list[str], canary: list[str]) -> RouterUnderTest:
    models = [
        {
            "name": f"chat-{v}",
            "static_backends": [{"url": u} for u in urls],
            "version_of": {"model": "chat", "version": v, "weight": w, "stable": v == "v1"},
        }
        for v, urls, w in (("v1", stable, 0), ("v2", canary, 100))
    ]
    return RouterUnderTest(
        lt, router_cfg([], models=models, default_strategy={"name": "round_robin"})
    ).start()


def test_a_moved_stream_keeps_its_version_while_a_replica_of_it_is_healthy(lt, models) -> None:
    f = models(3, ("reset", 3))
    stable, c1, c2 = f.engines
    r = _versioned(lt, [stable.url], [c1.url, c2.url])
    try:
        got = stream(r, {**CHAT, "model": "chat"})
        assert got.text() == full(LENGTH) and not got.errors
        assert [e.name for e, _ in f.log][1] in {c1.name, c2.name} and not stable.requests
    finally:
        r.stop()


def test_a_moved_stream_falls_back_to_stable_when_no_replica_of_its_version_is_left(lt, models) -> None:
    f = models(2, ("reset", 3))
    stable, canary = f.engines
    r = _versioned(lt, [stable.url], [canary.url])
    try:
        got = stream(r, {**CHAT, "model": "chat"})
        assert got.text() == full(LENGTH) and not got.errors
        assert [e.name for e, _ in f.log] == [canary.name, stable.name]
    finally:
        r.stop()


def test_tokens_whose_character_had_not_reached_the_client_are_generated_again() -> None:
    p = _progress({**CHAT, "max_tokens": 50})
    first = {"id": "A", "created": 1}
    _feed(
        p,
        {**first, "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {**first, "choices": [{"index": 0, "delta": {"content": "ab"}, "token_ids": [7, 8]}]},
        {**first, "choices": [{"index": 0, "delta": {}, "token_ids": [9]}]},  # a character's first byte
    )
    p.started = True
    cont = p.continuation()
    assert cont is not None
    body = json.loads(cont.body)
    assert body["prompt"] == [1, 2, 7, 8] and body["max_tokens"] == 48  # token 9 comes again, counted once
