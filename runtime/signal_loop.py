"""The loop that keeps a front end's replicas' health and load fresh, one for the router and the endpoint
picker. Each round reads the health monitor's feed (``runtime.fleet_feed``) when one is configured and
applies it to the models' replicas; while the feed is away (not configured, unreachable, stale) it looks
at every replica's engine itself (``runtime.engine_probe``) and records the looks (``ModelView.probed``).
Then it waits a period and goes again; no error in a round ends it.

What only one front end does goes through ``Extra``: the router adds the versions' weights and the adapters
the feed lists, the adapters an engine lists after a look, a faster period while a replica is out, and its
sleep sweep, which is handed the round's looks so that one read of an engine's metrics page serves the
probe and the sleep mode's prompt-token counter. The endpoint picker adds nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aiohttp

from runtime.config import RouterSettings
from runtime.engine_probe import Look, look_timeout_s, probe
from runtime.fleet_feed import Feed, ReplicaSignals, apply_signals, fetch_feed
from runtime.model_view import ModelView
from runtime.replica import ReplicaState

M = TypeVar("M", bound=ModelView[Any])
R = TypeVar("R", bound=ReplicaState)

log = logging.getLogger("inferstack.fleet")


@dataclass(slots=True)
class Round:
    """What one round learned: the feed when it was fresh, else the look taken at each replica."""

    feed: Feed | None = None
    looks: dict[ReplicaState, Look] = field(default_factory=dict)
    waited: bool = False  # the feed was a long poll that a monitor honours: the next round may start at once


def feed_replicas(models: Mapping[str, M], feed: Feed) -> Iterator[tuple[M, Any, ReplicaSignals]]:
    """(model, replica, its entry) for each feed entry naming a replica the front end knows."""
    for entry in feed.replicas:
        model = models.get(entry.model)
        replica = model.by_url.get(entry.url) if model is not None else None
        if model is not None and replica is not None:
            yield model, replica, entry


def apply_feed(models: Mapping[str, ModelView[Any]], feed: Feed) -> None:
    """Copy each replica's entry (may it take traffic, its load) onto the front end's replica; a model whose
    admitted replicas the feed ejects past the panic threshold takes them all (``ModelView.judge_panic``)."""
    listed = list(feed_replicas(models, feed))
    for model in models.values():
        mine = [entry for m, _, entry in listed if m is model and entry.admitted]
        ejected = sum(not entry.routable for entry in mine)
        model.judge_panic(len(mine), ejected, feed.max_ejected_percent)
    for model, replica, entry in listed:
        if apply_signals(entry, replica, model.panic):
            model.health_changed(replica)


class Extra(Generic[M, R]):
    """What a front end adds to each round of the loop; this base adds nothing."""

    def interval_s(self, models: Mapping[str, M], settings: RouterSettings) -> float:
        """The wait after a round: the probe period."""
        return settings.probe_interval_ms / 1000

    def took_feed(self, models: Mapping[str, M], feed: Feed) -> None:
        """Called right after the feed's signals were applied, before the round awaits anything else."""

    async def look_further(
        self, session: aiohttp.ClientSession, model: M, replica: R, look: Look, timeout_s: float
    ) -> Look:
        """After a look at a replica, before it is recorded: anything more to ask the engine. Returns the
        look to record (a failure here may turn it into a failed one)."""
        return look

    async def round_done(self, models: Mapping[str, M], done: Round) -> None:
        """After the round's signals are in, before the wait."""


class SignalLoop(Generic[M]):
    """One front end's signal loop. ``models``, ``settings`` and ``session`` are read when used, so a
    reload that swaps the models or the settings is seen by the next step of a round."""

    def __init__(
        self,
        models: Callable[[], Mapping[str, M]],
        settings: Callable[[], RouterSettings],
        session: Callable[[], aiohttp.ClientSession],
        extra: Extra[M, Any] | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.models = models
        self.settings = settings
        self.session = session
        self.extra: Extra[M, Any] = extra if extra is not None else Extra()
        self.log = logger
        self.feed_ok = False  # the last round applied a fresh feed (else it probed the engines)
        self.rounds = 0  # rounds completed
        self.routing_changes: int | None = (
            None  # the last feed's count (None: that monitor cannot be waited on)
        )

    async def run(self) -> None:
        """Round after round until cancelled."""
        while True:
            waited = False
            try:
                waited = (await self.refresh()).waited
            except asyncio.CancelledError:
                raise
            except Exception:  # the signal loop must outlive any one bad answer
                self.log.exception("signal refresh failed")
            # after the refresh: it may have taken one out; a long poll waited already (for a readmission)
            await asyncio.sleep(0.0 if waited else self.interval_s())

    def interval_s(self) -> float:
        return self.extra.interval_s(self.models(), self.settings())

    def long_poll(self, settings: RouterSettings) -> tuple[int, float] | None:
        """While a replica is out and the monitor can be waited on: wait for its next routing change (up to
        ``probe_interval_ms``), so a readmission is routed to as soon as the monitor decides it."""
        if self.routing_changes is None:
            return None
        out = any(not r.healthy for model in self.models().values() for r in model.replicas)
        return (self.routing_changes, settings.probe_interval_ms / 1000) if out else None

    async def refresh(self) -> Round:
        """One round: the feed if it is fresh, else a look at every replica; then the front end's step."""
        done = Round()
        settings = self.settings()
        if settings.health_feed_url:
            feed_timeout_s = settings.probe_interval_ms / 1000
            wait = self.long_poll(settings)
            done.feed = await fetch_feed(self.session(), str(settings.health_feed_url), feed_timeout_s, wait)
            self.routing_changes = done.feed.routing_changes if done.feed is not None else None
            done.waited = wait is not None and self.routing_changes is not None
        self.feed_ok = done.feed is not None
        if done.feed is not None:
            models = self.models()
            apply_feed(models, done.feed)
            self.extra.took_feed(models, done.feed)
        else:
            for model in self.models().values():  # panic is the feed's: the front end's own looks decide now
                model.panic = False
            done.looks = await self.probe_all()
        await self.extra.round_done(self.models(), done)
        self.rounds += 1
        return done

    async def probe_all(self) -> dict[ReplicaState, Look]:
        """Look at every replica of every model at once; record each look on its model."""
        timeout_s = look_timeout_s(self.settings().probe_interval_ms)
        looks: dict[ReplicaState, Look] = {}
        jobs = [self._probe(m, r, timeout_s, looks) for m in self.models().values() for r in m.replicas]
        if jobs:
            await asyncio.gather(*jobs)
        return looks

    async def _probe(self, model: M, replica: Any, timeout_s: float, looks: dict[ReplicaState, Look]) -> None:
        session = self.session()
        look = await probe(session, replica.url, model.target.engine, timeout_s)
        look = await self.extra.look_further(session, model, replica, look, timeout_s)
        looks[replica] = look
        if model.probed(replica, look.answered, look.signals):
            model.health_changed(replica)
