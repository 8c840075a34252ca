"""The work: validate batches, feed their requests to the router while there is headroom, record every
answer exactly once, and close batches with their output and error files.

One loop looks at the unfinished batches, oldest first, and asks ``lifecycle.next_step`` what each
needs. Requests go out per model through a *lane*: its window (``pacing``) bounds how many are in flight,
and a refusal from the router (no headroom) pauses it. A lane's room goes round the batches' owners one
request at a time, so a key's big batch does not keep another key's batch waiting until it ends. A request
stays *in flight* for its batch until its result is committed (results are committed in groups by the
flusher), so a batch is never closed while an answer could still arrive, and a crash leaves uncommitted
lines pending: they run again.

Trouble stays where it starts. A line that cannot be sent or answered is that line's error; a batch whose
step raises is tried again after a backoff, and after ``BATCH_TRIES`` failed tries it ends ``failed`` with
one ``internal_error``, while every other batch goes on. A batch rate-limited at its owner's key waits
alone (the Retry-After). The loops (work, flusher, janitor, feed) survive any error: it is logged and
counted, the loop is *failing* (``/readyz`` fails) until a turn succeeds, and the next turn comes after a
backoff. Failures of the store or the files (``ENVIRONMENT``) are the service's bad day, not a batch's:
they never count against one.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from runtime import tracing
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
from runtime.http import error_body, error_code
from runtime.upstream import UpstreamError

log = logging.getLogger("inferstack.batches")

TICK_S = 0.5
MIN_TICK_S = 0.02  # wake-ups closer than this are handled together (each tick reads the store)
FLUSH_S = 0.05
FLUSH_AT = 256
LOAD_LINES = 256
FEED_INTERVAL_S = 2.0
JANITOR_INTERVAL_S = 600.0
#: A failed loop turn: the next one after this, doubling per failure in a row, up to the maximum.
LOOP_BACKOFF_S = 1.0
LOOP_BACKOFF_MAX_S = 30.0
#: Tries of a batch whose step raises before it fails; the wait before the next try doubles from this.
BATCH_TRIES = 3
BATCH_RETRY_S = 1.0
#: What failing says about the store or the files (the service's day), not about the batch at hand.
ENVIRONMENT: tuple[type[Exception], ...] = (sqlite3.OperationalError, OSError, BlobError)


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


@dataclass
class Trouble:
    """A batch whose step raised: how often in a row, and when it may be tried again (monotonic)."""

    failures: int = 0
    retry_at: float = 0.0


def owners_in_turn(owners: Collection[str], last_served: str | None) -> list[str]:
    """The owners in the order they take lane room: by name, starting after the one whose request went out last
    (a turn per request sent, not per tick: most ticks find the lanes full, and a count of ticks between two free
    slots that divides by the owners would hand every slot to the same one)."""
    ordered = sorted(owners)
    first = bisect.bisect_right(ordered, last_served) if last_served is not None else 0
    return ordered[first:] + ordered[:first]


def _backoff(base_s: float, failures: int, max_s: float) -> float:
    return float(min(max_s, base_s * 2 ** min(failures - 1, 16)))


def _error_code(answer: Answer | None) -> str | None:
    """The ``error.code`` of a refusal's body (429 and 503 only: the rest are kept as they are)."""
    if answer is None or answer.status not in (429, 503):
        return None
    return error_code(answer.body)


#: The most tokens one answer's usage counts as. A JSON number past it (orjson reads up to 2**64 - 1, SQLite
#: stores below 2**63) is an engine's bug or hostility: counted as this, it never becomes the store error that
#: would keep every batch's results from being recorded.
MAX_COUNTED_TOKENS = 2**53 - 1


def _usage(body: Any) -> tuple[int, int, int]:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, 0
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    numbers = (usage.get("prompt_tokens"), usage.get("completion_tokens"), cached)
    counted = (min(max(n, 0), MAX_COUNTED_TOKENS) if type(n) is int else 0 for n in numbers)
    return tuple(counted)  # type: ignore[return-value]


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
    try:
        data = response_line(
            batch_id, pending.line, pending.custom_id, answer.status, answer.request_id, body
        )
    except orjson.JSONEncodeError:  # an answer nested deeper than a file line may be
        message = f"the endpoint's answer ({answer.status}) could not be written: nested too deeply"
        return Result(
            batch_id,
            pending.line,
            False,
            error_line(batch_id, pending.line, pending.custom_id, "server_error", message),
        )
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
        served: Collection[str] | None = None,
        traces: tracing.Tracing | None = None,
    ) -> None:
        self.tracing = traces or tracing.Tracing(None, "inferstack-batches")
        self.db = db
        self.served = served  # the models a line may name (None: any; the router judges)
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
        self.validating: str | None = None  # the batch whose input is being checked (one at a time)
        self.feed: Mapping[str, Any] | None = None
        self.wake = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.troubles: dict[str, Trouble] = {}  # batch -> its failed tries in a row
        self.owners_waiting: dict[str, float] = {}  # owner over its rate limit -> until (monotonic)
        self.failing: set[str] = set()  # loops whose last turn failed
        self._shown: set[str] = set()  # models with per-model gauges
        self._last_served: str | None = None  # the owner whose request went out last (share_lanes)

    # --- the loops --------------------------------------------------------------------------------
    async def run(self) -> None:
        helpers = [self._every("flusher", self._flush_turn), self._every("janitor", self._janitor_turn)]
        if self.settings.health_feed_url is not None:
            helpers.append(self._feed_reader(str(self.settings.health_feed_url)))
        background = [asyncio.create_task(h) for h in helpers]
        try:
            await self._every("work", self._work_turn)
        finally:
            for task in [*background, *self._tasks]:
                task.cancel()
            await asyncio.gather(*background, *self._tasks, return_exceptions=True)

    async def _every(self, name: str, turn: Callable[[], Awaitable[float]]) -> None:
        """Run ``turn`` for ever, waiting the seconds it returns between turns. A turn that raises is logged
        and counted and marks the loop failing until one succeeds; the next comes after a backoff."""
        failures = 0
        self.metrics.loop_failing.labels(name).set(0)
        while True:
            try:
                wait = await turn()
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                self.failing.add(name)
                self.metrics.loop_errors.labels(name).inc()
                self.metrics.loop_failing.labels(name).set(1)
                wait = _backoff(LOOP_BACKOFF_S, failures, LOOP_BACKOFF_MAX_S)
                log.exception("the %s loop failed (%d in a row); next try in %.0f s", name, failures, wait)
            else:
                if failures:
                    log.info("the %s loop works again after %d failures", name, failures)
                failures = 0
                self.failing.discard(name)
                self.metrics.loop_failing.labels(name).set(0)
            if wait > 0:
                await asyncio.sleep(wait)

    async def _work_turn(self) -> float:
        await self.tick()
        await asyncio.sleep(MIN_TICK_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(TICK_S):
                await self.wake.wait()
        self.wake.clear()
        return 0.0

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def tick(self) -> None:
        """One look at every unfinished batch, oldest first; then the lanes' room goes to the running ones,
        shared between their owners (``share_lanes``). A batch whose step raises is that batch's trouble
        (``trouble``); the store or the files failing ends the turn (the work loop reports it)."""
        now = time.time()
        running: list[BatchRecord] = []
        for batch in await self.db(self.db.store.active):
            trouble = self.troubles.get(batch.id)
            if trouble is not None and time.monotonic() < trouble.retry_at:
                continue
            try:
                step = await self.step(batch, now)
            except ENVIRONMENT:
                raise
            except Exception as err:
                await self.trouble(batch, err)
            else:
                if step is Step.RUN:
                    running.append(batch)
        for batch_id in await self.share_lanes(running, now):
            self.troubles.pop(batch_id, None)

    async def step(self, batch: BatchRecord, now: float) -> Step:
        """What ``batch`` needs now, begun (checking its input and closing it run as tasks of their own),
        except sending a running batch's requests (``share_lanes`` does)."""
        progress = Progress(
            status=Status(batch.status),
            expires_at=batch.expires_at,
            pending=batch.total - batch.completed - batch.failed,
            inflight=len(self.inflight.get(batch.id, ())),
        )
        step = lifecycle.next_step(progress, now)
        if step is Step.VALIDATE and self.validating is None:
            self.validating = batch.id
            self._spawn(self._validation(batch))
        elif (
            step in (Step.FINALIZE, Step.CLOSE_EXPIRED, Step.CLOSE_CANCELLED) and batch.id not in self.closing
        ):
            self.closing.add(batch.id)
            self._spawn(self.close(batch, step))
        return step

    async def share_lanes(self, running: list[BatchRecord], now: float) -> set[str]:
        """Send the running batches' requests while lanes have room, one request per owner in turn (each
        owner's oldest batch that can send first), so one key's big batch cannot hold a lane while another
        key's batch waits; a round starts after the owner served last. Returns the batches that sent a
        request (each that raised is its own trouble; one that had no room this tick proved nothing, so
        its count of failed tries stays)."""
        by_owner: dict[str, list[BatchRecord]] = {}
        for batch in running:  # oldest first
            by_owner.setdefault(batch.owner, []).append(batch)
        owners = owners_in_turn(by_owner, self._last_served)
        sent: set[str] = set()
        while owners:
            for owner in list(owners):
                batches = by_owner[owner]
                while batches:
                    batch = batches[0]
                    try:
                        if await self.send_one(batch, now):
                            self._last_served = owner
                            sent.add(batch.id)
                            break  # this owner's request of the round
                    except ENVIRONMENT:
                        raise
                    except Exception as err:
                        sent.discard(batch.id)
                        await self.trouble(batch, err)
                    batches.pop(0)  # nothing more to send this tick
                if not batches:
                    owners.remove(owner)
        return sent

    async def trouble(self, batch: BatchRecord, err: Exception) -> None:
        """A step of ``batch`` raised: try it again after a backoff; after ``BATCH_TRIES`` tries, fail it."""
        trouble = self.troubles.setdefault(batch.id, Trouble())
        trouble.failures += 1
        if trouble.failures < BATCH_TRIES:
            wait = _backoff(BATCH_RETRY_S, trouble.failures, LOOP_BACKOFF_MAX_S)
            trouble.retry_at = time.monotonic() + wait
            log.warning(
                "batch %s failed (%d of %d tries); next try in %.0f s",
                batch.id,
                trouble.failures,
                BATCH_TRIES,
                wait,
                exc_info=err,
            )
            return
        log.error("batch %s failed %d times; it fails", batch.id, trouble.failures, exc_info=err)
        error = BatchError(
            "internal_error",
            f"The batch service could not process this batch ({type(err).__name__}, {trouble.failures}"
            " tries); other batches are not affected. Create it again, or tell the platform's operators.",
        )
        if await self.db(self.db.store.give_up, batch.id, error, int(time.time())):
            self.metrics.finished.labels(Status.FAILED.value).inc()
        self._forget(batch.id)

    def _forget(self, batch_id: str) -> None:
        """Drop what the runner holds for a batch that ended, and the lanes nobody needs any more."""
        for key in [k for k in self.buffers if k[0] == batch_id]:
            self.buffers.pop(key, None)
            self.cursors.pop(key, None)
        self.models.pop(batch_id, None)
        self.inflight.pop(batch_id, None)
        self.troubles.pop(batch_id, None)
        used = {model for models in self.models.values() for model in models}
        for model in [m for m, lane in self.lanes.items() if m not in used and lane.inflight == 0]:
            del self.lanes[model]

    # --- validating -------------------------------------------------------------------------------
    async def _validation(self, batch: BatchRecord) -> None:
        """``validate`` in a task of its own, one batch at a time (each holds its input file in memory): a
        big file's check does not hold up the requests of the batches that run. It reports how it went as a
        closing step does."""
        try:
            async with self._reported(batch, "validate"):
                await self.validate(batch)
                trouble = self.troubles.get(batch.id)
                if trouble is not None and trouble.retry_at <= time.monotonic():
                    del self.troubles[batch.id]  # validated (or failed for good): no trouble left
        finally:
            self.validating = None
            self.wake.set()

    @contextlib.asynccontextmanager
    async def _reported(self, batch: BatchRecord, what: str) -> AsyncIterator[None]:
        """How a step run as a task of its own ends: the store's or the files' bad day is waited out (the next
        tick tries again), anything else is the batch's trouble (``trouble``)."""
        try:
            yield
        except ENVIRONMENT as err:
            log.warning("cannot %s %s yet: %s; trying again", what, batch.id, err)
            await asyncio.sleep(5.0)
        except Exception as err:
            with contextlib.suppress(*ENVIRONMENT):  # then the next tick tries again
                await self.trouble(batch, err)

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
        except BlobError as err:  # the files' bad day, not the batch's: it waits, the younger ones go on
            log.warning("cannot read the input file of %s: %s; trying again", batch.id, err)
            wait = self.troubles.setdefault(batch.id, Trouble())
            wait.retry_at = time.monotonic() + BATCH_RETRY_S  # counts no try against it
            return
        checked = await asyncio.to_thread(
            check_file, data, batch.endpoint, self.settings.max_requests_per_batch, self.served
        )
        if checked.errors:
            await self.db(self.db.store.fail, batch.id, checked.errors, checked.requests, now)
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

    async def send_one(self, batch: BatchRecord, now: float) -> bool:
        """Send one of this batch's pending requests on a lane with room (or answer one its owner's key may
        not send); False when it has none to send now (lanes full, nothing pending, its owner waiting out a
        rate limit)."""
        waiting = self.owners_waiting.get(batch.owner)
        if waiting is not None:
            if time.monotonic() < waiting:
                return False
            del self.owners_waiting[batch.owner]
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
            if not forbidden and lane.room(time.monotonic()) <= 0:
                continue
            pending = await self._next(batch.id, model, out)
            if pending is None:
                continue
            out.add(pending.line)
            if forbidden:  # the owner's key may not use this model: answered here, as the router would
                body = error_body(
                    403, f"key {batch.owner!r} may not use model {model!r}", code="model_not_allowed"
                )
                answer = Answer(403, request_id(batch.id, pending.line), body)
                self._done(result_of(batch.id, pending, answer, ""), model, "error")
                return True
            lane.inflight += 1
            self._spawn(self.send(batch, lane, pending))
            return True
        return False

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
                started = time.monotonic()
                answer, failure = await self._post(batch, pending, rid)
                self.metrics.duration.labels(lane.model).observe(time.monotonic() - started)
                status = answer.status if answer else None
                verdict = pacing.verdict(status, attempt, s.max_attempts, _error_code(answer))
                if verdict in (pacing.Verdict.REFUSED, pacing.Verdict.LIMITED):
                    if verdict == pacing.Verdict.LIMITED and answer is not None:  # the owner waits, alone
                        wait = min(pacing.LIMITED_PAUSE_MAX_S, answer.retry_after_s or 1.0)
                        self.owners_waiting[batch.owner] = time.monotonic() + wait
                    else:  # no headroom: the model's lane slows down
                        lane.paused_until = time.monotonic() + lane.window.refused()
                    if batch.id in self.inflight:  # (not when the batch ended meanwhile)
                        self.buffers.setdefault((batch.id, lane.model), deque()).appendleft(pending)
                        self.inflight[batch.id].discard(pending.line)
                    outcome = "rate_limited" if verdict == pacing.Verdict.LIMITED else "refused"
                    self.metrics.requests.labels(lane.model, outcome).inc()
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

    async def _post(self, batch: BatchRecord, pending: Pending, rid: str) -> tuple[Answer | None, str]:
        """One try of a line: its answer, or None and why there is none. Never raises (but cancelled): a
        surprise in one request stays with its line (tried again, then its error line)."""
        attributes: dict[str, tracing.Attribute] = {
            "inferstack.batch_id": batch.id,
            "inferstack.batch_line": pending.line,
            tracing.REQUEST_ID: rid,
            tracing.TENANT: batch.owner,
            tracing.PRIORITY: "low",
        }
        with self.tracing.outgoing("batch line", attributes) as span:
            try:
                answer = await self.client.post(
                    batch.endpoint, pending.body, rid, self.settings.request_timeout_s, batch.owner
                )
            except (UpstreamError, TimeoutError, OSError) as err:
                tracing.failed(span, (0, f"no answer: {err or type(err).__name__}"))
                return None, f"the router gave no answer: {err or type(err).__name__}"
            except Exception as err:
                log.exception("line %d of %s could not be sent", pending.line, batch.id)
                return None, f"the batch service could not send this request ({type(err).__name__})"
            tracing.note({tracing.STATUS: answer.status})
            if answer.status != 200:
                tracing.failed(span, (answer.status, "the router refused or failed the line"))
            return answer, ""

    def _done(self, result: Result, model: str, outcome: str) -> None:
        self.metrics.requests.labels(model, outcome).inc()
        self.results.append(result)
        if len(self.results) >= FLUSH_AT:
            self._flush_now.set()

    async def _flush_turn(self) -> float:
        """Commit results in groups; a line leaves ``inflight`` only once its result is committed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FLUSH_S):
                await self._flush_now.wait()
        self._flush_now.clear()
        await self.flush()
        return 0.0

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
            async with self._reported(batch, "close"):
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
                self._forget(batch.id)
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
        """Keep the health monitor's latest feed (routable replicas, engine queues); a feed that cannot be
        had, or is not the feed's shape, is none (then only the router's admission paces)."""
        timeout = aiohttp.ClientTimeout(total=FEED_INTERVAL_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def turn() -> float:
                try:
                    async with session.get(url) as resp:
                        feed = await resp.json(content_type=None) if resp.status == 200 else None
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    feed = None
                self.feed = feed if isinstance(feed, dict) else None
                return FEED_INTERVAL_S

            await self._every("feed", turn)

    async def _janitor_turn(self) -> float:
        """Delete files whose expiry passed (uploads after ``file_ttl_s``, results likewise)."""
        store: Store = self.db.store
        for file_id, blob in await self.db(store.expired_files, int(time.time())):
            await self.blobs.delete(blob)
            await self.db(store.forget_file, file_id)
        return JANITOR_INTERVAL_S

    async def snapshot(self) -> None:
        """Set the gauges from the store and the lanes (called before each scrape)."""
        m = self.metrics
        store: Store = self.db.store
        counts = await self.db(store.status_counts)
        for status in Status:
            m.batches.labels(status.value).set(counts.get(status.value, 0))
        pending = await self.db(store.pending_by_model)
        shown = set(pending) | set(self.lanes)
        for model in shown:
            m.pending.labels(model).set(pending.get(model, 0))
        for model in self._shown - shown:  # no unfinished batch uses it: its series go
            m.forget_model(model)
        self._shown = shown
        for model, lane in self.lanes.items():
            m.inflight.labels(model).set(lane.inflight)
            m.window.labels(model).set(lane.window.limit(lane.cap))
        now = time.time()
        ages = [now - max(b.last_progress_at, float(b.created_at)) for b in await self.db(store.active)]
        m.oldest_progress_age.set(max(ages, default=0.0))
