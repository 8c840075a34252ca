"""The batch service's pure parts (validation, multipart, state machine, pacing, API shapes) and its
stores (SQLite, a directory, S3 through a real S3 API on loopback)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the HTTP client (and multipart encoder) the openai SDK uses
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import Batch, FileObject

from runtime.batch_service import api, lifecycle, multipart, pacing, runner, validate
from runtime.batch_service.blobs import PART_BYTES, BlobError, LocalBlobs, S3Blobs
from runtime.batch_service.client import Answer, RouterClient
from runtime.batch_service.lifecycle import Progress, Status, Step
from runtime.batch_service.metrics import BatchMetrics
from runtime.batch_service.objects import BatchError, BatchRecord, FileRecord, error_line, response_line
from runtime.batch_service.runner import owners_in_turn
from runtime.batch_service.store import Db, Pending, Result, Store
from runtime.batch_service.validate import MAX_ERRORS, check_file
from runtime.config import BatchesSettings, S3Files
from tests.runtime.batch_service.harness import chat_line, free_port, jsonl

CHAT = "/v1/chat/completions"


# --- validation ---------------------------------------------------------------------------------------
def test_a_valid_file_gives_its_lines_with_numbers_models_and_bodies():
    data = jsonl([chat_line("a"), "", chat_line("b", model="other", temperature=0)])
    checked = check_file(data, CHAT, 10)
    assert checked.errors == []
    assert [(ln.number, ln.custom_id, ln.model) for ln in checked.lines] == [(1, "a", "m"), (3, "b", "other")]
    assert json.loads(checked.lines[1].body)["temperature"] == 0
    assert checked.models == ["m", "other"]


def test_more_requests_than_a_batch_takes_fail_the_file():
    checked = check_file(jsonl(chat_line(str(i)) for i in range(4)), CHAT, 3)
    assert [e.code for e in checked.errors] == ["too_many_requests"] and checked.lines == []


def test_errors_are_capped_and_the_rest_counted():
    checked = check_file(b"x\n" * (MAX_ERRORS + 50), CHAT, 100_000)
    assert len(checked.errors) == MAX_ERRORS
    assert checked.errors[-1].code == "too_many_errors" and "51 more" in checked.errors[-1].message


@given(st.binary(max_size=300))
def test_any_bytes_are_either_lines_or_errors_never_an_exception(data):
    checked = check_file(data, CHAT, 1000)
    assert bool(checked.lines) != bool(checked.errors)


# --- multipart, against the encoder the openai SDK uses (httpx) ------------------------------------------
def _encoded(files: dict[str, tuple[str, bytes]], data: dict[str, str]) -> tuple[bytes, bytes]:
    request = httpx.Request("POST", "http://x/v1/files", files=files, data=data)
    return request.headers["content-type"].encode(), request.read()


@settings(max_examples=60)
@given(
    content=st.binary(max_size=2000),
    filename=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30),
)
def test_multipart_parses_what_httpx_encodes(content, filename):
    ctype, body = _encoded({"file": (filename, content)}, {"purpose": "batch"})
    form = multipart.fields(multipart.parse(ctype, body))
    assert form["file"].data == content
    assert form["purpose"].data == b"batch"
    assert form["file"].filename is not None


@settings(max_examples=60)
@given(
    content=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=200),
)
def test_multipart_fed_in_any_pieces_reads_as_fed_whole(content, cuts):
    ctype, body = _encoded({"file": ("in.jsonl", content)}, {"purpose": "batch"})
    parser = multipart.Parser(multipart.boundary(ctype))
    events, pos = [], 0
    for cut in [*cuts, len(body)]:
        events += parser.feed(body[pos : pos + cut])
        pos += cut
    parser.close()
    heads = [e.name for e in events if isinstance(e, multipart.PartHead)]
    assert heads == ["purpose", "file"]
    after = events.index(next(e for e in events if isinstance(e, multipart.PartHead) and e.name == "file"))
    assert b"".join(events[after + 1 :]) == content
    assert b"".join(events[1:after]) == b"batch"


@pytest.mark.parametrize(
    ("ctype", "body"),
    [
        (b"application/json", b"{}"),
        (b"multipart/form-data", b"--x\r\n"),
        (b"multipart/form-data; boundary=x", b"no boundary here"),
        (b"multipart/form-data; boundary=x", b"--x\r\nno header end"),
        (b"multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data\r\n\r\nv\r\n--x--"),
    ],
)
def test_multipart_refuses_what_is_not_a_form(ctype, body):
    with pytest.raises(multipart.MultipartError):
        multipart.parse(ctype, body)


# --- the state machine --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "pending", "inflight", "late", "step"),
    [
        (Status.VALIDATING, 0, 0, False, Step.VALIDATE),
        (
            Status.VALIDATING,
            0,
            0,
            True,
            Step.CLOSE_EXPIRED,
        ),  # its input never read: the window still closes it
        (Status.IN_PROGRESS, 5, 2, False, Step.RUN),
        (Status.IN_PROGRESS, 0, 0, False, Step.FINALIZE),
        (Status.IN_PROGRESS, 5, 2, True, Step.WAIT),
        (Status.IN_PROGRESS, 5, 0, True, Step.CLOSE_EXPIRED),
        (Status.IN_PROGRESS, 0, 0, True, Step.FINALIZE),  # everything answered in time
        (Status.CANCELLING, 5, 1, False, Step.WAIT),
        (Status.CANCELLING, 5, 0, False, Step.CLOSE_CANCELLED),
        (Status.FINALIZING, 0, 0, False, Step.FINALIZE),
        (Status.COMPLETED, 0, 0, False, Step.NOTHING),
        (Status.FAILED, 0, 0, False, Step.NOTHING),
    ],
)
def test_next_step(status, pending, inflight, late, step):
    now = 1000.0
    p = Progress(
        status, expires_at=int(now) - 1 if late else int(now) + 100, pending=pending, inflight=inflight
    )
    assert lifecycle.next_step(p, now) is step


def test_only_validating_or_running_batches_can_be_cancelled():
    assert lifecycle.cancel_refusal(Status.IN_PROGRESS) is None
    assert lifecycle.cancel_refusal(Status.CANCELLING) is None  # again: no-op
    assert "completed" in (lifecycle.cancel_refusal(Status.COMPLETED) or "")


# --- pacing ---------------------------------------------------------------------------------------------
def test_capacity_reads_the_health_feed_and_ignores_a_stale_one():
    feed = {
        "generated_at": 100.0,
        "stale_after_s": 15,
        "models": [{"model": "m", "routable_replicas": 3, "queue_depth": 0}],
    }
    assert pacing.capacity(feed, "m", 101.0) == pacing.Capacity(3, 0.0)
    assert pacing.capacity(feed, "m", 200.0) is None
    assert pacing.capacity(feed, "other", 101.0) is None
    assert pacing.window_cap(pacing.Capacity(3, 0.0), 4) == 12
    assert pacing.window_cap(pacing.Capacity(3, 2.0), 4) == 0  # engines queue: no batch work
    assert pacing.window_cap(None, 4) == 4


def test_the_window_grows_by_one_per_window_of_answers_and_halves_on_refusal():
    w = pacing.Window()
    for _ in range(20):
        w.answered(cap=8)
    assert 5 <= w.limit(8) <= 7
    pause = w.refused()
    assert w.limit(8) <= 4 and pause == pacing.PAUSE_START_S
    assert w.refused() == 2 * pacing.PAUSE_START_S
    for _ in range(100):
        w.answered(cap=8)
    assert w.limit(8) == 8 and w.limit(3) == 3


@pytest.mark.parametrize(
    ("status", "attempt", "code", "verdict"),
    [
        (200, 1, None, pacing.Verdict.DONE),
        (400, 1, None, pacing.Verdict.DONE),
        (404, 1, None, pacing.Verdict.DONE),
        (429, 9, "no_headroom", pacing.Verdict.REFUSED),
        (503, 9, "overloaded", pacing.Verdict.REFUSED),  # the router's refusal for load: no attempt spent
        (429, 9, pacing.RATE_LIMITED, pacing.Verdict.LIMITED),  # the owner's limit: the owner waits
        (503, 1, None, pacing.Verdict.RETRY),
        (None, 1, None, pacing.Verdict.RETRY),
        (502, 5, None, pacing.Verdict.DONE),  # out of attempts: the error file
    ],
)
def test_verdicts(status, attempt, code, verdict):
    assert pacing.verdict(status, attempt, 5, code) == verdict


# --- the API's shapes, as the openai SDK reads them -------------------------------------------------------
def test_records_are_what_the_sdk_parses():
    file = FileRecord("file-1", "", "in.jsonl", "batch", 10, 1, 2)
    assert FileObject.model_validate(file.to_api()).purpose == "batch"
    batch = BatchRecord(
        "batch_1", "", CHAT, "file-1", "24h", "failed", 1, 2, errors=(BatchError("c", "m", "p", 3),)
    )
    parsed = Batch.model_validate(batch.to_api())
    assert parsed.errors is not None and parsed.errors.data[0].line == 3
    assert parsed.request_counts is not None and parsed.request_counts.total == 0
    ok = json.loads(response_line("batch_1", 1, "a", 200, "rid", {"x": 1}))
    assert (
        ok["response"] == {"status_code": 200, "request_id": "rid", "body": {"x": 1}} and ok["error"] is None
    )
    gone = json.loads(error_line("batch_1", 2, "b", "batch_expired", "late"))
    assert gone["response"] is None and gone["error"] == {"code": "batch_expired", "message": "late"}
    assert ok["id"] != gone["id"]


# --- the SQLite store -----------------------------------------------------------------------------------
def _batch(store: Store, batch_id: str = "batch_1", lines: int = 3) -> None:
    store.add_batch(BatchRecord(batch_id, "o", CHAT, "file-1", "24h", "validating", 1, 10_000_000_000))
    checked = check_file(jsonl(chat_line(f"c{i}") for i in range(lines)), CHAT, 100)
    assert store.start(batch_id, checked.lines, "m", 2)


def test_a_result_is_recorded_once_whatever_is_sent_twice(tmp_path):
    store = Store(tmp_path / "s.db")
    _batch(store)
    first = Result("batch_1", 1, True, b"one\n", 5, 2, 1)
    assert store.record([first, first]) == 1
    assert store.record([Result("batch_1", 1, False, b"late\n")]) == 0
    b = store.batch("batch_1")
    assert b is not None and (b.completed, b.failed, b.input_tokens, b.output_tokens, b.cached_tokens) == (
        1,
        0,
        5,
        2,
        1,
    )
    assert [p.line for p in store.pending("batch_1", "m", 0, 10)] == [2, 3]


def test_start_and_fail_happen_only_to_a_validating_batch(tmp_path):
    store = Store(tmp_path / "s.db")
    _batch(store)
    assert not store.start("batch_1", [], None, 3)
    assert not store.fail("batch_1", [BatchError("x", "y")], 0, 3)
    assert store.cancel("batch_1", "someone-else", 4) is None
    cancelled = store.cancel("batch_1", "o", 4)
    assert isinstance(cancelled, BatchRecord) and cancelled.status == "cancelling"


def test_closing_writes_files_from_the_rows_and_drops_them(tmp_path):
    store = Store(tmp_path / "s.db")
    _batch(store, lines=4)
    store.record([Result("batch_1", 2, True, b'{"ok":2}\n'), Result("batch_1", 4, False, b'{"err":4}\n')])
    batch = store.batch("batch_1")
    assert batch is not None
    with pytest.raises(RuntimeError):  # completing with lines unanswered is a bug, never a short file
        store.write_results(batch, Status.COMPLETED, tmp_path / "o", tmp_path / "e")
    counts = store.write_results(batch, Status.EXPIRED, tmp_path / "o", tmp_path / "e")
    assert counts == (1, 3)
    errors = [json.loads(x) for x in (tmp_path / "e").read_text().splitlines()]
    assert errors[2] == {"err": 4}  # recorded results as they were, in line order with the rest
    assert [(e["custom_id"], e["error"]["code"]) for e in errors[:2]] == [
        ("c0", "batch_expired"),
        ("c2", "batch_expired"),
    ]
    assert (tmp_path / "o").read_bytes() == b'{"ok":2}\n'
    out = FileRecord("file-o", "o", "batch_1_output.jsonl", "batch_output", 9, 5, None)
    assert store.finish("batch_1", Status.EXPIRED, 5, (out, "files/file-o"), None)
    assert not store.finish("batch_1", Status.EXPIRED, 6, None, None)  # terminal already
    done = store.batch("batch_1")
    assert done is not None and (done.status, done.completed, done.failed, done.output_file_id) == (
        "expired",
        1,
        3,
        "file-o",
    )
    assert store.pending_by_model() == {} and store.file("file-o", "o") is not None


def test_lists_page_by_id(tmp_path):
    store = Store(tmp_path / "s.db")
    for i in range(5):
        store.add_file(FileRecord(f"file-{i}", "o", "f", "batch", 1, i, None), f"files/file-{i}")
    store.add_file(FileRecord("file-x", "other", "f", "batch", 1, 9, None), "files/file-x")
    page, more = store.files("o", None, 2, None, ascending=False)
    assert [f.id for f in page] == ["file-4", "file-3"] and more
    page, more = store.files("o", "batch", 10, "file-3", ascending=False)
    assert [f.id for f in page] == ["file-2", "file-1", "file-0"] and not more
    page, _ = store.files("o", None, 2, "file-1", ascending=True)
    assert [f.id for f in page] == ["file-2", "file-3"]


# --- files: a directory, and S3 (moto's server: the S3 API on loopback) ----------------------------------
async def _round_trip(blobs, tmp_path: Path) -> None:
    await blobs.check()
    await blobs.put_bytes("files/a", b"hello")
    assert await blobs.read("files/a") == b"hello"
    big = tmp_path / "big"
    big.write_bytes(b"x" * (3 << 20) + b"end")
    await blobs.put_file("files/b", big)
    assert await blobs.size("files/b") == (3 << 20) + 3
    assert b"".join([c async for c in blobs.chunks("files/b")]) == big.read_bytes()
    await blobs.put_bytes("files/a", b"again")  # the same key twice: the second copy
    assert await blobs.read("files/a") == b"again"
    await blobs.delete("files/a")
    with pytest.raises(BlobError):
        await blobs.read("files/a")
    # written piece by piece (an upload): small, or in parts; an aborted one leaves nothing behind
    small = blobs.writer("files/c")
    await small.write(b"sm")
    await small.write(b"all")
    await small.commit()
    assert await blobs.read("files/c") == b"small"
    await blobs.delete("files/c")
    piece = bytes(range(256)) * 4096  # 1 MiB
    for key, keep in (("files/d", True), ("files/e", False)):
        writer = blobs.writer(key)
        for _ in range((PART_BYTES >> 20) + 1):
            await writer.write(piece)
        await (writer.commit() if keep else writer.abort())
    assert await blobs.size("files/d") == PART_BYTES + len(piece)
    assert b"".join([c async for c in blobs.chunks("files/d")]) == piece * ((PART_BYTES >> 20) + 1)
    await blobs.delete("files/d")
    with pytest.raises(BlobError):
        await blobs.size("files/e")


def test_local_files_round_trip_and_stay_inside_their_directory(tmp_path):
    blobs = LocalBlobs(tmp_path / "files")
    asyncio.run(_round_trip(blobs, tmp_path))
    assert [p.name for p in (tmp_path / "files" / "files").iterdir()] == ["b"]  # no temporary file left
    with pytest.raises(BlobError):
        asyncio.run(blobs.put_bytes("../escape", b"x"))


@pytest.fixture
def moto_s3():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:  # stopped on every path: SIGTERM, then SIGKILL
        deadline = time.monotonic() + 120  # a Python service's start on a loaded 2-core machine
        while True:
            assert proc.poll() is None, f"moto.server exited with code {proc.returncode}"
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_s3_files_round_trip_under_their_prefix(moto_s3, tmp_path, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("INFERSTACK_FILES_BUCKET", "platform-data")
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_s3)
    s3.create_bucket(Bucket="platform-data")
    blobs = S3Blobs(S3Files(region="us-east-1", endpoint_url=moto_s3, prefix="batches/"))
    assert blobs.bucket == "platform-data"  # from the environment the control plane sets
    asyncio.run(_round_trip(blobs, tmp_path))
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="platform-data").get("Contents", [])]
    assert keys == ["batches/files/b"]
    assert not s3.list_multipart_uploads(Bucket="platform-data").get("Uploads")  # the aborted one is gone
    with pytest.raises(BlobError):
        asyncio.run(S3Blobs(S3Files(bucket="missing", region="us-east-1", endpoint_url=moto_s3)).check())


async def _writes(blobs, tmp_path: Path) -> None:
    """What the batch service writes: small objects, a file, an upload in parts (s3rver aborts none: not here)."""
    await blobs.check()
    await blobs.put_bytes("files/a", b"hello")
    assert await blobs.read("files/a") == b"hello"
    big = tmp_path / "big"
    big.write_bytes(b"x" * (3 << 20) + b"end")
    await blobs.put_file("files/b", big)
    assert await blobs.size("files/b") == (3 << 20) + 3
    writer = blobs.writer("files/c")
    piece = bytes(range(256)) * 4096  # 1 MiB
    for _ in range((PART_BYTES >> 20) + 1):
        await writer.write(piece)
    await writer.commit()
    assert await blobs.size("files/c") == PART_BYTES + len(piece)
    await blobs.delete("files/a")


def test_with_the_local_store_batch_files_go_to_their_own_bucket(loopback_s3, tmp_path, monkeypatch):
    """`make local S3=1` as on EKS: the batch service's files land in the batch bucket on the real s3rver, under
    its prefix, and nothing of theirs in the model store's bucket the engines read."""
    from urllib.parse import urlsplit

    import boto3

    from components.core.weights.store import LOCAL_BATCH_BUCKET, LOCAL_BUCKET
    from components.local import s3_server
    from components.local.plan import LocalOptions, build_plan
    from tests.conftest import REPO_ROOT
    from tests.stacks import load

    port = urlsplit(loopback_s3.endpoint).port
    plan = build_plan(load("local", REPO_ROOT / "stacks"), LocalOptions(s3_port=port), REPO_ROOT)
    assert plan.config.batches is not None
    files = plan.config.batches.s3
    assert files is not None and files.bucket == LOCAL_BATCH_BUCKET != LOCAL_BUCKET
    assert str(files.endpoint_url).rstrip("/") == loopback_s3.endpoint.rstrip("/")
    s3 = s3_server.client(loopback_s3.endpoint)
    for bucket in (LOCAL_BUCKET, LOCAL_BATCH_BUCKET):
        if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
            s3.create_bucket(Bucket=bucket)
    for name, value in loopback_s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # boto3 keeps the credentials it resolved first
    asyncio.run(_writes(S3Blobs(files), tmp_path))
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=LOCAL_BATCH_BUCKET).get("Contents", [])]
    assert keys and all(k.startswith(files.prefix) for k in keys)
    beside_models = s3.list_objects_v2(Bucket=LOCAL_BUCKET, Prefix=files.prefix).get("Contents", [])
    assert beside_models == []


@given(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=40))
def test_lane_room_goes_to_every_owner_before_any_owner_gets_it_twice(wanting: list[str]) -> None:
    """Serving the first of ``owners_in_turn`` each time, any run of as many requests as there are owners serves
    each owner once: none gets room twice while another waits."""
    owners = set(wanting)
    last: str | None = wanting[0]  # wherever the last round ended
    served: list[str] = []
    for _ in range(3 * len(owners)):
        last = owners_in_turn(owners, last)[0]
        served.append(last)
    for i in range(len(served) - len(owners) + 1):
        assert set(served[i : i + len(owners)]) == owners


def test_reading_a_file_stops_at_the_first_request_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 MiB file of ``{}`` lines is 22 million requests: the check used to split and parse them all
    (1.3 GB, two minutes of CPU, the pod killed) before it said "too many". It reads no line past the limit."""
    read: list[int] = []
    guarded = validate._guarded

    def counting(number: int, *args: object) -> object:
        read.append(number)
        return guarded(number, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(validate, "_guarded", counting)
    checked = check_file(jsonl(chat_line(str(i)) for i in range(100_000)), CHAT, 100)
    assert [e.code for e in checked.errors] == ["too_many_requests"]
    assert "more than 100 requests" in checked.errors[0].message
    assert len(read) == 100 and checked.requests == 101


def test_a_slow_input_check_does_not_hold_up_the_work_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The work loop used to check a batch's input inline, so every running batch's requests waited for the
    largest file anyone uploaded. Now the check is a task of its own: a turn of the loop returns while it runs."""
    release, started = threading.Event(), threading.Event()

    def held_check(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(60)
        return check_file(*args, **kwargs)

    monkeypatch.setattr(runner, "check_file", held_check)

    async def scenario() -> None:
        db = Db(Store(tmp_path / "state.sqlite3"))
        blobs = LocalBlobs(tmp_path / "files")
        await blobs.put_bytes("files/file-1", jsonl([chat_line("a")]))
        await db(
            db.store.add_file, FileRecord("file-1", "o", "in.jsonl", "batch", 10, 1, None), "files/file-1"
        )
        batch = BatchRecord("batch-1", "o", CHAT, "file-1", "24h", "validating", 1, int(time.time()) + 86_400)
        await db(db.store.add_batch, batch)
        settings_ = BatchesSettings(router_url="http://127.0.0.1:9", state_dir=tmp_path)
        client = RouterClient("http://127.0.0.1:9", "sk-test", "x-request-id")
        work = runner.Runner(db, blobs, client, settings_, BatchMetrics(), tmp_path / "scratch")
        try:
            await asyncio.wait_for(work.tick(), 20)  # before: held until the check ends (60 s)
            assert work.validating == "batch-1"
            assert await asyncio.to_thread(started.wait, 20) and not release.is_set()
        finally:
            release.set()
            await asyncio.gather(*work._tasks, return_exceptions=True)
            client.close()
            db.close()

    asyncio.run(scenario())


def test_an_engines_impossible_token_count_is_capped_and_every_result_is_still_recorded(
    tmp_path: Path,
) -> None:
    """orjson reads integers up to 2**64 - 1 and SQLite stores below 2**63: one answer claiming 2**64 - 1 prompt
    tokens made the flusher's write raise for its whole group, again at every flush, so no batch's results were
    ever recorded. The count is capped; negative and non-integer counts count nothing."""
    store = Store(tmp_path / "s.db")
    _batch(store, lines=2)
    usage = {
        "prompt_tokens": 2**64 - 1,
        "completion_tokens": -5,
        "prompt_tokens_details": {"cached_tokens": True},
    }
    body = json.dumps({"id": "x", "object": "chat.completion", "choices": [], "usage": usage}).encode()
    hostile = runner.result_of("batch_1", Pending(1, "c0", b"{}"), Answer(200, "req-1", body), "")
    assert (hostile.input_tokens, hostile.output_tokens, hostile.cached_tokens) == (
        runner.MAX_COUNTED_TOKENS,
        0,
        0,
    )
    assert store.record([hostile, Result("batch_1", 2, True, b"two\n", 1, 1, 0)]) == 2
    b = store.batch("batch_1")
    assert b is not None and b.completed == 2 and b.input_tokens == runner.MAX_COUNTED_TOKENS + 1


def test_uploads_past_the_services_slots_are_load_and_past_a_keys_share_its_own_limit() -> None:
    uploads = api.Uploads(slots=3, per_owner=2)
    with uploads.slot("a"), uploads.slot("a"), uploads.slot("b"):
        with pytest.raises(api.ApiError) as own, uploads.slot("a"):
            pass
        assert own.value.status == 429 and b"too_many_uploads" in own.value.body
        with pytest.raises(api.ApiError) as load, uploads.slot("c"):
            pass
        assert load.value.status == 503 and b'"overloaded"' in load.value.body
        assert (b"retry-after", b"1") in load.value.headers
    assert uploads.running == {}
    assert api.upload_slots(64 << 20) >= 2  # never fewer than two, whatever the memory


@given(st.lists(st.sampled_from([b"", b" ", b"\t", b"\r", b"{}", b"a b", b" x\r", b"\x0b\x0c"]), max_size=30))
def test_the_lines_read_are_the_non_blank_lines_of_the_file_with_their_numbers(parts: list[bytes]) -> None:
    """What check_file reads (blank runs skipped by the regex engine, not a line at a time) is exactly the
    file's non-blank lines, numbered as a split of the whole file numbers them."""
    data = b"\n".join(parts)
    expected = [(n, line) for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
    assert list(validate._numbered_lines(data)) == expected
