"""The HTTP surface: OpenAI's Files and Batches endpoints, plus ``/metrics``, ``/healthz``, ``/readyz``.

    POST   /v1/files                   upload (multipart: file, purpose=batch)
    GET    /v1/files                   list (purpose, limit, order, after)
    GET    /v1/files/{id}              retrieve
    DELETE /v1/files/{id}              delete
    GET    /v1/files/{id}/content      download
    POST   /v1/batches                 create (input_file_id, endpoint, completion_window, metadata)
    GET    /v1/batches                 list (limit, after), newest first
    GET    /v1/batches/{id}            retrieve
    POST   /v1/batches/{id}/cancel     cancel

Clients reach it through the router, which checks their API key, scopes and rate limits and passes on
who they are: ``x-inferstack-key`` (the key's name: files and batches belong to it, and nobody else sees
them) and ``x-inferstack-models`` (the models the key may use; a batch's lines for any other model go to
its error file as 403s). Mistakes in a request are 400s with the API's error body; an unknown id is 404.
Each key keeps at most ``max_files_per_owner`` files of ``max_bytes_per_owner`` bytes in all (its uploads
and its batches' results); an upload beyond either is a 400 ``quota_exceeded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qs

import orjson
from prometheus_client import Gauge

from runtime.batch_service import multipart
from runtime.batch_service.blobs import PART_BYTES, BlobError, Blobs, BlobWriter
from runtime.batch_service.lifecycle import Status
from runtime.batch_service.metrics import BatchMetrics
from runtime.batch_service.objects import (
    BATCHES_PAGE,
    COMPLETION_WINDOW,
    COMPLETION_WINDOW_S,
    ENDPOINTS,
    FILES_PAGE,
    METADATA_MAX_KEY,
    METADATA_MAX_PAIRS,
    METADATA_MAX_VALUE,
    PURPOSE_INPUT,
    BatchRecord,
    FileRecord,
    new_batch_id,
    new_file_id,
    page,
)
from runtime.batch_service.runner import Runner
from runtime.batch_service.store import BatchLimitError, BatchLimits, Db, Quota, QuotaExceededError
from runtime.config import BatchesSettings
from runtime.http import (
    METRICS_CONTENT_TYPE,
    OVERLOADED,
    OVERLOADED_CODE,
    PRINCIPAL_HEADER,
    SCOPES_HEADER,
    error_body,
    metrics_payload,
    retry_after,
)
from runtime.server import Answer, BodyError, Connection, Request, body_budget

log = logging.getLogger("inferstack.batches")

#: Multipart framing and form fields around an upload, on top of the file itself (the server's body limit
#: allows it).
UPLOAD_SLACK_BYTES = 64 * 1024
#: Parts of an upload's form: the SDK sends three (purpose, file, and the expiry); each new name is held.
MAX_FORM_PARTS = 16
#: The body of any other call (a batch's JSON).
API_BODY_BYTES = 1 << 20
#: An upload's own expiry: 1 hour to 30 days after creation (the API's bounds).
EXPIRY_BOUNDS_S = (3600, 2_592_000)
READY_CACHE_S = 10.0
#: What one upload in progress may hold in memory: an S3 part being filled and the one being joined, and the
#: server's stream buffer. The uploads at once are what the server's body budget holds of those
#: (:func:`upload_slots`), and one key may run ``UPLOADS_PER_OWNER`` of them: uploads are streamed, so the
#: server's own budget for buffered bodies does not count them.
UPLOAD_HELD_BYTES = 2 * PART_BYTES + (1 << 20)
UPLOADS_PER_OWNER = 2
_JSON = b"application/json"


async def _pieces(req: Request) -> AsyncIterator[bytes]:
    """The body as it arrives (streamed), or whole (read already)."""
    if req.stream is None:
        if req.body:
            yield req.body
        return
    async for piece in req.stream:
        yield piece


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.body = error_body(status, message, code=code, param=param)
        self.headers = [retry_after(retry_after_s)] if retry_after_s is not None else []


def upload_slots(max_file_bytes: int) -> int:
    """Uploads in progress at once: the server's body budget (a quarter of the container's memory) over what
    one holds; never fewer than two."""
    return max(2, body_budget(max_file_bytes) // UPLOAD_HELD_BYTES)


class Uploads:
    """Who is uploading: a slot per upload in progress, at most ``slots`` in all and ``per_owner`` per key."""

    def __init__(self, slots: int, gauge: Gauge | None = None, per_owner: int = UPLOADS_PER_OWNER) -> None:
        self.slots = slots
        self.per_owner = per_owner
        self.running: dict[str, int] = {}
        self.gauge = gauge

    @contextlib.contextmanager
    def slot(self, owner: str) -> Iterator[None]:
        if self.running.get(owner, 0) >= self.per_owner:
            raise ApiError(
                429,
                f"this key has {self.per_owner} uploads in progress, the most it may; send the next when one"
                " has ended",
                code="too_many_uploads",
                retry_after_s=1,
            )
        if sum(self.running.values()) >= self.slots:
            raise ApiError(
                OVERLOADED,
                f"the batch service is taking {self.slots} uploads, the most it holds at once; try again",
                code=OVERLOADED_CODE,
                retry_after_s=1,
            )
        self.running[owner] = self.running.get(owner, 0) + 1
        self._show()
        try:
            yield
        finally:
            self.running[owner] -= 1
            if not self.running[owner]:
                del self.running[owner]
            self._show()

    def _show(self) -> None:
        if self.gauge is not None:
            self.gauge.set(sum(self.running.values()))


def _bad(message: str, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


def _int_param(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name, [None])[0]
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad(f"`{name}` must be an integer", name, "invalid_value") from None
    if not low <= value <= high:
        raise _bad(f"`{name}` must be between {low} and {high}", name, "invalid_value")
    return value


def check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad("`metadata` must be an object of string values", "metadata", "invalid_value")
    if len(metadata) > METADATA_MAX_PAIRS:
        raise _bad(f"`metadata` takes at most {METADATA_MAX_PAIRS} pairs", "metadata", "invalid_value")
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY or len(value) > METADATA_MAX_VALUE:
            raise _bad(
                f"`metadata` keys are at most {METADATA_MAX_KEY} characters and values at most"
                f" {METADATA_MAX_VALUE}",
                "metadata",
                "invalid_value",
            )
    return dict(metadata)


class BatchApi:
    """The request handler (``handle``) over the store, the files and the runner."""

    def __init__(
        self, db: Db, blobs: Blobs, settings: BatchesSettings, runner: Runner, metrics: BatchMetrics
    ) -> None:
        self.db = db
        self.store = db.store
        self.blobs = blobs
        self.settings = settings
        self.runner = runner
        self.metrics = metrics
        self.inflight = 0
        self._ready: tuple[float, bool] = (0.0, False)
        self.uploads = Uploads(upload_slots(settings.max_file_bytes), metrics.uploads)

    @property
    def max_body_bytes(self) -> int:
        """An upload's body: the largest file and its form."""
        return self.settings.max_file_bytes + UPLOAD_SLACK_BYTES

    def head(self, req: Request) -> Answer | None:
        """An upload's body is taken as it arrives (written to the file store, never held whole)."""
        if req.method == b"POST" and req.path.rstrip(b"/") == b"/v1/files":
            req.max_body = self.max_body_bytes
            req.streamed = True
        return None

    async def handle(self, req: Request, conn: Connection) -> None:
        self.inflight += 1
        extra: list[tuple[bytes, bytes]] = []
        try:
            status, body, ctype = await self._dispatch(req, conn)
        except ApiError as err:
            status, body, ctype, extra = err.status, err.body, _JSON, err.headers
        except BlobError as err:
            log.warning("file store failed: %s", err)
            status, body, ctype = 503, error_body(503, f"the file store is unavailable: {err}"), _JSON
        finally:
            self.inflight -= 1
        if status:  # 0: the handler streamed its answer itself
            conn.send(status, body, ctype, extra)

    async def handle_ops(self, req: Request, conn: Connection) -> None:
        """The metrics listener: /metrics, /healthz and /readyz, never the API."""
        try:
            status, body, ctype = await self._ops(req)
        except ApiError as err:
            status, body, ctype = err.status, err.body, _JSON
        conn.send(status, body, ctype)

    async def _dispatch(self, req: Request, conn: Connection) -> tuple[int, bytes, bytes]:
        path, method = req.path.rstrip(b"/"), req.method
        parts = path.decode("latin-1").split("/")[1:]  # ["v1", "files", id, "content"]
        if parts[:2] == ["v1", "files"] and len(parts) <= 4:
            return await self._files(req, conn, method, parts[2:])
        if parts[:2] == ["v1", "batches"] and len(parts) <= 4:
            return await self._batches(req, method, parts[2:])
        return await self._ops(req)

    async def _ops(self, req: Request) -> tuple[int, bytes, bytes]:
        path, method = req.path.rstrip(b"/"), req.method
        if method in (b"GET", b"HEAD") and path == b"/metrics":
            try:
                await self.runner.snapshot()
            except (sqlite3.Error, OSError) as err:  # the counters (loop errors among them) still show
                log.warning("metrics gauges not refreshed: %s", err)
            return 200, metrics_payload(self.metrics.registry), METRICS_CONTENT_TYPE.encode()
        if method in (b"GET", b"HEAD") and path == b"/healthz":
            return 200, b'{"status":"ok"}', _JSON
        if method in (b"GET", b"HEAD") and path == b"/readyz":
            ready = await self.ready()
            body: dict[str, Any] = {"ready": ready}
            if self.runner.failing:  # which loop, for whoever reads the probe
                body["failing"] = sorted(self.runner.failing)
            return (200 if ready else 503), _json(body), _JSON
        raise ApiError(404, f"no route for {method.decode('latin-1')} {path.decode('latin-1')[:100]}")

    async def ready(self) -> bool:
        """No background loop is failing (known at once), and the store answers and the files can be
        written (cached for a few seconds: probes are frequent)."""
        if self.runner.failing:
            return False
        at, ok = self._ready
        if time.monotonic() - at < READY_CACHE_S:
            return ok
        try:
            await self.blobs.check()
            await self.db(self.store.status_counts)
            ok = True
        except (BlobError, OSError, sqlite3.Error) as err:
            log.warning("not ready: %s", err)
            ok = False
        self._ready = (time.monotonic(), ok)
        return ok

    # --- who asks ---------------------------------------------------------------------------------
    @staticmethod
    def owner(req: Request) -> str:
        return req.headers.get(PRINCIPAL_HEADER, b"").decode("utf-8", "replace")

    @staticmethod
    def allowed_models(req: Request) -> tuple[str, ...]:
        raw = req.headers.get(SCOPES_HEADER, b"").decode("utf-8", "replace")
        return tuple(m for m in (x.strip() for x in raw.split(",")) if m)

    # --- files ------------------------------------------------------------------------------------
    async def _files(
        self, req: Request, conn: Connection, method: bytes, rest: list[str]
    ) -> tuple[int, bytes, bytes]:
        owner = self.owner(req)
        if not rest:
            if method == b"POST":
                return 200, _json((await self.upload(req, owner)).to_api()), _JSON
            if method == b"GET":
                return 200, _json(await self.list_files(req, owner)), _JSON
            raise ApiError(405, "/v1/files takes GET or POST")
        found = await self.db(self.store.file, rest[0], owner)
        if found is None:
            raise ApiError(404, f"No such File object: {rest[0]}", code="not_found", param="file_id")
        record, blob = found
        if len(rest) == 1:
            if method == b"GET":
                return 200, _json(record.to_api()), _JSON
            if method == b"DELETE":
                if await self.db(self.store.delete_file, record.id, owner) is not None:
                    await self.blobs.delete(blob)
                return 200, _json({"id": record.id, "object": "file", "deleted": True}), _JSON
            raise ApiError(405, "/v1/files/{file_id} takes GET or DELETE")
        if rest[1] == "content" and method == b"GET":
            await self.download(conn, blob)
            return 0, b"", b""
        raise ApiError(404, f"no route for {method.decode('latin-1')} {req.path.decode('latin-1')[:100]}")

    async def upload(self, req: Request, owner: str) -> FileRecord:
        """The form's file goes to the store as it arrives, under a running size limit; on any refusal
        what was written is removed."""
        await self.within_quota(owner, 0)  # before writing a byte: the count (the bytes once they are known)
        with self.uploads.slot(owner):
            return await self._upload(req, owner)

    async def _upload(self, req: Request, owner: str) -> FileRecord:
        record_id = new_file_id()
        blob = f"files/{record_id}"
        writer = self.blobs.writer(blob)
        try:
            form, size, filename = await self._receive(req, writer)
            purpose = form.get("purpose")
            if purpose is None:
                raise _bad("`purpose` is required", "purpose", "missing_required_parameter")
            purpose_text = purpose.decode("utf-8", "replace")
            if purpose_text != PURPOSE_INPUT:
                raise _bad(
                    f"purpose {purpose_text!r} is not supported here: this service keeps batch input files"
                    f" (purpose {PURPOSE_INPUT!r})",
                    "purpose",
                    "invalid_value",
                )
            if filename is None:
                raise _bad("`file` is required", "file", "missing_required_parameter")
            now = int(time.time())
            expires = now + self._ttl(form)
            record = FileRecord(
                id=record_id,
                owner=owner,
                filename=(filename or "upload.jsonl")[:255],
                purpose=purpose_text,
                bytes=size,
                created_at=now,
                expires_at=expires,
            )
            await writer.commit()  # the object first: a crash now leaves no id behind
        except BaseException:
            # also when the client left and this task is cancelled: the cleanup runs to its end regardless
            await asyncio.shield(writer.abort())
            raise
        await self.keep_upload(record, blob)
        return record

    @property
    def quota(self) -> Quota:
        return Quota(self.settings.max_files_per_owner, self.settings.max_bytes_per_owner)

    @property
    def batch_limits(self) -> BatchLimits:
        s = self.settings
        return BatchLimits(
            s.max_active_batches_per_owner, s.max_pending_requests_per_owner, s.max_bytes_per_owner
        )

    async def within_quota(self, owner: str, size: int) -> None:
        """400 ``quota_exceeded`` when one more file of ``size`` bytes would take ``owner`` past its quota."""
        files, used = await self.db(self.store.usage, owner)
        try:
            self.quota.check(files, used, size)
        except QuotaExceededError as err:
            raise _bad(str(err), "file", "quota_exceeded") from None

    async def keep_upload(self, record: FileRecord, blob: str) -> None:
        """Record a written upload, the quota checked again in the same transaction (uploads race); a
        refused one's object is deleted."""
        try:
            await self.db(self.store.add_file, record, blob, self.quota)
        except QuotaExceededError as err:
            await self.blobs.delete(blob)
            raise _bad(str(err), "file", "quota_exceeded") from None

    async def _receive(self, req: Request, writer: BlobWriter) -> tuple[dict[str, bytes], int, str | None]:
        """Read the form: its fields (small, held) and its file (written). -> fields, file size, file name
        (None: no file part)."""
        try:
            parser = multipart.Parser(multipart.boundary(req.headers.get(b"content-type", b"")))
        except multipart.MultipartError as err:
            raise _bad(f"upload: {err}") from None
        limit = self.settings.max_file_bytes
        form: dict[str, bytes] = {}
        held = size = parts = 0  # held: the fields' names and values and the parts' heads, not the file
        filename: str | None = None
        into: str | None = None  # the field being read; "" the file; None a part we skip (a repeated name)
        try:
            async for piece in _pieces(req):
                for event in parser.feed(piece):
                    if isinstance(event, multipart.PartHead):
                        parts += 1
                        if parts > MAX_FORM_PARTS:
                            raise _bad(
                                f"upload: the form has more than {MAX_FORM_PARTS} parts; send the file and"
                                " its fields (purpose, expires_after) once each"
                            )
                        held += len(event.name) + len(event.filename or "") + len(event.content_type or "")
                        if held > UPLOAD_SLACK_BYTES:
                            raise _bad(f"upload: the form's fields exceed {UPLOAD_SLACK_BYTES} bytes")
                        if event.name == "file" and filename is None:
                            filename, into = event.filename or "", ""
                        elif event.name != "file" and event.name not in form:
                            form[event.name], into = b"", event.name
                        else:
                            into = None  # a repeated name keeps the first
                    elif into == "":
                        size += len(event)
                        if size > limit:
                            raise _bad(
                                f"the file is over {limit:,} bytes; files may be at most {limit:,} bytes",
                                "file",
                                "file_too_large",
                            )
                        await writer.write(event)
                    elif into is not None:
                        held += len(event)
                        if held > UPLOAD_SLACK_BYTES:
                            raise _bad(f"upload: the form's fields exceed {UPLOAD_SLACK_BYTES} bytes")
                        form[into] += event
            parser.close()
        except multipart.MultipartError as err:
            raise _bad(f"upload: {err}") from None
        except BodyError as err:
            raise ApiError(err.status, err.message) from None
        return form, size, filename

    def _ttl(self, form: dict[str, bytes]) -> int:
        """``expires_after`` of the form, in seconds, or the service's default."""
        seconds = form.get("expires_after[seconds]")
        if seconds is None:
            return self.settings.file_ttl_s
        if form.get("expires_after[anchor]") != b"created_at":
            raise _bad("`expires_after.anchor` must be 'created_at'", "expires_after.anchor", "invalid_value")
        try:
            ttl = int(seconds)
        except ValueError:
            ttl = -1
        if not EXPIRY_BOUNDS_S[0] <= ttl <= EXPIRY_BOUNDS_S[1]:
            raise _bad(
                f"`expires_after.seconds` must be between {EXPIRY_BOUNDS_S[0]} and {EXPIRY_BOUNDS_S[1]}",
                "expires_after.seconds",
                "invalid_value",
            )
        return ttl

    async def list_files(self, req: Request, owner: str) -> dict[str, Any]:
        query = parse_qs(req.query.decode("latin-1"))
        limit = _int_param(query, "limit", FILES_PAGE[0], 1, FILES_PAGE[1])
        order = query.get("order", ["desc"])[0]
        if order not in ("asc", "desc"):
            raise _bad("`order` must be 'asc' or 'desc'", "order", "invalid_value")
        purpose = query.get("purpose", [None])[0]
        after = query.get("after", [None])[0]
        files, more = await self.db(self.store.files, owner, purpose, limit, after, order == "asc")
        return page([f.to_api() for f in files], more)

    async def download(self, conn: Connection, blob: str) -> None:
        size = await self.blobs.size(blob)
        chunks = self.blobs.chunks(blob)
        first = await anext(chunks, b"")
        conn.start_sized(200, [(b"content-type", b"application/octet-stream")], size, first)
        sent = len(first)
        async for chunk in chunks:
            await conn.write(chunk)
            sent += len(chunk)
        if sent != size:
            log.warning("file %s changed size while it was read (%d of %d bytes)", blob, sent, size)
            conn.close()
            return
        conn.end_sized()

    # --- batches ----------------------------------------------------------------------------------
    async def _batches(self, req: Request, method: bytes, rest: list[str]) -> tuple[int, bytes, bytes]:
        owner = self.owner(req)
        if not rest:
            if method == b"POST":
                return 200, _json((await self.create(req, owner)).to_api()), _JSON
            if method == b"GET":
                query = parse_qs(req.query.decode("latin-1"))
                limit = _int_param(query, "limit", BATCHES_PAGE[0], 1, BATCHES_PAGE[1])
                after = query.get("after", [None])[0]
                batches, more = await self.db(self.store.batches, owner, limit, after)
                return 200, _json(page([b.to_api() for b in batches], more)), _JSON
            raise ApiError(405, "/v1/batches takes GET or POST")
        batch_id = rest[0]
        if len(rest) == 1 and method == b"GET":
            found = await self.db(self.store.batch, batch_id, owner)
            if found is None:
                raise ApiError(
                    404, f"No batch found with id '{batch_id}'.", code="not_found", param="batch_id"
                )
            return 200, _json(found.to_api()), _JSON
        if len(rest) == 2 and rest[1] == "cancel" and method == b"POST":
            outcome = await self.db(self.store.cancel, batch_id, owner, int(time.time()))
            if outcome is None:
                raise ApiError(
                    404, f"No batch found with id '{batch_id}'.", code="not_found", param="batch_id"
                )
            if isinstance(outcome, str):
                raise _bad(outcome, "batch_id", "invalid_state")
            self.runner.wake.set()
            return 200, _json(outcome.to_api()), _JSON
        raise ApiError(404, f"no route for {method.decode('latin-1')} {req.path.decode('latin-1')[:100]}")

    async def create(self, req: Request, owner: str) -> BatchRecord:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            raise _bad("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise _bad(f"`{name}` is required (a string)", name, "missing_required_parameter")
        endpoint = body["endpoint"]
        if endpoint not in ENDPOINTS:
            raise _bad(
                f"endpoint {endpoint!r} is not supported here; use one of {', '.join(ENDPOINTS)}",
                "endpoint",
                "invalid_value",
            )
        if body["completion_window"] != COMPLETION_WINDOW:
            raise _bad(
                f"completion_window must be {COMPLETION_WINDOW!r}", "completion_window", "invalid_value"
            )
        metadata = check_metadata(body.get("metadata"))
        found = await self.db(self.store.file, body["input_file_id"], owner)
        if found is None:
            raise _bad(f"No such File object: {body['input_file_id']}", "input_file_id", "invalid_file")
        if found[0].purpose != PURPOSE_INPUT:
            raise _bad(
                f"the input file must have been uploaded with purpose {PURPOSE_INPUT!r}, not"
                f" {found[0].purpose!r}",
                "input_file_id",
                "invalid_file",
            )
        now = int(time.time())
        record = BatchRecord(
            id=new_batch_id(),
            owner=owner,
            endpoint=endpoint,
            input_file_id=found[0].id,
            completion_window=COMPLETION_WINDOW,
            status=Status.VALIDATING.value,
            created_at=now,
            expires_at=now + COMPLETION_WINDOW_S,
            metadata=metadata,
            allowed_models=self.allowed_models(req),
        )
        try:
            await self.db(self.store.add_batch, record, self.batch_limits, found[0].bytes)
        except BatchLimitError as err:
            raise ApiError(429, str(err), code="batch_limit_exceeded") from None
        self.runner.wake.set()
        return record
