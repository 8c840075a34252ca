"""`make local`'s autoscaler: plays KEDA's part for the models that scale (``min_replicas`` below
``max_replicas``, e.g. ``min_replicas: 0``), and keeps the replica lists the router and Prometheus read.

Every second it reads the router's ``/metrics`` (requests waiting per model, refusals for want of a replica,
requests in flight) and asks the cluster's own decision (``components.core.scaling.replicas_wanted``, on the
thresholds the ScaledObject renders) how many replicas each model should run; it starts engines for demand and
stops them after the idle period. Membership is published like Kubernetes publishes it:

- ``endpoints.json`` (the runtime's file discovery, as an EndpointSlice): replicas once they answer
  ``/health``, so the router hands them the requests it holds; a stopping or crashed replica leaves at once.
- ``monitor/engines.json`` (Prometheus file_sd): replicas that exist, started or crashed, until stopped.

Everything is said in the supervisor's log: what was waiting, what started, how long it took, what stopped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from components.core.scaling import Thresholds, replicas_wanted
from components.local import monitor
from components.local.engine_process import EngineProcess
from components.local.plan import HOST, EngineLaunch, LocalPlan
from components.render import scaling
from components.spec import PlatformSpec

TICK_S = 1.0
ENGINE_STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class RouterReport:
    """What the router's /metrics says about one model."""

    waiting: float = 0.0
    refused_total: float = 0.0
    inflight: float = 0.0


def router_reports(text: str) -> dict[str, RouterReport]:
    """Per model: requests waiting in the router, refusals for want of a replica so far, requests in flight."""
    # the runtime's extra (what `inferstack local` runs the services with); `inferstack plan` needs none of it
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    waiting: dict[str, float] = {}
    refused: dict[str, float] = {}
    inflight: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model", "")
            if sample.name == "inferstack_router_queue_depth":
                waiting[model] = waiting.get(model, 0.0) + sample.value
            elif (
                sample.name == "inferstack_router_rejections_total"
                and sample.labels.get("reason") == "no_backend"
            ):
                refused[model] = refused.get(model, 0.0) + sample.value
            elif sample.name == "inferstack_router_backend_inflight":
                inflight[model] = inflight.get(model, 0.0) + sample.value
    return {
        m: RouterReport(waiting.get(m, 0.0), refused.get(m, 0.0), inflight.get(m, 0.0))
        for m in set(waiting) | set(refused) | set(inflight)
        if m
    }


@dataclass
class Replica:
    """One planned engine replica: not started (``engine`` None), starting, ready, or crashed."""

    launch: EngineLaunch
    engine: EngineProcess | None = None
    ready: bool = False
    started_at: float = 0.0
    crashed: bool = False


@dataclass
class ModelScale:
    """One scaling model: its thresholds, replicas in launch order, and what the last tick saw."""

    thresholds: Thresholds
    replicas: list[Replica]
    last_busy: float
    refused_total: float | None = None
    refused_at: float = 0.0

    @property
    def present(self) -> list[Replica]:
        return [r for r in self.replicas if r.engine is not None]


@dataclass
class Autoscaler:
    """The scaling loop of one local stack; ``tick`` is called from the supervisor's watch loop."""

    plan: LocalPlan
    spec: PlatformSpec
    make_engine: Callable[[EngineLaunch], EngineProcess]
    healthy: Callable[[str], bool]
    say: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    models: dict[str, ModelScale] = field(default_factory=dict)
    fixed: list[Replica] = field(default_factory=list)
    stopping: list[threading.Thread] = field(default_factory=list)
    _published: tuple[str, str] = ("", "")
    _next_tick: float = 0.0

    def __post_init__(self) -> None:
        now = self.clock()
        for launch in self.plan.engines:
            if not scaling.scales(
                launch.spec
            ):  # its serving unit: the model, or one role of a disaggregated one
                continue
            decided = self.plan.units[launch.model].scaling  # the thresholds the cluster's scaler renders
            entry = self.models.setdefault(launch.model, ModelScale(decided, [], last_busy=now))
            entry.replicas.append(Replica(launch))

    # -- membership --------------------------------------------------------------------------------
    def adopt(self, launch: EngineLaunch, engine: EngineProcess) -> None:
        """An engine the supervisor started (and waited for) at start-up: ready."""
        entry = self.models.get(launch.model)
        replica = next((r for r in entry.replicas if r.launch == launch), None) if entry else None
        if replica is None:
            replica = Replica(launch)
            self.fixed.append(replica)
        replica.engine, replica.ready, replica.started_at = engine, True, self.clock()

    def replicas(self) -> list[Replica]:
        return self.fixed + [r for m in self.models.values() for r in m.replicas]

    def started(self) -> list[tuple[EngineLaunch, EngineProcess]]:
        """Engines this autoscaler started and has not stopped (for the state file and the final stop)."""
        return [(r.launch, r.engine) for m in self.models.values() for r in m.present if r.engine is not None]

    def _group(self, replica: Replica) -> tuple[str, dict[str, str]]:
        launch = replica.launch
        return f"{HOST}:{launch.port}", monitor.engine_labels(self.spec, launch.spec, launch.name)

    def publish(self) -> None:
        """Rewrite endpoints.json (ready replicas) and the Prometheus engine targets (existing ones) on change."""
        ready = [self._group(r) for r in self.replicas() if r.engine is not None and r.ready]
        exist = [self._group(r) for r in self.replicas() if r.engine is not None]
        docs = (
            json.dumps(monitor.target_groups(ready), indent=1),
            json.dumps(monitor.target_groups(exist), indent=1),
        )
        if docs == self._published:
            return
        for path, doc in zip((self.plan.endpoints_path, self.plan.engine_targets_path), docs, strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(doc + "\n")
            tmp.replace(path)  # readers see the old list or the new one, never half of one
        self._published = docs

    # -- the loop ----------------------------------------------------------------------------------
    def tick(self, router_metrics: Callable[[], str | None]) -> bool:
        """At most once per ``TICK_S``: notice engines that became ready or died, then scale on demand.
        True when which engines exist changed (the supervisor rewrites its state file)."""
        now = self.clock()
        if now < self._next_tick:
            return False
        self._next_tick = now + TICK_S
        before = [(r.launch.name, r.engine) for r in self.replicas()]
        self._watch_engines(now)
        if self.models:
            text = router_metrics()
            if text is not None:
                with contextlib.suppress(ValueError):
                    reports = router_reports(text)
                    for name, entry in self.models.items():
                        self._scale(name, entry, reports.get(name, RouterReport()), now)
        self.publish()
        return before != [(r.launch.name, r.engine) for r in self.replicas()]

    def _watch_engines(self, now: float) -> None:
        for replica in self.replicas():
            engine = replica.engine
            if engine is None or replica.crashed:
                continue
            if not engine.running():
                self.say(
                    f"warning: engine {replica.launch.name} exited"
                    f"{'' if replica.ready else ' before it was ready'}; log {engine.log_file}"
                )
                replica.crashed, replica.ready = True, False
            elif not replica.ready and self.healthy(engine.base_url):
                replica.ready = True
                self.say(
                    f"engine {replica.launch.name} ready after {now - replica.started_at:.0f}s: "
                    f"it takes {replica.launch.model} requests (and those the router holds)"
                )

    def _scale(self, name: str, entry: ModelScale, report: RouterReport, now: float) -> None:
        refused_rate = 0.0
        if entry.refused_total is not None and report.refused_total > entry.refused_total:
            refused_rate = (report.refused_total - entry.refused_total) / max(1e-3, now - entry.refused_at)
        entry.refused_total, entry.refused_at = report.refused_total, now
        demand = report.waiting + refused_rate
        if demand > 0 or report.inflight > 0:
            entry.last_busy = now
        present = entry.present
        idle_s = now - entry.last_busy
        wanted = replicas_wanted(entry.thresholds, demand, len(present), idle_s)
        why = f"{report.waiting:g} requests waiting in the router, {refused_rate:.1f}/s refused"
        if demand > 0:
            for replica in present:
                if replica.crashed:
                    self.say(f"{name}: {why}; starting the exited engine {replica.launch.name} again")
                    self._start(replica, now)
        if wanted > len(present):
            idle = [r for r in entry.replicas if r.engine is None][: wanted - len(present)]
            for replica in idle:
                self.say(
                    f"{name}: {why}: scaling {len(present)} -> {wanted}, starting engine {replica.launch.name}"
                )
                self._start(replica, now)
        elif wanted < len(present):
            for replica in list(reversed(present))[: len(present) - wanted]:
                self.say(
                    f"{name}: idle for {math.floor(idle_s)}s: scaling {len(present)} -> {wanted}, "
                    f"stopping engine {replica.launch.name}"
                )
                self._stop(replica)

    def _start(self, replica: Replica, now: float) -> None:
        if replica.engine is not None:  # an engine that exited: reaped, and its private TMPDIR removed, first
            replica.engine.stop(0)
        replica.engine = self.make_engine(replica.launch)
        replica.engine.start()
        replica.ready, replica.crashed, replica.started_at = False, False, now

    def _stop(self, replica: Replica) -> None:
        engine = replica.engine
        replica.engine, replica.ready, replica.crashed = None, False, False
        if engine is None:
            return
        self.publish()  # out of the router's list before the engine goes (as a terminating pod leaves its slice)
        name = replica.launch.name

        def stop() -> None:
            engine.stop(ENGINE_STOP_GRACE_S)
            self.say(f"engine {name} stopped")

        thread = threading.Thread(target=stop, name=f"stop-{name}", daemon=True)
        thread.start()
        self.stopping.append(thread)

    def stop_all(self, grace_s: float) -> None:
        """Stop every engine this autoscaler started; wait for the ones already stopping."""
        threads = [
            threading.Thread(target=engine.stop, args=(grace_s,), daemon=True) for _, engine in self.started()
        ]
        for thread in threads:
            thread.start()
        for thread in threads + self.stopping:
            thread.join()
