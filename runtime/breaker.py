"""A replica's circuit breaker: shared by every front end that sends requests to engines (the router, the
endpoint picker), so a replica that keeps failing is skipped the same way whichever one is in front."""

from __future__ import annotations

from enum import IntEnum


class Circuit(IntEnum):
    """Breaker states; the value is what ``inferstack_router_circuit_state`` exports."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Breaker:
    """Consecutive-failure circuit breaker with a single trial request when the open period ends."""

    __slots__ = ("failures", "open_s", "opened_at", "state", "threshold", "trial_in_flight")

    def __init__(self, threshold: int, open_s: float) -> None:
        self.threshold = threshold
        self.open_s = open_s
        self.failures = 0
        self.state = Circuit.CLOSED
        self.opened_at = 0.0
        self.trial_in_flight = False

    def allows(self, now: float) -> bool:
        """May a request go to this replica now? (Does not reserve the trial; see :meth:`on_start`.)"""
        if self.state is Circuit.CLOSED:
            return True
        if self.state is Circuit.OPEN:
            return now - self.opened_at >= self.open_s
        return not self.trial_in_flight

    def on_start(self, now: float) -> None:
        if self.state is Circuit.OPEN and now - self.opened_at >= self.open_s:
            self.state = Circuit.HALF_OPEN
        if self.state is Circuit.HALF_OPEN:
            self.trial_in_flight = True

    def on_success(self) -> None:
        self.failures = 0
        self.trial_in_flight = False
        self.state = Circuit.CLOSED

    def on_abandon(self) -> None:
        """The trial request ended without a verdict (its client left): let another one try."""
        if self.state is Circuit.HALF_OPEN:
            self.trial_in_flight = False

    def on_failure(self, now: float) -> None:
        self.failures += 1
        self.trial_in_flight = False
        if self.state is Circuit.HALF_OPEN or self.failures >= self.threshold:
            self.state = Circuit.OPEN
            self.opened_at = now
