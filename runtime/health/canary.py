"""The canary controller: per versioned model, tally each version's probes over an evaluation interval,
ask :func:`runtime.versions.judge` for a verdict, and on a breach put all weight back on the stable
version at once. The router reads the weights from the feed (``versions``), so a rollback reaches
traffic within one feed poll.

A rollback lasts until the config changes (a spec change re-renders it: promotion, a fixed canary, a
removed version); the monitor never moves weight towards a canary by itself, since promotion is a
spec change the plan shows. The verdict says why, and the monitor says it three ways: a log line, the
``inferstack_health_canary_rollbacks`` counter (by metric) and a Kubernetes Event.

Error rate here is what the monitor sees: failed probes (``/health``, and the one-token check when
``synthetic_probe_every`` is on) over probes of the version's replicas in the interval. Latency is the
replicas' own TTFT / inter-token p95 over the monitor's window, worst replica of each version, judged only
on ``min_requests`` requests (``runtime.versions.judge``).

A restart is not a failure by itself: a replica's failed probes are held while it is out, and dropped if it
comes back within ``restart_grace_s`` after having been taken out of rotation (one restart per replica per
``restart_grace_s`` or interval, whichever is longer: a crash loop counts). They count once the outage outlasts the grace, or when failures did not take the
replica out (errors, not a restart).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from runtime.config import CanaryCheck, ModelTarget, RuntimeConfig
from runtime.versions import Decision, Rule, Verdict, Window, judge, rolled_back


@dataclass
class Tally:
    probes: int = 0
    failures: int = 0


@dataclass
class Outage:
    """A canary replica's failed probes in a row, held until they prove more than a restart."""

    since: float
    pending: int = 0
    out: bool = False  # it was taken out of rotation meanwhile (a restart is)


@dataclass
class ReplicaView:
    """What the controller needs of one replica (the monitor builds it from a tracker)."""

    routable: bool
    ttft_p95_s: float | None
    inter_token_p95_s: float | None
    ttft_samples: float = 0  # requests behind the p95s
    inter_token_samples: float = 0


@dataclass
class ModelRollout:
    """One versioned model: its versions (stable first), current weights, tallies and last verdict."""

    model: str
    check: CanaryCheck
    targets: list[ModelTarget]
    weights: dict[str, float]
    window_started: float
    tallies: dict[str, Tally] = field(default_factory=dict)
    rolled_back: bool = False
    metric: str = ""
    reason: str = ""
    decided_at: float | None = None
    last: dict[str, Decision] = field(default_factory=dict)  # version -> the latest verdict
    outages: dict[tuple[str, str], Outage] = field(default_factory=dict)  # (target, url) -> held failures
    forgiven: dict[tuple[str, str], float] = field(
        default_factory=dict
    )  # replica -> when a restart was let go

    @property
    def stable(self) -> ModelTarget:
        return self.targets[0]

    def canaries(self) -> list[ModelTarget]:
        return [t for t in self.targets[1:] if t.version_of and self.weights[t.version_of.version] > 0]


def rule_of(check: CanaryCheck) -> Rule:
    return Rule(
        max_error_rate=check.max_error_rate,
        max_ttft_ratio=check.max_ttft_ratio,
        max_inter_token_ratio=check.max_inter_token_ratio,
        ttft_slo_s=check.ttft_slo_s,
        inter_token_slo_s=check.inter_token_slo_s,
        min_samples=check.min_samples,
        min_requests=check.min_requests,
    )


def window_of(tally: Tally, replicas: Iterable[ReplicaView], held_failures: int = 0) -> Window:
    views = list(replicas)
    ttfts = [r.ttft_p95_s for r in views if r.ttft_p95_s is not None]
    itls = [r.inter_token_p95_s for r in views if r.inter_token_p95_s is not None]
    return Window(
        probes=tally.probes,
        failures=tally.failures,
        ttft_p95_s=max(ttfts) if ttfts else None,
        inter_token_p95_s=max(itls) if itls else None,
        routable_replicas=sum(r.routable for r in views),
        ttft_samples=sum(r.ttft_samples for r in views),
        inter_token_samples=sum(r.inter_token_samples for r in views),
        held_failures=held_failures,
    )


@dataclass(frozen=True)
class Rollback:
    """A rollback just decided: what the monitor tells people and the cluster."""

    model: str
    canary: ModelTarget
    decision: Decision


class Canaries:
    """Every versioned model that has a canary check; fed by the monitor, read by the feed and metrics."""

    def __init__(self, config: RuntimeConfig, now: float) -> None:
        checks = {c.model: c for c in config.health.canaries}
        self.models: dict[str, ModelRollout] = {}
        self.of_target: dict[str, str] = {}  # target name -> model
        self.rollbacks: Counter[tuple[str, str, str]] = Counter()  # (model, version, metric)
        for model, targets in config.versions().items():
            check = checks.get(model)
            if check is None:
                continue
            weights = {t.version_of.version: t.version_of.weight for t in targets if t.version_of}
            self.models[model] = ModelRollout(model, check, targets, weights, now)
            for t in targets:
                self.of_target[t.name] = model

    def observe(self, target: str, url: str, ok: bool, routable: bool, now: float) -> None:
        """One probe of a version's replica (``routable``: after it)."""
        model = self.of_target.get(target)
        if model is None:
            return
        m = self.models[model]
        tally = m.tallies.setdefault(target, Tally())
        key = (target, url)
        outage = m.outages.get(key)
        if not ok:
            if outage is None:
                outage = m.outages[key] = Outage(now)
            outage.pending += 1
            outage.out |= not routable
            if now - outage.since >= m.check.restart_grace_s:  # longer than a restart: they all count
                _count_failures(tally, outage)
            return
        tally.probes += 1
        if outage is None:
            return
        del m.outages[key]
        grace = m.check.restart_grace_s
        last = m.forgiven.get(key)
        again = last is not None and now - last < max(grace, m.check.evaluation_interval_s)
        if outage.out and not again and now - outage.since < grace:
            m.forgiven[key] = now  # a restart within the grace: its failed probes are let go
        else:
            _count_failures(tally, outage)

    def forget(self, target: str, url: str) -> None:
        """A replica left: drop what is held for it."""
        model = self.of_target.get(target)
        if model is not None:
            self.models[model].outages.pop((target, url), None)
            self.models[model].forgiven.pop((target, url), None)

    def evaluate(
        self, now: float, replicas: dict[str, list[ReplicaView]], *, force: bool = False
    ) -> list[Rollback]:
        """Judge every model whose interval has ended (or whose canary has no routable replica left: that
        cannot wait for the interval); returns the rollbacks decided now."""
        out: list[Rollback] = []
        for m in self.models.values():
            canaries = m.canaries()
            if not canaries:
                continue
            due = force or now - m.window_started >= m.check.evaluation_interval_s
            stranded = any(
                m.tallies.get(c.name, Tally()).failures
                and not any(r.routable for r in replicas.get(c.name, []))
                for c in canaries
            )
            if not (due or stranded):
                continue
            stable = window_of(m.tallies.get(m.stable.name, Tally()), replicas.get(m.stable.name, []))
            for canary in canaries:
                assert canary.version_of is not None
                held = sum(o.pending for (t, _), o in m.outages.items() if t == canary.name)
                mine = window_of(m.tallies.get(canary.name, Tally()), replicas.get(canary.name, []), held)
                decision = judge(mine, stable, rule_of(m.check))
                m.last[canary.version_of.version] = decision
                if decision.verdict is Verdict.ROLLBACK:
                    versions = list(m.weights)
                    m.weights = dict(
                        zip(versions, rolled_back([m.weights[v] for v in versions]), strict=True)
                    )
                    m.rolled_back = True
                    m.metric = decision.metric
                    m.reason = f"version {canary.version_of.version} rolled back: {decision.reason}"
                    m.decided_at = now
                    self.rollbacks[(m.model, canary.version_of.version, decision.metric)] += 1
                    out.append(Rollback(m.model, canary, decision))
                    break
            if due:
                m.window_started = now
                m.tallies.clear()
        return out

    def feed(self) -> list[dict[str, object]]:
        """The ``versions`` part of ``/v1/backends``: weights now, and why they differ from the config."""
        return [
            {
                "model": m.model,
                "weights": dict(m.weights),
                "rolled_back": m.rolled_back,
                "metric": m.metric,
                "reason": m.reason,
                "decided_at": m.decided_at,
                "verdicts": {v: d.verdict.value for v, d in m.last.items()},
            }
            for m in self.models.values()
        ]


def _count_failures(tally: Tally, outage: Outage) -> None:
    """The held failed probes of an outage count now (and later ones as they come)."""
    tally.probes += outage.pending
    tally.failures += outage.pending
    outage.pending = 0
