"""Window percentiles from histogram deltas: histogram_quantile semantics, resets, merging."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from runtime.health.window import (
    WindowedCounter,
    WindowedHistogram,
    bucket_delta,
    merge,
    quantile,
    ratio,
)

INF = math.inf


def test_quantile_interpolates_inside_the_bucket():
    buckets = {0.1: 50.0, 0.2: 100.0, INF: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.75, buckets) == pytest.approx(0.15)
    assert quantile(0.25, buckets) == pytest.approx(0.05)


def test_quantile_in_inf_bucket_returns_highest_finite_bound():
    assert quantile(0.99, {0.1: 1.0, 1.0: 2.0, INF: 10.0}) == 1.0


def test_empty_window_has_no_percentile():
    assert quantile(0.95, {0.1: 0.0, INF: 0.0}) is None
    assert quantile(0.95, {}) is None


def test_window_uses_deltas_not_lifetime():
    h = WindowedHistogram(window_s=60)
    h.add(0, {0.1: 1000.0, 1.0: 1000.0, INF: 1000.0})  # a long fast past
    h.add(30, {0.1: 1000.0, 1.0: 1010.0, INF: 1010.0})  # ten slow requests just now
    delta = h.delta()
    assert delta == {0.1: 0.0, 1.0: 10.0, INF: 10.0}
    p95 = quantile(0.95, delta)
    assert p95 is not None and p95 > 0.9  # a lifetime p95 would still say < 0.1


def test_window_forgets_snapshots_older_than_the_window():
    h = WindowedHistogram(window_s=10)
    for t in range(0, 100, 5):
        h.add(t, {1.0: float(t), INF: float(t)})
    assert h.snapshots[0][0] <= 95 - 10 < h.snapshots[1][0]
    assert h.delta() == {1.0: 10.0, INF: 10.0}


def test_reset_starts_a_fresh_window():
    h = WindowedHistogram(window_s=60)
    h.add(0, {1.0: 500.0, INF: 500.0})
    h.add(5, {1.0: 3.0, INF: 3.0})  # the engine restarted
    assert h.delta() == {1.0: 3.0, INF: 3.0}


def test_bucket_delta_rejects_changed_bounds():
    assert bucket_delta({1.0: 1.0, INF: 1.0}, {2.0: 0.0, INF: 0.0}) is None


def test_counter_increase_and_hit_ratio():
    hits, queries = WindowedCounter(60), WindowedCounter(60)
    for t, h, q in ((0, 10, 100), (10, 40, 140)):
        hits.add(t, h)
        queries.add(t, q)
    assert ratio(hits.increase(), queries.increase()) == pytest.approx(0.75)
    assert ratio(0.0, 0.0) is None  # nothing asked is not a 0 % hit rate


def test_merge_sums_same_bounds():
    a = {0.1: 1.0, INF: 2.0}
    b = {0.1: 3.0, INF: 4.0}
    assert merge([a, b]) == {0.1: 4.0, INF: 6.0}
    assert merge([]) is None


@given(
    hs.lists(hs.integers(min_value=0, max_value=1000), min_size=1, max_size=8),
    hs.floats(min_value=0, max_value=1),
    hs.floats(min_value=0, max_value=1),
)
def test_quantile_is_monotone_and_within_bounds(counts, q1, q2):
    bounds = [0.01 * 2**i for i in range(len(counts))]
    cumulative, running = {}, 0.0
    for le, c in zip(bounds, counts, strict=True):
        running += c
        cumulative[le] = running
    cumulative[INF] = running + 1  # at least one observation
    lo, hi = sorted((q1, q2))
    a, b = quantile(lo, cumulative), quantile(hi, cumulative)
    assert a is not None and b is not None
    assert 0 <= a <= b <= bounds[-1]
