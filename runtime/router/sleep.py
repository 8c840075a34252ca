"""Sleep mode: put a replica that has been idle long enough to sleep (its engine frees the accelerator) and wake
one when requests wait for it. Idle means idle for every router replica: the engine's own prompt-token
counter says whether anyone sent it work, and its sleep state is read back each round (another router may
have put it to sleep or woken it; a restarted engine is awake). The counter is on the engine's metrics
page: when the signal loop looked at the engine this round (the feed is away), the page that look read is
used, so the page is read once per replica per round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

import aiohttp

from runtime.config import RouterSettings
from runtime.engine_probe import Look, look_timeout_s, read_metrics
from runtime.engines import Signal
from runtime.replica import ReplicaState
from runtime.router.model_state import ModelState
from runtime.router.replicas import Replica

log = logging.getLogger("inferstack.router.fleet")

#: An engine's answer to POST /sleep can take this long (it moves its weights off the accelerator).
SLEEP_CALL_TIMEOUT_S = 120


class SleepControl:
    """The sleep and wake calls of one router; ``on_slept(model)`` and ``on_woke(model, seconds)`` feed metrics."""

    def __init__(self, settings: RouterSettings, session: Callable[[], aiohttp.ClientSession]) -> None:
        self.settings = settings
        self._session = session
        self.on_slept: Callable[[str], None] | None = None
        self.on_woke: Callable[[str, float], None] | None = None
        self._going_to_sleep: dict[str, asyncio.Event] = {}  # url -> set when its /sleep call has returned

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=look_timeout_s(self.settings.probe_interval_ms))

    async def sweep(
        self, models: Iterable[ModelState], looks: Mapping[ReplicaState, Look] | None = None
    ) -> None:
        """One round over the replicas of models that sleep; ``looks`` are the signal loop's looks this round
        (none while the feed is in), whose metrics pages are read here instead of a second time."""
        seen = looks or {}
        jobs = [self._sweep(s, r, seen.get(r)) for s in models if s.sleep is not None for r in s.replicas]
        if jobs:
            await asyncio.gather(*jobs)

    async def _sweep(self, state: ModelState, r: Replica, look: Look | None = None) -> None:
        """Learn whether the engine sleeps, then put it to sleep if it has been idle long enough."""
        sleep = state.sleep
        assert sleep is not None
        session = self._session()
        try:
            async with session.get(r.url + sleep.state_path, timeout=self._timeout()) as resp:
                if resp.status != 200:
                    return
                sleeping = bool((await resp.json(content_type=None)).get("is_sleeping"))
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            return
        if state.waking is not None and not state.waking.done():
            return  # a wake is under way: its answer, not this look, decides
        if sleeping != r.asleep:
            r.asleep = sleeping
            if not sleeping:
                r.last_used = time.monotonic()
                state.queue.wake_all()
        if not r.asleep:
            await self._took_prompts(state, r, look)
        idle_s = time.monotonic() - r.last_used
        if r.asleep or not r.healthy or r.inflight or r.engine_running or r.engine_queued:
            return
        if idle_s < state.route.sleep_after_idle_ms / 1000:
            return
        r.asleep = True  # before the call: no request is routed to it from here on
        done = self._going_to_sleep[r.url] = asyncio.Event()
        try:
            url = f"{r.url}{sleep.sleep_path}?level={sleep.level}"
            async with session.post(url, timeout=aiohttp.ClientTimeout(total=SLEEP_CALL_TIMEOUT_S)) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        finally:
            done.set()
            self._going_to_sleep.pop(r.url, None)
        if not ok:
            r.asleep = False
            log.warning("replica %s of %s did not go to sleep", r.url, state.name)
            return
        log.info("replica %s of %s is asleep after %.0fs idle", r.url, state.name, idle_s)
        if self.on_slept is not None:
            self.on_slept(state.name)

    async def _took_prompts(self, state: ModelState, r: Replica, look: Look | None) -> None:
        """Whether the engine took prompts since the last look, from its own counter: requests through other
        router replicas count, so one router never puts to sleep a replica that another keeps busy. The
        counter comes from the page ``look`` read when it read one this round, else from one read here."""
        metrics = look.metrics if look is not None else None
        if metrics is None:
            timeout_s = look_timeout_s(self.settings.probe_interval_ms)
            metrics = await read_metrics(self._session(), r.url, state.target.engine, timeout_s)
        tokens = metrics.get(Signal.PROMPT_TOKENS)
        if tokens is None:
            return
        if r.prompt_tokens is not None and tokens != r.prompt_tokens:
            r.last_used = time.monotonic()
        r.prompt_tokens = tokens

    def wake(self, state: ModelState) -> None:
        """Wake one sleeping replica of ``state`` for the requests waiting on it (one wake at a time)."""
        if state.sleep is None or (state.waking is not None and not state.waking.done()):
            return
        sleepers = state.sleepers()
        if sleepers:
            state.waking = asyncio.get_running_loop().create_task(self._wake(state, sleepers[0]))

    async def _wake(self, state: ModelState, r: Replica) -> None:
        sleep = state.sleep
        assert sleep is not None
        started = time.monotonic()
        going = self._going_to_sleep.get(r.url)
        if going is not None:  # a request came while it was being put to sleep: let that finish first
            await going.wait()
        try:
            async with self._session().post(
                r.url + sleep.wake_path,
                timeout=aiohttp.ClientTimeout(total=state.route.wake_hold_ms / 1000 + 60),
            ) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        took = time.monotonic() - started
        if ok:
            r.asleep = False
            r.last_used = time.monotonic()
            log.info("replica %s of %s woke in %.2fs", r.url, state.name, took)
            if self.on_woke is not None:
                self.on_woke(state.name, took)
        else:
            log.warning("replica %s of %s did not wake", r.url, state.name)
        state.queue.wake_all()  # waiters re-decide: a replica to use, or another to wake
