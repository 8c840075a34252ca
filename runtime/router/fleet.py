"""The live fleet: every model's state (``model_state``), the discovery watches that list their replicas, and
the loop that keeps the replicas' signals fresh (``runtime.signal_loop``, shared with the endpoint picker, with
the router's own step in ``signals``) and puts idle ones to sleep (``sleep``).

Reconfiguration swaps whole ``ModelState`` objects; replicas that survive a change keep their
counters, pools and circuits, so a config reload or a scale-up does not reset what we learned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from runtime.config import ModelTarget, RuntimeConfig, version_target_name
from runtime.discovery import watch_replicas
from runtime.router.model_state import ModelState
from runtime.router.signals import RouterSignals
from runtime.router.sleep import SleepControl
from runtime.signal_loop import SignalLoop
from runtime.versions import MAX_CLIENT_SHARE, Split

if TYPE_CHECKING:  # imported when a model follows KV events: tokenizers, jinja2 and zmq cost ~10 MiB of RSS
    from runtime.router.cache_view import ModelCacheView

log = logging.getLogger("inferstack.router.fleet")


class Fleet:
    """All models; owns the discovery watches and the signal loop."""

    def __init__(self, cfg: RuntimeConfig, discover: Callable[[ModelTarget], Any] = watch_replicas) -> None:
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
        self.sleep = SleepControl(cfg.router, lambda: self.session)
        self.signals = SignalLoop(
            lambda: self.models,
            lambda: self.cfg.router,
            lambda: self.session,
            RouterSignals(lambda: self.splits, self.sleep),
            log,
        )
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
        self.sleep.settings = cfg.router
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
                state.set_replicas([r.url for r in old.replicas], old.by_url)
        for stage, served in cfg.prefill_targets().items():  # P/D: the two roles know each other
            fresh[served].prefill = fresh[stage]
            fresh[stage].prefill_for = served
            fresh[stage].adapters = fresh[
                served
            ].adapters  # the decode's adapters, loaded on prefill replicas
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
    def lookup(self, model: str, session: str | None, client: str | None = None) -> ModelState | None:
        """The state that takes a request for ``model``: the model itself, or the version its split picks
        (sticky per session key, within one ``client``'s share of a judged canary) among versions that can
        serve now."""
        split = self.splits.get(model)
        if split is None:
            state = self.models.get(model)
            # versions are reached through splits, a disaggregated model's prefill replicas through it
            return None if state is None or state.version or state.prefill_for else state
        chosen = split.choose(session, lambda v: self.lookup_version(model, v).servable(), client)
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
            if state.prefill_for:  # a disaggregated model's prefill replicas: reached through it only
                continue
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
                if urls != [r.url for r in state.replicas]:
                    log.info("replicas of %s: %s", target.name, urls)
                state.set_replicas(urls)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session for control calls to replicas (probes, adapter loads); open while started."""
        assert self._session is not None, "the fleet is not started"
        return self._session

    async def start(self) -> None:
        self._sync_watches()
        self._session = aiohttp.ClientSession()
        self._signals_task = asyncio.get_running_loop().create_task(self.signals.run())
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
            for r in state.replicas:
                r.pool.close()

    # --- load and health signals, and sleep -----------------------------------------------------
    @property
    def feed_ok(self) -> bool:
        """The last round of the signal loop applied a fresh health feed (else it probed the engines)."""
        return self.signals.feed_ok

    def wake(self, state: ModelState) -> None:
        """Wake one sleeping replica of ``state`` for the requests waiting on it (one wake at a time)."""
        if self._session is not None:
            self.sleep.wake(state)


def splits_of(cfg: RuntimeConfig, previous: dict[str, Split]) -> dict[str, Split]:
    """The splits a config declares; a split whose configured weights did not change keeps its override
    (a rollback stays until the config changes)."""
    out: dict[str, Split] = {}
    judged = {check.model for check in cfg.health.canaries}
    for model, targets in cfg.versions().items():
        names = tuple(t.version_of.version for t in targets if t.version_of)
        weights = tuple(t.version_of.weight for t in targets if t.version_of)
        old = previous.get(model)
        if old is not None and (old.versions, old.configured) == (names, weights):
            out[model] = old
        else:
            out[model] = Split(model, names, weights)
        # a canary the health monitor judges: no one client may make up its traffic (``runtime.versions``)
        out[model].client_share = MAX_CLIENT_SHARE if model in judged else 1.0
    return out
