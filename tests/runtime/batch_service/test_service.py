"""The batch service end to end with the ``openai`` SDK: engine doubles -> router -> batch service (a real
process). The doubles answer in milliseconds; the real-engine proofs are in tests/local/test_batches.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import openai
import pytest

from runtime.api_keys import hash_key
from tests.runtime.batch_service.harness import (
    chat_line,
    free_port,
    jsonl,
    results,
    run_batch,
    upload,
    wait_for,
    wait_until,
)


def test_a_batch_answers_every_line_once_in_the_output_file(make_stack):
    stack = make_stack(engines=2)
    client = stack.client()
    ids = [f"req-{i}" for i in range(200)]
    file_id = upload(client, jsonl(chat_line(i) for i in ids))
    uploaded = client.files.retrieve(file_id)
    assert (uploaded.purpose, uploaded.filename, uploaded.object) == ("batch", "in.jsonl", "file")
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "validating" and batch.expires_at == batch.created_at + 24 * 3600
    done = wait_for(client, batch.id, {"completed", "failed"})
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        200,
        200,
        0,
    )
    assert done.metadata == {"job": "nightly"} and done.model == "m" and done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert (
        done.usage is not None and done.usage.input_tokens == 200 * 5 and done.usage.output_tokens == 200 * 2
    )
    out, err = results(client, done)
    assert err == []
    assert [line["custom_id"] for line in out] == ids  # every line once, in input order
    assert len({line["id"] for line in out}) == 200
    first = out[0]
    assert first["error"] is None and first["response"]["status_code"] == 200
    assert first["response"]["body"]["choices"][0]["message"]["content"] == "ok"
    assert first["response"]["request_id"] == first["id"]  # the router kept the line's request id
    # both replicas served the batch, each request marked low priority
    assert all(d.requests for d in stack.doubles)
    assert all(r["headers"].get("x-inferstack-priority") == "low" for d in stack.doubles for r in d.requests)
    output = client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.filename == f"{done.id}_output.jsonl"
    listed = client.files.list(purpose="batch_output")
    assert [f.id for f in listed.data] == [done.output_file_id]
    assert client.batches.list().data[0].id == done.id
    metrics = stack.metrics()
    assert 'inferstack_batches_batches{status="completed"} 1.0' in metrics
    assert 'inferstack_batches_requests_total{model="m",outcome="ok"} 200.0' in metrics


def test_batches_list_newest_first_in_pages(make_stack):
    metrics_port = free_port()
    stack = make_stack(batches={"metrics_port": metrics_port})
    client = stack.client()
    file_id = upload(client, jsonl([chat_line("a")]))
    made = [
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(3)
    ]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == made[::-1][:2] and page.has_more
    rest = client.batches.list(limit=2, after=page.data[-1].id)
    assert [b.id for b in rest.data] == [made[0]] and not rest.has_more
    assert [b.id for b in client.batches.list(limit=1)] == made[::-1]  # the SDK pages through
    # the metrics listener (what Prometheus may reach) serves metrics and health, never the API
    ops = f"http://127.0.0.1:{metrics_port}"
    with urllib.request.urlopen(f"{ops}/metrics", timeout=5) as resp:
        assert b'inferstack_batches_batches{status="validating"}' in resp.read()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{ops}/v1/batches", timeout=5)
    assert refused.value.code == 404


def test_bad_lines_fail_validation_naming_each_line_and_nothing_runs(make_stack):
    stack = make_stack()
    client = stack.client()
    lines = [
        chat_line("good-1"),
        "{not json",
        json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}),
        chat_line("good-1"),
        json.dumps(
            {"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {"model": "m"}}
        ),
        json.dumps({"custom_id": "y", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m"}}),
        json.dumps({"custom_id": "z", "method": "POST", "url": "/v1/chat/completions", "body": "hi"}),
        chat_line("s", stream=True),
        "",
        "[1, 2]",
    ]
    batch = wait_for(client, run_batch(client, jsonl(lines)), {"failed", "completed"})
    assert batch.status == "failed" and batch.failed_at
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [
        (2, "invalid_json_line", None),
        (3, "missing_required_parameter", "custom_id"),
        (4, "duplicate_custom_id", "custom_id"),
        (5, "invalid_method", "method"),
        (6, "mismatched_endpoint", "url"),
        (7, "invalid_body", "body"),
        (8, "invalid_body", "body.stream"),
        (10, "invalid_json_line", None),
    ]
    assert all(e.message.startswith(f"Line {e.line}:") for e in batch.errors.data)
    assert batch.request_counts.total == 9 and batch.output_file_id is None and batch.error_file_id is None
    assert stack.doubles[0].requests == []  # nothing ran


def test_an_empty_file_fails_validation(make_stack):
    client = make_stack().client()
    batch = wait_for(client, run_batch(client, b"\n\n"), {"failed", "completed"})
    assert [(e.code, e.line) for e in batch.errors.data] == [("empty_file", None)]


def test_request_mistakes_are_400s_with_the_api_error_body(make_stack):
    stack = make_stack(batches={"max_file_bytes": 4096})
    client = stack.client()
    file_id = upload(client, jsonl([chat_line("a")]))
    cases = [
        (dict(input_file_id=file_id, endpoint="/v1/moderations", completion_window="24h"), "endpoint"),
        (
            dict(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="48h"),
            "completion_window",
        ),
        (
            dict(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"),
            "input_file_id",
        ),
        (
            dict(
                input_file_id=file_id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={f"k{i}": "v" for i in range(17)},
            ),
            "metadata",
        ),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.batches.create(**kwargs)
        assert caught.value.body["param"] == param, caught.value.body
        assert caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as caught:
        client.files.create(file=("a.jsonl", io.BytesIO(b"{}")), purpose="assistants")
    assert caught.value.body["param"] == "purpose"
    # a file just over the limit: 400 naming the file; far over it: refused before it is read (413)
    with pytest.raises(openai.BadRequestError) as caught:
        upload(client, b"x" * 4097)
    assert (caught.value.body["param"], caught.value.body["code"]) == ("file", "file_too_large")
    with pytest.raises(openai.APIStatusError) as too_big:
        upload(client, b"x" * (4096 + 200_000))
    assert too_big.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-nope")
    assert client.batches.list().data == []  # no batch was made by any of the mistakes


def test_lines_the_endpoint_refuses_go_to_the_error_file_with_its_answer(make_stack):
    stack = make_stack()
    client = stack.client()
    # (a model the platform does not serve fails validation: test_hardening)
    lines = [chat_line(f"ok-{i}") for i in range(5)] + [chat_line(f"bad-{i}", n=1000) for i in range(3)]
    batch = wait_for(client, run_batch(client, jsonl(lines)), {"completed", "failed"})
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 3)
    assert batch.model == "m"
    out, err = results(client, batch)
    assert [line["custom_id"] for line in out] == [f"ok-{i}" for i in range(5)]
    assert [line["custom_id"] for line in err] == [f"bad-{i}" for i in range(3)]
    for line in err:
        assert line["response"]["status_code"] == 400 and line["error"] is None
        assert line["response"]["body"]["error"]["param"] == "n"


def test_cancel_keeps_what_finished_and_lists_the_rest_as_cancelled(make_stack):
    stack = make_stack(double={"delay_s": 0.05}, batches={"max_inflight_per_replica": 2})
    client = stack.client()
    ids = [f"c{i}" for i in range(200)]
    batch_id = run_batch(client, jsonl(chat_line(i) for i in ids))
    wait_for(client, batch_id, {"in_progress"})
    while client.batches.retrieve(batch_id).request_counts.completed < 10:
        time.sleep(0.05)
    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = wait_for(client, batch_id, {"cancelled"})
    out, err = results(client, batch)
    assert Counter(line["custom_id"] for line in out + err) == Counter(ids)
    assert 10 <= len(out) < 200 and batch.request_counts.completed == len(out)
    assert batch.request_counts.failed == len(err)
    assert {line["error"]["code"] for line in err} == {"batch_cancelled"}
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch_id)  # a cancelled batch cannot be cancelled again


def test_a_batch_past_its_window_expires_with_what_it_finished(make_stack):
    stack = make_stack(double={"delay_s": 0.05}, batches={"max_inflight_per_replica": 2})
    client = stack.client()
    ids = [f"e{i}" for i in range(200)]
    batch_id = run_batch(client, jsonl(chat_line(i) for i in ids))
    while client.batches.retrieve(batch_id).request_counts.completed < 10:
        time.sleep(0.05)
    stack.kill()
    # fault injection: a day passes while the service is down
    with sqlite3.connect(stack.state_dir / "state.sqlite3") as db:
        doc = json.loads(db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()[0])
        doc["expires_at"] = int(time.time()) - 1
        db.execute("UPDATE batches SET doc = ? WHERE id = ?", (json.dumps(doc), batch_id))
    stack.start()
    batch = wait_for(client, batch_id, {"expired"})
    out, err = results(client, batch)
    assert Counter(line["custom_id"] for line in out + err) == Counter(ids)
    assert out and {line["error"]["code"] for line in err} == {"batch_expired"}
    assert batch.expired_at and batch.request_counts.completed + batch.request_counts.failed == 200


def test_kill_9_at_any_point_then_restart_every_line_appears_exactly_once(make_stack):
    stack = make_stack(engines=2, double={"delay_s": 0.02}, batches={"max_inflight_per_replica": 8})
    client = stack.client()
    ids = [f"k{i}" for i in range(600)]
    batch_id = run_batch(client, jsonl(chat_line(i) for i in ids))
    for threshold in (60, 250, 450):
        while client.batches.retrieve(batch_id).request_counts.completed < threshold:
            time.sleep(0.01)
        stack.kill()  # requests in flight, results not yet committed: all abandoned
        stack.start()
    batch = wait_for(client, batch_id, {"completed"})
    out, err = results(client, batch)
    assert err == [] and [line["custom_id"] for line in out] == ids
    assert batch.request_counts.completed == 600
    served = sum(len(d.requests) for d in stack.doubles)
    assert served >= 600  # lines in flight at a kill ran again; each is in the file once


def test_keys_scopes_and_rate_limits_apply_to_files_and_batches(make_stack):
    keys = [
        {"name": "alice", "sha256": hash_key("sk-alice")},
        {"name": "bob", "sha256": hash_key("sk-bob"), "models": ["other"]},
        {"name": "carol", "sha256": hash_key("sk-carol"), "requests_per_minute": 2},
        {"name": "batches", "sha256": hash_key("sk-batches")},
    ]
    stack = make_stack(router={"require_api_key": True, "api_keys": keys}, service_key="sk-batches")
    alice, bob = stack.client("sk-alice"), stack.client("sk-bob")
    with pytest.raises(openai.AuthenticationError):
        stack.client("sk-wrong").batches.list()
    batch = wait_for(alice, run_batch(alice, jsonl([chat_line("a1"), chat_line("a2")])), {"completed"})
    assert batch.request_counts.completed == 2
    # files and batches belong to their key
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.content(batch.output_file_id)
    assert bob.batches.list().data == [] and bob.files.list().data == []
    # a key scoped to other models: its lines for "m" are refused as the router would refuse them
    refused = wait_for(bob, run_batch(bob, jsonl([chat_line("b1")])), {"completed"})
    _, err = results(bob, refused)
    assert err[0]["response"]["status_code"] == 403
    assert err[0]["response"]["body"]["error"]["code"] == "model_not_allowed"
    # rate limits count Files and Batches calls
    carol = stack.client("sk-carol")
    carol.batches.list()
    carol.files.list()
    with pytest.raises(openai.RateLimitError):
        carol.batches.list()
    # a client cannot claim to be someone else
    forged = stack.router.request(
        "GET", "/v1/batches", headers={"Authorization": "Bearer sk-bob", "x-inferstack-key": "alice"}
    )
    assert [b["id"] for b in json.loads(forged[2])["data"]] == [refused.id]  # bob's own, never alice's


def test_a_keys_big_batch_does_not_keep_another_keys_batch_waiting(make_stack):
    """A lane's room goes round the batches' owners: a batch another key creates while a big one holds the lane
    gets its requests out among the big one's next few, not after all of them."""
    big_lines = 30
    keys = [{"name": name, "sha256": hash_key(f"sk-{name}")} for name in ("alice", "bob", "batches")]
    stack = make_stack(
        double={"hold": asyncio.Event()},  # the engine holds the first request until both batches run
        batches={"max_inflight_per_replica": 1},  # one slot: a turn per request sent, not per tick
        router={"require_api_key": True, "api_keys": keys},
        service_key="sk-batches",
    )
    (engine,) = stack.doubles
    alice, bob = stack.client("sk-alice"), stack.client("sk-bob")
    big = run_batch(alice, jsonl([chat_line(f"a{i}") for i in range(big_lines)]))
    wait_until(lambda: len(engine.requests) >= 1, "the big batch's first request at the engine")
    small = run_batch(bob, jsonl([chat_line(f"b{i}") for i in range(2)]))
    wait_until(lambda: bob.batches.retrieve(small).status == "in_progress", "the small batch to be validated")
    engine.release()
    assert wait_for(bob, small, {"completed"}).request_counts.completed == 2
    assert wait_for(alice, big, {"completed"}).request_counts.completed == big_lines
    sent = [r["body"]["messages"][0]["content"].removeprefix("say ") for r in engine.requests]
    small_at = [i for i, line in enumerate(sent) if line.startswith("b")]
    assert len(small_at) == 2 and max(small_at) < big_lines // 2, (
        f"the small batch's requests went out at {small_at} of {len(sent)}: {sent}"
    )


def test_low_priority_requests_only_take_headroom(make_stack):
    """With every replica holding interactive requests up to the share, the batch's requests are refused
    at once (503 overloaded) and wait; interactive requests are admitted as before."""
    # the double holds every request until released: the interactive ones stay in flight as long as needed
    stack = make_stack(
        double={"hold": asyncio.Event()}, batches={"headroom_share": 0.5}, router={"cap": 4}, start=False
    )
    (engine,) = stack.doubles
    done: list[int] = []

    def interactive() -> None:
        status, _, _ = stack.router.request(
            "POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
        done.append(status)

    def in_flight(n: int) -> None:
        deadline = time.monotonic() + 30
        while len(engine.requests) < n:
            assert time.monotonic() < deadline, f"{len(engine.requests)} of {n} requests reached the engine"
            time.sleep(0.01)

    threads = [threading.Thread(target=interactive, daemon=True) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        in_flight(2)
        body = {"model": "m", "messages": [{"role": "user", "content": "batch"}]}
        status, headers, raw = stack.router.request(
            "POST", "/v1/chat/completions", body, headers={"x-inferstack-priority": "low"}
        )
        assert status == 503 and json.loads(raw)["error"]["code"] == "overloaded" and headers["retry-after"]
        threads.append(threading.Thread(target=interactive, daemon=True))  # a third interactive request ...
        threads[-1].start()
        in_flight(3)  # ... still goes through
    finally:
        engine.release()
    for t in threads:
        t.join(30)
    assert done == [200, 200, 200]
    status, _, _ = stack.router.request(
        "POST", "/v1/chat/completions", body, headers={"x-inferstack-priority": "low"}
    )
    assert status == 200  # headroom again
