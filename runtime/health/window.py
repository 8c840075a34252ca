"""Percentiles and rates over the last window, from cumulative engine counters.

Why deltas: engines export lifetime histograms and counters. A p95 over the whole lifetime hides a
regression that started a minute ago, so we keep timestamped snapshots and subtract the one at the
window's start from the newest. An engine restart resets its counters; a decrease in any bucket
counts as a reset, and the history before it is dropped (the new cumulative values are then the
delta since the restart, the same rule Prometheus' ``rate`` applies).

Everything here is pure: snapshots in, numbers out.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

Buckets = Mapping[float, float]  # upper bound ``le`` -> cumulative count


def bucket_delta(new: Buckets, old: Buckets | None) -> dict[float, float] | None:
    """``new - old`` per bucket; ``None`` when a bucket went down (a reset) or bounds differ."""
    if old is None:
        return dict(new)
    if set(new) != set(old):
        return None
    out: dict[float, float] = {}
    for le, count in new.items():
        diff = count - old[le]
        if diff < 0:
            return None
        out[le] = diff
    return out


def quantile(q: float, buckets: Buckets) -> float | None:
    """``histogram_quantile`` semantics: linear interpolation inside the bucket holding rank q*total.

    Returns ``None`` for an empty histogram (no observations in the window is not latency zero). A
    rank that lands in the ``+Inf`` bucket returns the highest finite bound, as Prometheus does.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return prev_bound if len(bounds) > 1 else None
            if count == prev_count:
                return le
            return prev_bound + (le - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = le, count
    return prev_bound


def merge(histograms: list[Buckets]) -> dict[float, float] | None:
    """Sum histograms with the same bounds (per-model p95 across replicas); ``None`` if none agree."""
    usable = [h for h in histograms if h]
    if not usable:
        return None
    bounds = set(usable[0])
    same = [h for h in usable if set(h) == bounds]
    return {le: sum(h[le] for h in same) for le in bounds}


@dataclass
class WindowedHistogram:
    """Snapshots of one cumulative histogram, keeping just enough to cover ``window_s``."""

    window_s: float
    snapshots: deque[tuple[float, dict[float, float]]] = field(default_factory=deque)

    def add(self, at_s: float, buckets: Buckets) -> None:
        if self.snapshots and bucket_delta(buckets, self.snapshots[-1][1]) is None:
            self.snapshots.clear()  # reset or changed bounds: history no longer comparable
            self.snapshots.append((at_s - self.window_s, {le: 0.0 for le in buckets}))
        self.snapshots.append((at_s, dict(buckets)))
        # Keep the newest snapshot at or before the window start as the baseline; drop older ones.
        while len(self.snapshots) >= 2 and self.snapshots[1][0] <= at_s - self.window_s:
            self.snapshots.popleft()

    def delta(self) -> dict[float, float] | None:
        """Observations inside the window; on the first snapshot there is no window yet."""
        if len(self.snapshots) < 2:
            return None
        return bucket_delta(self.snapshots[-1][1], self.snapshots[0][1])


@dataclass
class WindowedCounter:
    """Increase of one counter over the window, reset-aware."""

    window_s: float
    snapshots: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, at_s: float, value: float) -> None:
        if self.snapshots and value < self.snapshots[-1][1]:
            self.snapshots.clear()
            self.snapshots.append((at_s - self.window_s, 0.0))
        self.snapshots.append((at_s, value))
        while len(self.snapshots) >= 2 and self.snapshots[1][0] <= at_s - self.window_s:
            self.snapshots.popleft()

    def increase(self) -> float | None:
        if len(self.snapshots) < 2:
            return None
        return self.snapshots[-1][1] - self.snapshots[0][1]


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """Hit rate from two increases; ``None`` when nothing was asked in the window."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return min(1.0, max(0.0, numerator / denominator))
