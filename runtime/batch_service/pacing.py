"""How many of a model's batch requests may be in flight: pure decisions on load signals.

Two signals, two speeds:

- The health monitor's feed (every few seconds): how many replicas are routable and whether their
  engines queue requests. A queue in the engine means the replicas are full: no batch work then. Its
  replicas times ``max_inflight_per_replica`` caps the window.
- The router's answer (per request): it admits a low-priority request only while a replica has headroom
  and nobody waits in line, and refuses it at once otherwise (503, code ``overloaded``, as for any request
  refused for load). A refusal halves the window and
  pauses the model's lane briefly; each answered request grows the window by 1/window (additive
  increase, multiplicative decrease), so batch work follows the headroom interactive traffic leaves.

A 429 for the batch owner's rate limit (``rate_limit_exceeded``) says nothing about headroom: only that
owner's batches wait (its Retry-After), and the lane goes on with everyone else's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.http import OVERLOADED, OVERLOADED_CODE

#: Pause after a refusal: doubles per refusal in a row, up to the maximum.
PAUSE_START_S = 0.1
PAUSE_MAX_S = 2.0


@dataclass(frozen=True)
class Capacity:
    """A model's replicas as the health monitor sees them."""

    routable: int
    queued: float  # requests waiting inside the engines, summed


def capacity(feed: Mapping[str, Any] | None, model: str, now_unix_s: float) -> Capacity | None:
    """The model's routable replicas and engine queue from a ``/v1/backends`` feed; None when the feed is
    absent, stale or does not know the model (then only the router's admission paces)."""
    if not isinstance(feed, Mapping):  # absent, or not the feed's shape (a health monitor in trouble)
        return None
    try:
        generated = float(feed.get("generated_at") or 0)
        stale_after = float(feed.get("stale_after_s") or 15)
    except (TypeError, ValueError, OverflowError):
        return None
    if now_unix_s - generated > stale_after:
        return None
    models = feed.get("models")
    for entry in models if isinstance(models, list) else []:
        if isinstance(entry, Mapping) and entry.get("model") == model:
            try:
                routable = int(entry.get("routable_replicas") or 0)
                queued = float(entry.get("queue_depth") or 0.0)
            except (TypeError, ValueError, OverflowError):
                return None
            return Capacity(routable, queued)
    return None


def window_cap(cap: Capacity | None, per_replica: int) -> int:
    """Most batch requests of the model in flight: per routable replica, none while engines queue; one
    replica's worth when the feed says nothing (the router still refuses what has no headroom)."""
    if cap is None:
        return per_replica
    if cap.queued > 0:
        return 0
    return cap.routable * per_replica


@dataclass
class Window:
    """Additive increase, multiplicative decrease, within ``window_cap``."""

    size: float = 1.0
    refusals_in_a_row: int = 0

    def limit(self, cap: int) -> int:
        return max(0, min(cap, math.floor(self.size)))

    def answered(self, cap: int) -> None:
        self.refusals_in_a_row = 0
        self.size = min(max(1.0, float(cap)), self.size + 1.0 / max(1.0, self.size))

    def refused(self) -> float:
        """Halve; returns how long the lane pauses before its next request."""
        self.size = max(1.0, self.size / 2)
        self.refusals_in_a_row += 1
        return float(min(PAUSE_MAX_S, PAUSE_START_S * 2.0 ** (self.refusals_in_a_row - 1)))


class Verdict:
    """What the runner does with an answer to one request."""

    DONE = "done"  # record it: output file (2xx) or error file (any other answer)
    REFUSED = "refused"  # no headroom: the model's lane slows down; try again later, no attempt spent
    LIMITED = "limited"  # the batch's owner is over its rate limit: that owner waits, nobody else
    RETRY = "retry"  # a server or transport error: try again, one attempt spent


RETRY_STATUSES = frozenset({500, 502, 503, 504})
#: The router's error code for a key over its request or token limit (``runtime.api_keys``).
RATE_LIMITED = "rate_limit_exceeded"
#: Longest an owner over its limit waits before its lines are tried again (its Retry-After, up to this).
LIMITED_PAUSE_MAX_S = 60.0


def verdict(status: int | None, attempt: int, max_attempts: int, code: str | None = None) -> str:
    """``status`` None: no HTTP answer at all (connect error, reset, timeout); ``code`` the error code of
    the answer's body."""
    if status == 429:
        return Verdict.LIMITED if code == RATE_LIMITED else Verdict.REFUSED
    if (
        status == OVERLOADED and code == OVERLOADED_CODE
    ):  # no headroom, or a full line: not this request's fault
        return Verdict.REFUSED
    if status is None or status in RETRY_STATUSES:
        return Verdict.RETRY if attempt < max_attempts else Verdict.DONE
    return Verdict.DONE


def retry_delay_s(attempt: int) -> float:
    """Backoff before retry ``attempt`` (1-based) of one request."""
    return float(min(30.0, 0.5 * 2 ** (attempt - 1)))
