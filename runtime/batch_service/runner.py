"""The work: validate batches, feed their requests to the router while there is headroom, record every
answer exactly once, and close batches with their output and error files.

One loop looks at the unfinished batches, oldest first, and asks ``lifecycle.next_step`` what each
needs. Requests go out per model through a *lane*: its window (``pacing``) bounds how many are in flight,
and a refusal from the router (no headroom) pauses it. A request stays *in flight* for its batch until
its result is committed (results are committed in groups by the flusher), so a batch is never closed
while an answer could still arrive, and a crash leaves uncommitted lines pending: they run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from runtime.batch_service import lifecycle, pacing
from runtime.batch_service.blobs import BlobError, Blobs
from runtime.batch_service.client import Answer, RouterClient
from runtime.batch_service.lifecycle import Progress, Status, Step
from runtime.batch_service.metrics import BatchMetrics
from runtime.batch_service.objects import (
    PURPOSE_OUTPUT,
    BatchError,
    BatchRecord,
    FileRecord,
    error_line,
    request_id,
    response_line,
    result_file_id,
)
from runtime.batch_service.store import Db, Pending, Result, Store
from runtime.batch_service.validate import check_file
from runtime.config import BatchesSettings
from runtime.http import error_body
from runtime.upstream import UpstreamError

log = logging.getLogger("inferstack.batches")

TICK_S = 0.5
MIN_TICK_S = 0.02  # wake-ups closer than this are handled together (each tick reads the store)
FLUSH_S = 0.05
FLUSH_AT = 256
LOAD_LINES = 256
FEED_INTERVAL_S = 2.0
JANITOR_INTERVAL_S = 600.0


@dataclass
class Lane:
    """One model's batch requests in flight, their window and pause."""

    model: str
    window: pacing.Window = field(default_factory=pacing.Window)
    inflight: int = 0
    paused_until: float = 0.0
    cap: int = 1

    def room(self, now: float) -> int:
        if now < self.paused_until:
            return 0
        return self.window.limit(self.cap) - self.inflight


def _usage(body: Any) -> tuple[int, int, int]:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, 0
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    numbers = (usage.get("prompt_tokens"), usage.get("completion_tokens"), cached)
    return tuple(n if isinstance(n, int) else 0 for n in numbers)  # type: ignore[return-value]


def result_of(batch_id: str, pending: Pending, answer: Answer | None, failure: str) -> Result:
    """What one request's answer puts in the files: 2xx -> output, other answers -> error file with the
    response, no answer -> error file with ``server_error``."""
    if answer is None:
        data = error_line(batch_id, pending.line, pending.custom_id, "server_error", failure)
        return Result(batch_id, pending.line, False, data)
    try:
        body: Any = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        body = {"error": {"message": answer.body[:2000].decode("utf-8", "replace"), "type": "api_error"}}
    ok = 200 <= answer.status < 300
    data = response_line(batch_id, pending.line, pending.custom_id, answer.status, answer.request_id, body)
    tokens = _usage(body) if ok else (0, 0, 0)
    return Result(batch_id, pending.line, ok, data, *tokens)


class Runner:
    """See the module docstring. ``run`` until cancelled; ``snapshot`` fills the gauges."""

    def __init__(
        self,
        db: Db,
        blobs: Blobs,
        client: RouterClient,
        settings: BatchesSettings,
        metrics: BatchMetrics,
        scratch: Path,
    ) -> None:
        self.db = db
        self.blobs = blobs
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.scratch = scratch
        self.lanes: dict[str, Lane] = {}
        self.inflight: dict[str, set[int]] = {}  # batch -> lines out or not yet committed
        self.buffers: dict[tuple[str, str], deque[Pending]] = {}
        self.cursors: dict[tuple[str, str], int] = {}
        self.models: dict[str, list[str]] = {}  # batch -> models with pending lines
        self.results: list[Result] = []
        self.closing: set[str] = set()
        self.feed: Mapping[str, Any] | None = None
        self.wake = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # --- the loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        helpers = [self._flusher(), self._janitor()]
        if self.settings.health_feed_url is not None:
            helpers.append(self._feed_reader(str(self.settings.health_feed_url)))
        background = [asyncio.create_task(h) for h in helpers]
        try:
            while True:
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception:  # one bad batch or a store hiccup must not stop the service
                    log.exception("batch loop failed; trying again")
                    await asyncio.sleep(1.0)
                await asyncio.sleep(MIN_TICK_S)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK_S):
                        await self.wake.wait()
                self.wake.clear()
        finally:
            for task in [*background, *self._tasks]:
                task.cancel()
            await asyncio.gather(*background, *self._tasks, return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def tick(self) -> None:
        now = time.time()
        for batch in await self.db(self.db.store.active):
            progress = Progress(
                status=Status(batch.status),
                expires_at=batch.expires_at,
                pending=batch.total - batch.completed - batch.failed,
                inflight=len(self.inflight.get(batch.id, ())),
            )
            step = lifecycle.next_step(progress, now)
            if step is Step.VALIDATE:
                await self.validate(batch)
            elif step is Step.RUN:
                await self.fill(batch, now)
            elif (
                step in (Step.FINALIZE, Step.CLOSE_EXPIRED, Step.CLOSE_CANCELLED)
                and batch.id not in self.closing
            ):
                self.closing.add(batch.id)
                self._spawn(self.close(batch, step))

    # --- validating -------------------------------------------------------------------------------
    async def validate(self, batch: BatchRecord) -> None:
        now = int(time.time())
        found = await self.db(self.db.store.file, batch.input_file_id, batch.owner)
        if found is None:
            error = BatchError("invalid_file", f"The input file {batch.input_file_id} no longer exists.")
            await self.db(self.db.store.fail, batch.id, [error], 0, now)
            self.metrics.finished.labels(Status.FAILED.value).inc()
            return
        try:
            data = await self.blobs.read(found[1])
        except BlobError as err:
            log.warning("cannot read the input file of %s: %s; trying again", batch.id, err)
            return
        checked = await asyncio.to_thread(
            check_file, data, batch.endpoint, self.settings.max_requests_per_batch
        )
        if checked.errors:
            total = sum(1 for raw in data.split(b"\n") if raw.strip())
            await self.db(self.db.store.fail, batch.id, checked.errors, total, now)
            self.metrics.finished.labels(Status.FAILED.value).inc()
            log.info("batch %s failed validation: %d errors", batch.id, len(checked.errors))
            return
        models = checked.models
        started = await self.db(
            self.db.store.start, batch.id, checked.lines, models[0] if len(models) == 1 else None, now
        )
        if started:
            log.info("batch %s in progress: %d requests for %s", batch.id, len(checked.lines), models)
            self.wake.set()

    # --- running ----------------------------------------------------------------------------------
    def lane(self, model: str) -> Lane:
        lane = self.lanes.get(model)
        if lane is None:
            lane = self.lanes[model] = Lane(model)
        return lane

    async def fill(self, batch: BatchRecord, now: float) -> None:
        """Send this batch's pending requests while its models' lanes have room."""
        models = self.models.get(batch.id)
        if models is None:
            models = self.models[batch.id] = sorted(await self.db(self.db.store.pending_models, batch.id))
        out = self.inflight.setdefault(batch.id, set())
        for model in models:
            lane = self.lane(model)
            lane.cap = pacing.window_cap(
                pacing.capacity(self.feed, model, now), self.settings.max_inflight_per_replica
            )
            forbidden = bool(batch.allowed_models) and model not in batch.allowed_models
            while forbidden or lane.room(time.monotonic()) > 0:
                pending = await self._next(batch.id, model, out)
                if pending is None:
                    break
                out.add(pending.line)
                if forbidden:  # the owner's key may not use this model: answered here, as the router would
                    body = error_body(
                        403, f"key {batch.owner!r} may not use model {model!r}", code="model_not_allowed"
                    )
                    answer = Answer(403, request_id(batch.id, pending.line), body)
                    self._done(result_of(batch.id, pending, answer, ""), model, "error")
                    continue
                lane.inflight += 1
                self._spawn(self.send(batch, lane, pending))

    async def _next(self, batch_id: str, model: str, out: set[int]) -> Pending | None:
        key = (batch_id, model)
        buffer = self.buffers.setdefault(key, deque())
        while True:
            while buffer:
                pending = buffer.popleft()
                if pending.line not in out:
                    return pending
            loaded = await self.db(
                self.db.store.pending, batch_id, model, self.cursors.get(key, 0), LOAD_LINES
            )
            if not loaded:
                return None
            self.cursors[key] = loaded[-1].line
            buffer.extend(loaded)

    async def send(self, batch: BatchRecord, lane: Lane, pending: Pending) -> None:
        """One request until it has a result to record, or is refused (back to its buffer)."""
        s = self.settings
        rid = request_id(batch.id, pending.line)
        attempt = 0
        try:
            while True:
                attempt += 1
                answer: Answer | None = None
                failure = ""
                started = time.monotonic()
                try:
                    answer = await self.client.post(batch.endpoint, pending.body, rid, s.request_timeout_s)
                except (UpstreamError, TimeoutError, OSError) as err:
                    failure = f"the router gave no answer: {err or type(err).__name__}"
                self.metrics.duration.labels(lane.model).observe(time.monotonic() - started)
                verdict = pacing.verdict(answer.status if answer else None, attempt, s.max_attempts)
                if verdict == pacing.Verdict.REFUSED:
                    lane.paused_until = time.monotonic() + lane.window.refused()
                    self.buffers.setdefault((batch.id, lane.model), deque()).appendleft(pending)
                    self.inflight.get(batch.id, set()).discard(pending.line)
                    self.metrics.requests.labels(lane.model, "refused").inc()
                    return
                if verdict == pacing.Verdict.RETRY:
                    self.metrics.requests.labels(lane.model, "retried").inc()
                    await asyncio.sleep(pacing.retry_delay_s(attempt))
                    continue
                lane.window.answered(lane.cap)
                result = result_of(batch.id, pending, answer, failure)
                self._done(result, lane.model, "ok" if result.ok else "error")
                return
        except asyncio.CancelledError:
            self.inflight.get(batch.id, set()).discard(pending.line)  # stopping: the line stays pending
            raise
        finally:
            lane.inflight -= 1
            self.wake.set()

    def _done(self, result: Result, model: str, outcome: str) -> None:
        self.metrics.requests.labels(model, outcome).inc()
        self.results.append(result)
        if len(self.results) >= FLUSH_AT:
            self._flush_now.set()

    async def _flusher(self) -> None:
        """Commit results in groups; a line leaves ``inflight`` only once its result is committed."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_S):
                    await self._flush_now.wait()
            self._flush_now.clear()
            await self.flush()

    async def flush(self) -> None:
        if not self.results:
            return
        group, self.results = self.results, []
        try:
            await self.db(self.db.store.record, group)
        except Exception:
            self.results[:0] = group  # keep them: the next flush tries again
            raise
        for r in group:
            self.inflight.get(r.batch_id, set()).discard(r.line)
        self.wake.set()

    # --- closing ----------------------------------------------------------------------------------
    async def close(self, batch: BatchRecord, step: Step) -> None:
        """Write the batch's files from its rows, then finish it in one transaction."""
        status = lifecycle.terminal_of(step)
        out_path = self.scratch / f"{batch.id}.output.jsonl"
        err_path = self.scratch / f"{batch.id}.error.jsonl"
        try:
            now = int(time.time())
            if step is Step.FINALIZE and batch.status == Status.IN_PROGRESS.value:
                await self.db(self.db.store.finalizing, batch.id, now)
            self.scratch.mkdir(parents=True, exist_ok=True)
            n_out, n_err = await self.db(self.db.store.write_results, batch, status, out_path, err_path)
            output = await self._keep(batch, "output", out_path, n_out, now)
            errors = await self._keep(batch, "error", err_path, n_err, now)
            if await self.db(self.db.store.finish, batch.id, status, now, output, errors):
                self.metrics.finished.labels(status.value).inc()
                log.info(
                    "batch %s %s: %d results, %d errors",
                    batch.id,
                    status.value,
                    n_out,
                    n_err,
                )
            for key in [k for k in self.buffers if k[0] == batch.id]:
                self.buffers.pop(key, None)
                self.cursors.pop(key, None)
            self.models.pop(batch.id, None)
            self.inflight.pop(batch.id, None)
        except BlobError as err:
            log.warning("cannot write the files of %s: %s; trying again", batch.id, err)
            await asyncio.sleep(5.0)
        finally:
            for path in (out_path, err_path):
                path.unlink(missing_ok=True)
            self.closing.discard(batch.id)
            self.wake.set()

    async def _keep(
        self, batch: BatchRecord, kind: str, path: Path, lines: int, now: int
    ) -> tuple[FileRecord, str] | None:
        if lines == 0:
            return None
        file_id = result_file_id(batch.id, kind)
        blob = f"files/{file_id}"
        await self.blobs.put_file(blob, path)
        record = FileRecord(
            id=file_id,
            owner=batch.owner,
            filename=f"{batch.id}_{kind}.jsonl",
            purpose=PURPOSE_OUTPUT,
            bytes=path.stat().st_size,
            created_at=now,
            expires_at=now + self.settings.file_ttl_s,
        )
        return record, blob

    # --- signals and upkeep -----------------------------------------------------------------------
    async def _feed_reader(self, url: str) -> None:
        """Keep the health monitor's latest feed (routable replicas, engine queues)."""
        timeout = aiohttp.ClientTimeout(total=FEED_INTERVAL_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    async with session.get(url) as resp:
                        self.feed = await resp.json(content_type=None) if resp.status == 200 else None
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    self.feed = None
                await asyncio.sleep(FEED_INTERVAL_S)

    async def _janitor(self) -> None:
        """Delete files whose expiry passed (uploads after ``file_ttl_s``, results likewise)."""
        store: Store = self.db.store
        while True:
            try:
                for file_id, blob in await self.db(store.expired_files, int(time.time())):
                    await self.blobs.delete(blob)
                    await self.db(store.forget_file, file_id)
            except (BlobError, OSError) as err:
                log.warning("expired files not deleted yet: %s", err)
            await asyncio.sleep(JANITOR_INTERVAL_S)

    async def snapshot(self) -> None:
        """Set the gauges from the store and the lanes (called before each scrape)."""
        m = self.metrics
        store: Store = self.db.store
        counts = await self.db(store.status_counts)
        for status in Status:
            m.batches.labels(status.value).set(counts.get(status.value, 0))
        pending = await self.db(store.pending_by_model)
        for model in set(pending) | set(self.lanes):
            m.pending.labels(model).set(pending.get(model, 0))
        for model, lane in self.lanes.items():
            m.inflight.labels(model).set(lane.inflight)
            m.window.labels(model).set(lane.window.limit(lane.cap))
        now = time.time()
        ages = [now - max(b.last_progress_at, float(b.created_at)) for b in await self.db(store.active)]
        m.oldest_progress_age.set(max(ages, default=0.0))
