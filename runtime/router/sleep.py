"""Sleep mode: put a replica that has been idle long enough to sleep (its engine frees the accelerator) and wake
one when requests wait for it. Idle means idle for every router replica: the engine's own prompt-token
counter says whether anyone sent it work, and its sleep state is read back each round (another router may
have put it to sleep or woken it; a restarted engine is awake).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp

from runtime.config import RouterSettings
from runtime.engine_probe import look_timeout_s, prompt_tokens
from runtime.router.backends import Backend
from runtime.router.model_state import ModelState

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

    async def sweep(self, models: Iterable[ModelState]) -> None:
        jobs = [self._sweep(s, b) for s in models if s.sleep is not None for b in s.replicas]
        if jobs:
            await asyncio.gather(*jobs)

    async def _sweep(self, state: ModelState, b: Backend) -> None:
        """Learn whether the engine sleeps, then put it to sleep if it has been idle long enough."""
        sleep = state.sleep
        assert sleep is not None
        session = self._session()
        try:
            async with session.get(b.url + sleep.state_path, timeout=self._timeout()) as resp:
                if resp.status != 200:
                    return
                sleeping = bool((await resp.json(content_type=None)).get("is_sleeping"))
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            return
        if state.waking is not None and not state.waking.done():
            return  # a wake is under way: its answer, not this look, decides
        if sleeping != b.asleep:
            b.asleep = sleeping
            if not sleeping:
                b.last_used = time.monotonic()
                state.queue.wake_all()
        if not b.asleep:
            await self._took_prompts(state, b)
        idle_s = time.monotonic() - b.last_used
        if b.asleep or not b.healthy or b.inflight or b.engine_running or b.engine_queued:
            return
        if idle_s < state.route.sleep_after_idle_ms / 1000:
            return
        b.asleep = True  # before the call: no request is routed to it from here on
        done = self._going_to_sleep[b.url] = asyncio.Event()
        try:
            url = f"{b.url}{sleep.sleep_path}?level={sleep.level}"
            async with session.post(url, timeout=aiohttp.ClientTimeout(total=SLEEP_CALL_TIMEOUT_S)) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        finally:
            done.set()
            self._going_to_sleep.pop(b.url, None)
        if not ok:
            b.asleep = False
            log.warning("replica %s of %s did not go to sleep", b.url, state.name)
            return
        log.info("replica %s of %s is asleep after %.0fs idle", b.url, state.name, idle_s)
        if self.on_slept is not None:
            self.on_slept(state.name)

    async def _took_prompts(self, state: ModelState, b: Backend) -> None:
        """Whether the engine took prompts since the last look, from its own counter: requests through other
        router replicas count, so one router never puts to sleep a replica that another keeps busy."""
        timeout_s = look_timeout_s(self.settings.probe_interval_ms)
        tokens = await prompt_tokens(self._session(), b.url, state.target.engine, timeout_s)
        if tokens is None:
            return
        if b.prompt_tokens is not None and tokens != b.prompt_tokens:
            b.last_used = time.monotonic()
        b.prompt_tokens = tokens

    def wake(self, state: ModelState) -> None:
        """Wake one sleeping replica of ``state`` for the requests waiting on it (one wake at a time)."""
        if state.sleep is None or (state.waking is not None and not state.waking.done()):
            return
        sleepers = state.sleepers()
        if sleepers:
            state.waking = asyncio.get_running_loop().create_task(self._wake(state, sleepers[0]))

    async def _wake(self, state: ModelState, b: Backend) -> None:
        sleep = state.sleep
        assert sleep is not None
        started = time.monotonic()
        going = self._going_to_sleep.get(b.url)
        if going is not None:  # a request came while it was being put to sleep: let that finish first
            await going.wait()
        try:
            async with self._session().post(
                b.url + sleep.wake_path,
                timeout=aiohttp.ClientTimeout(total=state.route.wake_hold_ms / 1000 + 60),
            ) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        took = time.monotonic() - started
        if ok:
            b.asleep = False
            b.last_used = time.monotonic()
            log.info("replica %s of %s woke in %.2fs", b.url, state.name, took)
            if self.on_woke is not None:
                self.on_woke(state.name, took)
        else:
            log.warning("replica %s of %s did not wake", b.url, state.name)
        state.queue.wake_all()  # waiters re-decide: a replica to use, or another to wake
