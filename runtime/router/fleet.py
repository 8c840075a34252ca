"""The live fleet: per model, its replicas (from discovery), its strategy, and its wait line; plus the
loop that keeps replicas' load and health signals fresh (health monitor feed, else our own probe).

Reconfiguration swaps whole ``ModelState`` objects; replicas that survive a change keep their
counters, pools and circuits, so a config reload or a scale-up does not reset what we learned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from runtime.config import (
    EngineKind,
    ModelRoute,
    ModelTarget,
    RouterSettings,
    RuntimeConfig,
    Task,
    version_target_name,
)
from runtime.discovery import watch_backends
from runtime.engines import Signal, SleepMode, facts
from runtime.router.adapters import listed_adapters
from runtime.router.admission import WaitQueue
from runtime.router.backends import Backend, Breaker
from runtime.scheduling import Need, Strategy, build
from runtime.versions import Split

if TYPE_CHECKING:  # imported when a model follows KV events: tokenizers, jinja2 and zmq cost ~10 MiB of RSS
    from runtime.router.cache_view import ModelCacheView

log = logging.getLogger("inferstack.router.fleet")

PROBE_MAX_BYTES = 4 * 1024 * 1024
PROBE_FAILURES_TO_UNHEALTHY = 2


class ModelState:
    """Everything the router needs to route one model."""

    def __init__(self, target: ModelTarget, route: ModelRoute, settings: RouterSettings) -> None:
        self.target = target
        self.route = route
        # A version has a name of its own ('<model>-<version>'), which its metrics, scaling and alerts carry;
        # ``served`` is what clients send, shared by the versions of a model.
        self.name = target.name
        self.served = target.served_name
        self.version = target.version_of.version if target.version_of is not None else ""
        #: (model, version) for the per-version metrics, None for a model without versions
        self.versioned: tuple[str, str] | None = (self.served, self.version) if self.version else None
        #: a version that is not the stable one: its failures are retried on the stable version
        self.canary = target.version_of is not None and not target.version_of.stable
        self.strategy: Strategy = build(route.strategy)
        # the request fields the strategy's scorers declared they read: parse only those
        self.needs_prompt = Need.PROMPT in self.strategy.needs
        self.needs_session = Need.SESSION in self.strategy.needs
        self.needs_adapter = Need.ADAPTER in self.strategy.needs
        self.adapters = {a.name: a.path for a in target.adapters}  # name -> what a replica loads
        self.session_header = route.strategy.session_header.lower().encode()
        self.ewma_alpha = route.strategy.latency_ewma_alpha
        self.settings = settings
        self.backends: list[Backend] = []
        self.by_url: dict[str, Backend] = {}
        self.queue = WaitQueue(settings.queue_max_requests)
        self.weights = {str(b.url).rstrip("/"): b.weight for b in target.static_backends}
        self.batcher: Backend | None = None
        if route.batcher_url is not None and target.task is Task.EMBED:
            self.batcher = self._new_backend(str(route.batcher_url).rstrip("/"), cap=1 << 30)
        self.probe_failures: dict[str, int] = {}
        self.on_departed: Callable[[str, str], None] | None = None  # (model, url), e.g. to drop metrics
        # sleep mode: the engine's endpoints when the model sleeps when idle; the fleet wakes replicas
        self.sleep: SleepMode | None = facts(target.engine).sleep if route.sleep_after_idle_ms else None
        self.request_wake: Callable[[], None] = lambda: None
        self.waking: asyncio.Task[None] | None = None
        # the engines' KV events, for a strategy that reads them (set by the fleet: kept across reloads)
        self.needs_blocks = Need.PROMPT_BLOCKS in self.strategy.needs and target.kv_events is not None
        self.max_blocks = route.strategy.prefix_max_blocks
        self.kv: ModelCacheView | None = None

    def _new_backend(self, url: str, cap: int | None = None) -> Backend:
        s = self.settings
        breaker = Breaker(s.breaker_failures, s.breaker_open_ms / 1000)
        return Backend(
            url, cap or self.target.max_concurrency_per_backend, breaker, self.weights.get(url, 1.0)
        )

    def set_backends(self, urls: list[str], previous: dict[str, Backend] | None = None) -> None:
        old = {**(previous or {}), **self.by_url}
        fresh: list[Backend] = []
        for url in sorted(set(urls)):
            b = old.get(url)
            if b is None or b.cap != self.target.max_concurrency_per_backend:
                if b is not None:
                    b.pool.close()  # replaced (its cap changed): in-use connections close when done
                b = self._new_backend(url)
            fresh.append(b)
        for url, b in old.items():
            if url not in urls:
                b.pool.close()
                self.probe_failures.pop(url, None)
                if self.on_departed is not None:
                    self.on_departed(self.name, url)
        self.backends = fresh
        self.by_url = {b.url: b for b in fresh}
        if self.kv is not None:
            self.kv.followers.sync([b.url for b in fresh])
        self.queue.wake_all()  # new capacity, or nothing left: waiters re-decide

    def healthy_count(self) -> int:
        return sum(1 for b in self.backends if b.healthy)

    def awake(self) -> list[Backend]:
        """Replicas a request may go to now (a sleeping one first has to wake)."""
        return [b for b in self.backends if not b.asleep] if self.sleep is not None else self.backends

    def sleepers(self) -> list[Backend]:
        """Healthy replicas that sleep: what a waiting request can wake."""
        return [b for b in self.backends if b.asleep and b.healthy] if self.sleep is not None else []

    def servable(self) -> bool:
        """A request for the model can be answered: a healthy replica, a batcher, or (scaled to zero) a
        replica the activator holds requests for while it starts."""
        return bool(self.healthy_count() or self.batcher is not None or self.route.cold_start_hold_ms)


class Fleet:
    """All models; owns the discovery watches and the signal loop."""

    def __init__(self, cfg: RuntimeConfig, discover: Callable[[ModelTarget], Any] = watch_backends) -> None:
        self.cfg = cfg
        self.discover = discover
        self.models: dict[str, ModelState] = {}
        self.splits: dict[str, Split] = {}  # model clients send -> its versions (targets "<model>-<version>")
        self.adapter_parents: dict[str, str] = {}  # adapter name -> its base model's name
        self.on_departed: Callable[[str, str], None] | None = None
        self.on_kv_problem: Callable[[str, str], None] = lambda model, cause: None
        self._retired: set[asyncio.Task[None]] = set()
        self._watches: dict[str, tuple[ModelTarget, asyncio.Task[None]]] = {}
        self._signals_task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.feed_ok = False
        # sleep mode: (model, seconds) of each sleep and each wake, for metrics
        self.on_slept: Callable[[str], None] | None = None
        self.on_woke: Callable[[str, float], None] | None = None
        self._going_to_sleep: dict[str, asyncio.Event] = {}  # url -> set when its /sleep call has returned
        self.apply(cfg)

    # --- configuration ---------------------------------------------------------------------------
    def apply(self, cfg: RuntimeConfig) -> None:
        """Install a (new) config: rebuild model states, keep replicas and restart changed watches.

        Every model's state (its strategy) is built before anything changes, so a config that cannot
        be built raises and leaves the running one whole."""
        fresh = {target.name: ModelState(target, cfg.route(target.name), cfg.router) for target in cfg.models}
        splits = splits_of(cfg, self.splits)
        views = {name: self._cache_view(state) for name, state in fresh.items()}
        self.cfg = cfg
        for target in cfg.models:
            state = fresh[target.name]
            state.on_departed = self._departed
            state.request_wake = functools.partial(self.wake, state)
            state.kv = views[target.name]
            old = self.models.get(target.name)
            same_source = old is not None and (old.target.discovery, old.target.static_backends) == (
                target.discovery,
                target.static_backends,
            )
            if old is not None and same_source:  # keep replicas (and what we learned) across a reload
                state.set_backends([b.url for b in old.backends], old.by_url)
        kept = {id(v) for v in views.values()}
        for old in self.models.values():
            if old.kv is not None and id(old.kv) not in kept:
                self._retire(old.kv)
        self.models = fresh
        self.splits = splits
        self.adapter_parents = cfg.adapter_parents()
        with contextlib.suppress(RuntimeError):  # no loop yet: start() will start the watches
            asyncio.get_running_loop()
            self._sync_watches()

    # --- versions --------------------------------------------------------------------------------
    def lookup(self, model: str, session: str | None) -> ModelState | None:
        """The state that takes a request for ``model``: the model itself, or the version its split picks
        (sticky per session key) among versions that can serve now."""
        split = self.splits.get(model)
        if split is None:
            state = self.models.get(model)
            return None if state is None or state.version else state  # versions are reached through splits
        chosen = split.choose(session, lambda v: self.lookup_version(model, v).servable())
        return self.lookup_version(model, chosen if chosen is not None else split.stable)

    def fallback(self, state: ModelState) -> ModelState | None:
        """Where a failed request of a canary goes next: its model's stable version (None for the stable)."""
        split = self.splits.get(state.served)
        if split is None or not state.version or state.version == split.stable:
            return None
        return self.lookup_version(state.served, split.stable)

    def lookup_version(self, model: str, version: str) -> ModelState:
        return self.models[version_target_name(model, version)]

    def public_models(self) -> dict[str, list[ModelState]]:
        """Model name clients see -> the states that serve it (one, or its versions)."""
        out: dict[str, list[ModelState]] = {}
        for state in self.models.values():
            out.setdefault(state.served, []).append(state)
        return out

    def _cache_view(self, state: ModelState) -> ModelCacheView | None:
        """The model's KV-event view: the running one when its source did not change, else a new one."""
        source = state.target.kv_events
        if not state.needs_blocks or source is None:
            return None
        old = self.models.get(state.name)
        if old is not None and old.kv is not None and old.target == state.target:
            return old.kv
        from runtime.router.cache_view import ModelCacheView  # noqa: PLC0415  (see the import above)

        view = ModelCacheView(state.target, source)
        view.count_problem = self._kv_problem  # late-bound: the router sets on_kv_problem after apply()
        return view

    def _kv_problem(self, model: str, cause: str) -> None:
        self.on_kv_problem(model, cause)

    def _retire(self, view: ModelCacheView) -> None:
        with contextlib.suppress(RuntimeError):  # no loop: nothing was started
            task = asyncio.get_running_loop().create_task(view.followers.stop())
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    def _departed(self, model: str, url: str) -> None:
        if self.on_departed is not None:
            self.on_departed(model, url)

    def _sync_watches(self) -> None:
        for name, (target, task) in list(self._watches.items()):
            state = self.models.get(name)
            if state is None or state.target != target:
                task.cancel()
                del self._watches[name]
        for name, state in self.models.items():
            if name not in self._watches:
                task = asyncio.get_running_loop().create_task(self._watch(state.target))
                self._watches[name] = (state.target, task)

    async def _watch(self, target: ModelTarget) -> None:
        async for urls in self.discover(target):
            state = self.models.get(target.name)
            if state is not None and state.target == target:
                if urls != [b.url for b in state.backends]:
                    log.info("replicas of %s: %s", target.name, urls)
                state.set_backends(urls)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session for control calls to replicas (probes, adapter loads); open while started."""
        assert self._session is not None, "the fleet is not started"
        return self._session

    async def start(self) -> None:
        self._sync_watches()
        self._session = aiohttp.ClientSession()
        self._signals_task = asyncio.get_running_loop().create_task(self._signals_loop())
        # static targets yield at once: let the first lists land before we report ready
        for _ in range(3):
            await asyncio.sleep(0)

    async def stop(self) -> None:
        tasks = [t for _, t in self._watches.values()]
        if self._signals_task is not None:
            tasks.append(self._signals_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watches.clear()
        if self._session is not None:
            await self._session.close()
        for state in self.models.values():
            if state.kv is not None:
                await state.kv.followers.stop()
            for b in state.backends:
                b.pool.close()

    # --- load and health signals -----------------------------------------------------------------
    async def _signals_loop(self) -> None:
        while True:
            try:
                self.feed_ok = await self._read_feed() if self.cfg.router.health_feed_url else False
                if not self.feed_ok:
                    await self._probe_all()
                await self._sleep_sweep()
            except asyncio.CancelledError:
                raise
            except Exception:  # the signal loop must outlive any one bad answer
                log.exception("signal refresh failed")
            await asyncio.sleep(self.signals_interval_s())  # after the refresh: it may have taken one out

    def signals_interval_s(self) -> float:
        """The feed (or probe) period: ``recovery_poll_ms`` while some replica is out, so one that comes back
        is routed to again within a fraction of a second of the health monitor readmitting it."""
        s = self.cfg.router
        out = any(not b.healthy for state in self.models.values() for b in state.backends)
        return min(s.recovery_poll_ms, s.probe_interval_ms) / 1000 if out else s.probe_interval_ms / 1000

    async def _read_feed(self) -> bool:
        """Apply the health monitor's ``/v1/backends``; False if it is unreachable or stale."""
        assert self._session is not None
        url = str(self.cfg.router.health_feed_url)
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.router.probe_interval_ms / 1000)
            async with self._session.get(url, timeout=timeout) as resp:
                if resp.status != 200:
                    return False
                feed = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            log.warning("health feed %s unavailable (%s); probing engines directly", url, err)
            return False
        fresh = apply_feed(self.models, feed, time.time())
        if fresh:
            apply_version_feed(self.splits, feed)
        return fresh

    async def _probe_all(self) -> None:
        jobs = [self._probe(state, b) for state in self.models.values() for b in state.backends]
        if jobs:
            await asyncio.gather(*jobs)

    async def _probe(self, state: ModelState, b: Backend) -> None:
        assert self._session is not None
        engine = facts(state.target.engine)
        timeout = aiohttp.ClientTimeout(total=max(0.5, self.cfg.router.probe_interval_ms / 1000 * 0.8))
        healthy = False
        text = ""
        try:
            async with self._session.get(b.url + engine.health_path, timeout=timeout) as resp:
                healthy = resp.status == 200
            if healthy:
                async with self._session.get(b.url + engine.metrics_path, timeout=timeout) as resp:
                    if resp.status == 200:
                        text = (await resp.content.read(PROBE_MAX_BYTES)).decode("utf-8", "replace")
            if healthy and state.adapters:  # which adapters it holds: its model list says (lost on restart)
                observed_at = time.time()
                async with self._session.get(b.url + engine.models_path, timeout=timeout) as resp:
                    if resp.status == 200:
                        listed = listed_adapters(await resp.json(content_type=None), state.name)
                        b.adapters.sync(listed, observed_at)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            healthy = False
        fails = 0 if healthy else state.probe_failures.get(b.url, 0) + 1
        state.probe_failures[b.url] = fails
        signals = parse_signals(text, state.target.engine.value) if text else {}
        was = b.healthy
        b.update_signals(
            healthy=fails < PROBE_FAILURES_TO_UNHEALTHY,
            queued=signals.get(Signal.QUEUED),
            running=signals.get(Signal.RUNNING),
            kv_usage=signals.get(Signal.KV_USAGE),
        )
        if b.healthy != was:
            log.warning(
                "replica %s of %s is now %s", b.url, state.name, "healthy" if b.healthy else "unhealthy"
            )
            state.queue.wake_all()

    # --- sleep mode ------------------------------------------------------------------------------
    async def _sleep_sweep(self) -> None:
        jobs = [self._sweep(s, b) for s in self.models.values() if s.sleep is not None for b in s.backends]
        if jobs:
            await asyncio.gather(*jobs)

    async def _sweep(self, state: ModelState, b: Backend) -> None:
        """Learn whether the engine sleeps (another router may have put it to sleep or woken it; a restarted
        engine is awake), then put it to sleep if it has been idle long enough."""
        sleep = state.sleep
        assert sleep is not None and self._session is not None
        timeout = aiohttp.ClientTimeout(total=max(0.5, self.cfg.router.probe_interval_ms / 1000 * 0.8))
        try:
            async with self._session.get(b.url + sleep.state_path, timeout=timeout) as resp:
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
            await self._took_prompts(state, b, timeout)
        idle_s = time.monotonic() - b.last_used
        if b.asleep or not b.healthy or b.inflight or b.engine_running or b.engine_queued:
            return
        if idle_s < state.route.sleep_after_idle_ms / 1000:
            return
        b.asleep = True  # before the call: no request is routed to it from here on
        done = self._going_to_sleep[b.url] = asyncio.Event()
        try:
            url = f"{b.url}{sleep.sleep_path}?level={sleep.level}"
            async with self._session.post(url, timeout=aiohttp.ClientTimeout(total=120)) as resp:
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

    async def _took_prompts(self, state: ModelState, b: Backend, timeout: aiohttp.ClientTimeout) -> None:
        """Whether the engine took prompts since the last look, from its own counter: requests through other
        router replicas count, so one router never puts to sleep a replica that another keeps busy."""
        assert self._session is not None
        try:
            async with self._session.get(
                b.url + facts(state.target.engine).metrics_path, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    return
                text = (await resp.content.read(PROBE_MAX_BYTES)).decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError):
            return
        tokens = parse_signals(text, state.target.engine.value).get(Signal.PROMPT_TOKENS)
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
        if sleepers and self._session is not None:
            state.waking = asyncio.get_running_loop().create_task(self._wake(state, sleepers[0]))

    async def _wake(self, state: ModelState, b: Backend) -> None:
        sleep = state.sleep
        assert sleep is not None and self._session is not None
        started = time.monotonic()
        going = self._going_to_sleep.get(b.url)
        if going is not None:  # a request came while it was being put to sleep: let that finish first
            await going.wait()
        try:
            async with self._session.post(
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


def splits_of(cfg: RuntimeConfig, previous: dict[str, Split]) -> dict[str, Split]:
    """The splits a config declares; a split whose configured weights did not change keeps its override
    (a rollback stays until the config changes)."""
    out: dict[str, Split] = {}
    for model, targets in cfg.versions().items():
        names = tuple(t.version_of.version for t in targets if t.version_of)
        weights = tuple(t.version_of.weight for t in targets if t.version_of)
        old = previous.get(model)
        if old is not None and (old.versions, old.configured) == (names, weights):
            out[model] = old
        else:
            out[model] = Split(model, names, weights)
    return out


def apply_version_feed(splits: dict[str, Split], feed: dict[str, Any]) -> None:
    """Install the weights the health monitor decided (a canary rolled back) on the splits."""
    for entry in feed.get("versions") or []:
        split = splits.get(str(entry.get("model")))
        weights = entry.get("weights") or {}
        if split is None or set(weights) != set(split.versions):
            continue
        if split.set_weights([float(weights[v]) for v in split.versions], str(entry.get("reason") or "")):
            log.warning(
                "versions of %s now weighted %s: %s",
                split.model,
                dict(zip(split.versions, split.weights, strict=True)),
                split.override_reason or "back to the configured weights",
            )


def apply_feed(models: dict[str, ModelState], feed: dict[str, Any], now: float) -> bool:
    """Copy routable/queued/running/kv from a feed onto our replicas; False if the feed is stale."""
    generated = float(feed.get("generated_at") or 0)
    stale_after = float(feed.get("stale_after_s") or 15)
    if now - generated > stale_after:
        return False
    for entry in feed.get("backends") or []:
        state = models.get(str(entry.get("model")))
        if state is None:
            continue
        b = state.by_url.get(str(entry.get("url", "")).rstrip("/"))
        if b is None:
            continue
        m = entry.get("metrics") or {}
        fresh = not entry.get("metrics_stale", False)
        if state.adapters and isinstance(entry.get("adapters"), list):
            b.adapters.sync([str(a) for a in entry["adapters"]], generated)
        was = b.healthy
        b.update_signals(
            healthy=bool(entry.get("routable", entry.get("state") != "ejected")),
            queued=m.get("queued") if fresh else None,
            running=m.get("running") if fresh else None,
            kv_usage=m.get("kv_usage") if fresh else None,
        )
        if b.healthy != was:
            state.queue.wake_all()
    return True


def parse_signals(text: str, engine: str) -> dict[Signal, float]:
    """Sum queued / running / KV usage over label sets from an engine's Prometheus text."""
    names: dict[str, Signal] = {}
    engine_facts = facts(EngineKind(engine))
    for wanted in (Signal.QUEUED, Signal.RUNNING, Signal.KV_USAGE, Signal.PROMPT_TOKENS):
        for n in engine_facts.names(wanted):
            names[n] = wanted
    sums: dict[Signal, float] = {}
    kv_count = 0
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 > space) else space
        name = line[:end] if end > 0 else line
        found = names.get(name)
        if found is None:
            continue
        signal = found
        tail = line[line.rfind("}") + 1 :] if brace >= 0 else line[space:]
        try:
            value = float(tail.split()[0])
        except (ValueError, IndexError):
            continue
        if math.isnan(value):
            continue
        sums[signal] = sums.get(signal, 0.0) + value
        if signal is Signal.KV_USAGE:
            kv_count += 1
    if kv_count > 1:  # usage is a ratio: average it over engines (data-parallel ranks), do not sum
        sums[Signal.KV_USAGE] /= kv_count
    return sums
