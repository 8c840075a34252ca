"""The health monitor: discovery in, one probe loop per replica, feed and metrics out.

Orchestration only; decisions live in ``state`` (eject/readmit), ``window`` (percentiles) and
``tracker`` (signals). Each replica has its own loop, so a slow or hostile engine delays nobody
else, and every probe is bounded by timeouts and byte limits (``probe``). The loops do not fire together:
after its first probe (at once, so a new replica is judged at once) each loop moves to its own phase of the
interval, and at most ``MAX_PROBES_IN_FLIGHT`` probes hold a response at a time, so memory does not grow
with the fleet (a fleet of 1,024 found at start would otherwise parse 1,024 expositions at once, every round).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from runtime.config import HealthSettings, ModelTarget, RuntimeConfig
from runtime.engines import Signal
from runtime.health import state as st
from runtime.health.canary import Canaries, ReplicaView, Rollback
from runtime.health.feed import FleetFeed, VersionWeights
from runtime.health.kube import Actions, NoActions
from runtime.health.probe import ProbeSpec, probe
from runtime.health.tracker import Tracker, in_panic_now, summarize, wanted_for

log = logging.getLogger("inferstack.health")

WatchFn = Callable[[ModelTarget], AsyncIterator[list[str]]]
DISCOVERY_RETRY_S = 2.0
#: Probes awaiting or parsing a response at once. Far above what a spread fleet needs (a probe takes ~2 ms of
#: CPU: 1,024 replicas at 5 s keep ~1 in flight), so it binds only in bursts: a fleet found at start, or many
#: replicas hanging until their timeouts at once.
MAX_PROBES_IN_FLIGHT = 128
#: How long a departed replica's counters stay on ``/metrics`` (as the router keeps its request series): a
#: replica ejected and then gone (killed, remediated, scaled in) must still be scraped with its last counts, or
#: its ejection is lost to ``increase()`` and the ejection alert. Then they go, so months of pods cost nothing.
DEPARTED_KEEP_S = 600.0


@dataclass
class Counters:
    """Lifetime event counts per (model, replica) for ``/metrics``."""

    probes: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (model, url, result)
    ejections: Counter[tuple[str, str]] = field(default_factory=Counter)
    readmissions: Counter[tuple[str, str]] = field(default_factory=Counter)
    remediations: Counter[str] = field(default_factory=Counter)
    remediation_failures: Counter[str] = field(default_factory=Counter)


class Monitor:
    def __init__(
        self,
        config: RuntimeConfig,
        *,
        watch: WatchFn,
        actions: Actions | None = None,
        clock: Callable[[], float] = time.time,
        run_loops: bool = True,
    ) -> None:
        self.config = config
        self.settings: HealthSettings = config.health
        self._watch = watch
        self.actions: Actions = actions or NoActions()
        self._clock = clock
        self._run_loops = run_loops  # False: tests drive rounds with probe_all()
        self.trackers: dict[str, dict[str, Tracker]] = {m.name: {} for m in config.models}
        self._loops: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._discovery: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self._remediated: set[tuple[str, str, float]] = set()  # (model, url, episode): once per episode
        self._remediation: asyncio.Task[Any] | None = None  # the pod deletion under way (one at a time)
        self._remediated_at: float | None = (
            None  # when the last attempt started (one per remediate_interval_s)
        )
        self.panic: set[str] = set()  # models in panic now (``tracker.in_panic_now``)
        self._recovery_s: dict[tuple[str, str], float] = {}  # probe interval while ejected
        self._readmitted_at: dict[tuple[str, str], float] = {}
        self.routing_changes = 0  # replicas turned routable or not (the feed's ``routing_changes``)
        self._routing_changed = asyncio.Event()  # set, and replaced, at each such change
        self.counters = Counters()
        self._departed: dict[
            tuple[str, str], float
        ] = {}  # (model, url) -> when it left (counters still shown)
        self.canaries = Canaries(config, clock())
        self.discovered: set[str] = set()  # models whose discovery has reported at least once
        self._session: aiohttp.ClientSession | None = None
        self._in_flight = asyncio.Semaphore(MAX_PROBES_IN_FLIGHT)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, connect=self.settings.timeout_ms / 1000)
        # Own connection limits: one slow replica may hold at most a few sockets.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=4, ttl_dns_cache=30)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)
        for target in self.config.models:
            self._discovery.append(
                asyncio.create_task(self._discover(target), name=f"discover:{target.name}")
            )

    async def stop(self) -> None:
        tasks = [*self._discovery, *self._loops.values(), *self._side_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops.clear()
        if self._session is not None:
            await self._session.close()
        await self.actions.close()

    @property
    def ready(self) -> bool:
        return len(self.discovered) == len(self.config.models)

    # --- discovery ---------------------------------------------------------------------------

    async def _discover(self, target: ModelTarget) -> None:
        while True:
            try:
                async for urls in self._watch(target):
                    self._set_replicas(target, urls)
                    self.discovered.add(target.name)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # discovery trouble keeps the last known fleet
                log.warning("discovery for %s failed: %s; retrying", target.name, err)
            await asyncio.sleep(DISCOVERY_RETRY_S)

    def _set_replicas(self, target: ModelTarget, urls: list[str]) -> None:
        current = self.trackers[target.name]
        wanted = {u.rstrip("/") for u in urls}
        for url in sorted(set(current) - wanted):
            task = self._loops.pop((target.name, url), None)
            if task is not None:
                task.cancel()
            del current[url]
            self._forget(target.name, url)
            log.info("replica left", extra={"model": target.name, "backend": url})
        for url in sorted(wanted - set(current)):
            tracker = Tracker.new(url, target.name, target.engine, self.settings.window_s, self._clock())
            current[url] = tracker
            if self._run_loops:
                self._loops[(target.name, url)] = asyncio.create_task(
                    self._probe_loop(target, tracker), name=f"probe:{target.name}:{url}"
                )
            self._departed.pop((target.name, url), None)  # back before its counters went: they go on
            log.info("replica joined", extra={"model": target.name, "backend": url})
        self._note_panic(target.name)
        self.sweep_departed()

    def _forget(self, model: str, url: str) -> None:
        """Drop what is kept about a replica that left: with pods coming and going for months, state keyed by
        replica must not outlive it. Its counters stay on ``/metrics`` for ``DEPARTED_KEEP_S``
        (``sweep_departed``)."""
        key = (model, url)
        self._recovery_s.pop(key, None)
        self._readmitted_at.pop(key, None)
        self._remediated = {r for r in self._remediated if r[:2] != key}
        self.canaries.forget(model, url)
        self._departed[key] = self._clock()

    def sweep_departed(self) -> None:
        """Drop the counters of replicas that left more than ``DEPARTED_KEEP_S`` ago (called on discovery
        changes and on every scrape)."""
        now = self._clock()
        gone = {key for key, at in self._departed.items() if now - at >= DEPARTED_KEEP_S}
        if not gone:
            return
        for key in gone:
            del self._departed[key]
        c = self.counters
        for probe_key in [k for k in c.probes if k[:2] in gone]:
            del c.probes[probe_key]
        for key in gone:
            c.ejections.pop(key, None)
            c.readmissions.pop(key, None)

    # --- probing -----------------------------------------------------------------------------

    def _spec(self, target: ModelTarget, url: str) -> ProbeSpec:
        s = self.settings
        return ProbeSpec(
            url=url,
            model=target.served_name,
            engine=target.engine,
            task=target.task,
            timeout_s=s.timeout_ms / 1000,
            synthetic_timeout_s=s.synthetic_timeout_ms / 1000,
            max_metrics_bytes=s.max_metrics_bytes,
            wanted=wanted_for(target.engine),
            adapters=bool(target.adapters),
        )

    async def _probe_loop(self, target: ModelTarget, tracker: Tracker) -> None:
        spec = self._spec(target, tracker.url)
        loop = asyncio.get_running_loop()
        phase: float | None = random.random()  # this loop's place in the interval: a shorter first gap
        while True:
            started = loop.time()
            try:
                await self.probe_once(target, tracker, spec)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not end this replica's monitoring
                log.exception("probe loop error for %s", tracker.url)
            interval = self.probe_interval_s(target, tracker) * (1.0 if phase is None else phase)
            phase = None
            await asyncio.sleep(max(0.0, interval - (loop.time() - started)))

    def probe_interval_s(self, target: ModelTarget, tracker: Tracker) -> float:
        """The normal interval; the (shorter) recovery interval while the replica is ejected."""
        s = self.settings
        if tracker.health.state is st.State.EJECTED:
            return self._recovery_s.get((target.name, tracker.url), s.recovery_interval_ms / 1000)
        return s.interval_ms / 1000

    async def probe_once(self, target: ModelTarget, tracker: Tracker, spec: ProbeSpec | None = None) -> None:
        """One probe round and its consequences (state, counters, events, remediation)."""
        assert self._session is not None, "start() first"
        spec = spec or self._spec(target, tracker.url)
        every = self.settings.synthetic_probe_every
        synthetic = every > 0 and tracker.probes % every == 0
        async with self._in_flight:
            result = await probe(self._session, spec, synthetic=synthetic)
        now = self._clock()
        if spec.adapters:
            tracker.adapters = result.adapters
        if result.metrics is not None:
            tracker.observe_metrics(result.metrics, now)
        else:
            tracker.metrics_failed()
        s = self.settings
        routable = tracker.health.routable
        transition = tracker.apply(
            result.outcome, now, eject_after=s.eject_after_failures, readmit_after=s.readmit_after_successes
        )
        if tracker.health.routable != routable:
            self._routing_change()
        key = (target.name, tracker.url)
        code = result.outcome.hard or result.outcome.soft
        self.counters.probes[(*key, code.value if code else "ok")] += 1
        if transition is not None:
            self._on_transition(target, tracker, transition)
            self._note_panic(target.name)
        self._maybe_remediate(target, tracker, now)
        if target.version_of is not None:
            self.canaries.observe(target.name, tracker.url, result.outcome.ok, tracker.health.routable, now)
            self.judge_canaries(now)

    def judge_canaries(self, now: float, *, force: bool = False) -> list[Rollback]:
        """Compare canaries with their stable versions when an interval ends; apply and announce rollbacks."""
        replicas = {
            name: [
                ReplicaView(
                    t.health.routable,
                    status.metrics.ttft_p95_s,
                    status.metrics.inter_token_p95_s,
                    t.window_count(Signal.TTFT),
                    t.window_count(Signal.INTER_TOKEN),
                )
                for t in self.trackers.get(name, {}).values()
                for status in (t.status(now),)
            ]
            for name in self.canaries.of_target
        }
        rollbacks = self.canaries.evaluate(now, replicas, force=force)
        for rb in rollbacks:
            urls = sorted(self.trackers.get(rb.canary.name, {}))
            log.warning(
                "canary rolled back: model %s, version %s (%s): %s",
                rb.model,
                rb.canary.version_of.version if rb.canary.version_of else "",
                rb.decision.metric,
                rb.decision.reason,
                extra={"model": rb.model, "metric": rb.decision.metric},
            )
            self._spawn(self.actions.on_rollback(rb.canary, urls, rb.decision.metric, rb.decision.reason))
        return rollbacks

    async def probe_all(self) -> None:
        """One round for every known replica, concurrently; one replica's trouble is its own (as in the loops)."""
        targets = {m.name: m for m in self.config.models}
        trackers = self.all_trackers()
        results = await asyncio.gather(
            *(self.probe_once(targets[t.model], t) for t in trackers), return_exceptions=True
        )
        for tracker, result in zip(trackers, results, strict=True):
            if isinstance(result, Exception):
                log.error("probe error for %s", tracker.url, exc_info=result)
            elif isinstance(result, BaseException):
                raise result

    def _on_transition(self, target: ModelTarget, tracker: Tracker, t: st.Transition) -> None:
        key = (target.name, tracker.url)
        s = self.settings
        if st.is_ejection(t):
            if t.before is not st.State.EJECTED:
                self.counters.ejections[key] += 1
                readmitted = self._readmitted_at.get(key)
                self._recovery_s[key] = st.recovery_interval_s(
                    self._recovery_s.get(key, s.recovery_interval_ms / 1000),
                    s.recovery_interval_ms / 1000,
                    s.interval_ms / 1000,
                    None if readmitted is None else self._clock() - readmitted,
                    s.flap_window_s,
                )
            log.warning(
                "replica ejected: %s %s (%s) %s",
                target.name,
                tracker.url,
                t.reason.value if t.reason else "",
                t.detail,
            )
        elif st.is_readmission(t):
            self.counters.readmissions[key] += 1
            self._readmitted_at[key] = self._clock()
            log.info("replica readmitted: %s %s", target.name, tracker.url)
        elif t.first_admission:
            log.info("replica admitted: %s %s", target.name, tracker.url)
            return
        else:
            log.info("replica %s %s: %s -> %s (%s)", target.name, tracker.url, t.before, t.after, t.detail)
            return
        self._spawn(self.actions.on_transition(target, tracker.url, t))

    def in_panic(self, model: str) -> bool:
        """More than ``max_ejected_percent`` of the model's admitted replicas are ejected (the front ends then
        route to all of them: ``runtime.model_view.in_panic``)."""
        return in_panic_now(list(self.trackers.get(model, {}).values()), self.settings.max_ejected_percent)

    def _note_panic(self, model: str) -> None:
        """Say when a model enters or leaves panic (a log line here, ``inferstack_health_model_panic``)."""
        panic = self.in_panic(model)
        if panic == (model in self.panic):
            return
        if panic:
            self.panic.add(model)
            log.warning(
                "model %s is in panic: more than %g%% of its replicas ejected; the front ends route to all of"
                " them and no pod is remediated (a fault between this monitor and the engines looks the same)",
                model,
                self.settings.max_ejected_percent,
                extra={"model": model},
            )
        else:
            self.panic.discard(model)
            log.warning("model %s is out of panic", model, extra={"model": model})

    def _maybe_remediate(self, target: ModelTarget, tracker: Tracker, now: float) -> None:
        """Delete the pod of a replica wedged past ``remediate_after_s``: once per ejection episode, one pod at a
        time fleet-wide, one per ``remediate_interval_s``, and never in a model in panic (if the monitor's own
        network fails, every replica looks wedged: deleting them would take down what still serves). An attempt
        that fails or outlasts ``remediate_timeout_s`` leaves the episode open: tried again an interval later."""
        s = self.settings
        if s.remediate_after_s is None:
            return
        wedged = st.wedged_for_s(tracker.health, now)
        episode = tracker.health.ejected_since_s
        if wedged < s.remediate_after_s or episode is None:
            return
        key = (target.name, tracker.url, episode)
        if key in self._remediated:
            return  # once per ejection episode
        if self.in_panic(target.name):
            return
        if self._remediation is not None and not self._remediation.done():
            return  # one at a time; this replica is looked at again next round
        if self._remediated_at is not None and now - self._remediated_at < s.remediate_interval_s:
            return
        self._remediated_at = now
        self._remediation = self._spawn(self._remediate(target, tracker.url, wedged, key))

    async def _remediate(
        self, target: ModelTarget, url: str, wedged: float, key: tuple[str, str, float]
    ) -> None:
        """One remediation attempt, bounded by ``remediate_timeout_s``; only a pod deleted closes the episode."""
        timeout_s = self.settings.remediate_timeout_s
        why = "no pod was deleted (none found behind it, or the API refused: logged above)"
        try:
            async with asyncio.timeout(timeout_s):
                deleted = await self.actions.remediate(target, url, wedged)
        except TimeoutError:
            deleted, why = False, f"the Kubernetes API did not answer within {timeout_s:g}s"
        except Exception as err:  # an Actions bug must cost one attempt, not remediation for good
            deleted, why = False, f"{type(err).__name__}: {err}"
        if deleted:
            self._remediated.add(key)
            self.counters.remediations[target.name] += 1
            return
        self.counters.remediation_failures[target.name] += 1
        log.warning(
            "remediation of %s %s failed: %s; tried again in %ds if still wedged",
            target.name,
            url,
            why,
            self.settings.remediate_interval_s,
            extra={"model": target.name, "backend": url},
        )

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    # --- outputs -----------------------------------------------------------------------------

    def all_trackers(self) -> list[Tracker]:
        return [t for model in self.trackers.values() for t in model.values()]

    def _routing_change(self) -> None:
        """A replica turned routable or not: front ends waiting on the feed are answered now."""
        self.routing_changes += 1
        self._routing_changed.set()
        self._routing_changed = asyncio.Event()

    async def routing_change_after(self, seen: int, timeout_s: float) -> None:
        """Returns once ``routing_changes`` differs from ``seen``, or after ``timeout_s``."""
        if self.routing_changes != seen:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._routing_changed.wait(), timeout_s)

    def feed(self) -> FleetFeed:
        now = self._clock()
        interval_s = self.settings.interval_ms / 1000
        return FleetFeed(
            generated_at=now,
            interval_ms=self.settings.interval_ms,
            stale_after_s=max(3 * interval_s, interval_s + self.settings.timeout_ms / 1000),
            max_ejected_percent=self.settings.max_ejected_percent,
            backends=[t.status(now) for t in sorted(self.all_trackers(), key=lambda t: (t.model, t.url))],
            models=[
                summarize(name, list(ts.values()), self.settings.max_ejected_percent)
                for name, ts in self.trackers.items()
            ],
            versions=[VersionWeights.model_validate(v) for v in self.canaries.feed()],
            routing_changes=self.routing_changes,
        )

    async def wait_idle(self) -> None:
        """Let pending side tasks (events, remediation) finish; tests and shutdown use it."""
        with contextlib.suppress(Exception):
            await asyncio.gather(*list(self._side_tasks), return_exceptions=True)
