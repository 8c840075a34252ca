"""One model as a front end routes it: its target and route, its strategy (built by ``runtime.scheduling``),
its replicas as discovery lists them, and the request fields its scorers read.

The router's ``ModelState`` and the endpoint picker's ``ModelPool`` extend this, so the two front ends
build the strategy, keep replicas across a relist, fill the scheduling ``Context`` and word their refusals
one way; what they add is their own (the router's wait line, batcher, sleep and KV view; the picker's
``ip:port`` names). No I/O here.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from runtime.breaker import Breaker
from runtime.config import ModelRoute, ModelTarget, RouterSettings
from runtime.engines import Signal
from runtime.openai_request import prompt_text
from runtime.replica import ReplicaState
from runtime.scheduling import Context, Need, Strategy, build
from runtime.scheduling.scorers.latency import LATENCY_EWMA_ALPHA

R = TypeVar("R", bound=ReplicaState)

log = logging.getLogger("inferstack.fleet")

#: Failed looks in a row before a front end probing replicas itself takes one out (one can be a blip).
PROBE_FAILURES_TO_UNHEALTHY = 2

#: ``(model, url)`` of a replica that left the model's list (to drop its metric series).
DepartedHook = Callable[[str, str], None]


def in_panic(replicas: int, ejected: int, max_ejected_percent: float) -> bool:
    """Are more than ``max_ejected_percent`` of a model's ``replicas`` ejected? Then the ejections are not to be
    believed (Envoy's panic threshold): a fault between the health monitor and the engines, or in the
    monitor, looks exactly like every engine failing, and honouring it would empty the model. In panic the
    front ends route to every replica (their circuits and retries still steer around the ones that fail)
    and the monitor deletes no pod. The health monitor and both front ends decide it here.

    As in Envoy (0 % healthy is below any panic threshold), a model's only replica ejected is a panic too: it
    keeps its traffic, there is nowhere else for it to go. Panic decides routing only: an ejected replica
    stays ejected in what the front ends report (``ReplicaState.ejected``), so dashboards and alerts see it."""
    return ejected > 0 and ejected * 100 > replicas * max_ejected_percent


class ModelView(ABC, Generic[R]):
    """Everything a front end needs to pick a replica of one model."""

    def __init__(self, target: ModelTarget, route: ModelRoute, settings: RouterSettings) -> None:
        self.target = target
        self.route = route
        self.name = target.name
        self.settings = settings
        self.strategy: Strategy = build(route.strategy)
        # the request fields the strategy's scorers declared they read: parse only those
        self.needs_prompt = Need.PROMPT in self.strategy.needs
        self.needs_session = Need.SESSION in self.strategy.needs
        self.needs_adapter = Need.ADAPTER in self.strategy.needs
        self.session_header = route.strategy.session_header.lower()
        self.ewma_alpha = LATENCY_EWMA_ALPHA.read(route.strategy)
        self.weights = {str(b.url).rstrip("/"): b.weight for b in target.static_backends}
        self.replicas: list[R] = []
        self.by_url: dict[str, R] = {}
        self.probe_failures: dict[str, int] = {}
        self.on_departed: DepartedHook | None = None
        self.panic = False  # the health feed ejects too many replicas to be believed (``in_panic``)

    @abstractmethod
    def new_replica(self, url: str, cap: int) -> R:
        """A replica record for a URL discovery reported (fresh counters, a closed circuit)."""

    def new_breaker(self) -> Breaker:
        """A closed circuit for a new replica record, with the router settings' thresholds."""
        return Breaker(self.settings.breaker_failures, self.settings.breaker_open_ms / 1000)

    def retire(self, replica: R) -> None:
        """A replica record is dropped (it left, or was replaced): release what it holds."""

    def replicas_changed(self) -> None:
        """The replica list was replaced (after ``set_replicas``)."""

    def health_changed(self, replica: R) -> None:
        """The health feed or a probe changed whether ``replica`` may take traffic (after ``probed`` or
        ``runtime.fleet_feed.apply_signals`` said so)."""

    def set_replicas(self, urls: list[str], previous: Mapping[str, R] | None = None) -> None:
        """The replicas discovery reports now. Survivors (here or in ``previous``, the state a reload
        replaced) keep their counters, latency and circuit; a replica whose concurrency cap changed
        starts afresh."""
        old = {**(previous or {}), **self.by_url}
        cap = self.target.max_concurrency_per_backend
        listed = set(urls)
        fresh: list[R] = []
        for url in sorted(listed):
            r = old.get(url)
            if r is None or r.cap != cap:
                if r is not None:
                    self.retire(r)
                r = self.new_replica(url, cap)
            fresh.append(r)
        for url, r in old.items():
            if url not in listed:
                self.retire(r)
                self.probe_failures.pop(url, None)
                if self.on_departed is not None:
                    self.on_departed(self.name, url)
        self.replicas = fresh
        self.by_url = {r.url: r for r in fresh}
        self.replicas_changed()

    def healthy_count(self) -> int:
        return sum(1 for r in self.replicas if r.healthy)

    def judge_panic(self, replicas: int, ejected: int, max_ejected_percent: float) -> bool:
        """Record whether the feed's ejections put the model in panic (``in_panic``); says so when that
        changes. Returns the verdict: in panic, every replica the feed lists as admitted takes traffic."""
        panic = in_panic(replicas, ejected, max_ejected_percent)
        if panic != self.panic:
            if panic:
                log.warning(
                    "model %s is in panic: the health feed ejects %d of %d replicas (more than %g%%); "
                    "routing to all of them",
                    self.name,
                    ejected,
                    replicas,
                    max_ejected_percent,
                )
            else:
                log.warning("model %s is out of panic: the health feed's ejections apply again", self.name)
        self.panic = panic
        return panic

    def probed(self, replica: R, answered: bool, signals: Mapping[Signal, float]) -> bool:
        """Record the front end's own look at a replica (while the health feed is away). True when that
        changed whether it may take traffic."""
        fails = 0 if answered else self.probe_failures.get(replica.url, 0) + 1
        self.probe_failures[replica.url] = fails
        was = replica.healthy
        replica.update_signals(
            healthy=fails < PROBE_FAILURES_TO_UNHEALTHY,
            queued=signals.get(Signal.QUEUED),
            running=signals.get(Signal.RUNNING),
            kv_usage=signals.get(Signal.KV_USAGE),
        )
        if replica.healthy == was:
            return False
        log.warning(
            "replica %s of %s is now %s",
            replica.url,
            self.name,
            "healthy" if replica.healthy else "unhealthy",
        )
        return True

    def warm_for(self, adapter: str) -> frozenset[str]:
        """Replicas holding ``adapter`` loaded (a front end that tracks adapters says which)."""
        return frozenset()

    def context(
        self,
        now: float,
        payload: dict[str, Any],
        header: Callable[[str], str | None],
        adapter: str | None = None,
        kind: str = "",
    ) -> Context:
        """The scheduling context of one request, filled with only what the strategy's scorers read.
        ``header`` looks a request header up by its lower-case name; ``kind`` is the API called (chat,
        completions, embeddings)."""
        ctx = Context(model=self.name, now=now, adapter=adapter)
        ctx.notes["kind"] = kind
        if adapter is not None and self.needs_adapter:
            ctx.warm = self.warm_for(adapter)
        if self.needs_prompt:
            ctx.prompt = prompt_text(payload)
        if self.needs_session:
            ctx.session = header(self.session_header)
        self.add_context(ctx, payload)
        return ctx

    def add_context(self, ctx: Context, payload: dict[str, Any]) -> None:
        """What a front end adds to the context of its own (the router: the engines' cached blocks)."""

    def busy_message(self) -> str:
        return f"all replicas of {self.name!r} are at capacity; try again shortly"

    def no_replica_message(self, why: str = "") -> str:
        return f"no healthy replica of {self.name!r} right now{why}"
