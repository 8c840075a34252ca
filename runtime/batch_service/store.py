"""The batch service's state: files, batches and each batch's requests, in SQLite.

Every change is one transaction (WAL journal, ``synchronous=FULL``: an answered upload or create
survives a power cut, and a crash at any point leaves the last committed state whole). The rules that
make a batch exact:

- Validation inserts all request rows and moves the batch to ``in_progress`` in one transaction.
- A result is written once: ``UPDATE ... WHERE done = 0``, and the batch's counters move only with the
  rows that changed. Results are committed in groups; a crash loses at most the uncommitted ones, whose
  lines are still pending and run again.
- A batch's files are made from its rows (done rows as recorded; pending rows as expired or cancelled
  when it closes so), so making them twice gives the same files; the terminal transaction records the
  files, marks the pending rows and drops the batch's rows.

Single-threaded by design: the service calls it from one worker thread (``Db``), never from the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from runtime.batch_service.lifecycle import ACTIVE, CANCELLABLE, Status, cancel_refusal, unfinished_line
from runtime.batch_service.objects import BatchError, BatchRecord, FileRecord, error_line
from runtime.batch_service.validate import Line

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    seq INTEGER NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    blob TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, seq);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    seq INTEGER NOT NULL,
    status TEXT NOT NULL,
    doc TEXT NOT NULL,
    total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    last_progress_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
CREATE TABLE IF NOT EXISTS requests (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    model TEXT NOT NULL,
    body BLOB NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    ok INTEGER NOT NULL DEFAULT 0,
    result BLOB,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX IF NOT EXISTS requests_pending ON requests (batch_id, model, line) WHERE done = 0;
"""

# Fields of a batch kept in its JSON document (the rest are columns the store updates in place).
_DOC_FIELDS = (
    "endpoint",
    "input_file_id",
    "completion_window",
    "created_at",
    "expires_at",
    "metadata",
    "allowed_models",
    "model",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "output_file_id",
    "error_file_id",
    "errors",
)
_TERMINAL_AT = {
    Status.COMPLETED: "completed_at",
    Status.EXPIRED: "expired_at",
    Status.CANCELLED: "cancelled_at",
}


@dataclass(frozen=True)
class Result:
    """The outcome of one request, as it goes into the output (``ok``) or the error file."""

    batch_id: str
    line: int
    ok: bool
    data: bytes  # the file line, newline included
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


class QuotaExceededError(Exception):
    """An upload would take its owner past its files quota; the message says which limit and how to fix it."""


@dataclass(frozen=True)
class Quota:
    """Files and bytes one owner may keep."""

    files: int
    bytes: int

    def check(self, files: int, used: int, adding: int) -> None:
        """``QuotaExceededError`` when one more file of ``adding`` bytes does not fit beside ``files`` of ``used``."""
        if files + 1 > self.files:
            raise QuotaExceededError(
                f"this key keeps {files:,} files, the most it may keep; delete some (DELETE /v1/files/{{id}})"
                " or wait for them to expire"
            )
        if used + adding > self.bytes:
            raise QuotaExceededError(
                f"this key keeps {used:,} bytes of files and may keep at most {self.bytes:,}; this file of"
                f" {adding:,} bytes does not fit: delete some (DELETE /v1/files/{{id}}) or wait for them to expire"
            )


class BatchLimitError(Exception):
    """A new batch would take its owner past its batch limits; the message says which and how to fix it."""


@dataclass(frozen=True)
class BatchLimits:
    """What one owner's unfinished batches may hold: their number, their lines not yet done, and (with its
    files) the bytes of their input files, each batch's lines being a copy of its input in the store."""

    batches: int
    pending: int
    bytes: int

    def check(self, batches: int, pending: int, used: int, adding: int) -> None:
        """``BatchLimitError`` when one more batch over an input of ``adding`` bytes does not fit."""
        if batches + 1 > self.batches:
            raise BatchLimitError(
                f"this key has {batches:,} unfinished batches, the most it may have; wait for one to finish or"
                " cancel one (POST /v1/batches/{batch_id}/cancel)"
            )
        if pending >= self.pending:
            raise BatchLimitError(
                f"this key's unfinished batches still have {pending:,} requests to run, and it may have at"
                f" most {self.pending:,}; wait for them to progress or cancel a batch"
            )
        if used + adding > self.bytes:
            raise BatchLimitError(
                f"this key's files and its unfinished batches' inputs take {used:,} bytes, and it may take at"
                f" most {self.bytes:,}; this batch's input of {adding:,} bytes does not fit: wait for a batch"
                " to finish, cancel one, or delete files (DELETE /v1/files/{id})"
            )


@dataclass(frozen=True)
class Pending:
    line: int
    custom_id: str
    body: bytes


def _doc(record: BatchRecord) -> str:
    fields: dict[str, Any] = {name: getattr(record, name) for name in _DOC_FIELDS}
    fields["errors"] = [e.to_api() for e in record.errors]
    fields["allowed_models"] = list(record.allowed_models)
    return json.dumps(fields, separators=(",", ":"))


class Store:
    """The SQLite database under ``path``; see the module docstring for its rules."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def _write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``work`` in one immediate transaction; roll back on any error."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            out = work(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    @staticmethod
    def _next_seq(db: sqlite3.Connection, table: str) -> int:
        row = db.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}").fetchone()
        return int(row[0])

    # --- files ------------------------------------------------------------------------------------
    def _insert_file(self, db: sqlite3.Connection, record: FileRecord, blob: str) -> None:
        db.execute(
            "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.id,
                record.owner,
                self._next_seq(db, "files"),
                record.filename,
                record.purpose,
                record.bytes,
                record.created_at,
                record.expires_at,
                blob,
            ),
        )

    def add_file(self, record: FileRecord, blob: str, quota: Quota | None = None) -> None:
        """Keep a file; with ``quota``, only while its owner stays within it (``QuotaExceededError`` otherwise,
        checked in the same transaction, so concurrent uploads cannot both slip in)."""

        def work(db: sqlite3.Connection) -> None:
            if quota is not None:
                quota.check(*self._usage(db, record.owner), record.bytes)
            self._insert_file(db, record, blob)

        self._write(work)

    @staticmethod
    def _usage(db: sqlite3.Connection, owner: str) -> tuple[int, int]:
        row = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM files WHERE owner = ?", (owner,)
        ).fetchone()
        return int(row[0]), int(row[1])

    def usage(self, owner: str) -> tuple[int, int]:
        """(files, bytes) ``owner`` keeps: uploads and its batches' results."""
        return self._usage(self.db, owner)

    @staticmethod
    def _file(row: tuple[Any, ...]) -> FileRecord:
        return FileRecord(
            id=row[0],
            owner=row[1],
            filename=row[3],
            purpose=row[4],
            bytes=row[5],
            created_at=row[6],
            expires_at=row[7],
        )

    def file(self, file_id: str, owner: str) -> tuple[FileRecord, str] | None:
        """A file of ``owner`` and its blob key."""
        row = self.db.execute("SELECT * FROM files WHERE id = ? AND owner = ?", (file_id, owner)).fetchone()
        return (self._file(row), row[8]) if row else None

    def files(
        self, owner: str, purpose: str | None, limit: int, after: str | None, ascending: bool
    ) -> tuple[list[FileRecord], bool]:
        where, args = ["owner = ?"], [owner]
        if purpose:
            where.append("purpose = ?")
            args.append(purpose)
        if after:
            row = self.db.execute(
                "SELECT seq FROM files WHERE id = ? AND owner = ?", (after, owner)
            ).fetchone()
            if row:
                where.append("seq > ?" if ascending else "seq < ?")
                args.append(row[0])
        order = "ASC" if ascending else "DESC"
        sql = f"SELECT * FROM files WHERE {' AND '.join(where)} ORDER BY seq {order} LIMIT ?"
        rows = self.db.execute(sql, (*args, limit + 1)).fetchall()
        return [self._file(r) for r in rows[:limit]], len(rows) > limit

    def delete_file(self, file_id: str, owner: str) -> str | None:
        """Forget a file of ``owner``; its blob key (for the caller to delete), or None when unknown."""

        def work(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT blob FROM files WHERE id = ? AND owner = ?", (file_id, owner)).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))
            return str(row[0])

        out: str | None = self._write(work)
        return out

    def expired_files(self, now: int) -> list[tuple[str, str]]:
        """(id, blob) of files whose expiry passed."""
        rows = self.db.execute(
            "SELECT id, blob FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def forget_file(self, file_id: str) -> None:
        self._write(lambda db: db.execute("DELETE FROM files WHERE id = ?", (file_id,)))

    # --- batches ----------------------------------------------------------------------------------
    def add_batch(self, record: BatchRecord, limits: BatchLimits | None = None, input_bytes: int = 0) -> None:
        """Keep a new batch; with ``limits``, only while its owner stays within them (``BatchLimitError``
        otherwise, checked in the same transaction, so concurrent creations cannot both slip in)."""

        def work(db: sqlite3.Connection) -> None:
            if limits is not None:
                marks = ",".join("?" * len(ACTIVE))
                row = db.execute(
                    "SELECT COUNT(*), COALESCE(SUM(b.total - b.completed - b.failed), 0),"
                    " COALESCE(SUM(f.bytes), 0) FROM batches b"
                    " LEFT JOIN files f ON f.id = json_extract(b.doc, '$.input_file_id')"
                    f" WHERE b.owner = ? AND b.status IN ({marks})",
                    (record.owner, *ACTIVE),
                ).fetchone()
                used = self._usage(db, record.owner)[1]
                limits.check(int(row[0]), int(row[1]), used + int(row[2]), input_bytes)
            db.execute(
                "INSERT INTO batches (id, owner, seq, status, doc) VALUES (?, ?, ?, ?, ?)",
                (record.id, record.owner, self._next_seq(db, "batches"), record.status, _doc(record)),
            )

        self._write(work)

    @staticmethod
    def _batch(row: tuple[Any, ...]) -> BatchRecord:
        doc = json.loads(row[4])
        doc["errors"] = tuple(BatchError(**e) for e in doc.get("errors") or ())
        doc["allowed_models"] = tuple(doc.get("allowed_models") or ())
        return BatchRecord(
            id=row[0],
            owner=row[1],
            status=row[3],
            total=row[5],
            completed=row[6],
            failed=row[7],
            input_tokens=row[8],
            output_tokens=row[9],
            cached_tokens=row[10],
            last_progress_at=row[11],
            **doc,
        )

    def batch(self, batch_id: str, owner: str | None = None) -> BatchRecord | None:
        """A batch (of ``owner``, when given)."""
        if owner is None:
            row = self.db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        else:
            row = self.db.execute(
                "SELECT * FROM batches WHERE id = ? AND owner = ?", (batch_id, owner)
            ).fetchone()
        return self._batch(row) if row else None

    def batches(self, owner: str, limit: int, after: str | None) -> tuple[list[BatchRecord], bool]:
        """Newest first, ``after`` an id of the previous page."""
        where, args = ["owner = ?"], [owner]
        if after:
            row = self.db.execute(
                "SELECT seq FROM batches WHERE id = ? AND owner = ?", (after, owner)
            ).fetchone()
            if row:
                where.append("seq < ?")
                args.append(row[0])
        sql = f"SELECT * FROM batches WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?"
        rows = self.db.execute(sql, (*args, limit + 1)).fetchall()
        return [self._batch(r) for r in rows[:limit]], len(rows) > limit

    def active(self) -> list[BatchRecord]:
        """Batches not yet terminal, oldest first (the order their work is done in)."""
        marks = ",".join("?" * len(ACTIVE))
        rows = self.db.execute(
            f"SELECT * FROM batches WHERE status IN ({marks}) ORDER BY seq",
            tuple(ACTIVE),
        ).fetchall()
        return [self._batch(r) for r in rows]

    def _update_doc(self, db: sqlite3.Connection, batch_id: str, status: Status, **changes: Any) -> None:
        row = db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
        doc = json.loads(row[0])
        for name, value in changes.items():
            doc[name] = value
        db.execute(
            "UPDATE batches SET status = ?, doc = ? WHERE id = ?",
            (status.value, json.dumps(doc, separators=(",", ":")), batch_id),
        )

    def cancel(self, batch_id: str, owner: str, now: int) -> BatchRecord | str | None:
        """Move a batch to ``cancelling``: the batch, or why it cannot be cancelled, or None if unknown."""

        def work(db: sqlite3.Connection) -> BatchRecord | str | None:
            row = db.execute(
                "SELECT status FROM batches WHERE id = ? AND owner = ?", (batch_id, owner)
            ).fetchone()
            if row is None:
                return None
            status = Status(row[0])
            refusal = cancel_refusal(status)
            if refusal:
                return refusal
            if status in CANCELLABLE:
                self._update_doc(db, batch_id, Status.CANCELLING, cancelling_at=now)
            return self._batch(db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone())

        out: BatchRecord | str | None = self._write(work)
        return out

    def start(self, batch_id: str, lines: list[Line], model: str | None, now: int) -> bool:
        """Validation passed: the request rows and ``in_progress``, together. False when the batch is no
        longer validating (cancelled meanwhile): nothing changed."""

        def work(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row[0] != Status.VALIDATING.value:
                return False
            db.executemany(
                "INSERT INTO requests (batch_id, line, custom_id, model, body) VALUES (?, ?, ?, ?, ?)",
                ((batch_id, ln.number, ln.custom_id, ln.model, ln.body) for ln in lines),
            )
            self._update_doc(db, batch_id, Status.IN_PROGRESS, in_progress_at=now, model=model)
            db.execute(
                "UPDATE batches SET total = ?, last_progress_at = ? WHERE id = ?",
                (len(lines), time.time(), batch_id),
            )
            return True

        ok: bool = self._write(work)
        return ok

    def fail(self, batch_id: str, errors: list[BatchError], total: int, now: int) -> bool:
        """Validation failed: ``failed`` with the errors (only from ``validating``)."""

        def work(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row[0] != Status.VALIDATING.value:
                return False
            self._update_doc(db, batch_id, Status.FAILED, failed_at=now, errors=[e.to_api() for e in errors])
            db.execute("UPDATE batches SET total = ? WHERE id = ?", (total, batch_id))
            return True

        ok: bool = self._write(work)
        return ok

    def give_up(self, batch_id: str, error: BatchError, now: int) -> bool:
        """The service could not move this batch on, again and again: ``failed`` with ``error``, whatever
        its status (only while active); lines without a result count as failed, its rows go."""

        def work(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or Status(row[0]) not in ACTIVE:
                return False
            left = db.execute(
                "SELECT COUNT(*) FROM requests WHERE batch_id = ? AND done = 0", (batch_id,)
            ).fetchone()[0]
            self._update_doc(db, batch_id, Status.FAILED, failed_at=now, errors=[error.to_api()])
            db.execute("UPDATE batches SET failed = failed + ? WHERE id = ?", (left, batch_id))
            db.execute("DELETE FROM requests WHERE batch_id = ?", (batch_id,))
            return True

        ok: bool = self._write(work)
        return ok

    def finalizing(self, batch_id: str, now: int) -> None:
        """Every line of an ``in_progress`` batch has its result: ``finalizing``."""

        def work(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row and row[0] == Status.IN_PROGRESS.value:
                self._update_doc(db, batch_id, Status.FINALIZING, finalizing_at=now)

        self._write(work)

    # --- requests ---------------------------------------------------------------------------------
    def pending_models(self, batch_id: str) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT model, COUNT(*) FROM requests WHERE batch_id = ? AND done = 0 GROUP BY model",
            (batch_id,),
        ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def pending(self, batch_id: str, model: str, after_line: int, limit: int) -> list[Pending]:
        rows = self.db.execute(
            "SELECT line, custom_id, body FROM requests WHERE batch_id = ? AND model = ? AND done = 0"
            " AND line > ? ORDER BY line LIMIT ?",
            (batch_id, model, after_line, limit),
        ).fetchall()
        return [Pending(r[0], r[1], bytes(r[2])) for r in rows]

    def record(self, results: Iterable[Result]) -> int:
        """Write results, each at most once; returns how many rows changed."""

        def work(db: sqlite3.Connection) -> int:
            moved: dict[str, list[int]] = {}
            changed = 0
            for r in results:
                cur = db.execute(
                    "UPDATE requests SET done = 1, ok = ?, result = ? WHERE batch_id = ? AND line = ? AND done = 0",
                    (1 if r.ok else 0, r.data, r.batch_id, r.line),
                )
                if cur.rowcount:
                    changed += 1
                    c = moved.setdefault(r.batch_id, [0, 0, 0, 0, 0])
                    c[0 if r.ok else 1] += 1
                    c[2] += r.input_tokens
                    c[3] += r.output_tokens
                    c[4] += r.cached_tokens
            now = time.time()
            for batch_id, c in moved.items():
                db.execute(
                    "UPDATE batches SET completed = completed + ?, failed = failed + ?,"
                    " input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
                    " cached_tokens = cached_tokens + ?, last_progress_at = ? WHERE id = ?",
                    (*c, now, batch_id),
                )
            return changed

        out: int = self._write(work)
        return out

    def write_results(
        self, batch: BatchRecord, closing: Status, output: Path, errors: Path
    ) -> tuple[int, int]:
        """The batch's output and error files from its rows, in line order; pending rows become the
        ``closing`` status's error lines. Returns (output lines, error lines)."""
        unfinished = unfinished_line(closing)
        counts = [0, 0]
        with output.open("wb") as out, errors.open("wb") as err:
            cursor = self.db.execute(
                "SELECT line, custom_id, done, ok, result FROM requests WHERE batch_id = ? ORDER BY line",
                (batch.id,),
            )
            for line, custom_id, done, ok, result in cursor:
                if done:
                    (out if ok else err).write(bytes(result))
                    counts[0 if ok else 1] += 1
                elif unfinished is not None:
                    err.write(error_line(batch.id, line, custom_id, *unfinished))
                    counts[1] += 1
                else:
                    raise RuntimeError(f"batch {batch.id}: line {line} has no result; cannot finish")
            for f in (out, err):
                f.flush()
        return counts[0], counts[1]

    def finish(
        self,
        batch_id: str,
        status: Status,
        now: int,
        output: tuple[FileRecord, str] | None,
        errors: tuple[FileRecord, str] | None,
    ) -> bool:
        """The terminal transaction: the result files (record and blob key), the status and its time,
        pending rows counted as failed, the batch's request rows gone. False when it was terminal already."""

        def work(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or Status(row[0]) not in ACTIVE:
                return False
            for found in (output, errors):
                if found is not None:
                    self._insert_file(db, *found)
            left = db.execute(
                "SELECT COUNT(*) FROM requests WHERE batch_id = ? AND done = 0", (batch_id,)
            ).fetchone()[0]
            self._update_doc(
                db,
                batch_id,
                status,
                **{_TERMINAL_AT[status]: now},
                output_file_id=output[0].id if output else None,
                error_file_id=errors[0].id if errors else None,
            )
            db.execute("UPDATE batches SET failed = failed + ? WHERE id = ?", (left, batch_id))
            db.execute("DELETE FROM requests WHERE batch_id = ?", (batch_id,))
            return True

        ok: bool = self._write(work)
        return ok

    # --- what /metrics shows ----------------------------------------------------------------------
    def status_counts(self) -> dict[str, int]:
        rows = self.db.execute("SELECT status, COUNT(*) FROM batches GROUP BY status").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def pending_by_model(self) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT model, COUNT(*) FROM requests WHERE done = 0 GROUP BY model"
        ).fetchall()
        return {r[0]: int(r[1]) for r in rows}


P = ParamSpec("P")
T = TypeVar("T")


class Db:
    """The store behind one worker thread, so SQLite's fsyncs never stall the event loop."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches-sqlite")

    async def __call__(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._thread.submit(self.store.close).result()
        self._thread.shutdown(wait=True)
