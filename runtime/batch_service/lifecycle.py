"""The batch state machine of the OpenAI API, as pure decisions. No I/O.

    validating --ok--> in_progress --all lines done--> finalizing --files written--> completed
        |  |  \\--bad input--> failed           |  \\--window passed--> (files written) --> expired
        |  \\--window passed (input never read) ---------------------------------------> expired
        \\--cancel--> cancelling <--cancel------/
                          \\--in-flight lines back--> (files written) --> cancelled

Lines still pending when a batch is cancelled or expires go to the error file (``batch_cancelled``,
``batch_expired``), so every input line appears exactly once in the output or the error file. A batch is
closed only when none of its requests is in flight: a late answer can never land after the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL = frozenset({Status.FAILED, Status.COMPLETED, Status.EXPIRED, Status.CANCELLED})
ACTIVE = frozenset(Status) - TERMINAL
#: What ``cancel`` may interrupt.
CANCELLABLE = frozenset({Status.VALIDATING, Status.IN_PROGRESS})

#: Error-file codes and messages of lines that never ran.
EXPIRED_LINE = ("batch_expired", "This request could not be executed before the completion window expired.")
CANCELLED_LINE = ("batch_cancelled", "This request was not executed because the batch was cancelled.")


class Step(StrEnum):
    """What the runner does next with a batch."""

    VALIDATE = "validate"  # read the input file: in_progress, or failed with errors
    RUN = "run"  # dispatch pending lines while there is headroom
    WAIT = "wait"  # requests in flight must come back first (cancelling, expiring)
    FINALIZE = "finalize"  # every line has a result: write the files, completed
    CLOSE_EXPIRED = "close_expired"  # window passed: pending lines -> error file, write files, expired
    CLOSE_CANCELLED = "close_cancelled"  # cancelled: pending lines -> error file, write files, cancelled
    NOTHING = "nothing"  # terminal


@dataclass(frozen=True)
class Progress:
    """What the runner knows of a batch right now."""

    status: Status
    expires_at: int
    pending: int  # lines without a recorded result, in flight or not
    inflight: int  # lines whose request is out (or whose result is not committed yet)


def next_step(p: Progress, now: float) -> Step:
    """The one thing to do next with a batch; see the module docstring for the diagram."""
    if p.status in TERMINAL:
        return Step.NOTHING
    if p.status is Status.VALIDATING:  # no line is out yet: nothing to wait for
        return Step.CLOSE_EXPIRED if now >= p.expires_at else Step.VALIDATE
    if p.status is Status.CANCELLING:
        return Step.WAIT if p.inflight else Step.CLOSE_CANCELLED
    if p.status is Status.FINALIZING:
        return Step.FINALIZE
    # in_progress
    if p.pending == 0:
        return Step.FINALIZE
    if now >= p.expires_at:
        return Step.WAIT if p.inflight else Step.CLOSE_EXPIRED
    return Step.RUN


def dispatching(p: Progress, now: float) -> bool:
    """May new requests of this batch go out now?"""
    return next_step(p, now) is Step.RUN


def terminal_of(step: Step) -> Status:
    """The status a closing step ends in."""
    return {
        Step.FINALIZE: Status.COMPLETED,
        Step.CLOSE_EXPIRED: Status.EXPIRED,
        Step.CLOSE_CANCELLED: Status.CANCELLED,
    }[step]


def unfinished_line(status: Status) -> tuple[str, str] | None:
    """The error code and message written for lines still pending when a batch ends in ``status``."""
    if status is Status.EXPIRED:
        return EXPIRED_LINE
    if status is Status.CANCELLED:
        return CANCELLED_LINE
    return None


def cancel_refusal(status: Status) -> str | None:
    """Why a batch in ``status`` cannot be cancelled; None when it can (or already is being)."""
    if status in CANCELLABLE or status is Status.CANCELLING:
        return None
    return f"Cannot cancel a batch with status {status.value!r}."
