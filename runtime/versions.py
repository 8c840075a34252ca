"""Versions of a model as pure decisions: which version takes a request, and whether a canary holds,
advances or rolls back.

No I/O, no clock, no randomness but the order a split is given: the router and the health monitor call
these with what they know, and tests call them with numbers (and a seeded order).

- :class:`Split` picks a version by weight. A request with a session key always lands on the same version
  while the weights stay (the key hashes to a point in [0, 100), and each version owns a range, stable
  first, so moving weight to the canary moves only the sessions in between). Requests without a key are
  spread by smooth weighted round robin over the shortest cycle that holds the weights exactly (10 requests
  for 90/10), which hits them exactly rather than on average, dealt in an order shuffled per cycle
  (``order``: the OS's randomness in the router). A fixed order would tell a client that every tenth
  request lands on a 10 % canary, and it could make exactly those the slow ones its verdict reads.
  The hash is public, so a client can choose keys that land on a canary. Where a canary is judged
  (``client_share``), one client (its API key's name, else its address: the router's ``_client``) may hold
  only a small share of the canary's recent requests; past it its keyed requests go to the stable version.
  No one client then makes up the tail of the canary's latency, which its verdict reads.
- :func:`judge` compares a canary's window with the stable version's and with the SLO.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

#: A canary's recent requests a split remembers (per version that is not the stable one), and the share of
#: them one client may hold when a canary is judged: below the 5 % tail a p95 reads, so one client's
#: requests, however slow, cannot make the canary's p95 alone (its first request always goes where its key
#: says). Requests without a key are spread by weight whoever sends them: they count, uncapped.
CLIENT_WINDOW = 100
MAX_CLIENT_SHARE = 0.04
_ANONYMOUS = -1
CYCLE = 100  # requests dealt per shuffled cycle when the weights are not whole numbers


@dataclass
class Split:
    """The versions of one model and their current weights (percent); ``stable`` is index 0."""

    model: str
    versions: tuple[str, ...]  # version names, stable first
    weights: tuple[float, ...]
    configured: tuple[float, ...] = ()  # the weights the config gave (an override may replace ``weights``)
    override_reason: str = ""  # why the weights differ from the config (a rollback), or ""
    client_share: float = 1.0  # most of a canary's recent keyed requests one client may hold (1: no cap)
    order: random.Random = field(default_factory=random.SystemRandom)  # shuffles each cycle's deal
    _current: list[float] = field(default_factory=list)  # smooth weighted round robin state
    _deck: list[int] = field(default_factory=list)  # this cycle's versions still to deal, last first
    _recent: dict[int, deque[int]] = field(default_factory=dict)  # version index -> recent clients' digests
    _held: dict[int, Counter[int]] = field(default_factory=dict)  # version index -> digest -> in _recent

    def __post_init__(self) -> None:
        if not self.configured:
            self.configured = self.weights
        self._current = [0.0] * len(self.versions)

    @property
    def stable(self) -> str:
        return self.versions[0]

    def set_weights(self, weights: Sequence[float], reason: str = "") -> bool:
        """Install weights (e.g. a rollback from the health monitor); True if they changed."""
        new = tuple(float(w) for w in weights)
        if new == self.weights or len(new) != len(self.versions) or sum(new) <= 0:
            return False
        if not all(math.isfinite(w) and w >= 0 for w in new):  # a feed's NaN or negative: never installed
            return False
        self.weights = new
        self.override_reason = reason if new != self.configured else ""
        self._current = [0.0] * len(self.versions)
        self._deck.clear()
        self._recent.clear()
        self._held.clear()
        return True

    def choose(
        self, session: str | None, usable: Callable[[str], bool] = lambda _: True, client: str | None = None
    ) -> str | None:
        """The version for one request, among those ``usable`` says can serve now; None if none can.
        ``client`` names who sends it (an API key's name, or an address) when the caller knows; else the session
        key does."""
        live = [w if usable(v) else 0.0 for v, w in zip(self.versions, self.weights, strict=True)]
        if sum(live) <= 0:
            fallback = [v for v in self.versions if usable(v)]
            return fallback[0] if fallback else None
        if session is None:
            i = self._deal(live)
            if i > 0 and self.client_share < 1:
                self._admit(i, _ANONYMOUS)
            return self.versions[i]
        i = _range_of(_point(session), live)
        capped = i > 0 and self.client_share < 1 and live[0] > 0
        if capped and not self._admit(i, _digest(client if client is not None else session)):
            return self.stable  # this client already holds its share of the canary's recent requests
        return self.versions[i]

    def _admit(self, i: int, who: int) -> bool:
        """Count one request of ``who`` towards version ``i``'s window; False (not counted) when that would
        put more than ``client_share`` of the window on ``who`` (its first request is always let through)."""
        recent = self._recent.setdefault(i, deque())
        held = self._held.setdefault(i, Counter())
        if who != _ANONYMOUS and held[who] >= max(1, int(self.client_share * (len(recent) + 1))):
            return False
        recent.append(who)
        held[who] += 1
        if len(recent) > CLIENT_WINDOW:
            gone = recent.popleft()
            held[gone] -= 1
            if not held[gone]:
                del held[gone]
        return True

    def _deal(self, live: list[float]) -> int:
        """The next version of this cycle's shuffled deal; a new cycle when it ran out, or when a version in
        it cannot serve now (the weights of those that can are dealt afresh)."""
        if not self._deck or live[self._deck[-1]] <= 0:
            self._deck = [self._round_robin(live) for _ in range(_cycle(live))]
            self.order.shuffle(self._deck)
        return self._deck.pop()

    def _round_robin(self, live: list[float]) -> int:
        total = sum(live)
        cur = self._current
        best = -1
        for i, w in enumerate(live):
            cur[i] += w
            if w > 0 and (best < 0 or cur[i] > cur[best]):
                best = i
        cur[best] -= total
        return best


def _cycle(weights: list[float]) -> int:
    """The fewest requests that hold whole-number weights exactly (90/10: 10; 50/50: 2), at most ``CYCLE``."""
    whole = [int(w) for w in weights if w > 0]
    if any(w != int(w) for w in weights):
        return CYCLE
    return min(CYCLE, max(1, sum(whole) // math.gcd(*whole)))


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def _point(key: str) -> float:
    """A session key's stable place in [0, 100)."""
    return (_digest(key) / 2**64) * 100.0


def _range_of(point: float, weights: list[float]) -> int:
    scaled = point * sum(weights) / 100.0
    edge = 0.0
    last = 0
    for i, w in enumerate(weights):
        if w <= 0:
            continue
        last = i
        edge += w
        if scaled < edge:
            return i
    return last


# --- the canary's verdict ------------------------------------------------------------------------


class Verdict(StrEnum):
    HOLD = "hold"  # not enough evidence yet, or all good but the next step is a spec change
    ADVANCE = "advance"  # healthy through the interval: the next step may be taken
    ROLLBACK = "rollback"  # a breach: weight back to stable now


@dataclass(frozen=True)
class Window:
    """What one version did during one evaluation interval (``None``: no sample)."""

    probes: int = 0
    failures: int = 0
    ttft_p95_s: float | None = None
    inter_token_p95_s: float | None = None
    routable_replicas: int = 0
    ttft_samples: float = 0  # requests behind ``ttft_p95_s`` (the engines' histogram count in the window)
    inter_token_samples: float = 0
    held_failures: int = 0  # failed probes of a replica that is out, held for its restart grace

    @property
    def error_rate(self) -> float | None:
        return self.failures / self.probes if self.probes else None


@dataclass(frozen=True)
class Rule:
    """When a canary is rolled back (the runtime form of the spec's rollout.canary.rollback)."""

    max_error_rate: float = 0.05
    max_ttft_ratio: float = 1.5
    max_inter_token_ratio: float = 1.5
    ttft_slo_s: float | None = None
    inter_token_slo_s: float | None = None
    min_samples: int = 3
    min_requests: int = 20


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    metric: str  # which signal decided ("error_rate", "ttft_p95", ...; "" when nothing did)
    reason: str  # one sentence for the log line and the Kubernetes Event


def judge(canary: Window, stable: Window, rule: Rule) -> Decision:
    """Compare a canary's interval with the stable version's and the SLO: rollback on any breach, hold
    while evidence is thin, advance when every check passed on enough samples.

    No signal decides on less than its minimum: the probe checks (all replicas out, the error rate) need
    ``min_samples`` probes, a latency p95 needs ``min_requests`` requests behind it (and the stable version's
    too, to compare with), so one request, or one probe that caught a restart, never rolls a canary back."""
    if canary.probes >= rule.min_samples and canary.routable_replicas == 0 and canary.failures:
        return Decision(
            Verdict.ROLLBACK, "routable_replicas", "no replica of the canary is routable (all ejected)"
        )
    rate = canary.error_rate
    if rate is not None and canary.probes >= rule.min_samples and rate > rule.max_error_rate:
        return Decision(
            Verdict.ROLLBACK,
            "error_rate",
            f"canary error rate {rate:.1%} ({canary.failures}/{canary.probes} probes failed) is above "
            f"{rule.max_error_rate:.1%}",
        )

    def enough(p95: float | None, samples: float) -> float | None:
        return p95 if samples >= rule.min_requests else None

    checks = (
        (
            "ttft_p95",
            enough(canary.ttft_p95_s, canary.ttft_samples),
            enough(stable.ttft_p95_s, stable.ttft_samples),
            rule.max_ttft_ratio,
            rule.ttft_slo_s,
        ),
        (
            "inter_token_p95",
            enough(canary.inter_token_p95_s, canary.inter_token_samples),
            enough(stable.inter_token_p95_s, stable.inter_token_samples),
            rule.max_inter_token_ratio,
            rule.inter_token_slo_s,
        ),
    )
    for metric, mine, theirs, ratio, slo in checks:
        if mine is None:
            continue
        if slo is not None and mine > slo:
            return Decision(
                Verdict.ROLLBACK,
                metric,
                f"canary {metric} {mine * 1000:.0f} ms breaks the SLO of {slo * 1000:.0f} ms",
            )
        if theirs is not None and theirs > 0 and mine > theirs * ratio:
            return Decision(
                Verdict.ROLLBACK,
                metric,
                f"canary {metric} {mine * 1000:.0f} ms is {mine / theirs:.2f}x the stable version's "
                f"{theirs * 1000:.0f} ms (limit {ratio:g}x)",
            )
    if canary.probes < rule.min_samples:
        return Decision(
            Verdict.HOLD, "", f"{canary.probes} of {rule.min_samples} probes needed to judge the canary"
        )
    if canary.held_failures:  # a replica is out: a restart, or the start of a failure; not a pass either way
        return Decision(
            Verdict.HOLD,
            "",
            f"{canary.held_failures} failed probes of a canary replica that is out are held for its restart"
            " grace",
        )
    return Decision(Verdict.ADVANCE, "", "canary within its error and latency limits")


def rolled_back(weights: Sequence[float]) -> tuple[float, ...]:
    """All weight on the stable version (index 0)."""
    return (float(sum(weights)), *(0.0 for _ in weights[1:]))
