"""Retry budget and backoff: retries may add at most ``ratio`` extra load fleet-wide.

Every request deposits ``ratio`` tokens (capped), every retry spends one; a small floor lets a quiet
router still retry. This is what keeps a failing fleet from being hit by a retry storm.
"""

from __future__ import annotations

import random

_RNG = random.Random()


class RetryBudget:
    __slots__ = ("cap", "ratio", "tokens")

    def __init__(self, ratio: float, floor: float = 10.0, cap: float = 100.0) -> None:
        self.ratio = ratio
        self.cap = max(cap, floor)
        self.tokens = floor if ratio > 0 else 0.0

    def deposit(self) -> None:
        t = self.tokens + self.ratio
        self.tokens = t if t < self.cap else self.cap

    def withdraw(self) -> bool:
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def backoff_s(base_ms: int, attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform in [base/2, base] x 2^(attempt-1)."""
    if base_ms <= 0:
        return 0.0
    top = base_ms * (2 ** max(0, attempt - 1)) / 1000.0
    draw = (rng or _RNG).random()
    return float(top * (0.5 + draw / 2))
