"""Per-engine health as a pure state machine: probe outcomes in, healthy / degraded / ejected out.

Why hysteresis: a single timeout must not take a replica out of rotation, and a single good answer
must not put a broken one back. So an engine is ejected after ``eject_after`` consecutive hard
failures and readmitted only after ``readmit_after`` consecutive successes; in between it is
*degraded* (still routable, flagged with the reason). Soft problems (metrics unreadable or stale)
degrade but never eject: the engine still serves, the router only loses load signals.

A replica that was never healthy (just discovered) is admitted on its first success: it has no
history to distrust, and engines answer ``/health`` only once ready.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class State(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    EJECTED = "ejected"


class Reason(StrEnum):
    """Why a probe failed or an engine is degraded; a bounded set, so it can be a metric label."""

    NOT_PROBED = "not_probed"
    HTTP_STATUS = "http_status"  # /health answered, but not 200
    TIMEOUT = "timeout"
    CONNECT = "connect"  # refused, reset, unreachable
    DNS = "dns"
    TLS = "tls"
    PROTOCOL = "protocol"  # malformed HTTP, disconnect mid-answer
    BODY_TOO_LARGE = "body_too_large"
    SYNTHETIC_FAILED = "synthetic_failed"  # one-token generation errored
    SYNTHETIC_TIMEOUT = "synthetic_timeout"  # ... or hung: /health lies
    METRICS_UNAVAILABLE = "metrics_unavailable"  # soft: no /metrics (e.g. SGLang without --enable-metrics)
    METRICS_MALFORMED = "metrics_malformed"  # soft: unparseable or no known names


SOFT_REASONS = frozenset({Reason.METRICS_UNAVAILABLE, Reason.METRICS_MALFORMED})


@dataclass(frozen=True)
class Outcome:
    """What one probe round found. ``hard`` failures count towards ejection; ``soft`` only degrade."""

    hard: Reason | None = None
    soft: Reason | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.hard is None


@dataclass(frozen=True)
class Health:
    state: State
    reason: Reason | None
    detail: str
    since_s: float  # when ``state`` was entered (monotonic or wall clock: the caller's choice, consistently)
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    ever_healthy: bool = False
    ejected_since_s: float | None = None  # start of the current ejection episode

    @property
    def routable(self) -> bool:
        return self.state is not State.EJECTED


@dataclass(frozen=True)
class Transition:
    """A state change worth telling people about (Kubernetes Event, log line)."""

    before: State
    after: State
    reason: Reason | None
    detail: str
    first_admission: bool = False  # a new replica's first success: not news worth an Event


def initial(now_s: float) -> Health:
    return Health(State.EJECTED, Reason.NOT_PROBED, "", since_s=now_s, ejected_since_s=now_s)


def step(
    prev: Health, outcome: Outcome, now_s: float, *, eject_after: int, readmit_after: int
) -> tuple[Health, Transition | None]:
    """Apply one probe outcome; returns the new health and the transition, if the state changed."""
    if outcome.hard is not None:
        failures = prev.consecutive_failures + 1
        if prev.state is State.EJECTED:
            nxt = replace(
                prev,
                reason=outcome.hard,
                detail=outcome.detail,
                consecutive_failures=failures,
                consecutive_successes=0,
            )
        elif failures >= eject_after:
            nxt = Health(
                State.EJECTED,
                outcome.hard,
                outcome.detail,
                since_s=now_s,
                consecutive_failures=failures,
                ever_healthy=prev.ever_healthy,
                ejected_since_s=now_s,
            )
        else:
            nxt = _enter(prev, State.DEGRADED, outcome.hard, outcome.detail, now_s, counts=(failures, 0))
        return nxt, _transition(prev, nxt)

    successes = prev.consecutive_successes + 1
    if prev.state is State.EJECTED and prev.ever_healthy and successes < readmit_after:
        nxt = replace(prev, consecutive_failures=0, consecutive_successes=successes)
        return nxt, None
    if outcome.soft is not None:
        nxt = _enter(prev, State.DEGRADED, outcome.soft, outcome.detail, now_s, counts=(0, successes))
    else:
        nxt = _enter(prev, State.HEALTHY, None, "", now_s, counts=(0, successes))
    nxt = replace(nxt, ever_healthy=True, ejected_since_s=None)
    return nxt, _transition(prev, nxt)


def _enter(
    prev: Health,
    state: State,
    reason: Reason | None,
    detail: str,
    now_s: float,
    *,
    counts: tuple[int, int],
) -> Health:
    failures, successes = counts
    since = prev.since_s if prev.state is state else now_s
    return replace(
        prev,
        state=state,
        reason=reason,
        detail=detail,
        since_s=since,
        consecutive_failures=failures,
        consecutive_successes=successes,
    )


def _transition(prev: Health, nxt: Health) -> Transition | None:
    if prev.state is nxt.state:
        return None
    first = prev.state is State.EJECTED and not prev.ever_healthy
    return Transition(prev.state, nxt.state, nxt.reason, nxt.detail, first_admission=first)


def is_ejection(t: Transition) -> bool:
    return t.after is State.EJECTED


def is_readmission(t: Transition) -> bool:
    return t.before is State.EJECTED and t.after is not State.EJECTED and not t.first_admission


def recovery_interval_s(
    current_s: float, base_s: float, cap_s: float, since_readmission_s: float | None, flap_window_s: float
) -> float:
    """How often to probe a replica that was just ejected, so a good one is readmitted within a second
    (``readmit_after`` probes at ``base_s``): doubled, up to ``cap_s`` (the normal interval), when it was
    readmitted less than ``flap_window_s`` ago, so one that flaps is let back in ever more slowly."""
    if since_readmission_s is not None and since_readmission_s < flap_window_s:
        return min(cap_s, max(current_s, base_s) * 2)
    return base_s


def wedged_for_s(health: Health, now_s: float) -> float:
    """How long the current ejection episode has lasted (0 when routable); remediation reads this."""
    if health.state is not State.EJECTED or health.ejected_since_s is None:
        return 0.0
    return max(0.0, now_s - health.ejected_since_s)
