"""Attacks on the batch service and the router in front of it, each over real HTTP (engine double -> router
-> batch service process, on 127.0.0.1): a poisoned input file or batch, a key's rate limit dodged through
a batch, model names from input files, the store failing under the background loops, file quotas, and a
second key with a name already taken.

Two stacks serve the module, each started once: ``shared`` (keys required, small file quotas, the router
started from its files as ``python -m runtime.router`` starts it) and ``faulty`` (SQLite failures and a
batch that cannot be processed, injected on demand into the batch service's process).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from runtime.api_keys import hash_key
from runtime.batch_service.api import MAX_FORM_PARTS, UPLOADS_PER_OWNER
from runtime.config_file import ConfigError
from runtime.router.reload import load_router_files
from tests.runtime.batch_service.harness import (
    BatchStack,
    chat_line,
    jsonl,
    run_batch,
    upload,
    wait_for,
    wait_until,
)

#: One xdist worker runs the module: its two stacks start once, not once per worker.
pytestmark = pytest.mark.xdist_group("batch-service-attacks")

CHAT = "/v1/chat/completions"
#: The shared stack's keys (each test uses its own, so quotas and limits never cross tests).
KEYS: dict[str, dict[str, Any]] = {
    "alice": {},
    "bob": {"models": ["other"]},
    "carol": {"requests_per_minute": 4},
    "dave": {},
    "erin": {},
    "frank": {},
    "gina": {},
    "hank": {},
    "mallet": {},
    "ivan": {},
    "judy": {},
    "kate": {},
    "leo": {},
    "mia": {},
    "nina": {},
    "batches": {},  # the batch service's own key
}
MAX_FILES = 4
MAX_BYTES = 1024 * 1024
MAX_BATCHES = 3

#: Fault injection, run in the batch service's process before it starts: while ``flag`` exists the store
#: fails under the flusher and the janitor as a full or broken disk would; a batch with metadata
#: ``inject: crash`` raises whenever it is worked on. Backoffs are short, so the test waits less.
PRELOAD = """
import pathlib, sqlite3
from runtime.batch_service import runner, store

FLAG = pathlib.Path({flag!r})
runner.LOOP_BACKOFF_S = runner.BATCH_RETRY_S = 0.05
runner.JANITOR_INTERVAL_S = 0.2


def failing(method):
    def call(self, *args, **kwargs):
        if FLAG.exists():
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return method(self, *args, **kwargs)
    return call


store.Store.record = failing(store.Store.record)
store.Store.expired_files = failing(store.Store.expired_files)
send_one = runner.Runner.send_one


async def crashing_send_one(self, batch, now):
    if (batch.metadata or {{}}).get("inject") == "crash":
        raise RuntimeError("injected: this batch cannot be processed")
    return await send_one(self, batch, now)


runner.Runner.send_one = crashing_send_one
"""


def key(name: str) -> str:
    return f"sk-{name}"


@pytest.fixture(scope="module")
def shared(
    make_module_stack: Callable[..., BatchStack], tmp_path_factory: pytest.TempPathFactory
) -> BatchStack:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys_file.write_text("[]\n")
    inline = [{"name": name, "sha256": hash_key(key(name)), **extra} for name, extra in KEYS.items()]
    return make_module_stack(
        from_file=True,
        router={
            "require_api_key": True,
            "api_keys": inline,
            "api_keys_file": str(keys_file),
            "config_reload_interval_ms": 100,
        },
        batches={
            "router_key_name": "batches",
            "max_files_per_owner": MAX_FILES,
            "max_bytes_per_owner": MAX_BYTES,
            "max_active_batches_per_owner": MAX_BATCHES,
        },
        service_key=key("batches"),
    )


@pytest.fixture(scope="module")
def faulty(
    make_module_stack: Callable[..., BatchStack], tmp_path_factory: pytest.TempPathFactory
) -> tuple[BatchStack, Path]:
    flag = tmp_path_factory.mktemp("faults") / "fail-sqlite"
    return make_module_stack(preload=PRELOAD.format(flag=str(flag))), flag


def said(stack: BatchStack, prefix: str) -> int:
    """Requests the engine answered whose prompt is ``say <prefix>...`` (``chat_line``'s prompt)."""
    return sum(
        1
        for r in stack.doubles[0].requests
        if str(r["body"].get("messages", [{}])[0].get("content", "")).startswith(f"say {prefix}")
    )


def sample(metrics: str, name: str, **labels: str) -> float:
    """One sample of the batch service's /metrics text; 0 when absent."""
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(
        rf"^{re.escape(name)}{re.escape('{' + shown + '}' if shown else '')} (\S+)$", metrics, re.M
    )
    return float(found.group(1)) if found else 0.0


# --- item 2: one poisoned input file or batch stays where it is ---------------------------------------
def test_a_poisoned_input_fails_its_batch_line_by_line_and_later_batches_run(shared: BatchStack) -> None:
    """Nesting 100,000 deep makes ``json.loads`` raise RecursionError, and lone surrogates make encoding
    raise: each is its line's error, and a batch created after it still runs."""
    mallet, frank = shared.client(key("mallet")), shared.client(key("frank"))
    deep = "[" * 100_000 + "]" * 100_000
    poison = [
        json.dumps({"custom_id": "deep", "method": "POST", "url": CHAT, "body": {"model": "m"}}).replace(
            '"m"}', '"m", "messages": ' + deep + "}"
        ),
        chat_line("surrogate-in-body", messages=[{"role": "user", "content": "\ud800"}]),
        json.dumps({"custom_id": "id-\udfff", "method": "POST", "url": CHAT, "body": {"model": "m"}}),
        chat_line("fine"),
    ]
    poisoned = run_batch(mallet, jsonl(poison))
    later = run_batch(frank, jsonl([chat_line("after-poison")]))
    assert wait_for(frank, later, {"completed", "failed"}, timeout_s=20).status == "completed"
    failed = wait_for(mallet, poisoned, {"completed", "failed"}, timeout_s=20)
    assert failed.status == "failed" and failed.request_counts.total == 4
    assert [(e.line, e.code) for e in failed.errors.data] == [(n, "invalid_json_line") for n in (1, 2, 3)]
    assert all(e.message.startswith(f"Line {e.line}: ") for e in failed.errors.data)
    assert said(shared, "fine") == 0  # nothing of the poisoned batch ran


def test_a_batch_whose_input_cannot_be_read_expires_with_its_window(shared: BatchStack) -> None:
    """A validating batch used to wait for its input for ever; now its window closes it, as any other."""
    alice = shared.client(key("alice"))
    file_id = upload(alice, jsonl([chat_line("lost")]))
    (shared.state_dir / "files" / "files" / file_id).unlink()  # the object is gone (a disk, a bucket rule)
    batch_id = alice.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h").id
    # the unreadable input waits between tries: a younger batch is checked and run meanwhile (the oldest
    # batch used to take the one checking slot again at every turn, and no batch after it was ever checked)
    nina = shared.client(key("nina"))
    younger = run_batch(nina, jsonl([chat_line("younger")]))
    assert wait_for(nina, younger, {"completed", "failed"}, timeout_s=20).status == "completed"
    assert alice.batches.retrieve(batch_id).status == "validating"
    # fault injection: the day passes (the service reads the batch again on its next look)
    with sqlite3.connect(shared.state_dir / "state.sqlite3") as db:
        doc = json.loads(db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()[0])
        doc["expires_at"] = int(time.time()) - 1
        db.execute("UPDATE batches SET doc = ? WHERE id = ?", (json.dumps(doc), batch_id))
    expired = wait_for(alice, batch_id, {"expired", "failed", "completed"}, timeout_s=20)
    assert expired.status == "expired" and expired.expired_at
    assert expired.output_file_id is None and expired.error_file_id is None


# --- item 5: a batch's lines are charged to its owner ------------------------------------------------
def test_batch_lines_are_charged_to_their_owners_rate_limit_and_only_that_owner_waits(
    shared: BatchStack,
) -> None:
    """carol may make 4 requests a minute: her upload and create take 2, so 2 of her 10 lines run and
    the rest wait for her limit, while another owner's batch runs. Only the batch service's key may name
    an owner."""
    carol, hank = shared.client(key("carol")), shared.client(key("hank"))
    batch_id = run_batch(carol, jsonl(chat_line(f"carol-{i}") for i in range(10)))

    def limited_or_done() -> bool:
        done = shared.get(f"/v1/batches/{batch_id}", "carol")[1]["status"] == "completed"
        return (
            done
            or sample(
                shared.metrics(), "inferstack_batches_requests_total", model="m", outcome="rate_limited"
            )
            > 0
        )

    try:
        wait_until(limited_or_done, "carol's lines refused for her rate limit, or her batch done")
        assert shared.get(f"/v1/batches/{batch_id}", "carol")[1]["status"] == "in_progress"
        assert 2 <= said(shared, "carol-") < 10  # (a line more per 15 s as her limit refills)
        other = wait_for(hank, run_batch(hank, jsonl([chat_line("hank-1")])), {"completed"}, timeout_s=20)
        assert other.request_counts.completed == 1
    finally:  # past the router: carol's limit is spent
        shared.get(f"/v1/batches/{batch_id}/cancel", "carol", method="POST")
        wait_until(
            lambda: shared.get(f"/v1/batches/{batch_id}", "carol")[1]["status"] in {"cancelled", "completed"},
            "carol's batch closed",
        )
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    # a client naming someone else is still itself: bob is scoped to another model
    status, _, raw = shared.router.request(
        "POST", CHAT, chat, headers={"Authorization": f"Bearer {key('bob')}", "x-inferstack-key": "alice"}
    )
    assert status == 403 and json.loads(raw)["error"]["code"] == "model_not_allowed"
    # the batch service's key naming a key that is not (or no longer) there: refused, never its own
    status, _, raw = shared.router.request(
        "POST",
        CHAT,
        chat,
        headers={"Authorization": f"Bearer {key('batches')}", "x-inferstack-key": "nobody"},
    )
    assert status == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key"


def test_a_line_refused_for_lack_of_headroom_costs_its_owner_nothing(
    make_stack: Callable[..., BatchStack],
) -> None:
    """The batch service sends a refused line again and again while replicas are busy; were each refusal
    charged to the owner's limit, a batch would eat its owner's requests (carol may make one a minute)."""
    keys = [
        {"name": "alice", "sha256": hash_key(key("alice"))},
        {"name": "carol", "sha256": hash_key(key("carol")), "requests_per_minute": 1},
        {"name": "batches", "sha256": hash_key(key("batches"))},
    ]
    stack = make_stack(
        double={"hold": asyncio.Event()},
        router={"cap": 2, "require_api_key": True, "api_keys": keys},
        batches={"headroom_share": 0.5, "router_key_name": "batches"},
        start=False,
    )
    assert stack.router is not None
    router, (engine,) = stack.router, stack.doubles
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    line = {
        "Authorization": f"Bearer {key('batches')}",
        "x-inferstack-key": "carol",
        "x-inferstack-priority": "low",
    }
    busy = threading.Thread(
        target=router.request,
        args=("POST", CHAT, chat, {"Authorization": f"Bearer {key('alice')}"}),
        daemon=True,
    )
    try:
        busy.start()
        wait_until(lambda: len(engine.requests) == 1, "alice's request held by the engine")
        for _ in range(3):
            status, _, raw = router.request("POST", CHAT, chat, line)
            assert status == 503 and json.loads(raw)["error"]["code"] == "overloaded"
    finally:
        engine.release()
        busy.join(30)
    status, _, _ = router.request("POST", CHAT, chat, line)
    assert status == 200  # carol's one request of the minute was still hers
    status, _, raw = router.request("POST", CHAT, chat, line)
    assert status == 429 and json.loads(raw)["error"]["code"] == "rate_limit_exceeded"  # and now it is spent


# --- item 6: model names from input files ------------------------------------------------------------
def test_unserved_models_fail_validation_and_closed_batches_leave_no_series(shared: BatchStack) -> None:
    dave = shared.client(key("dave"))
    names = [f"model-{i:03d}" for i in range(200)]
    batch = wait_for(
        dave,
        run_batch(dave, jsonl(chat_line(f"dave-{i}", model=name) for i, name in enumerate(names))),
        {"completed", "failed"},
        timeout_s=20,
    )
    assert batch.status == "failed"
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [(i, "model_not_found", "body.model") for i in range(1, 201)]
    assert batch.errors.data[0].message == "Line 1: the model 'model-000' is not served here; served: m"
    assert said(shared, "dave-") == 0
    done = wait_for(dave, run_batch(dave, jsonl([chat_line("dave-ok")])), {"completed"}, timeout_s=20)
    assert done.request_counts.completed == 1
    metrics = shared.metrics()
    assert "model-" not in metrics
    # no unfinished batch uses "m": its lane and its per-model gauges are gone (counters stay, as counters do)
    assert not re.search(r'^inferstack_batches_(pending|inflight|window)\{model="m"\}', metrics, re.M)
    assert sample(metrics, "inferstack_batches_requests_total", model="m", outcome="ok") >= 1


# --- item 7: per-owner file quotas ---------------------------------------------------------------------
def test_uploads_beyond_a_keys_file_count_or_bytes_are_refused_until_it_deletes(shared: BatchStack) -> None:
    erin, gina = shared.client(key("erin")), shared.client(key("gina"))
    ids = [upload(erin, b"{}\n", f"f{i}.jsonl") for i in range(MAX_FILES)]
    with pytest.raises(openai.BadRequestError) as refused:
        upload(erin, b"{}\n")
    body = refused.value.body
    assert (body["code"], body["param"], body["type"]) == ("quota_exceeded", "file", "invalid_request_error")
    assert f"keeps {MAX_FILES} files" in body["message"] and "DELETE /v1/files/{id}" in body["message"]
    upload(gina, b"x" * 100)  # another key's quota is its own
    erin.files.delete(ids[0])
    upload(erin, b"{}\n")  # room again
    upload(gina, b"x" * (MAX_BYTES // 2))
    with pytest.raises(openai.BadRequestError) as too_big:
        upload(gina, b"x" * (MAX_BYTES // 2))
    assert (
        too_big.value.body["code"] == "quota_exceeded"
        and f"at most {MAX_BYTES:,}" in too_big.value.body["message"]
    )
    assert len(erin.files.list().data) == MAX_FILES and len(gina.files.list().data) == 2  # refused: not kept


# --- issue #34 hardening: an upload's form is bounded -------------------------------------------------
def test_an_upload_form_of_many_tiny_parts_is_refused(shared: BatchStack) -> None:
    """Each new part name would be held: a form of many tiny named parts is refused, however small."""
    parts = b"".join(
        b'--b\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nx\r\n' % i for i in range(MAX_FORM_PARTS)
    )
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        + parts
        + b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n{}\n\r\n--b--\r\n'
    )
    request = urllib.request.Request(
        f"{shared.router_url}/v1/files",
        data=body,
        headers={"authorization": f"Bearer {key('ivan')}", "content-type": "multipart/form-data; boundary=b"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400
    message = json.loads(refused.value.read())["error"]["message"]
    assert f"more than {MAX_FORM_PARTS} parts" in message, message
    assert not shared.client(key("ivan")).files.list().data  # nothing kept


# --- issue #34, second review: uploads in progress are bounded -----------------------------------------
def _held_upload(router_url: str, raw_key: str) -> socket.socket:
    """An upload that has begun and goes on no further: its head and the first bytes of its file, of a body
    that declares 1 MiB. The batch service holds a slot (and, on S3, a part's buffer) for it."""
    start = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n{}\n'
    )
    host, port = router_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\n"
        b"content-type: multipart/form-data; boundary=b\r\ncontent-length: %d\r\n\r\n%b"
        % (raw_key.encode(), 1 << 20, start)
    )
    return sock


def test_a_key_holds_at_most_its_share_of_the_uploads_in_progress(shared: BatchStack) -> None:
    """Uploads are streamed, so the server's budget for buffered bodies does not count them, and each holds
    up to two S3 parts (16 MiB): a key with many half-sent uploads could fill the service's memory. A key
    runs UPLOADS_PER_OWNER at once (429 ``too_many_uploads`` past it, with Retry-After), another key is not
    affected, and the slots come back when the uploads end, however they end."""
    held = [_held_upload(shared.router_url, key("leo")) for _ in range(UPLOADS_PER_OWNER)]
    try:
        wait_until(
            lambda: sample(shared.metrics(), "inferstack_batches_uploads_in_progress") == UPLOADS_PER_OWNER,
            "the held uploads reach the batch service",
        )
        with pytest.raises(openai.RateLimitError) as refused:
            upload(shared.client(key("leo")), b"{}\n")
        assert refused.value.body["code"] == "too_many_uploads"
        assert int(refused.value.response.headers["retry-after"]) >= 1
        upload(shared.client(key("mia")), b"{}\n")  # another key's uploads are its own
    finally:
        for sock in held:
            sock.close()  # gone mid-upload
    wait_until(
        lambda: sample(shared.metrics(), "inferstack_batches_uploads_in_progress") == 0,
        "the abandoned uploads give their slots back",
    )
    upload(shared.client(key("leo")), b"{}\n")
    assert len(shared.client(key("leo")).files.list().data) == 1  # the abandoned ones were not kept


# --- issue #34 hardening: an owner's unfinished batches are bounded ------------------------------------
def _create(client: openai.OpenAI, file_id: str) -> str:
    return client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h").id


def test_unfinished_batches_beyond_a_keys_limits_are_refused_429(shared: BatchStack) -> None:
    """Each batch copies its input's lines into the store: a key creating batch after batch over one input
    is refused past its count of unfinished batches, and past its bytes once their inputs count."""
    engine = shared.doubles[0]
    engine.hold = asyncio.Event()  # every line waits in the engine: the batches stay unfinished
    judy = shared.client(key("judy")).with_options(max_retries=0)
    kate = shared.client(key("kate")).with_options(max_retries=0)
    made: list[tuple[openai.OpenAI, str]] = []
    try:
        small = upload(judy, jsonl([chat_line("judy-1")]))
        made += [(judy, _create(judy, small)) for _ in range(MAX_BATCHES)]
        with pytest.raises(openai.RateLimitError) as refused:
            _create(judy, small)
        body = refused.value.body
        assert isinstance(body, dict) and body["code"] == "batch_limit_exceeded", body
        assert f"{MAX_BATCHES:,} unfinished batches" in body["message"]
        # a file of ~0.4 of the quota: its first batch fits (file and copy: 0.8), a second does not
        big = upload(kate, jsonl([chat_line("kate-1", user="x" * (MAX_BYTES * 2 // 5))]))
        made.append((kate, _create(kate, big)))
        with pytest.raises(openai.RateLimitError) as too_big:
            _create(kate, big)
        body = too_big.value.body
        assert isinstance(body, dict) and body["code"] == "batch_limit_exceeded", body
        assert f"at most {MAX_BYTES:,}" in body["message"]
        assert len(kate.batches.list().data) == 1  # the refused one was not kept
    finally:
        for client, batch_id in made:
            client.batches.cancel(batch_id)
        engine.release()
        engine.hold = None
    for client, batch_id in made:
        wait_for(client, batch_id, {"cancelled", "completed"}, timeout_s=30)
    small_again = _create(judy, small)  # finished batches no longer count
    wait_for(judy, small_again, {"completed"}, timeout_s=30)


# --- item 17: one name, one key --------------------------------------------------------------------------
def test_a_second_key_with_a_taken_name_is_refused_and_never_sees_that_names_files(
    shared: BatchStack,
) -> None:
    """Adding a key named alice to the keys file would have made its holder alice: her files and batches.
    The router refuses the change (the running keys stay, the failure is counted), and would refuse to
    start with it, saying which entries clash and never showing a key."""
    alice = shared.client(key("alice"))
    file_id = upload(alice, jsonl([chat_line("alice-secret")]))
    keys_file = Path(shared.router_extra["api_keys_file"])
    mallory = {"Authorization": "Bearer sk-mallory"}
    router = shared.router
    assert router is not None

    def failures() -> float:
        registry = router.router.metrics.registry  # type: ignore[union-attr]
        return registry.get_sample_value("inferstack_router_config_reload_failures_total") or 0.0

    before = failures()
    replace(keys_file, [{"name": "alice", "sha256": hash_key("sk-mallory")}])
    try:
        wait_until(
            lambda: failures() > before or router.request("GET", "/v1/files", headers=mallory)[0] != 401,
            "the keys file change refused or applied",
        )
        status, _, raw = router.request("GET", "/v1/files", headers=mallory)
        assert status == 401 and file_id.encode() not in raw
        assert failures() == before + 1
        with pytest.raises(ConfigError) as refused:
            load_router_files(shared.config_path)  # what a router starting from these files says
        assert refused.value.lines == [
            f"{keys_file}: [0]: name 'alice' is used by router.api_keys[0] already; each key needs its own"
            " name (files and batches belong to a name)"
        ]
    finally:
        replace(keys_file, [])
    assert file_id in [f.id for f in alice.files.list()]


def replace(path: Path, keys: list[dict[str, Any]]) -> None:
    """Write the keys file atomically: the watch never reads it half-written."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(keys))
    os.replace(tmp, path)


# --- item 7: the background loops survive the store failing, and say so ------------------------------
def test_the_flusher_and_janitor_survive_store_errors_and_readiness_fails_meanwhile(
    faulty: tuple[BatchStack, Path],
) -> None:
    stack, flag = faulty
    client = stack.client()
    assert stack.get("/readyz") == (200, {"ready": True})
    flag.touch()
    try:
        batch_id = run_batch(client, jsonl(chat_line(f"io-{i}") for i in range(3)))
        wait_until(
            lambda: stack.get("/readyz") == (503, {"ready": False, "failing": ["flusher", "janitor"]}),
            "the flusher and the janitor reported failing",
        )
        metrics = stack.metrics()
        for loop in ("flusher", "janitor"):
            assert sample(metrics, "inferstack_batches_loop_errors_total", loop=loop) >= 1
            assert sample(metrics, "inferstack_batches_loop_failing", loop=loop) == 1
    finally:
        flag.unlink(missing_ok=True)
    batch = wait_for(client, batch_id, {"completed", "failed"}, timeout_s=20)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    wait_until(lambda: stack.get("/readyz")[0] == 200, "ready again")
    metrics = stack.metrics()
    assert all(
        sample(metrics, "inferstack_batches_loop_failing", loop=loop) == 0 for loop in ("flusher", "janitor")
    )


# --- item 2: a batch the service cannot process fails alone --------------------------------------------
def test_a_batch_that_keeps_raising_fails_alone_and_later_batches_run(
    faulty: tuple[BatchStack, Path],
) -> None:
    stack, _ = faulty
    client = stack.client()
    file_id = upload(client, jsonl([chat_line("crash-1")]))
    crashing = client.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h", metadata={"inject": "crash"}
    ).id
    later = run_batch(client, jsonl([chat_line("later-1"), chat_line("later-2")]))
    assert wait_for(client, later, {"completed", "failed"}, timeout_s=20).status == "completed"
    failed = wait_for(client, crashing, {"completed", "failed"}, timeout_s=20)
    assert failed.status == "failed" and failed.request_counts.failed == 1
    (error,) = failed.errors.data
    assert error.code == "internal_error" and error.line is None
    assert "RuntimeError, 3 tries" in error.message and "other batches are not affected" in error.message
